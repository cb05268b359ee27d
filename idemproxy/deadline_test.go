package idemproxy_test

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-dev/idem/idemproxy"
)

// TestUpstreamDeadline: an upstream that stalls (before its headers, after
// them, or in the middle of its body) is cut off at the route's
// upstream_deadline, instead of holding the key's lease alive forever
// through the heartbeat. The client gets 504 when nothing of the body had
// come (an aborted response otherwise), and the key goes to review. The
// upstream is an http.Server on connections in memory, reached by the
// proxy's own transport, and time is fake: the request always reaches the
// upstream (and what it sends before it stalls, the proxy) before the
// deadline, which a slow machine on a real network and clock cannot
// promise (past the deadline before the request is written, the proxy
// rightly answers 502 upstream_unreachable and releases the key).
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
			synctest.Test(t, func(t *testing.T) {
				var runs counter
				stalled := make(chan struct{})
				tr := memUpstream(t, runs.wrap(func(w http.ResponseWriter, r *http.Request) {
					io.Copy(io.Discard, r.Body) // and so hears when the proxy drops the connection
					tc.before(w)
					select { // until the proxy gives up, or the test ends
					case <-r.Context().Done():
					case <-stalled:
					}
				}))
				t.Cleanup(func() { close(stalled) })
				r := newRig(t, slowRoute(t), idemproxy.Options{Transport: tr})
				start := time.Now()
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
				if waited := time.Since(start); waited != 50*time.Millisecond {
					t.Fatalf("the call was cut off after %v (fake time), want the route's upstream_deadline, 50ms", waited)
				}
				wantTimedOutKey(t, r, &runs)
				outlastHeartbeat()
			})
		})
	}
}

// slowRoute is the configuration of the deadline tests: POST /slow has an
// upstream_deadline of 50ms of its own (the default route keeps the 5m
// default), in front of an upstream the test's transport reaches.
func slowRoute(t *testing.T) idemproxy.Config {
	t.Helper()
	cfg, err := idemproxy.ParseConfig([]byte(`
upstream: http://upstream.invalid
routes:
  - match: POST /slow
    upstream_deadline: 50ms
`))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// wantTimedOutKey checks what an upstream call cut off at its deadline
// leaves: the key in review, counted in the metrics, a retry answered 409,
// and the upstream run once.
func wantTimedOutKey(t *testing.T, r *rig, runs *counter) {
	t.Helper()
	if got := r.state(t, "/slow", "k"); got != "needs_review" {
		t.Fatalf("record: %s, want needs_review", got)
	}
	if r.metric(t, "upstream_timeout", "escalated") == "" {
		t.Error("metrics do not count an upstream_timeout answer")
	}
	rec, _ := r.call(t, "/slow", "k")
	wantAnswer(t, "retry", rec, http.StatusConflict, "needs_review", "needs-review")
	if runs.n.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", runs.n.Load())
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

// memUpstream serves h on connections in memory (net.Pipe), for a test in
// a synctest bubble, and returns the proxy's own transport (NewTransport),
// traced as in production, dialling them whatever the upstream's address.
func memUpstream(t *testing.T, h http.Handler) *http.Transport {
	t.Helper()
	l := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	srv := &http.Server{Handler: h, ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(l)
	tr := idemproxy.NewTransport(0)
	tr.DialContext = l.dial
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
	})
	return tr
}

// pipeListener accepts the connections its dial makes.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		client.Close()
		server.Close()
		return nil, &net.OpError{Op: "dial", Net: "pipe", Err: net.ErrClosed}
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, &net.OpError{Op: "dial", Net: "pipe", Err: ctx.Err()}
	}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "upstream.invalid:80" }
