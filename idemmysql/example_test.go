package idemmysql_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	_ "github.com/go-sql-driver/mysql"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmysql"
)

// Example is a purchase handler on MySQL or MariaDB whose order insert and
// stored answer commit together: the handler completes its lease with
// CompleteTx inside its own transaction, so a crash before COMMIT leaves
// neither the order nor the answer, and a retry may safely take the key
// over (Policy.Kind Transactional).
//
// It needs a server (MYSQL_DSN, a go-sql-driver DSN such as
// root@tcp(127.0.0.1:3306)/shop), so go test compiles it without running
// it; TestExample runs it against the test server. Its output looks like:
//
//	201  {"order":1}
//	201 true {"order":1}
func Example() {
	ctx := context.Background()
	db, err := sql.Open("mysql", os.Getenv("MYSQL_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := idemmysql.New(db, idemmysql.Config{Migrate: true})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, item VARCHAR(100) NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}

	purchase := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback() // no-op after Commit
		res, err := tx.ExecContext(ctx, `INSERT INTO orders (item) VALUES (?)`, "book")
		if err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		id, _ := res.LastInsertId()
		body := fmt.Appendf(nil, `{"order":%d}`, id)
		answer := &idem.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
		// The answer is stored in the same transaction as the order. On
		// idemstore.ErrLeaseLost the key was taken over: roll back.
		if err := store.CompleteTx(ctx, tx, idem.LeaseFrom(ctx), answer); err != nil {
			http.Error(w, "conflict", http.StatusConflict)
			return
		}
		if err := tx.Commit(); err != nil {
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
