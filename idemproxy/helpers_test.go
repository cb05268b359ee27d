package idemproxy_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
)

// frontOf starts an upstream running api, which counts its runs, and a
// proxy in front of it on a memory store. It returns the proxy's URL and
// the count.
func frontOf(t *testing.T, api http.HandlerFunc) (string, *atomic.Int32) {
	t.Helper()
	runs := new(atomic.Int32)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		api(w, r)
	}))
	t.Cleanup(upstream.Close)
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	engine, err := idem.NewEngine(store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := idemproxy.New(engine, idemproxy.Config{Upstream: upstream.URL}, idemproxy.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(proxy)
	t.Cleanup(front.Close)
	return front.URL, runs
}
