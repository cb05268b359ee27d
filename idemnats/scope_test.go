package idemnats_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemnats"
	"github.com/idem-dev/idem/idemseal"
	"github.com/idem-dev/idem/idemstore"
)

// With a business key, ScopeFunc scopes each tenant apart: tenant B's
// order with tenant A's ID runs, and publishes its own receipt, not A's. A
// message without a tenant is terminated (scope_missing); a ScopeFunc
// failure marked Retryable is nakked with a delay.
func TestScopeFuncKeepsTenantsApart(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	var pub publisher
	g := newGuard(t, e, idemnats.Config{Publisher: &pub, Key: idemnats.HeaderKey("Order-Id"),
		ScopeFunc: func(msg jetstream.Msg) (string, error) {
			if msg.Headers().Get("Tenant") == "down" {
				return "", idem.Retryable(errors.New("the tenant directory timed out"))
			}
			return msg.Headers().Get("Tenant"), nil
		}})
	var c counting
	for seq, tenant := range []string{"a", "b"} {
		m := newMsg(uint64(seq+1), "order 1", "Order-Id", "1", "Tenant", tenant)
		if err := g.Handle(context.Background(), m, c.handle); err != nil || m.ack(t) != "ack" {
			t.Fatalf("tenant %s: %v, %q", tenant, err, m.ack(t))
		}
	}
	if ids := pub.ids(); c.runs.Load() != 2 || len(ids) != 2 || ids[0] == ids[1] {
		t.Fatalf("%d runs, published %q", c.runs.Load(), ids)
	}
	if _, err := e.Get(context.Background(), idem.Key{Scope: "billing/b", Operation: "ORDERS orders.placed", Key: "1"}); err != nil {
		t.Fatalf("tenant b's record: %v", err)
	}
	m := newMsg(3, "order 1", "Order-Id", "1")
	if err := g.Handle(context.Background(), m, c.handle); !errors.Is(err, idem.ErrScopeMissing) || !idemnats.IsTerminated(err) {
		t.Fatalf("no tenant: %v, %q", err, m.ack(t))
	}
	m = newMsg(5, "order 1", "Order-Id", "1", "Tenant", "a\x00b") // a store may refuse the NUL
	if err := g.Handle(context.Background(), m, c.handle); !errors.Is(err, idem.ErrScopeMissing) || !idemnats.IsTerminated(err) || c.runs.Load() != 2 {
		t.Fatalf("a control character: %v, %q", err, m.ack(t))
	}
	m = newMsg(4, "order 1", "Order-Id", "1", "Tenant", "down")
	if err := g.Handle(context.Background(), m, c.handle); err == nil || idemnats.IsTerminated(err) || m.ack(t) != "nak 5s" || c.runs.Load() != 2 {
		t.Fatalf("a failed lookup: %v, %q", err, m.ack(t))
	}
	if _, err := idemnats.New(e, idemnats.Config{Scope: "a/b", ScopeFunc: func(jetstream.Msg) (string, error) { return "t", nil }}); err == nil {
		t.Fatal("a Scope with a slash was accepted beside ScopeFunc")
	}
}

