package idemproxy

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-dev/idem/idemmem"
)

// TestProbes: /livez answers without asking the store, and /readyz says
// "draining" once the proxy drains, even while the store answers.
func TestProbes(t *testing.T) {
	t.Parallel()
	mem := idemmem.MustNew(idemmem.Config{})
	defer mem.Close()
	var draining atomic.Bool
	get := func(h http.Handler, path string) (int, string) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		return w.Code, w.Body.String()
	}
	down := withProbes(adminHandler(downStore{mem}, NewMetrics(), nil, slog.New(slog.DiscardHandler)), draining.Load)
	if code, body := get(down, "/livez"); code != 200 || body != "ok\n" {
		t.Errorf("/livez with the store down: %d %q", code, body)
	}
	if code, _ := get(down, "/readyz"); code != 503 {
		t.Errorf("/readyz with the store down: %d", code)
	}
	up := withProbes(adminHandler(mem, NewMetrics(), nil, slog.New(slog.DiscardHandler)), draining.Load)
	if code, _ := get(up, "/readyz"); code != 200 {
		t.Errorf("/readyz: %d", code)
	}
	draining.Store(true)
	if code, body := get(up, "/readyz"); code != 503 || !strings.Contains(body, "draining") {
		t.Errorf("/readyz while draining: %d %q", code, body)
	}
	if code, _ := get(up, "/livez"); code != 200 {
		t.Errorf("/livez while draining: %d", code)
	}
	if code, _ := get(up, "/healthz"); code != 200 {
		t.Errorf("/healthz: %d", code)
	}
	w := httptest.NewRecorder()
	up.ServeHTTP(w, httptest.NewRequest("POST", "/livez", nil))
	if w.Code == 200 {
		t.Errorf("POST /livez: %d", w.Code)
	}
}

// TestInFlightGauge: idem_proxy_requests_in_flight counts the requests
// being served, and falls back once they are done.
func TestInFlightGauge(t *testing.T) {
	t.Parallel()
	m := NewMetrics()
	inside, release := make(chan struct{}), make(chan struct{})
	h := m.inFlight(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		inside <- struct{}{}
		<-release
	}))
	done := make(chan struct{})
	for range 3 {
		go func() {
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
			done <- struct{}{}
		}()
	}
	for range 3 {
		<-inside
	}
	if n := gaugeValue(t, m, "idem_proxy_requests_in_flight"); n != 3 {
		t.Errorf("in flight %v; want 3", n)
	}
	close(release)
	for range 3 {
		<-done
	}
	if n := gaugeValue(t, m, "idem_proxy_requests_in_flight"); n != 0 {
		t.Errorf("in flight once done %v; want 0", n)
	}
}

// gaugeValue gathers m's registry and reads the gauge name.
func gaugeValue(t *testing.T, m *Metrics, name string) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s in the registry", name)
	return 0
}
