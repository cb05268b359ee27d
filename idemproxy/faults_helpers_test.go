package idemproxy_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// blippingStore fails Release and Escalate with ErrUnavailable while
// blipping is set; everything else works.
type blippingStore struct {
	idemstore.Store
	blipping atomic.Bool
}

var errBlip = fmt.Errorf("test blip: %w", idemstore.ErrUnavailable)

func (s *blippingStore) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	if s.blipping.Load() {
		return errBlip
	}
	return s.Store.Release(ctx, p)
}

func (s *blippingStore) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	if s.blipping.Load() {
		return errBlip
	}
	return s.Store.Escalate(ctx, p)
}

// rig is a proxy on a memory store whose clock the test moves, with
// metrics, called directly (no http.Server) unless a test puts one in front.
type rig struct {
	store   *blippingStore
	clock   *testenv.Clock // the memory store's, moved by hand
	engine  *idem.Engine
	proxy   *idemproxy.Proxy
	metrics *idemproxy.Metrics
}

// newRig returns a rig for cfg; opts.Transport may be set.
func newRig(t *testing.T, cfg idemproxy.Config, opts idemproxy.Options) *rig {
	t.Helper()
	r := &rig{clock: testenv.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)), metrics: idemproxy.NewMetrics()}
	mem := idemmem.MustNew(idemmem.Config{Now: r.clock.Now})
	t.Cleanup(func() { mem.Close() })
	r.store = &blippingStore{Store: mem}
	var err error
	r.engine, err = idem.NewEngine(r.store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler), SettleTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	opts.Logger, opts.Metrics = slog.New(slog.DiscardHandler), r.metrics
	if cfg.Anonymous == "" {
		cfg.Anonymous = idemproxy.AnonymousShared // the tests' clients send no credentials
	}
	r.proxy, err = idemproxy.New(r.engine, cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// outlastHeartbeat ends a synctest bubble that ran the rig: the engine's
// heartbeat loop stays for a moment after its last lease (so that requests
// in a row share one goroutine), and a bubble cannot end while it does.
// Only the bubble's fake clock moves; no real time passes.
func outlastHeartbeat() { time.Sleep(time.Second) }

// call sends a POST with key and body straight to the proxy's handler, and
// returns the recorded answer and the value the handler panicked with, if
// it did.
func (r *rig) call(t *testing.T, path, key string) (rec *httptest.ResponseRecorder, panicked any) {
	t.Helper()
	rec = httptest.NewRecorder()
	req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, path, strings.NewReader(`{"amount":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	defer func() { panicked = recover() }()
	r.proxy.ServeHTTP(rec, req)
	return rec, nil
}

// state returns the state of key's record on path, or "gone".
func (r *rig) state(t *testing.T, path, key string) idemstore.State {
	t.Helper()
	rec, err := getRecord(context.Background(), r.store, idemproxy.AnonymousScope, "POST "+path, key)
	if errors.Is(err, idemstore.ErrNotFound) {
		return "gone"
	}
	if err != nil {
		t.Fatal(err)
	}
	if rec.State == idemstore.StateCompleted && rec.Response != nil {
		return idemstore.State(fmt.Sprintf("%s %d", rec.State, rec.Response.Status))
	}
	return rec.State
}

// metric returns the outcome counter's line for outcome and settlement.
func (r *rig) metric(t *testing.T, outcome, settlement string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	r.metrics.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	// Any route's: the rigs' requests go to one route.
	prefix := fmt.Sprintf(`idem_proxy_requests_total{outcome=%q,route=`, outcome)
	suffix := fmt.Sprintf(`,settlement=%q} `, settlement)
	for _, l := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(l, prefix) && strings.Contains(l, suffix) {
			return l
		}
	}
	return ""
}

// wantAnswer checks a recorded answer's status, Idempotency-Outcome, and
// problem type fragment ("" for none).
func wantAnswer(t *testing.T, what string, rec *httptest.ResponseRecorder, status int, outcome, problem string) {
	t.Helper()
	if rec.Code != status || rec.Header().Get("Idempotency-Outcome") != outcome ||
		(problem != "" && !strings.Contains(rec.Body.String(), `"type":"`+idem.ProblemTypeBase+problem+`"`)) {
		t.Fatalf("%s: %d, Idempotency-Outcome %q, body %s; want %d %q %s", what, rec.Code, rec.Header().Get("Idempotency-Outcome"), rec.Body, status, outcome, problem)
	}
}

// counter counts the requests an upstream handler saw.
type counter struct{ n atomic.Int32 }

func (c *counter) wrap(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { c.n.Add(1); h(w, r) }
}

// resetConn drops the connection under w with a TCP reset.
func resetConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	conn.(*net.TCPConn).SetLinger(0)
	conn.Close()
}

// upstreamServer starts h as an upstream and returns its URL.
func upstreamServer(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// refusedURL is the URL of a port nothing listens on.
func refusedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	return "http://" + ln.Addr().String()
}