// With a business key, the subject is part of the default operation: an
// order created and then cancelled, with one Order-Id and the same data,
// runs twice. A record stored before (under the stream's name alone) for
// the same subject keeps its meaning: its message, delivered again,
// replays; one for another subject does not stop this one.
func TestBusinessKeyNamesTheSubject(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	fp, err := idem.Fingerprint(idem.FingerprintInput{Method: "MESSAGE", Operation: "ORDERS", Body: []byte("order 1")}, idem.FingerprintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.Begin(context.Background(), idem.Request{Key: idem.Key{Scope: "billing", Operation: "ORDERS", Key: "1"}, Fingerprint: fp,
		Info: &idemstore.Request{Method: "MESSAGE", Path: "orders.created"}})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := idemnats.Answer([]*nats.Msg{{Subject: "receipts", Header: nats.Header{"Nats-Msg-Id": {"receipt-1"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Lease.Complete(context.Background(), stored); err != nil {
		t.Fatal(err)
	}
	var pub publisher
	g := newGuard(t, e, idemnats.Config{Publisher: &pub, Key: idemnats.HeaderKey("Order-Id")})
	var c counting
	for seq, subject := range []string{"orders.created", "orders.cancelled", "orders.cancelled"} {
		m := newMsg(uint64(seq+1), "order 1", "Order-Id", "1")
		m.subject = subject
		if err := g.Handle(context.Background(), m, c.handle); err != nil || m.ack(t) != "ack" {
			t.Fatalf("%s: %v, %q", subject, err, m.ack(t))
		}
	}
	if ids := pub.ids(); c.runs.Load() != 1 || len(ids) != 3 || ids[0] != "receipt-1" || ids[1] != ids[2] {
		t.Fatalf("%d runs, published %q", c.runs.Load(), ids)
	}

	skip := newGuard(t, e, idemnats.Config{Publisher: &pub, Key: idemnats.HeaderKey("Order-Id"), SkipFormerKeys: true})
	m := newMsg(9, "order 1", "Order-Id", "1")
	m.subject = "orders.created"
	if err := skip.Handle(context.Background(), m, c.handle); err != nil || c.runs.Load() != 2 {
		t.Fatalf("SkipFormerKeys: %v, %d runs", err, c.runs.Load())
	}
}

// getFails fails its first n Gets, as a store that blips.
type getFails struct {
	idemstore.Store
	n atomic.Int32
}

func (s *getFails) Get(ctx context.Context, key idem.Key) (*idemstore.Record, error) {
	if s.n.Add(-1) >= 0 {
		return nil, fmt.Errorf("dial tcp: connection refused: %w", idemstore.ErrUnavailable)
	}
	return s.Store.Get(ctx, key)
}

// The lookup of a business key's former record fails (a store blip): the
// message does not run, and is nakked with a delay as after any store
// failure; its next delivery looks again and runs. The lookup never runs
// the handler blind.
func TestFormerLookupStoreBlip(t *testing.T) {
	t.Parallel()
	_, mem := memEngine(t, idem.EngineConfig{})
	store := &getFails{Store: mem}
	store.n.Store(1)
	e, err := idem.NewEngine(store, idem.EngineConfig{Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	g := newGuard(t, e, idemnats.Config{Publisher: &publisher{}, Key: idemnats.HeaderKey("Order-Id")})
	var c counting
	m := newMsg(1, "order 1", "Order-Id", "1")
	if err := g.Handle(context.Background(), m, c.handle); !errors.Is(err, idemstore.ErrUnavailable) || m.ack(t) != "nak 5s" || c.runs.Load() != 0 {
		t.Fatalf("blip: %v, %q, %d runs", err, m.ack(t), c.runs.Load())
	}
	m = newMsg(1, "order 1", "Order-Id", "1")
	if err := g.Handle(context.Background(), m, c.handle); err != nil || m.ack(t) != "ack" || c.runs.Load() != 1 {
		t.Fatalf("next delivery: %v, %q, %d runs", err, m.ack(t), c.runs.Load())
	}
}

// A record stored before under a business key's former operation for
// another subject is another event type's, whatever its sealed answer: a
// message for this subject runs, even when the key that sealed that record
// is no longer configured (rotated out), instead of being terminated as a
// record that does not open.
func TestFormerRecordOfAnotherSubjectSealed(t *testing.T) {
	t.Parallel()
	ring := func(id string, b byte) *idemseal.Keyring {
		k, err := idemseal.New(idemseal.Key{ID: id, Secret: bytes.Repeat([]byte{b}, idemseal.KeySize)})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	_, mem := memEngine(t, idem.EngineConfig{})
	before, err := idem.NewEngine(mem, idem.EngineConfig{Logger: discard, Sealer: ring("old", 1)})
	if err != nil {
		t.Fatal(err)
	}
	fp, err := idem.Fingerprint(idem.FingerprintInput{Method: "MESSAGE", Operation: "ORDERS", Body: []byte("order 1")}, idem.FingerprintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := before.Begin(context.Background(), idem.Request{Key: idem.Key{Scope: "billing", Operation: "ORDERS", Key: "1"}, Fingerprint: fp,
		Info: &idemstore.Request{Method: "MESSAGE", Path: "orders.created"}})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := idemnats.Answer([]*nats.Msg{{Subject: "receipts", Header: nats.Header{"Nats-Msg-Id": {"receipt-1"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Lease.Complete(context.Background(), stored); err != nil {
		t.Fatal(err)
	}
	var c counting
	// Its own message, delivered again, still replays the sealed record.
	g := newGuard(t, before, idemnats.Config{Publisher: &publisher{}, Key: idemnats.HeaderKey("Order-Id")})
	m := newMsg(1, "order 1", "Order-Id", "1")
	m.subject = "orders.created"
	if err := g.Handle(context.Background(), m, c.handle); err != nil || m.ack(t) != "ack" || c.runs.Load() != 0 {
		t.Fatalf("its own message: %v, %q, %d runs", err, m.ack(t), c.runs.Load())
	}
	now, err := idem.NewEngine(mem, idem.EngineConfig{Logger: discard, Sealer: ring("new", 2)})
	if err != nil {
		t.Fatal(err)
	}
	g = newGuard(t, now, idemnats.Config{Publisher: &publisher{}, Key: idemnats.HeaderKey("Order-Id")})
	m = newMsg(2, "order 1", "Order-Id", "1")
	m.subject = "orders.cancelled"
	if err := g.Handle(context.Background(), m, c.handle); err != nil || m.ack(t) != "ack" || c.runs.Load() != 1 {
		t.Fatalf("%v, %q, %d runs", err, m.ack(t), c.runs.Load())
	}
}
