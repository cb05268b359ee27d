package idemwatermill_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemwatermill"
)

// A router whose handler writes an order to a ledger once, however often
// the pub/sub delivers it, and whose receipt carries the same UUID on
// every delivery. Poison (a UUID reused for another order, a key in
// review) goes to a poison queue.
func ExampleMiddleware() {
	store := idemmem.MustNew(idemmem.Config{})
	defer store.Close()
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}
	logger := watermill.NopLogger{}
	pubsub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	defer pubsub.Close()
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		log.Fatal(err)
	}
	poison, err := middleware.PoisonQueueWithFilter(pubsub, "orders.poison", idemwatermill.IsPoison)
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(poison, idemwatermill.Middleware(engine, idemwatermill.Config{Scope: "billing"}))

	ledger := 0
	router.AddHandler("ledger", "orders", pubsub, "receipts", pubsub, func(msg *message.Message) ([]*message.Message, error) {
		ledger++ // here: write the order to the ledger
		return []*message.Message{message.NewMessage("receipt-"+msg.UUID, []byte("paid"))}, nil
	})
	receipts, err := pubsub.Subscribe(context.Background(), "receipts")
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = router.Run(ctx)
	}()
	<-router.Running()

	// The broker delivers the order twice (a consumer died before its ack).
	for range 2 {
		if err := pubsub.Publish("orders", message.NewMessage("order-1", []byte(`{"amount":500}`))); err != nil {
			log.Fatal(err)
		}
		r := <-receipts
		r.Ack()
		fmt.Println("receipt", r.UUID)
	}
	cancel()
	<-done
	fmt.Println("ledger rows:", ledger)
	// Output:
	// receipt receipt-order-1
	// receipt receipt-order-1
	// ledger rows: 1
}

// A Transactional handler writes to its database and stores its answer in
// the same transaction (CompleteTx): both commit, or neither does, so a
// consumer that dies after the commit changes nothing more when the
// message comes again.
func ExampleCompleteTx() {
	dir, err := os.MkdirTemp("", "idemwatermill")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := idemsqlite.Open(filepath.Join(dir, "app.db"), idemsqlite.OpenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := idemsqlite.New(db, idemsqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE ledger (order_id TEXT NOT NULL, amount INTEGER NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}
	handler := idemwatermill.Middleware(engine, idemwatermill.Config{Scope: "billing", Kind: idem.Transactional})(
		func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return nil, err
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(ctx, `INSERT INTO ledger VALUES (?, 500)`, msg.UUID); err != nil {
				return nil, err
			}
			receipt := message.NewMessage("receipt-"+msg.UUID, []byte("paid"))
			if err := idemwatermill.CompleteTx[*sql.Tx](ctx, store, tx, receipt); err != nil {
				return nil, err
			}
			return []*message.Message{receipt}, tx.Commit()
		})

	for range 2 { // delivered twice
		out, err := handler(message.NewMessage("order-1", []byte(`{"amount":500}`)))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("emits", out[0].UUID)
	}
	var rows int
	if err := db.QueryRow(`SELECT count(*) FROM ledger`).Scan(&rows); err != nil {
		log.Fatal(err)
	}
	fmt.Println("ledger rows:", rows)
	// Output:
	// emits receipt-order-1
	// emits receipt-order-1
	// ledger rows: 1
}

// Config.ScopeFunc scopes each message by its tenant: two tenants' orders
// that carry the same business ID (order 42) are two keys, and each runs
// and emits its own receipt; each tenant's redelivery replays its own.
func ExampleConfig_scopeFunc() {
	store := idemmem.MustNew(idemmem.Config{})
	defer store.Close()
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}
	handler := idemwatermill.Middleware(engine, idemwatermill.Config{
		Scope:     "billing",
		Key:       idemwatermill.MetadataKey("order_id"),
		ScopeFunc: func(m *message.Message) (string, error) { return m.Metadata.Get("tenant_id"), nil },
	})(func(msg *message.Message) ([]*message.Message, error) {
		fmt.Println("booked order", msg.Metadata.Get("order_id"), "of tenant", msg.Metadata.Get("tenant_id"))
		return []*message.Message{message.NewMessage("receipt-"+msg.UUID, nil)}, nil
	})
	for _, d := range []struct{ uuid, tenant string }{{"m-1", "acme"}, {"m-2", "globex"}, {"m-2", "globex"}} {
		msg := message.NewMessage(d.uuid, []byte(`{"amount":500}`))
		msg.Metadata.Set("order_id", "42")
		msg.Metadata.Set("tenant_id", d.tenant)
		out, err := handler(msg)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("emits", out[0].UUID)
	}
	// Output:
	// booked order 42 of tenant acme
	// emits receipt-m-1
	// booked order 42 of tenant globex
	// emits receipt-m-2
	// emits receipt-m-2
}
