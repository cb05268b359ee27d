package idemproxy_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/internal/testenv"
)

// newCapRig is a rig for cfg whose new-key caps run on the rig's clock, in
// front of an upstream that answers 201 and counts its runs.
func newCapRig(t *testing.T, cfg idemproxy.Config) (*rig, *counter) {
	t.Helper()
	var c counter
	cfg.Upstream = upstreamServer(t, c.wrap(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"path":%q}`, r.URL.Path)
	}))
	var clock *testenv.Clock
	r := newRig(t, cfg, idemproxy.Options{Now: func() time.Time { return clock.Now() }})
	clock = r.clock
	return r, &c
}

// as sends a POST to path with key, as the client whose credentials are
// scope.
func (r *rig) as(t *testing.T, scope, path, key string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, path, strings.NewReader(`{"amount":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Authorization", "Bearer "+scope)
	r.proxy.ServeHTTP(rec, req)
	return rec
}

// refusedMetric returns the value of idem_proxy_new_keys_refused_total for
// route, or "" when the series is not there.
func (r *rig) refusedMetric(t *testing.T, route string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	r.metrics.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	series := fmt.Sprintf(`idem_proxy_new_keys_refused_total{route=%q} `, route)
	for _, l := range strings.Split(rec.Body.String(), "\n") {
		if v, ok := strings.CutPrefix(l, series); ok {
			return v
		}
	}
	return ""
}

func capOf(limit int, interval time.Duration) *idemproxy.NewKeyLimit {
	return &idemproxy.NewKeyLimit{Limit: limit, Interval: idemproxy.Duration(interval)}
}

// TestNewKeysPerScope: a scope that reserved its new keys for the interval
// gets 429 too-many-new-keys with Retry-After for the next one, which is
// not forwarded and not kept; its existing keys still replay; another
// scope is not affected; when the interval ends, the refused key (retried
// as it is) goes through.
func TestNewKeysPerScope(t *testing.T) {
	t.Parallel()
	r, up := newCapRig(t, idemproxy.Config{Settings: idemproxy.Settings{NewKeysPerScope: capOf(2, time.Minute)}})
	wantAnswer(t, "alice's first key", r.as(t, "alice", "/pay", "k1"), 201, "acquired", "")
	r.clock.Advance(15 * time.Second)
	wantAnswer(t, "alice's second key", r.as(t, "alice", "/pay", "k2"), 201, "acquired", "")
	rec := r.as(t, "alice", "/pay", "k3")
	wantAnswer(t, "alice's third key", rec, 429, "too_many_new_keys", "too-many-new-keys")
	if got := rec.Header().Get("Retry-After"); got != "45" {
		t.Errorf("Retry-After %q, want 45 (the interval started 15s ago)", got)
	}
	if !strings.Contains(rec.Body.String(), `"idempotency_key":"k3"`) || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("the problem: %s %s", rec.Header().Get("Content-Type"), rec.Body)
	}
	if n := up.n.Load(); n != 2 {
		t.Fatalf("the upstream ran %d times, want 2: the refused key was forwarded", n)
	}
	// A replay of an existing key is never refused, however often.
	for range 3 {
		rec := r.as(t, "alice", "/pay", "k1")
		wantAnswer(t, "a replay of k1 at the cap", rec, 201, "replayed", "")
		if rec.Header().Get("Idempotent-Replayed") != "true" {
			t.Error("k1 was not replayed")
		}
	}
	// Nor a request that the key's record answers: a mismatch.
	rec = httptest.NewRecorder()
	req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/pay", strings.NewReader(`{"amount":2}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k2")
	req.Header.Set("Authorization", "Bearer alice")
	r.proxy.ServeHTTP(rec, req)
	wantAnswer(t, "k2 with another body at the cap", rec, 422, "mismatch", "key-reused")
	// Another scope has its own count.
	wantAnswer(t, "bob's first key", r.as(t, "bob", "/pay", "k3"), 201, "acquired", "")
	wantAnswer(t, "bob's second key", r.as(t, "bob", "/pay", "k4"), 201, "acquired", "")
	// The refused key was released, not left pending: its retry meets the
	// cap again, not 409 in_flight.
	wantAnswer(t, "alice's third key again", r.as(t, "alice", "/pay", "k3"), 429, "too_many_new_keys", "too-many-new-keys")
	if got := r.refusedMetric(t, "default"); got != "2" {
		t.Errorf("idem_proxy_new_keys_refused_total{route=default} %q, want 2", got)
	}
	if n := up.n.Load(); n != 4 {
		t.Fatalf("the upstream ran %d times, want 4", n)
	}
	// A second before the interval ends, still refused; at its end, the
	// refused key goes through, and starts alice's next interval.
	r.clock.Advance(44 * time.Second)
	rec = r.as(t, "alice", "/pay", "k3")
	wantAnswer(t, "a second before the interval ends", rec, 429, "too_many_new_keys", "too-many-new-keys")
	if got := rec.Header().Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After %q, want 1", got)
	}
	r.clock.Advance(time.Second)
	wantAnswer(t, "alice's third key in the next interval", r.as(t, "alice", "/pay", "k3"), 201, "acquired", "")
	wantAnswer(t, "alice's fourth key", r.as(t, "alice", "/pay", "k4"), 201, "acquired", "")
	wantAnswer(t, "alice's fifth key", r.as(t, "alice", "/pay", "k5"), 429, "too_many_new_keys", "too-many-new-keys")
	if n := up.n.Load(); n != 6 {
		t.Errorf("the upstream ran %d times, want 6", n)
	}
	if l := r.metric(t, "too_many_new_keys", "released"); !strings.HasSuffix(l, " 4") {
		t.Errorf("idem_proxy_requests_total for too_many_new_keys: %q, want 4 released", l)
	}
}

