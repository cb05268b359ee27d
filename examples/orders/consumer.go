package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemwatermill"
)

// Topics are the queues the consumer works with.
type Topics struct {
	// Orders is where orders arrive. Defaults to "orders".
	Orders string
	// Receipts is where receipts go. Defaults to Orders + ".receipts".
	Receipts string
	// Poison is where orders that no redelivery can help go. Defaults to
	// Orders + ".poison".
	Poison string
}

func (t Topics) withDefaults() Topics {
	if t.Orders == "" {
		t.Orders = "orders"
	}
	if t.Receipts == "" {
		t.Receipts = t.Orders + ".receipts"
	}
	if t.Poison == "" {
		t.Poison = t.Orders + ".poison"
	}
	return t
}

// Order is an order to book, as its producer publishes it. The message's
// UUID names the order's booking: the producer picks it once.
type Order struct {
	Customer string `json:"customer"`
	Amount   int64  `json:"amount"`
}

// ErrMalformed is a handler error for an order that cannot be booked as
// it is (no customer, no positive amount): it goes to the poison queue.
var ErrMalformed = errors.New("malformed order: a customer and a positive amount are required")

// Receipt is what the consumer publishes once an order is booked.
type Receipt struct {
	LedgerID int64 `json:"ledger_id"`
	Amount   int64 `json:"amount"`
}

// Migrate creates schema with idem's tables and the ledger. The ledger
// has no unique constraint on the order: exactly once is idem's doing.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	if err := idempg.Migrate(ctx, pool, idempg.Config{Schema: schema}); err != nil {
		return fmt.Errorf("idem migrations: %w", err)
	}
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+pgx.Identifier{schema, "ledger"}.Sanitize()+` (
		id bigserial PRIMARY KEY,
		order_uuid text NOT NULL,
		customer text NOT NULL,
		amount bigint NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`)
	return err
}

// Consumer books orders to the ledger, once per order however often the
// broker delivers it.
type Consumer struct {
	Pool   *pgxpool.Pool
	Store  *idempg.Store
	Schema string
	Logger *slog.Logger

	// committed, for the tests, runs after an order's transaction
	// committed and before the router acks it.
	committed func(msg *message.Message)
}

// Options tune the consumer.
type Options struct {
	// Lease is how long a consumer that died mid-order holds it. Defaults
	// to 30s.
	Lease time.Duration
	// Topics are the queues. Defaults to "orders" and its receipts and
	// poison queues.
	Topics Topics
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// NewRouter returns a Watermill router whose handler books the orders sub
// delivers and publishes receipts through pub. Orders that no redelivery
// can help (an order UUID reused for another order, one whose booking went
// to review, a malformed order) go to the poison queue.
func NewRouter(pool *pgxpool.Pool, schema string, sub message.Subscriber, pub message.Publisher, opts Options) (*message.Router, *Consumer, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	topics := opts.Topics.withDefaults()
	store, err := idempg.New(pool, idempg.Config{Schema: schema})
	if err != nil {
		return nil, nil, err
	}
	engine, err := idem.NewEngine(store, idem.EngineConfig{Lease: opts.Lease, Logger: opts.Logger,
		OnReview: func(_ context.Context, key idem.Key, reason string) {
			opts.Logger.Warn("order needs review", "order", key.Key, "reason", reason)
		}})
	if err != nil {
		store.Close()
		return nil, nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NewSlogLogger(opts.Logger))
	if err != nil {
		store.Close()
		return nil, nil, err
	}
	poison, err := middleware.PoisonQueueWithFilter(pub, topics.Poison, func(err error) bool {
		return idemwatermill.IsPoison(err) || errors.Is(err, ErrMalformed)
	})
	if err != nil {
		store.Close()
		return nil, nil, err
	}
	c := &Consumer{Pool: pool, Store: store, Schema: schema, Logger: opts.Logger}
	router.AddMiddleware(
		poison,
		idemwatermill.Middleware(engine, idemwatermill.Config{
			Scope: "orders-ledger",
			// The booking commits with the ledger row, so a failure that
			// rolled back may run again.
			Kind:      idem.Transactional,
			Retention: 7 * 24 * time.Hour,
		}),
	)
	router.AddHandler("book-order", topics.Orders, sub, topics.Receipts, pub, c.Book)
	return router, c, nil
}

// Book writes msg's order to the ledger and stores its receipt, in one
// transaction: a delivery after the commit (the consumer died before its
// ack) writes nothing more and emits the same receipt, with the same UUID.
func (c *Consumer) Book(msg *message.Message) ([]*message.Message, error) {
	var order Order
	if err := json.Unmarshal(msg.Payload, &order); err != nil || order.Customer == "" || order.Amount <= 0 {
		// Nothing was written: release the key (Retryable), and send the
		// order to the poison queue, since no redelivery can fix it.
		return nil, idem.Retryable(ErrMalformed)
	}
	ctx := msg.Context()
	var receipt *message.Message
	err := pgx.BeginFunc(ctx, c.Pool, func(tx pgx.Tx) error {
		var r Receipt
		err := tx.QueryRow(ctx, `INSERT INTO `+pgx.Identifier{c.Schema, "ledger"}.Sanitize()+` (order_uuid, customer, amount)
			VALUES ($1, $2, $3) RETURNING id, amount`, msg.UUID, order.Customer, order.Amount).Scan(&r.LedgerID, &r.Amount)
		if err != nil {
			return err
		}
		body, err := json.Marshal(r)
		if err != nil {
			return err
		}
		receipt = message.NewMessage(watermill.NewUUID(), body)
		receipt.Metadata.Set("order_uuid", msg.UUID)
		return idemwatermill.CompleteTx[pgx.Tx](ctx, c.Store, tx, receipt)
	})
	if err != nil {
		return nil, err
	}
	if c.committed != nil {
		c.committed(msg)
	}
	c.Logger.Info("order booked", "order", msg.UUID, "receipt", receipt.UUID)
	return []*message.Message{receipt}, nil
}
