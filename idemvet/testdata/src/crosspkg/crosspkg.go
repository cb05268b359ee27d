// Package crosspkg uses middleware built in another package.
package crosspkg

import (
	"net/http"

	"github.com/go-chi/chi/v5"
	"protect"
)

func pay(w http.ResponseWriter, r *http.Request) {}

// Routes are protected by what package protect exports, or not.
func Routes() {
	r := chi.NewRouter()
	r.With(protect.Idem).Post("/payments", pay)
	r.With(protect.New(protect.Engine)).Post("/orders", pay)
	r.Handle("POST /refunds", protect.Handler(http.HandlerFunc(pay)))
	r.With(protect.Logger).Post("/charges", pay) // want `POST /charges: mutating route without idempotency protection`

	mux := http.NewServeMux()
	mux.HandleFunc("POST /transfers", pay)
	http.Handle("/", protect.Idem(mux))
}
