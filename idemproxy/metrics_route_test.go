package idemproxy_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
)

// TestOutcomesByRoute: idem_proxy_requests_total counts each protected
// request under its route's label (its match pattern, or default), the
// proxy's own answers too, so that a dashboard can show outcomes by route.
func TestOutcomesByRoute(t *testing.T) {
	t.Parallel()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(upstream.Close)
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	engine, err := idem.NewEngine(store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := idemproxy.ParseConfig([]byte("upstream: " + upstream.URL + "\nanonymous: shared\nroutes:\n  - match: POST /pay\n"))
	if err != nil {
		t.Fatal(err)
	}
	metrics := idemproxy.NewMetrics()
	p, err := idemproxy.New(engine, cfg, idemproxy.Options{Logger: slog.New(slog.DiscardHandler), Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)
	send := func(path, key string) {
		req, _ := http.NewRequest(http.MethodPost, front.URL+path, strings.NewReader("{}"))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := front.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	send("/pay", "a")
	send("/pay", "a")
	send("/orders", "b")
	send("/orders", "") // the middleware's own answer: missing key
	rec := httptest.NewRecorder()
	metrics.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, series := range []string{
		`idem_proxy_requests_total{outcome="acquired",route="POST /pay",settlement="completed"} 1`,
		`idem_proxy_requests_total{outcome="replayed",route="POST /pay",settlement=""} 1`,
		`idem_proxy_requests_total{outcome="acquired",route="default",settlement="completed"} 1`,
		`idem_proxy_requests_total{outcome="missing_key",route="default",settlement=""} 1`,
	} {
		if !strings.Contains(rec.Body.String(), series+"\n") {
			t.Errorf("metrics lack %s:\n%s", series, rec.Body.String())
		}
	}
}
