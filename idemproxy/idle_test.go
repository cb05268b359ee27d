package idemproxy_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"

	"github.com/idem-dev/idem/idemproxy"
)

// TestClosedIdleConnectionReleases: the upstream resets an idle keep-alive
// connection just before the proxy reuses it. The transport's write fails
// and nothing reaches the upstream, so the key must be released (or the
// request retried by the transport), never sent to review: the transport
// had already written the headers into its buffer, which is why "sent" is
// decided by the bytes that reached the connection.
//
// The race is made deterministic by holding back, on the proxy's side, the
// read that would tell the transport about the reset until it has written
// on the connection.
func TestClosedIdleConnectionReleases(t *testing.T) {
	t.Parallel()
	var runs counter
	idle, hold, r := idleRig(t, &runs, nil)
	if rec, _ := r.call(t, "/warm", "w"); rec.Code != http.StatusOK {
		t.Fatalf("warm-up: %d %s", rec.Code, rec.Body)
	}
	// The upstream resets the idle connection; the proxy's side sees it.
	c := <-idle
	c.(*net.TCPConn).SetLinger(0)
	c.Close()
	<-hold.closed

	rec, panicked := r.call(t, "/pay", "k")
	select {
	case <-hold.wrote:
	default:
		t.Fatal("the transport did not reuse the reset connection; the case was not exercised")
	}
	switch {
	case panicked != nil:
		t.Fatalf("panic: %v", panicked)
	case rec.Code == http.StatusOK: // retried by the transport on a new connection
		if got := r.state(t, "/pay", "k"); got != "completed 200" {
			t.Fatalf("record after a transparent retry: %s", got)
		}
		return
	}
	wantAnswer(t, "request on the reset connection", rec, http.StatusBadGateway, "upstream_unreachable", "upstream-unreachable")
	if got := r.state(t, "/pay", "k"); got != "gone" {
		t.Fatalf("record: %s, want released (gone)", got)
	}
	if runs.n.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1 (the warm-up)", runs.n.Load())
	}
	if rec, _ := r.call(t, "/pay", "k"); rec.Code != http.StatusOK || runs.n.Load() != 2 {
		t.Fatalf("retry: %d, upstream runs %d; want it forwarded on a new connection", rec.Code, runs.n.Load())
	}
}

// idleRig starts an upstream that answers "ok" and reports each connection
// that goes idle, and a proxy whose first upstream connection is held by
// the returned readHold.
func idleRig(t *testing.T, runs *counter, wrap func(http.RoundTripper) http.RoundTripper) (idle chan net.Conn, hold *readHold, r *rig) {
	t.Helper()
	idle = make(chan net.Conn, 8)
	up := httptest.NewUnstartedServer(runs.wrap(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	up.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateIdle {
			idle <- c
		}
	}
	up.Start()
	t.Cleanup(up.Close)

	hold = newReadHold(t)
	tr := idemproxy.NewTransport(0)
	dial := tr.DialContext
	var (
		mu    sync.Mutex
		first = true
	)
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		hc := &holdConn{Conn: c}
		if first { // only the first connection is the one the upstream closes
			hc.hold, first = hold, false
		}
		return hc, nil
	}
	t.Cleanup(tr.CloseIdleConnections)
	var rt http.RoundTripper = tr
	if wrap != nil {
		rt = wrap(tr)
	}
	return idle, hold, newRig(t, idemproxy.Config{Upstream: up.URL}, idemproxy.Options{Transport: rt})
}

// TestIdleConnectionClosedAsTaken: the upstream closes an idle keep-alive
// connection (FIN), and the transport learns of it just after it took that
// connection for the next request, before registering the request on it.
// Go's transport then fails the request with "server closed idle
// connection" (and may or may not have written it to the half-closed
// socket): the upstream had closed before, so the key is released.
func TestIdleConnectionClosedAsTaken(t *testing.T) {
	t.Parallel()
	var runs counter
	var errs errorRecorder
	idle, hold, r := idleRig(t, &runs, errs.wrap)
	if rec, _ := r.call(t, "/warm", "w"); rec.Code != http.StatusOK {
		t.Fatalf("warm-up: %d %s", rec.Code, rec.Body)
	}
	(<-idle).Close()
	<-hold.closed

	// As the proxy takes the connection, the transport hears of the close
	// and closes its side.
	reused := false
	ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if info.Reused && !reused {
			reused = true
			hold.release()
			<-hold.shut
		}
	}})
	rec := httptest.NewRecorder()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
	req.Header.Set("Idempotency-Key", "k")
	r.proxy.ServeHTTP(rec, req)
	if !reused {
		t.Fatal("the transport did not take the closed connection; the case was not exercised")
	}
	if rec.Code == http.StatusOK { // retried by the transport on a new connection
		if got := r.state(t, "/pay", "k"); got != "completed 200" {
			t.Fatalf("record after a transparent retry: %s", got)
		}
		return
	}
	// NotSent recognises the transport's own error, whether or not the
	// request was written to the half-closed socket.
	if err := errs.last(); err == nil || !strings.Contains(err.Error(), "server closed idle connection") || !idemproxy.NotSent(err) {
		t.Errorf("round trip error %v: want http.Transport's \"server closed idle connection\", which NotSent reports", err)
	}
	wantAnswer(t, "request on the closed connection", rec, http.StatusBadGateway, "upstream_unreachable", "upstream-unreachable")
	if got := r.state(t, "/pay", "k"); got != "gone" || runs.n.Load() != 1 {
		t.Fatalf("record: %s, upstream runs %d; want released (gone), 1", got, runs.n.Load())
	}
}

// readHold holds back a connection's failed read (the news that the peer
// closed it) until something was written on it, or release is called.
type readHold struct {
	closed   chan struct{} // the peer's close reached this side
	released chan struct{} // the failed read may return
	wrote    chan struct{} // something was written after the peer's close
	shut     chan struct{} // the transport closed the connection
	done     chan struct{} // the test ended

	closedOnce, releaseOnce, wroteOnce, shutOnce sync.Once
}

func newReadHold(t *testing.T) *readHold {
	h := &readHold{closed: make(chan struct{}), released: make(chan struct{}), wrote: make(chan struct{}),
		shut: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() { close(h.done) })
	return h
}

func (h *readHold) release() { h.releaseOnce.Do(func() { close(h.released) }) }

type holdConn struct {
	net.Conn
	hold *readHold // nil: not held
}

func (c *holdConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && c.hold != nil {
		c.hold.closedOnce.Do(func() { close(c.hold.closed) })
		select {
		case <-c.hold.released:
		case <-c.hold.done:
		}
	}
	return n, err
}

func (c *holdConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if c.hold != nil {
		select {
		case <-c.hold.closed:
			c.hold.wroteOnce.Do(func() { close(c.hold.wrote) })
			c.hold.release()
		default:
		}
	}
	return n, err
}

func (c *holdConn) Close() error {
	if c.hold != nil {
		c.hold.shutOnce.Do(func() { close(c.hold.shut) })
	}
	return c.Conn.Close()
}

// NetConn returns the connection underneath, as tls.Conn does.
func (c *holdConn) NetConn() net.Conn { return c.Conn }

// errorRecorder keeps the last error of the round trips it wraps.
type errorRecorder struct {
	mu  sync.Mutex
	err error
}

func (e *errorRecorder) wrap(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := next.RoundTrip(r)
		if err != nil {
			e.mu.Lock()
			e.err = err
			e.mu.Unlock()
		}
		return resp, err
	})
}

func (e *errorRecorder) last() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
