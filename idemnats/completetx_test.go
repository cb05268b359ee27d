package idemnats_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemnats"
	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/internal/msgchaos"
)

// Produced messages too large to keep (over the engine's MaxResponseBody),
// stored with CompleteTx: the key completes as not replayable, and the
// delivery that ran the handler publishes what it returned, since nothing
// else has them; a redelivery is terminated, and runs nothing.
func TestCompleteTxOverTheLimitPublishesWhatItReturned(t *testing.T) {
	t.Parallel()
	db := msgchaos.NewDB(t)
	store, err := idempg.New(db.Pool, idempg.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	e, err := idem.NewEngine(store, idem.EngineConfig{MaxResponseBody: 64, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	var pub publisher
	g := newGuard(t, e, idemnats.Config{Kind: idem.Transactional, Publisher: &pub})
	runs := 0
	h := func(ctx context.Context, _ jetstream.Msg) ([]*nats.Msg, error) {
		runs++
		receipt := &nats.Msg{Subject: "receipts", Header: nats.Header{jetstream.MsgIDHeader: {"receipt-1"}}, Data: []byte(strings.Repeat("r", 100))}
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			return idemnats.CompleteTx[pgx.Tx](ctx, store, tx, receipt)
		})
		return []*nats.Msg{receipt}, err
	}
	m := newMsg(1, "x")
	if err := g.Handle(context.Background(), m, h); err != nil || m.ack(t) != "ack" {
		t.Fatalf("the delivery that ran: %v, %q", err, m.ack(t))
	}
	if ids := pub.ids(); len(ids) != 1 || ids[0] != "receipt-1" {
		t.Fatalf("published %q; want the receipt the handler returned", ids)
	}
	again := newMsg(1, "x")
	if err := g.Handle(context.Background(), again, h); !errors.Is(err, idem.ErrNotReplayable) || !idemnats.IsTerminated(err) || runs != 1 {
		t.Fatalf("redelivery: %v after %d runs; want not replayable, terminated, one run", err, runs)
	}
}
