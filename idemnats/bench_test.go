package idemnats_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemnats"
	"github.com/idem-dev/idem/internal/msgbench"
	"github.com/idem-dev/idem/internal/msgchaos"
	"github.com/idem-dev/idem/internal/testenv"
)

// BenchmarkJetStream measures messages per second through a durable
// JetStream pull consumer (cons.Consume, explicit acks), bare and through a
// Guard on each store. Consume's callback hands each message to one of
// msgbench.Consumers() workers, as a team does to handle messages in
// parallel; each decodes the order, signs a receipt and acks (the Guard
// acks for it); the ledger variants also write a row to PostgreSQL. b.N messages, each with its Nats-Msg-Id, are stored before
// the clock starts (run it with -benchtime=3000x: a count of messages).
func BenchmarkJetStream(b *testing.B) {
	url := testenv.Getenv(b, "IDEM_TEST_NATS_URL")
	work := func(_ context.Context, msg jetstream.Msg) error {
		_, err := msgbench.Work(msg.Data())
		return err
	}
	for _, st := range msgbench.Stores() {
		b.Run(st.Name, func(b *testing.B) {
			benchJetStream(b, url, st.Engine(b), idem.External, work)
		})
	}
	// The ledger variants: each handler also writes a row to PostgreSQL in
	// a transaction, and with idem completes its lease in it (CompleteTx),
	// as a Transactional handler does.
	b.Run("bare+ledger", func(b *testing.B) {
		l := msgbench.NewLedgerDB(b)
		benchJetStream(b, url, nil, idem.External, func(ctx context.Context, msg jetstream.Msg) error {
			return l.Book(ctx, msg.Headers().Get(jetstream.MsgIDHeader), msg.Data(), nil)
		})
	})
	b.Run("postgres+ledger", func(b *testing.B) {
		l := msgbench.NewLedgerDB(b)
		benchJetStream(b, url, l.Engine, idem.Transactional, func(ctx context.Context, msg jetstream.Msg) error {
			return l.Book(ctx, msg.Headers().Get(jetstream.MsgIDHeader), msg.Data(), func(tx pgx.Tx) error {
				return idemnats.CompleteTx[pgx.Tx](ctx, l.Store, tx)
			})
		})
	})
}

// benchJetStream stores b.N messages, then times a consumer whose
// msgbench.Consumers() workers run handle on them, through a Guard when
// engine is not nil.
func benchJetStream(b *testing.B, url string, engine *idem.Engine, kind idem.Kind, handle func(context.Context, jetstream.Msg) error) {
	b.ReportAllocs()
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	name := msgchaos.RandomName("BENCH_")
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".orders"}})
	if err != nil {
		b.Fatal(err)
	}
	defer js.DeleteStream(context.Background(), name)
	for i := 0; i < b.N; i++ {
		m := nats.NewMsg(name + ".orders")
		m.Header.Set(jetstream.MsgIDHeader, name+"-"+strconv.Itoa(i))
		m.Data = msgbench.Payload(i)
		if _, err := js.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("publishing did not complete within a minute")
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 10000})
	if err != nil {
		b.Fatal(err)
	}
	var handled atomic.Int64
	done := make(chan struct{})
	n := int64(b.N)
	count := func() {
		if handled.Add(1) == n {
			close(done)
		}
	}
	run := func(msg jetstream.Msg) {
		if err := handle(ctx, msg); err != nil {
			_ = msg.Nak()
			return
		}
		_ = msg.Ack()
		count()
	}
	if engine != nil {
		guard, err := idemnats.New(engine, idemnats.Config{Kind: kind})
		if err != nil {
			b.Fatal(err)
		}
		run = func(msg jetstream.Msg) {
			err := guard.Handle(ctx, msg, func(ctx context.Context, msg jetstream.Msg) ([]*nats.Msg, error) {
				return nil, handle(ctx, msg)
			})
			if err == nil {
				count()
			}
		}
	}
	work := make(chan jetstream.Msg)
	var wg sync.WaitGroup
	for range msgbench.Consumers() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range work {
				run(m)
			}
		}()
	}
	b.ResetTimer()
	meter := msgbench.Start()
	cc, err := cons.Consume(func(m jetstream.Msg) { work <- m })
	if err != nil {
		b.Fatal(err)
	}
	<-done
	b.StopTimer()
	meter.Report(b, b.N)
	cc.Stop()
	<-cc.Closed()
	close(work)
	wg.Wait()
}
