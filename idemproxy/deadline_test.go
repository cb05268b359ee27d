package idemproxy_test

import (
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/idem-dev/idem/idemproxy"
)

// TestUpstreamDeadline: an upstream that stalls (before its headers, after
// them, or in the middle of its body) is cut off at the route's
// upstream_deadline, instead of holding the key's lease alive forever
// through the heartbeat. The client gets 504 when nothing of the body had
// come (an aborted response otherwise), and the key goes to review.
func TestUpstreamDeadline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		before  func(http.ResponseWriter) // what the upstream sends before it stalls
		aborted bool
	}{
		{"stalls before its headers", func(http.ResponseWriter) {}, false},
		{"stalls after its headers", func(w http.ResponseWriter) {
			w.Header().Set("X-Upstream", "yes")
			w.WriteHeader(http.StatusCreated)
			http.NewResponseController(w).Flush()
		}, false},
		{"stalls in its body", func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "first chunk")
			http.NewResponseController(w).Flush()
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var runs counter
			stalled := make(chan struct{})
			up := upstreamServer(t, runs.wrap(func(w http.ResponseWriter, r *http.Request) {
				tc.before(w)
				select { // until the proxy gives up, or the test ends
				case <-r.Context().Done():
				case <-stalled:
				}
			}))
			t.Cleanup(func() { close(stalled) }) // before the upstream closes
			// The default route keeps the 5m default; the slow one has a
			// short deadline of its own.
			cfg, err := idemproxy.ParseConfig(fmt.Appendf(nil, `
upstream: %s
routes:
  - match: POST /slow
    upstream_deadline: 50ms
`, up))
			if err != nil {
				t.Fatal(err)
			}
			r := newRig(t, cfg, idemproxy.Options{})
			rec, panicked := r.call(t, "/slow", "k")
			switch {
			case tc.aborted:
				if panicked != http.ErrAbortHandler {
					t.Fatalf("the handler answered %d %q (panic %v); want it to abort", rec.Code, rec.Body, panicked)
				}
			case panicked != nil:
				t.Fatalf("the handler panicked: %v", panicked)
			default:
				wantAnswer(t, "past the deadline", rec, http.StatusGatewayTimeout, "upstream_timeout", "upstream-timeout")
				if rec.Header().Get("X-Upstream") != "" {
					t.Fatalf("the 504 carries the upstream's headers: %v", rec.Header())
				}
			}
			if got := r.state(t, "/slow", "k"); got != "needs_review" {
				t.Fatalf("record: %s, want needs_review", got)
			}
			if r.metric(t, "upstream_timeout", "escalated") == "" {
				t.Error("metrics do not count an upstream_timeout answer")
			}
			rec, _ = r.call(t, "/slow", "k")
			wantAnswer(t, "retry", rec, http.StatusConflict, "needs_review", "needs-review")
			if runs.n.Load() != 1 {
				t.Fatalf("upstream ran %d times, want 1", runs.n.Load())
			}
		})
	}
}

func TestParseUpstreamSettings(t *testing.T) {
	t.Parallel()
	c, err := idemproxy.ParseConfig([]byte(`
upstream: http://127.0.0.1:3000
upstream_deadline: 2m
upstream_idle_timeout: 20s
routes:
  - match: POST /exports
    upstream_deadline: 30m
`))
	if err != nil {
		t.Fatal(err)
	}
	if c = c.WithDefaults(); c.Validate() != nil || c.UpstreamIdleTimeout.String() != "20s" || c.UpstreamDeadline.String() != "2m0s" ||
		c.Routes[0].UpstreamDeadline.String() != "30m0s" {
		t.Fatalf("parsed %+v", c)
	}
	if d := (idemproxy.Config{}).WithDefaults().UpstreamIdleTimeout; d != idemproxy.Duration(idemproxy.DefaultUpstreamIdleTimeout) {
		t.Errorf("default upstream_idle_timeout %v", d)
	}
	for _, bad := range []string{
		"upstream: http://h\nupstream_deadline: -1s\n",
		"upstream: http://h\nroutes:\n  - match: POST /x\n    upstream_deadline: -1s\n",
	} {
		if _, err := idemproxy.ParseConfig([]byte(bad)); err == nil {
			t.Errorf("ParseConfig accepted %q", bad)
		}
	}
	if err := (idemproxy.Config{Upstream: "http://h", UpstreamIdleTimeout: -1}).WithDefaults().Validate(); err == nil {
		t.Error("a negative upstream_idle_timeout passed Validate")
	}
}
