package idemproxy_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemproxy"
)

// TestProxyAnswerNeverStored: when the upstream fails and the store refuses
// to record the settlement (Release or Escalate fail for longer than the
// engine's SettleTimeout), the proxy's own problem document must not become
// the key's answer. The key stays pending; retries get 409 in_flight, never
// a replayed 502; once its lease expires, recovery sends it to review.
func TestProxyAnswerNeverStored(t *testing.T) {
	t.Parallel()
	noRelease := []idemproxy.Status{} // even a 503 would otherwise be stored
	for _, tc := range []struct {
		name         string
		upstream     func(*testing.T, *counter) string
		shutdown     bool
		status       int
		outcome      string
		wantSettled  string
		wantUpstream int32
	}{
		{"escalate fails after a reset", func(t *testing.T, c *counter) string {
			return upstreamServer(t, c.wrap(func(w http.ResponseWriter, r *http.Request) { resetConn(w) }))
		}, false, http.StatusBadGateway, "upstream_failed", "failed", 1},
		{"release fails when nothing was sent", func(t *testing.T, c *counter) string {
			return refusedURL(t)
		}, false, http.StatusBadGateway, "upstream_unreachable", "failed", 0},
		{"release fails during shutdown", func(t *testing.T, c *counter) string {
			return upstreamServer(t, c.wrap(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
		}, true, http.StatusServiceUnavailable, "shutting_down", "failed", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var runs counter
			cfg := idemproxy.Config{Upstream: tc.upstream(t, &runs)}
			cfg.ReleaseStatuses = noRelease
			r := newRig(t, cfg, idemproxy.Options{})
			if tc.shutdown {
				r.proxy.BeginShutdown()
			}
			r.store.blipping.Store(true)

			rec, _ := r.call(t, "/pay", "k")
			wantAnswer(t, "first call", rec, tc.status, tc.outcome, "")
			if got := r.state(t, "/pay", "k"); got != "pending" {
				t.Fatalf("record after a refused settlement: %s, want pending", got)
			}
			if r.metric(t, tc.outcome, tc.wantSettled) == "" {
				t.Errorf("metrics do not count outcome %s, settlement %s", tc.outcome, tc.wantSettled)
			}
			rec, _ = r.call(t, "/pay", "k")
			wantAnswer(t, "retry while the lease lives", rec, http.StatusConflict, "in_flight", "in-flight")

			// The blip ends; the lease expires; recovery escalates.
			r.store.blipping.Store(false)
			r.clock.Advance(time.Minute)
			rep, err := r.engine.Recover(t.Context(), idem.RecoverOptions{})
			if err != nil || rep.Escalated != 1 {
				t.Fatalf("Recover: %+v, %v; want one escalation", rep, err)
			}
			rec, _ = r.call(t, "/pay", "k")
			wantAnswer(t, "retry after recovery", rec, http.StatusConflict, "needs_review", "needs-review")
			if n := runs.n.Load(); n != tc.wantUpstream {
				t.Fatalf("upstream ran %d times, want %d", n, tc.wantUpstream)
			}
		})
	}
}

// TestProxySettlesUpstreamFailures: with a store that answers, an upstream
// failure settles the key at once, by whether the request was sent and by
// the route's ambiguous policy, and the proxy's answer names its situation.
func TestProxySettlesUpstreamFailures(t *testing.T) {
	t.Parallel()
	dialErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	for _, tc := range []struct {
		name      string
		refused   bool
		transport http.RoundTripper // one that reports nothing to httptrace
		ambiguous idemproxy.Ambiguous
		outcome   string
		settled   string
		state     string
		retry     int
	}{
		{"nothing sent", true, nil, "", "upstream_unreachable", "released", "gone", http.StatusBadGateway},
		{"reset after send", false, nil, "", "upstream_failed", "escalated", "needs_review", http.StatusConflict},
		{"reset after send, ambiguous release", false, nil, idemproxy.AmbiguousRelease, "upstream_failed", "released", "gone", http.StatusBadGateway},
		{"untraced transport, dial error", false, failingTransport{dialErr}, "", "upstream_unreachable", "released", "gone", http.StatusBadGateway},
		{"untraced transport, other error", false, failingTransport{errors.New("stream broken")}, "", "upstream_failed", "escalated", "needs_review", http.StatusConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var runs counter
			up := refusedURL(t)
			if !tc.refused {
				up = upstreamServer(t, runs.wrap(func(w http.ResponseWriter, r *http.Request) { resetConn(w) }))
			}
			cfg := idemproxy.Config{Upstream: up}
			cfg.Ambiguous = tc.ambiguous
			r := newRig(t, cfg, idemproxy.Options{Transport: tc.transport})
			rec, _ := r.call(t, "/pay", "k")
			wantAnswer(t, "first call", rec, http.StatusBadGateway, tc.outcome, tc.outcome[:8]+"-"+tc.outcome[9:])
			if got := r.state(t, "/pay", "k"); string(got) != tc.state {
				t.Fatalf("record: %s, want %s", got, tc.state)
			}
			if r.metric(t, tc.outcome, tc.settled) == "" {
				t.Errorf("metrics do not count outcome %s, settlement %s", tc.outcome, tc.settled)
			}
			if r.metric(t, "acquired", "handler") != "" {
				t.Error("the proxy's answer was also counted as acquired")
			}
			rec, _ = r.call(t, "/pay", "k")
			if rec.Code != tc.retry {
				t.Fatalf("retry: %d, want %d", rec.Code, tc.retry)
			}
		})
	}
}

// failingTransport fails every round trip with err, without a word to
// httptrace: the proxy can only go by the error.
type failingTransport struct{ err error }

func (f failingTransport) RoundTrip(*http.Request) (*http.Response, error) { return nil, f.err }
