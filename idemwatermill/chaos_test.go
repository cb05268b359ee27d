package idemwatermill_test

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

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemwatermill"
	"github.com/idem-dev/idem/internal/msgchaos"
	"github.com/idem-dev/idem/internal/testenv"
)

const childEnv = msgchaos.ChildEnv

// The chaos runs' consumers: one handler per process, under one scope and
// operation, so that the processes share their keys.
const (
	chaosHandler = "ledger"
	chaosLease   = 2 * time.Second
)

func chaosTopics(name string) (in, out string) { return name + "_in", name + "_out" }

// TestChaosRabbitMQ: two consumer processes on one durable RabbitMQ queue,
// through watermill-amqp, killed with SIGKILL mid-handler and between
// completion and ack (by the test and by themselves), nacking completed
// messages so that RabbitMQ delivers them again, and failing messages with
// Retryable. Every message's ledger row must be written exactly once, none
// lost, and every produced message must carry the UUID its ledger row
// recorded, however often it was emitted.
func TestChaosRabbitMQ(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos runs only without -short")
	}
	url := testenv.Getenv(t, "IDEM_TEST_AMQP_URL")
	db := msgchaos.NewDB(t)
	faults, messages := msgchaos.Settings()
	name := msgchaos.RandomName("chaos_")
	in, out := chaosTopics(name)
	t.Cleanup(func() { deleteQueues(t, url, in, out) })

	logger := watermill.NopLogger{}
	cfg := amqp.NewDurableQueueConfig(url)
	pub, err := amqp.NewPublisher(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sub, err := amqp.NewSubscriber(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	seen := msgchaos.NewSeen()
	// Declare both queues before the consumers start, and collect.
	for _, topic := range []string{in, out} {
		if err := sub.SubscribeInitialize(topic); err != nil {
			t.Fatal(err)
		}
	}
	receipts, err := sub.Subscribe(context.Background(), out)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range receipts {
			seen.Add(m.Metadata.Get("in_id"), m.UUID)
			m.Ack()
		}
	}()

	env := []string{msgchaos.SchemaEnv + "=" + db.Schema, msgchaos.NameEnv + "=" + name}
	fleet := msgchaos.NewFleet(t, "amqp", 2, append(env, msgchaos.FaultsEnv+"=1"))
	run := &msgchaos.Run{DB: db, Fleet: fleet, Faults: faults, Messages: messages, Calm: env,
		Publish: func(_ context.Context, id string) error {
			return pub.Publish(in, message.NewMessage(id, []byte(`{"order":"`+id+`"}`)))
		}}
	ids := run.Go(t)
	seen.Wait(len(ids))
	fleet.Stop(10 * time.Second)
	msgchaos.Verify(t, db, fleet, ids, seen, faults)
}

// TestChaosPostgreSQL: the same on PostgreSQL through watermill-sql, with
// the outbox: each handler writes its ledger row, publishes its produced
// message to the outbox table and completes its idem lease in one
// transaction. Two consumer processes share one consumer group.
func TestChaosPostgreSQL(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos runs only without -short")
	}
	db := msgchaos.NewDB(t)
	faults, messages := msgchaos.Settings()
	name := msgchaos.RandomName("chaos_")
	in, out := chaosTopics(name)
	pool := searchPathPool(t, db.URL, db.Schema)
	pub, err := wsql.NewPublisher(wsql.BeginnerFromPgx(pool), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, AutoInitializeSchema: true}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	// Create both topics' tables before the consumers start.
	sub, err := newSQLSubscriber(pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{in, out} {
		if err := sub.SubscribeInitialize(topic); err != nil {
			t.Fatal(err)
		}
	}
	sub.Close()

	env := []string{msgchaos.SchemaEnv + "=" + db.Schema, msgchaos.NameEnv + "=" + name}
	fleet := msgchaos.NewFleet(t, "sql", 2, append(env, msgchaos.FaultsEnv+"=1"))
	run := &msgchaos.Run{DB: db, Fleet: fleet, Faults: faults, Messages: messages, Calm: env,
		Publish: func(_ context.Context, id string) error {
			return pub.Publish(in, message.NewMessage(id, []byte(`{"order":"`+id+`"}`)))
		}}
	ids := run.Go(t)
	fleet.Stop(10 * time.Second)
	// The outbox: every produced message, as it committed.
	seen := msgchaos.NewSeen()
	rows, err := pool.Query(context.Background(), `SELECT uuid, metadata->>'in_id' FROM `+pgx.Identifier{"watermill_" + out}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var uuid, inID string
		if err := rows.Scan(&uuid, &inID); err != nil {
			t.Fatal(err)
		}
		seen.Add(inID, uuid)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	msgchaos.Verify(t, db, fleet, ids, seen, faults)
	for id, uuids := range seen.All() {
		if len(uuids) != 1 {
			t.Errorf("message %s: %d produced messages in the outbox", id, len(uuids))
		}
	}
}

// searchPathPool is a pool whose connections find watermill-sql's tables
// in schema.
func searchPathPool(t testing.TB, url, schema string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func newSQLSubscriber(pool *pgxpool.Pool) (*wsql.Subscriber, error) {
	ack := 10 * time.Second
	return wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
		ConsumerGroup:    "billing",
		SchemaAdapter:    wsql.DefaultPostgreSQLSchema{},
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
		PollInterval:     50 * time.Millisecond,
		ResendInterval:   100 * time.Millisecond,
		AckDeadline:      &ack,
	}, watermill.NopLogger{})
}

