// Command orders is a Watermill consumer on RabbitMQ that books orders to
// a PostgreSQL ledger exactly once, though RabbitMQ delivers each order at
// least once: the ledger row and idem's record of the order (with the
// receipt the consumer publishes) commit in one transaction, so an order
// delivered again after its booking committed (the consumer died before
// its ack) writes nothing more and publishes the same receipt, with the
// same UUID, for downstream consumers to drop.
//
//	orders -database postgres://localhost/app -amqp amqp://guest:guest@localhost:5672/ -publish 3
//	orders -database postgres://localhost/app -amqp amqp://guest:guest@localhost:5672/
//
// -publish publishes that many orders first (each twice, as a producer
// retrying would). idem's tables and the ledger live in -schema. See
// consumer.go for the handler.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	database := flag.String("database", os.Getenv("DATABASE_URL"), "PostgreSQL URL (default $DATABASE_URL)")
	amqpURL := flag.String("amqp", os.Getenv("AMQP_URL"), "RabbitMQ URL (default $AMQP_URL)")
	schema := flag.String("schema", "orders_demo", "schema for idem's tables and the ledger")
	publish := flag.Int("publish", 0, "publish this many orders (each twice) before consuming")
	flag.Parse()
	if err := run(*database, *amqpURL, *schema, *publish); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func run(database, amqpURL, schema string, publish int) error {
	if database == "" || amqpURL == "" {
		return errors.New("set -database and -amqp (or DATABASE_URL and AMQP_URL)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, database)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := Migrate(ctx, pool, schema); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg := amqp.NewDurableQueueConfig(amqpURL)
	wlog := watermill.NewSlogLogger(logger)
	pub, err := amqp.NewPublisher(cfg, wlog)
	if err != nil {
		return err
	}
	defer pub.Close()
	sub, err := amqp.NewSubscriber(cfg, wlog)
	if err != nil {
		return err
	}
	defer sub.Close()
	router, c, err := NewRouter(pool, schema, sub, pub, Options{Logger: logger})
	if err != nil {
		return err
	}
	defer c.Store.Close()
	for i := 1; i <= publish; i++ {
		body, _ := json.Marshal(Order{Customer: fmt.Sprintf("customer-%d", i), Amount: int64(100 * i)})
		msg := message.NewMessage(watermill.NewUUID(), body)
		for range 2 { // a producer's retry: the same order, the same UUID
			if err := pub.Publish(Topics{}.withDefaults().Orders, msg.Copy()); err != nil {
				return err
			}
		}
	}
	return router.Run(ctx) // until a signal; running handlers finish first
}
