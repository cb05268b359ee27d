package idem_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
)

// TestMiddlewareWithChi mounts the middleware on chi routers in the three
// ways chi takes middleware. chi fills in r.Pattern as it routes, so the
// default operation depends on where the middleware sits: on the root
// router nothing is routed yet and the operation is the method and path; in
// a subrouter's Use it is the mount ("POST /v1/*"); with With on a route it
// is the route's pattern. Every way runs the handler once per key.
func TestMiddlewareWithChi(t *testing.T) {
	t.Parallel()
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	e, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var (
		runs atomic.Int32
		mu   sync.Mutex
		ops  []string
	)
	mw := idem.Middleware(e, idem.Config{Scope: userScope, OnOutcome: func(ev idem.Event) {
		mu.Lock()
		ops = append(ops, ev.Operation)
		mu.Unlock()
	}})
	order := func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%q,"run":%d}`, chi.URLParam(r, "id"), n)
	}

	root := chi.NewRouter() // middleware on the root router
	root.Use(mw)
	root.Post("/v0/orders/{id}", order)
	sub := chi.NewRouter() // in a subrouter, and on one route
	sub.Route("/v1", func(r chi.Router) {
		r.Use(mw)
		r.Post("/orders/{id}", order)
	})
	sub.With(mw).Post("/v2/orders/{id}", order)
	rootSrv, subSrv := httptest.NewServer(root), httptest.NewServer(sub)
	defer rootSrv.Close()
	defer subSrv.Close()

	for _, tc := range []struct {
		path, key, outcome, operation string
		status                        int
	}{
		{"/v0/orders/1", "k0", "acquired", "POST /v0/orders/1", 201},
		{"/v0/orders/1", "k0", "replayed", "POST /v0/orders/1", 201},
		{"/v0/orders/2", "k0", "acquired", "POST /v0/orders/2", 201}, // another path, another operation
		{"/v1/orders/1", "k1", "acquired", "POST /v1/*", 201},
		{"/v1/orders/1", "k1", "replayed", "POST /v1/*", 201},
		{"/v1/orders/2", "k1", "mismatch", "POST /v1/*", 422}, // one operation for the mount
		{"/v2/orders/1", "k2", "acquired", "POST /v2/orders/{id}", 201},
		{"/v2/orders/1", "k2", "replayed", "POST /v2/orders/{id}", 201},
		{"/v2/orders/2", "k2", "mismatch", "POST /v2/orders/{id}", 422},
	} {
		url := subSrv.URL + tc.path
		if strings.HasPrefix(tc.path, "/v0/") {
			url = rootSrv.URL + tc.path
		}
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Idempotency-Key", tc.key)
		req.Header.Set("X-User", "alice")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		mu.Lock()
		op := ops[len(ops)-1]
		mu.Unlock()
		if resp.StatusCode != tc.status || resp.Header.Get("Idempotency-Outcome") != tc.outcome || op != tc.operation {
			t.Errorf("POST %s key %s: %d %s operation %q, want %d %s %q", tc.path, tc.key,
				resp.StatusCode, resp.Header.Get("Idempotency-Outcome"), op, tc.status, tc.outcome, tc.operation)
		}
	}
	if n := runs.Load(); n != 4 {
		t.Errorf("handler ran %d times, want 4", n)
	}
}
