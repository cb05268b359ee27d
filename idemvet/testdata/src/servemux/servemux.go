// Package servemux registers routes on net/http's ServeMux.
package servemux

import (
	"net/http"

	"github.com/idem-dev/idem"
)

func pay(w http.ResponseWriter, r *http.Request) {}

// createOrder checks its method itself.
func createOrder(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
}

// items answers GET and POST.
func items(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
	case "PATCH":
	}
}

func list(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		return
	}
}

type refunds struct{}

func (refunds) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == "POST" {
		return
	}
}

// Unwrapped: a mux whose routes nothing protects.
func Unwrapped(e *idem.Engine) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", pay)                                      // want `POST /payments: mutating route without idempotency protection`
	mux.Handle("PATCH /payments/{id}", http.HandlerFunc(pay))                  // want `PATCH /payments/\{id\}: mutating route without idempotency protection`
	mux.HandleFunc("/orders", createOrder)                                     // want `POST /orders: mutating route without idempotency protection`
	mux.HandleFunc("/items", items)                                            // want `PATCH /items: mutating route without idempotency protection`
	mux.Handle("/refunds", refunds{})                                          // want `POST /refunds: mutating route without idempotency protection`
	mux.HandleFunc("/checkout", func(w http.ResponseWriter, r *http.Request) { // want `POST /checkout: mutating route without idempotency protection`
		if r.Method == http.MethodPost {
			return
		}
	})

	// Not mutating, or not judged.
	mux.HandleFunc("GET /payments", pay)
	mux.HandleFunc("PUT /users/{id}/name", pay)
	mux.HandleFunc("DELETE /payments/{id}", pay)
	mux.HandleFunc("/list", list)
	mux.HandleFunc("/anything", pay)

	// Wrapped one by one.
	mw := idem.Middleware(e, idem.Config{Scope: idem.GlobalScope})
	mux.Handle("POST /wrapped", mw(http.HandlerFunc(pay)))
	mux.HandleFunc("POST /wrapped-method-value", mw(http.HandlerFunc(pay)).ServeHTTP)

	//idem:ignore the provider deduplicates webhooks by event ID
	mux.HandleFunc("POST /webhooks", pay)
	mux.HandleFunc("POST /webhooks/other", pay) //idem:ignore same as above

	// want +1 `//idem:ignore needs a reason`
	//idem:ignore
	mux.HandleFunc("POST /no-reason", pay) // want `POST /no-reason: mutating route without idempotency protection`
	return mux
}

// Wrapped: the whole mux is served through the middleware.
func Wrapped(e *idem.Engine) {
	mw, err := idem.NewMiddleware(e, idem.Config{Scope: idem.GlobalScope})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", pay)
	api := http.NewServeMux()
	api.HandleFunc("POST /v1/charges", pay)
	mux.Handle("/api/", http.StripPrefix("/api", api))
	_ = http.ListenAndServe("127.0.0.1:8080", mw(mux))
}

// Default: the package-level functions register on DefaultServeMux, which
// is not wrapped here.
func Default() {
	http.HandleFunc("POST /signup", pay)    // want `POST /signup: mutating route without idempotency protection`
	http.HandleFunc("/invite", createOrder) // want `POST /invite: mutating route without idempotency protection`
}

// Server keeps its middleware in a field.
type Server struct {
	protect func(http.Handler) http.Handler // want protect:"idem middleware"
	mux     *http.ServeMux
}

// NewServer sets the field.
func NewServer(e *idem.Engine) *Server {
	return &Server{protect: idem.Middleware(e, idem.Config{}), mux: http.NewServeMux()}
}

// Routes wraps each route with the field.
func (s *Server) Routes() {
	s.mux.Handle("POST /transfers", s.protect(http.HandlerFunc(pay)))
	s.mux.Handle("POST /points", wrap(s.protect, pay))
	s.mux.HandleFunc("POST /email", pay) // want `POST /email: mutating route without idempotency protection`
}

// wrap applies mw to h: its parameter carries the middleware.
func wrap(mw func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler { // want wrap:"idem middleware"
	return mw(h)
}

// Register is called by a main package that wraps the mux it is given.
//
//idem:ignore main serves this mux through idem.Middleware
func Register(mux *http.ServeMux) {
	mux.HandleFunc("POST /payments", pay)
	mux.HandleFunc("POST /orders", pay)
}

// RegisterNoReason gives no reason, so it suppresses nothing.
//
// want +2 `//idem:ignore needs a reason`
//
//idem:ignore
func RegisterNoReason(mux *http.ServeMux) {
	mux.HandleFunc("POST /payments", pay) // want `POST /payments: mutating route`
}

// Hostile: a pattern that would forge a line of output is quoted.
func Hostile(mux *http.ServeMux) {
	mux.HandleFunc("POST /a\n/b", pay) // want `POST "/a\\n/b": mutating route`
}

// generic passes its middleware through a type parameter's function.
func generic[T any](mw func(http.Handler) http.Handler, h http.HandlerFunc, _ T) http.Handler { // want generic:"idem middleware"
	return mw(h)
}

// Generic routes through an instantiated generic function.
func Generic(e *idem.Engine, mux *http.ServeMux) {
	mux.Handle("POST /generic", generic[int](idem.Middleware(e, idem.Config{}), pay, 0))
}
