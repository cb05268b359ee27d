package idemproxy_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemproxy"
)

// TestNotSent classifies the errors a real http.Transport returns.
func TestNotSent(t *testing.T) {
	t.Parallel()
	// Port 1, which no ephemeral port can be: a port closed here could be
	// taken by another test's listener before the round trip dials it.
	refused := "http://127.0.0.1:1"
	reset := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, _ := http.NewResponseController(w).Hijack()
		conn.(*net.TCPConn).SetLinger(0)
		conn.Close()
	}))
	t.Cleanup(reset.Close)
	// It never answers: only the transport's response-header timeout can
	// end the round trip, however slow the machine.
	stalled := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stalled:
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(stalled) }) // before the server closes

	tests := []struct {
		name, url   string
		notSent     bool
		wantTimeout bool
	}{
		{"connection refused", refused, true, false},
		{"unknown host", "http://idem-no-such-host.invalid", true, false},
		{"reset after the request was sent", reset.URL, false, false},
		{"no response headers in time", slow.URL, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tr := idemproxy.NewTransport(200 * time.Millisecond)
			defer tr.CloseIdleConnections()
			req, _ := http.NewRequestWithContext(context.Background(), "POST", tt.url, strings.NewReader("{}"))
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
				t.Fatal("round trip succeeded")
			}
			if got := idemproxy.NotSent(err); got != tt.notSent {
				t.Errorf("NotSent(%v) = %v, want %v", err, got, tt.notSent)
			}
			var ne net.Error
			if tt.wantTimeout && !(errors.As(err, &ne) && ne.Timeout()) {
				t.Errorf("%v is not a timeout", err)
			}
		})
	}
}

func TestParseConfig(t *testing.T) {
	t.Parallel()
	c, err := idemproxy.ParseConfig([]byte(`
upstream: http://127.0.0.1:3000
wait: 2s
release_statuses: [429, 503, 502]
routes:
  - match: POST /payments/{id}/refund
    ambiguous: release
    optional_key: true
    max_body: 4096
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
	r := c.Routes[0]
	if r.Match.Pattern != "POST /payments/{id}/refund" || r.Match.Line != 6 || r.Ambiguous != idemproxy.AmbiguousRelease ||
		!*r.OptionalKey || *r.MaxBody != 4096 || time.Duration(*c.Wait) != 2*time.Second || len(c.ReleaseStatuses) != 3 {
		t.Errorf("parsed %+v", c)
	}
	if d := c.WithDefaults(); len(d.ScopeHeader) != 1 || d.ScopeHeader[0] != "Authorization" || d.Anonymous != idemproxy.AnonymousReject || c.WithDefaults().Listen != idemproxy.DefaultListen {
		t.Error("defaults not filled")
	}
}
