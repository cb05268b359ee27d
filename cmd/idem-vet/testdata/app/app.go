// Package app is a fixture for the idem-vet tests: real chi, real idem.
package app

import (
	"database/sql"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/idem-dev/idem"
)

func pay(w http.ResponseWriter, r *http.Request) {}

// Routes mixes protected and unprotected routes.
func Routes(e *idem.Engine) http.Handler {
	mw := idem.Middleware(e, idem.Config{Scope: idem.GlobalScope})
	r := chi.NewRouter()
	r.With(mw).Post("/payments", pay)
	r.Post("/orders", pay)
	r.Get("/orders", pay)
	r.Put("/users/{id}/name", pay)
	r.Post("/webhooks", pay) //idem:ignore deduplicated by the provider's event ID

	mux := http.NewServeMux()
	mux.HandleFunc("POST /refunds", pay)
	r.Mount("/legacy", mux)
	return r
}

// Reserve locks a key row that may not exist yet.
func Reserve(tx *sql.Tx, key string) error {
	if _, err := tx.Exec(`SELECT 1 FROM idempotency_keys WHERE key = $1 FOR UPDATE`, key); err != nil {
		return err
	}
	_, err := tx.Exec(`INSERT INTO idempotency_keys (key) VALUES ($1)`, key)
	return err
}
