package idempg_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idempg"
)

// Example is a purchase handler whose order insert and stored answer commit
// together: the handler completes its lease with CompleteTx inside its own
// transaction, so a crash before COMMIT leaves neither the order nor the
// answer, and a retry may safely take the key over (Policy.Kind
// Transactional).
//
// It needs a PostgreSQL server (DATABASE_URL), so go test compiles it but
// does not run it (it has no Output comment); TestExample runs it against
// the test server. Its output looks like:
//
//	201  {"order":1}
//	201 true {"order":1}
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := idempg.Migrate(ctx, pool, idempg.Config{}); err != nil {
		log.Fatal(err)
	}
	store, err := idempg.New(pool, idempg.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}

	purchase := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := pool.Begin(ctx)
		if err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback(ctx) // no-op after Commit
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO orders (item) VALUES ($1) RETURNING id`, "book").Scan(&id); err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		body := fmt.Appendf(nil, `{"order":%d}`, id)
		answer := &idem.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
		// The answer is stored in the same transaction as the order. On
		// idemstore.ErrLeaseLost the key was taken over: roll back.
		if err := store.CompleteTx(ctx, tx, idem.LeaseFrom(ctx), answer); err != nil {
			http.Error(w, "conflict", http.StatusConflict)
			return
		}
		if err := tx.Commit(ctx); err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	})
	protect := idem.Middleware(engine, idem.Config{Scope: idem.GlobalScope, Policy: idem.Policy{Kind: idem.Transactional}})
	srv := httptest.NewServer(protect(purchase))
	defer srv.Close()

	key := "order-" + rand.Text() // one purchase, sent twice
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(b))
	}
}