// TestNewKeysPerScopeRoutes: the global cap is one count per scope across
// the routes that inherit it; a route that sets its own counts apart, and
// limit 0 turns it off there; a route in observe mode never refuses.
func TestNewKeysPerScopeRoutes(t *testing.T) {
	t.Parallel()
	cfg, err := idemproxy.ParseConfig([]byte(`
new_keys_per_scope: {limit: 2, interval: 1h}
routes:
  - match: POST /orders
  - match: POST /refunds
    new_keys_per_scope: 1/10m
  - match: POST /events
    new_keys_per_scope: {limit: 0}
  - match: POST /trial
    mode: observe
`))
	if err != nil {
		t.Fatal(err)
	}
	r, up := newCapRig(t, cfg)
	wantAnswer(t, "a payment", r.as(t, "alice", "/pay", "p1"), 201, "acquired", "")
	wantAnswer(t, "an order", r.as(t, "alice", "/orders", "o1"), 201, "acquired", "")
	wantAnswer(t, "a second order, third key of the global cap", r.as(t, "alice", "/orders", "o2"), 429, "too_many_new_keys", "too-many-new-keys")
	wantAnswer(t, "a payment, third key of the global cap", r.as(t, "alice", "/pay", "p2"), 429, "too_many_new_keys", "too-many-new-keys")
	wantAnswer(t, "a refund, a cap of its own", r.as(t, "alice", "/refunds", "r1"), 201, "acquired", "")
	rec := r.as(t, "alice", "/refunds", "r2")
	wantAnswer(t, "a second refund", rec, 429, "too_many_new_keys", "too-many-new-keys")
	if got := rec.Header().Get("Retry-After"); got != "600" {
		t.Errorf("the refund's Retry-After %q, want 600", got)
	}
	for i := range 5 {
		wantAnswer(t, "an event, no cap", r.as(t, "alice", "/events", fmt.Sprint("e", i)), 201, "acquired", "")
	}
	for i := range 3 {
		rec := r.as(t, "alice", "/trial", fmt.Sprint("t", i))
		if rec.Code != 201 {
			t.Errorf("a request on the observed route: %d %s", rec.Code, rec.Body)
		}
	}
	if n := up.n.Load(); n != 2+1+5+3 {
		t.Errorf("the upstream ran %d times, want 11", n)
	}
	for route, want := range map[string]string{"default": "1", "POST /orders": "1", "POST /refunds": "1", "POST /events": "", "POST /trial": ""} {
		if got := r.refusedMetric(t, route); got != want {
			t.Errorf("idem_proxy_new_keys_refused_total{route=%q} %q, want %q", route, got, want)
		}
	}
}

