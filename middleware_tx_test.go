package idem_test

import (
	"database/sql"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemsqlite"
)

// txFixture is a transactional handler on SQLite: it inserts an order and
// completes its lease inside the same transaction, then commits or rolls
// back as told by the request's X-Then header.
type txFixture struct {
	db    *sql.DB
	h     http.Handler
	runs  atomic.Int32
	logs  *syncBuffer
	store *idemsqlite.Store
}

func newTxFixture(t *testing.T) *txFixture {
	t.Helper()
	db, store, cleanup := openSQLite()
	t.Cleanup(cleanup)
	if _, err := db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	f := &txFixture{db: db, store: store, logs: &syncBuffer{}}
	e, err := idem.NewEngine(store, idem.EngineConfig{Logger: slog.New(slog.NewTextHandler(f.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	mw := idem.Middleware(e, idem.Config{Scope: idem.GlobalScope, Policy: idem.Policy{Kind: idem.Transactional}})
	f.h = mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.runs.Add(1)
		ctx := r.Context()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			panic(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (item) VALUES ('book')`); err != nil {
			panic(err)
		}
		stored := &idem.Response{Status: 201, Body: []byte(`{"order":"stored"}`)}
		if err := store.CompleteTx(ctx, tx, idem.LeaseFrom(ctx), stored); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		switch r.Header.Get("X-Then") { // not part of the fingerprint
		case "panic": // before the commit: the deferred rollback runs as the panic unwinds
			panic("boom before commit")
		case "commit-panic":
			if err := tx.Commit(); err != nil {
				panic(err)
			}
			panic("boom after commit")
		case "rollback":
			w.WriteHeader(201) // claims success, but nothing commits
			return
		case "lie":
			if err := tx.Commit(); err != nil {
				panic(err)
			}
			w.WriteHeader(200)
			io.WriteString(w, "something else")
			return
		}
		if err := tx.Commit(); err != nil {
			panic(err)
		}
		w.WriteHeader(stored.Status)
		w.Write(stored.Body)
	}))
	return f
}

func (f *txFixture) post(key, then string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"item":"book"}`))
	r.Header.Set("X-Then", then)
	r.Header.Set(idem.HeaderName, key)
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

func (f *txFixture) orders(t *testing.T) int {
	t.Helper()
	var n int
	if err := f.db.QueryRow(`SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestMiddlewareCompleteTxCommits(t *testing.T) {
	t.Parallel()
	f := newTxFixture(t)
	first := f.post("k", "commit")
	again := f.post("k", "commit")
	if first.Code != 201 || again.Code != 201 || again.Body.String() != `{"order":"stored"}` || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %d %q, again %d %q", first.Code, first.Body, again.Code, again.Body)
	}
	if f.runs.Load() != 1 || f.orders(t) != 1 {
		t.Fatalf("runs %d, orders %d", f.runs.Load(), f.orders(t))
	}
	if strings.Contains(f.logs.String(), "level=ERROR") {
		t.Fatalf("unexpected error logs: %s", f.logs)
	}
}

func TestMiddlewareCompleteTxRolledBack(t *testing.T) {
	t.Parallel()
	f := newTxFixture(t)
	f.post("k", "rollback")
	if f.orders(t) != 0 {
		t.Fatal("a rolled-back order persisted")
	}
	// Nothing committed, so the key was released and a retry runs again.
	if w := f.post("k", "commit"); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry: %d %v", w.Code, w.Header())
	}
	if f.runs.Load() != 2 || f.orders(t) != 1 {
		t.Fatalf("runs %d, orders %d", f.runs.Load(), f.orders(t))
	}
	if !strings.Contains(f.logs.String(), "transaction did not commit") {
		t.Fatalf("the success answer without a commit was not logged: %s", f.logs)
	}
}

func TestMiddlewareCompleteTxDifferentAnswerIsLogged(t *testing.T) {
	t.Parallel()
	f := newTxFixture(t)
	if w := f.post("k", "lie"); w.Code != 200 {
		t.Fatalf("first %d", w.Code)
	}
	// Retries get what committed, and the difference was reported.
	if w := f.post("k", "lie"); w.Code != 201 || w.Body.String() != `{"order":"stored"}` {
		t.Fatalf("replay %d %q", w.Code, w.Body)
	}
	if !strings.Contains(f.logs.String(), "answered differently from what it stored") {
		t.Fatalf("no log of the difference: %s", f.logs)
	}
	if f.runs.Load() != 1 {
		t.Fatalf("runs %d", f.runs.Load())
	}
}

// A panic settles by what the transaction did, read back from the store:
// rolled back (provably nothing committed) releases the key, committed
// keeps the stored answer.
func TestMiddlewareCompleteTxPanic(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		then       string
		wantOrders int
		wantRuns   int32
	}{
		{"panic", 1, 2},        // released: the retry runs and commits
		{"commit-panic", 1, 1}, // completed in the transaction: the retry replays
	} {
		t.Run(tc.then, func(t *testing.T) {
			t.Parallel()
			f := newTxFixture(t)
			func() {
				defer func() {
					if v := recover(); v == nil {
						t.Fatal("the handler's panic was swallowed")
					}
				}()
				f.post("k", tc.then)
			}()
			w := f.post("k", "commit")
			if w.Code != 201 || w.Body.String() != `{"order":"stored"}` {
				t.Fatalf("retry: %d %q", w.Code, w.Body)
			}
			if f.runs.Load() != tc.wantRuns || f.orders(t) != tc.wantOrders {
				t.Fatalf("runs %d, orders %d; want %d, %d", f.runs.Load(), f.orders(t), tc.wantRuns, tc.wantOrders)
			}
		})
	}
}
