package idemproxy_test

import (
	"io"
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
	url    string
	runs   *atomic.Int32
	proxy  *idemproxy.Proxy
	store  *idemmem.Store
	client *http.Client // to the proxy: its server's own (see newTestProxyConfig)
}

// newTestProxy starts an upstream running api, which counts its runs, and
// a proxy in front of it on a memory store. Requests without credentials
// share one scope.
func newTestProxy(t *testing.T, api http.HandlerFunc) *testProxy {
	t.Helper()
	return newTestProxyConfig(t, idemproxy.Config{Settings: idemproxy.Settings{Anonymous: idemproxy.AnonymousShared}}, api)
}

// newTestProxyConfig is newTestProxy with cfg (its upstream set here).
func newTestProxyConfig(t *testing.T, cfg idemproxy.Config, api http.HandlerFunc) *testProxy {
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
	cfg.Upstream = upstream.URL
	tp.proxy, err = idemproxy.New(engine, cfg, idemproxy.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(tp.proxy)
	t.Cleanup(front.Close)
	tp.url = front.URL
	// A client of the proxy's own: httptest.Server.Close closes
	// http.DefaultTransport's idle connections, which breaks a request
	// of a parallel test that is reusing one.
	tp.client = front.Client()
	return tp
}

// send sends method path to the proxy with Idempotency-Key key and body
// (nil: none), and returns the response and its body, read whole.
func (tp *testProxy) send(t *testing.T, method, path, key string, body io.Reader) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, tp.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := tp.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}
