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

// testProxy is a proxy on a memory store in front of a counting upstream.
type testProxy struct {
	url   string
	runs  *atomic.Int32
	proxy *idemproxy.Proxy
	store *idemmem.Store
}

// newTestProxy starts an upstream running api, which counts its runs, and
// a proxy in front of it on a memory store.
func newTestProxy(t *testing.T, api http.HandlerFunc) *testProxy {
	t.Helper()
	tp := &testProxy{runs: new(atomic.Int32)}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tp.runs.Add(1)
		api(w, r)
	}))
	t.Cleanup(upstream.Close)
	tp.store = idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { tp.store.Close() })
	engine, err := idem.NewEngine(tp.store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	tp.proxy, err = idemproxy.New(engine, idemproxy.Config{Upstream: upstream.URL}, idemproxy.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(tp.proxy)
	t.Cleanup(front.Close)
	tp.url = front.URL
	return tp
}
