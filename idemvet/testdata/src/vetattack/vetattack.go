// Package vetattack registers routes in the shapes that are easy to get
// wrong: constant patterns and methods, helpers that apply idem's
// middleware, chi's With and Route, trailing //idem:ignore comments, and
// SQL in raw strings that span lines.
package vetattack

import (
	"context"
	"database/sql"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/idem-dev/idem"
)

var mw = idem.Middleware(&idem.Engine{}, idem.Config{Scope: idem.GlobalScope}) // want mw:"idem middleware"

func other(next http.Handler) http.Handler { return next }

func pay(w http.ResponseWriter, r *http.Request) {}

const (
	payPattern = "POST /payments"
	method     = http.MethodPost
	patchVerb  = "patch"
)

// protect applies idem's middleware.
func protect(h http.Handler) http.Handler { return mw(h) } // want protect:"idem middleware"

// handle registers a handler through idem's middleware.
func handle(mux *http.ServeMux, pattern string, h http.Handler) {
	mux.Handle(pattern, mw(h))
}

// Constants: a pattern or method named by a constant is judged like a
// literal.
func Constants() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(payPattern, pay)        // want `POST /payments: mutating route without idempotency protection`
	mux.HandleFunc(method+" /orders", pay) // want `POST /orders: mutating route without idempotency protection`
	mux.Handle(payPattern+"/x", protect(http.HandlerFunc(pay)))
	handle(mux, "POST /refunds", http.HandlerFunc(pay))

	r := chi.NewRouter()
	r.Method(method, "/charges", http.HandlerFunc(pay)) // want `POST /charges: mutating route without idempotency protection`
	r.MethodFunc(patchVerb, "/charges/{id}", pay)       // want `PATCH /charges/\{id\}: mutating route without idempotency protection`
	r.Method(method, "/charges/safe", protect(http.HandlerFunc(pay)))
	mux.Handle("/", r)

	// A pattern held in a variable is not judged (documented).
	p := "POST /transfers"
	mux.HandleFunc(p, pay)
	// Not mutating.
	mux.HandleFunc("GET /payments", pay)
	mux.HandleFunc("PUT /payments/{id}", pay)
	mux.HandleFunc("post /payments", pay) // ServeMux methods are case-sensitive: this is no POST
	r.Get("/charges", pay)
	r.Put("/charges/{id}", pay)
	r.Delete("/charges/{id}", pay)
	return mux
}

// Chi: With and Route that apply idem's middleware protect what they
// register; their siblings and parents stay unprotected.
func Chi() http.Handler {
	r := chi.NewRouter()
	r.With(mw).Post("/payments", pay)
	r.With(other).Post("/orders", pay) // want `POST /orders: mutating route without idempotency protection`
	r.With(other, mw).Patch("/orders/{id}", pay)
	r.Route("/refunds", func(r chi.Router) {
		r.Use(mw)
		r.Post("/", pay)
		r.Route("/{id}", func(r chi.Router) {
			r.Post("/retry", pay)
		})
	})
	r.Route("/invites", func(r chi.Router) {
		r.Use(other)
		r.Post("/", pay) // want `POST /invites/: mutating route without idempotency protection`
	})
	r.Group(func(g chi.Router) {
		g.Use(mw)
		g.Post("/checkout", pay)
	})
	r.Post("/signup", pay) // want `POST /signup: mutating route without idempotency protection`
	return r
}

// Ignores: an //idem:ignore at the end of a line covers that line only,
// not the next one.
func Ignores() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /webhooks/a", pay) //idem:ignore the provider deduplicates by event ID
	mux.HandleFunc("POST /webhooks/b", pay) // want `POST /webhooks/b: mutating route without idempotency protection`

	//idem:ignore	a tab before the reason
	mux.HandleFunc("POST /webhooks/c", pay)

	//idem:ignore-all this is not the directive
	mux.HandleFunc("POST /webhooks/d", pay) // want `POST /webhooks/d: mutating route without idempotency protection`

	// want +1 `//idem:ignore needs a reason` `POST /webhooks/e: mutating route without idempotency protection`
	mux.HandleFunc("POST /webhooks/e", pay) //idem:ignore
	mux.HandleFunc("POST /webhooks/f", pay) // want `POST /webhooks/f: mutating route without idempotency protection`
	return mux
}

const lockPayment = `
	SELECT id, status
	  FROM payments
	 WHERE idempotency_key = $1
	   FOR UPDATE`

// ReserveByLock locks a row that may not exist, in raw strings that span
// lines.
func ReserveByLock(ctx context.Context, tx *sql.Tx, key string) error {
	var id, status string
	err := tx.QueryRowContext(ctx, lockPayment, key).Scan(&id, &status) // want `SELECT … FOR UPDATE on payments before INSERT into it`
	if err == sql.ErrNoRows {
		_, err = tx.ExecContext(ctx, `
			INSERT INTO public.payments
			  (idempotency_key, status)
			VALUES ($1, 'pending')`, key)
	}
	return err
}

// ReserveFirst inserts first and reads on conflict: not reported.
func ReserveFirst(ctx context.Context, tx *sql.Tx, key string) error {
	_, err := tx.ExecContext(ctx, `
		INSERT INTO payments (idempotency_key, status)
		VALUES ($1, 'pending')
		ON CONFLICT (idempotency_key) DO NOTHING`, key)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `
		SELECT status FROM payments
		 WHERE idempotency_key = $1
		   FOR UPDATE`, key)
	return err
}

// LockOtherTable locks one table and inserts into another: not reported.
func LockOtherTable(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, `SELECT id FROM accounts
		WHERE id = $1 FOR UPDATE`, 1); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO ledger (account_id) VALUES ($1)`, 1)
	return err
}