// TestNewKeysPerScopeConcurrent: many new keys of one scope at once get
// exactly the cap's worth forwarded, and every other one 429, never run;
// their keys are free again (run with -race).
func TestNewKeysPerScopeConcurrent(t *testing.T) {
	t.Parallel()
	r, up := newCapRig(t, idemproxy.Config{Settings: idemproxy.Settings{NewKeysPerScope: capOf(5, time.Minute)}})
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
	)
	for i := range 40 {
		wg.Go(func() {
			rec := r.as(t, "alice", "/pay", fmt.Sprint("k", i))
			mu.Lock()
			statuses[rec.Code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if statuses[201] != 5 || statuses[429] != 35 || up.n.Load() != 5 {
		t.Fatalf("statuses %v, upstream runs %d; want 5 201s, 35 429s, 5 runs", statuses, up.n.Load())
	}
	// Each refused key, retried as it was after Retry-After, goes through;
	// the forwarded ones replay, never counted.
	replays := 0
	for i := range 40 {
		rec := r.as(t, "alice", "/pay", fmt.Sprint("k", i))
		if rec.Code == 429 {
			secs, _ := strconv.Atoi(rec.Header().Get("Retry-After"))
			r.clock.Advance(time.Duration(secs) * time.Second)
			rec = r.as(t, "alice", "/pay", fmt.Sprint("k", i))
		}
		if rec.Code != 201 {
			t.Fatalf("k%d after Retry-After: %d %s", i, rec.Code, rec.Body)
		}
		if rec.Header().Get("Idempotent-Replayed") == "true" {
			replays++
		}
	}
	if replays != 5 || up.n.Load() != 40 {
		t.Errorf("%d replays, %d upstream runs; want 5 and 40", replays, up.n.Load())
	}
}

// TestNewKeyLimitConfig: the cap is read from YAML (a mapping or
// "LIMIT/INTERVAL") and from --new-keys-per-scope's syntax, and a bad one
// stops the proxy at start.
func TestNewKeyLimitConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want string
	}{
		{"100/1m", "100/1m0s"}, {"5/1h", "5/1h0m0s"}, {"7", "7/1m0s"}, {"0", "off"}, {"off", "off"},
	} {
		l, err := idemproxy.ParseNewKeyLimit(tc.in)
		if err != nil || l.String() != tc.want {
			t.Errorf("ParseNewKeyLimit(%q) = %v, %v; want %s", tc.in, l, err, tc.want)
		}
	}
	for _, bad := range []string{"", "x", "-1/1m", "10/0.5s", "10/1", "10/-1m", "10/1m/2"} {
		if l, err := idemproxy.ParseNewKeyLimit(bad); err == nil {
			t.Errorf("ParseNewKeyLimit(%q) = %v, want an error", bad, l)
		}
	}
	c, err := idemproxy.ParseConfig([]byte("upstream: http://127.0.0.1:1\nnew_keys_per_scope: {limit: 100, interval: 1m}\n"))
	if err != nil || c.NewKeysPerScope == nil || c.NewKeysPerScope.String() != "100/1m0s" {
		t.Errorf("a mapping: %+v, %v", c.NewKeysPerScope, err)
	}
	c, err = idemproxy.ParseConfig([]byte("upstream: http://127.0.0.1:1\nnew_keys_per_scope: {limit: 3}\n"))
	if err != nil || c.NewKeysPerScope.String() != "3/1m0s" {
		t.Errorf("a mapping without interval: %+v, %v", c.NewKeysPerScope, err)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"new_keys_per_scope: {limit: -1}", "line 1: new_keys_per_scope: limit -1 is negative"},
		{"new_keys_per_scope: {limit: 1, interval: 10ms}", "at least a second"},
		{"new_keys_per_scope: {limit: 1, per: 1m}", `not "per"`},
		{"new_keys_per_scope: [1]", "{limit: N, interval: D}"},
		{"new_keys_per_scope: 1/soon", "not a duration"},
		{"routes:\n  - match: POST /a\n    new_keys_per_scope: {limit: 1, interval: 0.1s}", "line 3"},
	} {
		if _, err := idemproxy.ParseConfig([]byte(tc.yaml)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.yaml, err, tc.want)
		}
	}
	// Built in Go, it is checked at New.
	_, err = idemproxy.New(nil, idemproxy.Config{Upstream: "http://127.0.0.1:1", Settings: idemproxy.Settings{NewKeysPerScope: capOf(-5, time.Minute)}}, idemproxy.Options{})
	if err == nil || !strings.Contains(err.Error(), "new_keys_per_scope") {
		t.Errorf("a negative limit at New: %v", err)
	}
}

// TestNewKeysPerScopeReleaseFails: when the store cannot release a
// refused key, nothing is forwarded still, the answer says the key stays
// reserved, and it is counted as failed; once the store is back, the
// key answers 409 in flight (it waits for recovery, as any key whose
// settlement failed), and never runs.
func TestNewKeysPerScopeReleaseFails(t *testing.T) {
	t.Parallel()
	r, up := newCapRig(t, idemproxy.Config{Settings: idemproxy.Settings{NewKeysPerScope: capOf(1, time.Minute)}})
	wantAnswer(t, "the first key", r.as(t, "alice", "/pay", "k1"), 201, "acquired", "")
	r.store.blipping.Store(true)
	rec := r.as(t, "alice", "/pay", "k2")
	wantAnswer(t, "a key over the cap, the store failing", rec, 429, "too_many_new_keys", "too-many-new-keys")
	if !strings.Contains(rec.Body.String(), "could not be released") || rec.Header().Get("Retry-After") == "" {
		t.Errorf("the answer: Retry-After %q, %s", rec.Header().Get("Retry-After"), rec.Body)
	}
	r.store.blipping.Store(false)
	if l := r.metric(t, "too_many_new_keys", "failed"); !strings.HasSuffix(l, " 1") {
		t.Errorf("idem_proxy_requests_total: %q, want 1 failed", l)
	}
	wantAnswer(t, "the key left reserved", r.as(t, "alice", "/pay", "k2"), 409, "in_flight", "in-flight")
	if n := up.n.Load(); n != 1 {
		t.Errorf("the upstream ran %d times, want 1", n)
	}
}