func deleteQueues(t testing.TB, url string, queues ...string) {
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Logf("deleting queues: %v", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	for _, q := range queues {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
}

// chaosChild is a consumer process of the chaos tests.
func chaosChild(role string) int {
	if err := runChaosChild(role); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

func runChaosChild(role string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	schema, name := os.Getenv(msgchaos.SchemaEnv), os.Getenv(msgchaos.NameEnv)
	faulty := msgchaos.Faulty()
	in, out := chaosTopics(name)
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	wlogger := watermill.NewSlogLogger(logger)

	cfg, err := pgxpool.ParseConfig(os.Getenv("IDEM_TEST_POSTGRES_URL"))
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
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
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, wlogger)
	if err != nil {
		return err
	}
	router.AddMiddleware(
		faultsAfterCompletion(faulty),
		idemwatermill.Middleware(engine, idemwatermill.Config{Kind: idem.Transactional, Scope: "billing", NackDelay: 300 * time.Millisecond, Logger: logger}),
	)
	switch role {
	case "amqp":
		acfg := amqp.NewDurableQueueConfig(os.Getenv("IDEM_TEST_AMQP_URL"))
		sub, err := amqp.NewSubscriber(acfg, wlogger)
		if err != nil {
			return err
		}
		pub, err := amqp.NewPublisher(acfg, wlogger)
		if err != nil {
			return err
		}
		router.AddHandler(chaosHandler, in, sub, out, pub, func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context()
			if faulty && msgchaos.Chance(0.03) {
				return nil, idem.Retryable(errors.New("forced failure: nothing written"))
			}
			receipt := message.NewMessage(watermill.NewUUID(), []byte("receipt for "+msg.UUID))
			receipt.Metadata.Set("in_id", msg.UUID)
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if err := msgchaos.InsertLedger(ctx, tx, schema, msg.UUID, receipt.UUID); err != nil {
					return err
				}
				if faulty && msgchaos.Chance(0.01) {
					msgchaos.Crash() // mid-handler: the row is not committed
				}
				return idemwatermill.CompleteTx[pgx.Tx](ctx, store, tx, receipt)
			})
			if err != nil {
				return nil, err
			}
			return []*message.Message{receipt}, nil
		})
	case "sql":
		sub, err := newSQLSubscriber(pool)
		if err != nil {
			return err
		}
		router.AddConsumerHandler(chaosHandler, in, sub, func(msg *message.Message) error {
			ctx := msg.Context()
			if faulty && msgchaos.Chance(0.03) {
				return idem.Retryable(errors.New("forced failure: nothing written"))
			}
			// watermill-sql's default schema keeps payloads as JSON.
			receipt := message.NewMessage(watermill.NewUUID(), []byte(`{"receipt":"`+msg.UUID+`"}`))
			receipt.Metadata.Set("in_id", msg.UUID)
			// The outbox: the ledger row, the produced message and idem's
			// record commit in one transaction.
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if err := msgchaos.InsertLedger(ctx, tx, schema, msg.UUID, receipt.UUID); err != nil {
					return err
				}
				outbox, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, wlogger)
				if err != nil {
					return err
				}
				if err := outbox.Publish(out, receipt); err != nil {
					return err
				}
				if faulty && msgchaos.Chance(0.01) {
					msgchaos.Crash() // mid-handler: nothing is committed
				}
				return idemwatermill.CompleteTx[pgx.Tx](ctx, store, tx)
			})
		})
	default:
		return fmt.Errorf("unknown role %q", role)
	}
	if err := router.Run(ctx); err != nil {
		return err
	}
	return nil
}

// faultsAfterCompletion, outside idem's middleware, acts once a message was
// handled and its answer stored: now and then it dies before the ack
// (SIGKILL), or fails the delivery so that the broker delivers it again.
func faultsAfterCompletion(faulty bool) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil || !faulty {
				return out, err
			}
			switch {
			case msgchaos.Chance(0.01):
				msgchaos.Crash()
			case msgchaos.Chance(0.03):
				return nil, errors.New("forced redelivery after completion")
			}
			return out, nil
		}
	}
}
