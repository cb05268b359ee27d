package idemnats_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemnats"
	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/internal/msgchaos"
	"github.com/idem-dev/idem/internal/testenv"
)

const childEnv = msgchaos.ChildEnv

// The chaos run's JetStream names, from msgchaos.NameEnv: the stream holds
// <name>.in (what the consumers handle) and <name>.out (what they produce).
func chaosSubjects(name string) (in, out string) { return name + ".in", name + ".out" }

const (
	chaosConsumer = "billing"
	chaosAckWait  = 2 * time.Second
	chaosLease    = 2 * time.Second
)

// TestChaosJetStream: two consumer processes on one durable JetStream
// consumer, killed with SIGKILL mid-handler, between completion and the
// publication of the produced message, and between publication and ack
// (by the test and by themselves), dropping acks so that AckWait
// redelivers, and failing messages with Retryable. Every message's ledger
// row must be written exactly once, none lost, and every produced message
// must carry the Nats-Msg-Id its ledger row recorded.
func TestChaosJetStream(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos runs only without -short")
	}
	url := testenv.Getenv(t, "IDEM_TEST_NATS_URL")
	db := msgchaos.NewDB(t)
	faults, messages := msgchaos.Settings()
	name := msgchaos.RandomName("CHAOS_")
	in, out := chaosSubjects(name)

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{in, out}, Duplicates: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer js.DeleteStream(context.Background(), name)
	if _, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: chaosConsumer, FilterSubject: in,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: chaosAckWait, MaxDeliver: -1, MaxAckPending: 1000}); err != nil {
		t.Fatal(err)
	}

	// Collect the produced messages: input ID -> Nats-Msg-Ids seen.
	seen := msgchaos.NewSeen()
	watch, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{out}})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := watch.Consume(func(m jetstream.Msg) {
		seen.Add(m.Headers().Get("In-Id"), m.Headers().Get(jetstream.MsgIDHeader))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()

	env := []string{msgchaos.SchemaEnv + "=" + db.Schema, msgchaos.NameEnv + "=" + name}
	fleet := msgchaos.NewFleet(t, "nats", 2, append(env, msgchaos.FaultsEnv+"=1"))
	run := &msgchaos.Run{DB: db, Fleet: fleet, Faults: faults, Messages: messages, Calm: env,
		Publish: func(ctx context.Context, id string) error {
			m := nats.NewMsg(in)
			m.Header.Set(jetstream.MsgIDHeader, id)
			m.Data = []byte(id)
			_, err := js.PublishMsg(ctx, m)
			return err
		}}
	ids := run.Go(t)
	seen.Wait(len(ids))
	fleet.Stop(10 * time.Second)
	msgchaos.Verify(t, db, fleet, ids, seen, faults)
}

// chaosChild is a consumer process of TestChaosJetStream.
func chaosChild(role string) int {
	if err := runChaosChild(role); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

func runChaosChild(string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	schema, name := os.Getenv(msgchaos.SchemaEnv), os.Getenv(msgchaos.NameEnv)
	faulty := msgchaos.Faulty()
	_, out := chaosSubjects(name)
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_TEST_POSTGRES_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := idempg.New(pool, idempg.Config{Schema: schema})
	if err != nil {
		return err
	}
	defer store.Close()
	engine, err := idem.NewEngine(store, idem.EngineConfig{Lease: chaosLease, Logger: logger})
	if err != nil {
		return err
	}
	nc, err := nats.Connect(os.Getenv("IDEM_TEST_NATS_URL"))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.Consumer(ctx, name, chaosConsumer)
	if err != nil {
		return err
	}
	var pub jetstream.Publisher = js
	if faulty {
		pub = faultyPublisher{js}
	}
	guard, err := idemnats.New(engine, idemnats.Config{Kind: idem.Transactional, Publisher: pub, NakDelay: 300 * time.Millisecond, Logger: logger})
	if err != nil {
		return err
	}
	handle := func(ctx context.Context, msg jetstream.Msg) ([]*nats.Msg, error) {
		if faulty && msgchaos.Chance(0.03) {
			return nil, idem.Retryable(errors.New("forced failure: nothing written"))
		}
		id := string(msg.Data())
		produced := nats.NewMsg(out)
		produced.Header.Set("In-Id", id)
		produced.Header.Set(jetstream.MsgIDHeader, nuid.Next())
		produced.Data = []byte("receipt for " + id)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := msgchaos.InsertLedger(ctx, tx, schema, id, produced.Header.Get(jetstream.MsgIDHeader)); err != nil {
				return err
			}
			if faulty && msgchaos.Chance(0.01) {
				msgchaos.Crash() // mid-handler: the row is not committed
			}
			return idemnats.CompleteTx[pgx.Tx](ctx, store, tx, produced)
		})
		if err != nil {
			return nil, err
		}
		return []*nats.Msg{produced}, nil
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		if faulty {
			msg = &faultyAck{Msg: msg}
		}
		_ = guard.Handle(ctx, msg, handle)
	}, jetstream.PullMaxMessages(8))
	if err != nil {
		return err
	}
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
	return nil
}

// faultyAck dies between completion and ack now and then, and drops acks
// now and then (JetStream then delivers the message again after AckWait).
type faultyAck struct{ jetstream.Msg }

func (m *faultyAck) Ack() error {
	switch {
	case msgchaos.Chance(0.01):
		msgchaos.Crash()
	case msgchaos.Chance(0.03):
		return nil // the ack is lost
	}
	return m.Msg.Ack()
}

// faultyPublisher dies now and then before publishing a produced message:
// between completion and publication, so that the message's next delivery
// must publish the stored messages, with their IDs.
type faultyPublisher struct{ jetstream.JetStream }

func (p faultyPublisher) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if msgchaos.Chance(0.01) {
		msgchaos.Crash()
	}
	return p.JetStream.PublishMsg(ctx, m, opts...)
}
