package idem_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemsqlite"
)

// openSQLite opens a store in a fresh temporary directory.
func openSQLite() (*sql.DB, *idemsqlite.Store, func()) {
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	db, err := idemsqlite.Open(filepath.Join(dir, "idem.db"), idemsqlite.OpenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	store, err := idemsqlite.New(db, idemsqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	return db, store, func() { db.Close(); os.RemoveAll(dir) }
}

// Begin and Complete protect any operation, such as a queue job: the first
// attempt runs it, every retry gets its answer back.
func ExampleEngine_Begin() {
	_, store, cleanup := openSQLite()
	defer cleanup()
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	fp, _ := idem.Fingerprint(idem.FingerprintInput{Method: "JOB", Operation: "send-invoice", Body: []byte(`{"invoice":"in_42"}`)}, idem.FingerprintOptions{})
	req := idem.Request{Key: idem.Key{Scope: "tenant-7", Operation: "send-invoice", Key: "in_42-attempt"}, Fingerprint: fp}

	for attempt := 1; attempt <= 2; attempt++ {
		res, err := engine.Begin(ctx, req)
		if err != nil {
			log.Fatal(err)
		}
		switch res.Outcome {
		case idem.Acquired:
			fmt.Println("attempt", attempt, "sends the invoice")
			if err := res.Lease.Complete(ctx, &idem.Response{Status: 200, Body: []byte("sent")}); err != nil {
				log.Fatal(err)
			}
		case idem.Replayed:
			fmt.Println("attempt", attempt, "replays:", string(res.Response.Body))
		default:
			fmt.Println("attempt", attempt, "got", res.Outcome)
		}
	}
	// Output:
	// attempt 1 sends the invoice
	// attempt 2 replays: sent
}

// Middleware makes a ServeMux's POST handlers safe to retry.
func ExampleMiddleware() {
	_, store, cleanup := openSQLite()
	defer cleanup()
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}
	protect := idem.Middleware(engine, idem.Config{
		// Keys are per user; here the user comes from a header an auth
		// layer would have checked.
		Scope: func(r *http.Request) (string, error) { return "user:" + r.Header.Get("X-User"), nil },
	})
	charges := 0
	mux := http.NewServeMux()
	mux.Handle("POST /payments", protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":"pay_%d"}`, charges)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	post := func(key, body string) {
		req, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User", "alice")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.Header.Get("Content-Type") == "application/problem+json" {
			var p idem.Problem
			json.Unmarshal(b, &p)
			b = []byte(p.Type[strings.IndexByte(p.Type, '#'):])
		}
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotency-Outcome"), string(b))
	}
	post("k-1", `{"amount":100}`)
	post("k-1", `{ "amount": 100 }`) // a retry: same meaning
	post("k-1", `{"amount":200}`)    // the key reused for another request
	post("", `{"amount":100}`)       // no key
	fmt.Println("charges:", charges)
	// Output:
	// 201 acquired {"payment":"pay_1"}
	// 201 replayed {"payment":"pay_1"}
	// 422 mismatch #key-reused
	// 400 missing_key #missing-key
	// charges: 1
}

// A handler whose data lives in the store's database completes its lease
// inside its own transaction: the order and the stored answer commit
// together, or neither does.
func ExampleLeaseFrom() {
	db, store, cleanup := openSQLite()
	defer cleanup()
	if _, err := db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}
	protect := idem.Middleware(engine, idem.Config{
		Scope:  idem.GlobalScope,
		Policy: idem.Policy{Kind: idem.Transactional},
	})
	purchase := protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback()
		res, err := tx.ExecContext(ctx, `INSERT INTO orders (item) VALUES ('book')`)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		id, _ := res.LastInsertId()
		answer := &idem.Response{Status: http.StatusCreated, Body: []byte(fmt.Sprintf(`{"order":%d}`, id))}
		if err := store.CompleteTx(ctx, tx, idem.LeaseFrom(ctx), answer); err != nil {
			http.Error(w, err.Error(), http.StatusConflict) // lease lost: roll back
			return
		}
		if err := tx.Commit(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(answer.Status)
		w.Write(answer.Body)
	}))

	for i := 0; i < 3; i++ {
		req := httptest.NewRequest("POST", "/purchase", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Idempotency-Key", "order-77")
		w := httptest.NewRecorder()
		purchase.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Idempotency-Outcome"), w.Body.String())
	}
	var orders int
	if err := db.QueryRow(`SELECT count(*) FROM orders`).Scan(&orders); err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders:", orders)
	// Output:
	// 201 acquired {"order":1}
	// 201 replayed {"order":1}
	// 201 replayed {"order":1}
	// orders: 1
}
