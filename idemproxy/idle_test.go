package idemproxy_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
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
	idle := make(chan net.Conn, 8)
	up := httptest.NewUnstartedServer(runs.wrap(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	up.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateIdle {
			idle <- c
		}
	}
	up.Start()
	t.Cleanup(up.Close)

	hold := &readHold{closed: make(chan struct{}), wrote: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() { close(hold.done) })
	tr := idemproxy.NewTransport(0)
	dial := tr.DialContext
	var dials sync.Mutex
	first := true
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		dials.Lock()
		defer dials.Unlock()
		hc := &holdConn{Conn: c}
		if first { // only the first connection is the one the upstream resets
			hc.hold, first = hold, false
		}
		return hc, nil
	}
	t.Cleanup(tr.CloseIdleConnections)
	r := newRig(t, idemproxy.Config{Upstream: up.URL}, idemproxy.Options{Transport: tr})

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

// readHold holds back a connection's failed read (the news that the peer
// closed it) until something was written on it.
type readHold struct {
	closed, wrote, done   chan struct{}
	closedOnce, wroteOnce sync.Once
}

type holdConn struct {
	net.Conn
	hold *readHold // nil: not held
}

func (c *holdConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && c.hold != nil {
		c.hold.closedOnce.Do(func() { close(c.hold.closed) })
		select {
		case <-c.hold.wrote:
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
		default:
		}
	}
	return n, err
}

// NetConn returns the connection underneath, as tls.Conn does.
func (c *holdConn) NetConn() net.Conn { return c.Conn }
