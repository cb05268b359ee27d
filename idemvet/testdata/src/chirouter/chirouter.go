// Package chirouter registers routes on chi.
package chirouter

import (
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/idem-dev/idem"
)

func pay(w http.ResponseWriter, r *http.Request) {}

// Unwrapped: nothing protects these.
func Unwrapped() http.Handler {
	r := chi.NewRouter()
	r.Post("/payments", pay)                            // want `POST /payments: mutating route without idempotency protection`
	r.Patch("/payments/{id}", pay)                      // want `PATCH /payments/\{id\}: mutating route without idempotency protection`
	r.Method("POST", "/refunds", http.HandlerFunc(pay)) // want `POST /refunds: mutating route without idempotency protection`
	r.MethodFunc(http.MethodPatch, "/orders/{id}", pay) // want `PATCH /orders/\{id\}: mutating route without idempotency protection`
	r.HandleFunc("POST /charges", pay)                  // want `POST /charges: mutating route without idempotency protection`
	r.Route("/v1", func(r chi.Router) {
		r.Post("/transfers", pay) // want `POST /v1/transfers: mutating route without idempotency protection`
	})

	// Not mutating, or ignored.
	r.Get("/payments", pay)
	r.Put("/users/{id}/name", pay)
	r.Delete("/payments/{id}", pay)
	r.Method("GET", "/x", http.HandlerFunc(pay))
	r.Post("/webhooks", pay) //idem:ignore the provider deduplicates by event ID
	return r
}

// UseOnRouter: Use on the router protects every route on it and below.
func UseOnRouter(e *idem.Engine) http.Handler {
	r := chi.NewRouter()
	r.Use(idem.Middleware(e, idem.Config{Scope: idem.GlobalScope}))
	r.Post("/payments", pay)
	r.Route("/v1", func(r chi.Router) {
		r.Post("/transfers", pay)
	})
	r.Group(func(g chi.Router) {
		g.Patch("/orders/{id}", pay)
	})
	return r
}

// OnAGroup: the middleware on one group protects that group only.
func OnAGroup(e *idem.Engine) http.Handler {
	mw, _ := idem.NewMiddleware(e, idem.Config{Scope: idem.GlobalScope})
	r := chi.NewRouter()
	r.Group(func(r chi.Router) {
		r.Use(mw)
		r.Post("/payments", pay)
	})
	r.Group(func(r chi.Router) {
		r.Post("/invites", pay) // want `POST /invites: mutating route without idempotency protection`
	})
	r.With(mw).Post("/orders", pay)
	r.With(logger).Post("/signup", pay) // want `POST /signup: mutating route without idempotency protection`
	protected := r.With(mw)
	protected.Post("/refunds", pay)
	r.Post("/checkout", mw(http.HandlerFunc(pay)).ServeHTTP)
	r.Post("/points", chi.Chain(logger, mw).Handler(http.HandlerFunc(pay)).ServeHTTP)
	return r
}

// Mounted: a subrouter mounted under a protected router is protected;
// one whose middleware is only on a sibling is not.
func Mounted(e *idem.Engine) http.Handler {
	mw := idem.Middleware(e, idem.Config{})
	root := chi.NewRouter()
	api := chi.NewRouter()
	api.Post("/accounts", pay)
	root.With(mw).Mount("/api", api)

	other := chi.NewRouter()
	other.Post("/emails", pay) // want `POST /admin/emails: mutating route without idempotency protection`
	root.Mount("/admin", other)

	wrapped := chi.NewRouter()
	wrapped.Post("/sends", pay)
	root.Mount("/w", mw(wrapped))
	return root
}

// routes gets its router from a caller that protects it.
func routes(r chi.Router) {
	r.Post("/orders", pay)
}

// Server calls routes with a protected router.
func Server(e *idem.Engine) http.Handler {
	r := chi.NewRouter()
	r.Use(idem.Middleware(e, idem.Config{}))
	routes(r)
	return r
}

func logger(next http.Handler) http.Handler { return next }
