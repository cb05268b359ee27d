package idemwatermill_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemwatermill"
	"github.com/idem-dev/idem/internal/msgbench"
	"github.com/idem-dev/idem/internal/msgchaos"
	"github.com/idem-dev/idem/internal/testenv"
)

// BenchmarkRouterRabbitMQ measures messages per second through a Watermill
// router consuming a durable RabbitMQ queue (watermill-amqp, persistent
// messages, one consumer per handler with prefetch 1, as
// NewDurableQueueConfig sets it), bare and behind the middleware on each
// store, and with a ledger row in PostgreSQL per message. The router runs msgbench.Consumers() handlers on the queue, which
// is how a team gets parallel handling from watermill-amqp; each decodes the
// order and signs a receipt. b.N messages are queued before the clock
// starts (run it with -benchtime=3000x: a count of messages).
func BenchmarkRouterRabbitMQ(b *testing.B) {
	url := testenv.Getenv(b, "IDEM_TEST_AMQP_URL")
	work := func(msg *message.Message) error {
		_, err := msgbench.Work(msg.Payload)
		return err
	}
	for _, st := range msgbench.Stores() {
		b.Run(st.Name, func(b *testing.B) {
			benchRouter(b, url, st.Engine(b), idem.External, work)
		})
	}
	// The ledger variants: each handler also writes a row to PostgreSQL in
	// a transaction, and with idem completes its lease in it (CompleteTx),
	// as a Transactional handler does.
	b.Run("bare+ledger", func(b *testing.B) {
		l := msgbench.NewLedgerDB(b)
		benchRouter(b, url, nil, idem.External, func(msg *message.Message) error {
			return l.Book(msg.Context(), msg.UUID, msg.Payload, nil)
		})
	})
	b.Run("postgres+ledger", func(b *testing.B) {
		l := msgbench.NewLedgerDB(b)
		benchRouter(b, url, l.Engine, idem.Transactional, func(msg *message.Message) error {
			return l.Book(msg.Context(), msg.UUID, msg.Payload, func(tx pgx.Tx) error {
				return idemwatermill.CompleteTx[pgx.Tx](msg.Context(), l.Store, tx)
			})
		})
	})
}

// benchRouter queues b.N messages, then times a router with
// msgbench.Consumers() handlers running handle on them, behind the
// middleware when engine is not nil.
func benchRouter(b *testing.B, url string, engine *idem.Engine, kind idem.Kind, handle func(*message.Message) error) {
	b.ReportAllocs()
	topic := msgchaos.RandomName("bench_")
	b.Cleanup(func() { deleteQueues(b, url, topic) })
	logger := watermill.NopLogger{}
	cfg := amqp.NewDurableQueueConfig(url)
	pub, err := amqp.NewPublisher(cfg, logger)
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	sub, err := amqp.NewSubscriber(cfg, logger)
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	if err := sub.SubscribeInitialize(topic); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		if err := pub.Publish(topic, message.NewMessage(watermill.NewUUID(), msgbench.Payload(i))); err != nil {
			b.Fatal(err)
		}
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		b.Fatal(err)
	}
	if engine != nil {
		router.AddMiddleware(idemwatermill.Middleware(engine, idemwatermill.Config{Kind: kind,
			Scope: "bench", Operation: func(*message.Message) string { return "book" }}))
	}
	var handled atomic.Int64
	done := make(chan struct{})
	n := int64(b.N)
	for c := 0; c < msgbench.Consumers(); c++ {
		router.AddConsumerHandler("book-"+strconv.Itoa(c), topic, sub, func(msg *message.Message) error {
			if err := handle(msg); err != nil {
				return err
			}
			if handled.Add(1) == n {
				close(done)
			}
			return nil
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ResetTimer()
	meter := msgbench.Start()
	ran := make(chan error, 1)
	go func() { ran <- router.Run(ctx) }()
	select {
	case <-done:
	case err := <-ran:
		b.Fatalf("the router stopped: %v", err)
	}
	b.StopTimer()
	meter.Report(b, b.N)
	cancel()
	<-ran
}
