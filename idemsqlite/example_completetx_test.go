package idemsqlite_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemsqlite"
)

// ExampleStore_CompleteTx stores an operation's answer in the same
// transaction as its business change, so that both commit or neither does.
func ExampleStore_CompleteTx() {
	dir, err := os.MkdirTemp("", "idemsqlite-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := idemsqlite.Open(filepath.Join(dir, "shop.db"), idemsqlite.OpenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := idemsqlite.New(db, idemsqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE orders (id TEXT PRIMARY KEY, item TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	req := idem.Request{Key: idem.Key{Scope: "user-42", Operation: "POST /orders", Key: "order-attempt-1"}, Fingerprint: "fp-1"}
	for attempt := 1; attempt <= 2; attempt++ {
		res, err := engine.Begin(ctx, req)
		if err != nil {
			log.Fatal(err)
		}
		if res.Outcome == idem.Replayed {
			fmt.Println("attempt", attempt, "replays:", string(res.Response.Body))
			continue
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			log.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, item) VALUES ('o1', 'book')`); err != nil {
			log.Fatal(err)
		}
		resp := &idem.Response{Status: 201, Body: []byte(`{"order":"o1"}`)}
		if err := store.CompleteTx(ctx, tx, res.Lease, resp); err != nil {
			tx.Rollback() // the lease was lost: the order must not commit
			log.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			log.Fatal(err)
		}
		fmt.Println("attempt", attempt, "created the order")
	}
	var orders int
	if err := db.QueryRow(`SELECT count(*) FROM orders`).Scan(&orders); err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders:", orders)
	// Output:
	// attempt 1 created the order
	// attempt 2 replays: {"order":"o1"}
	// orders: 1
}
