package idemproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultUpstreamIdleTimeout is how long an idle keep-alive connection to
// the upstream is kept (Config.UpstreamIdleTimeout).
const DefaultUpstreamIdleTimeout = 90 * time.Second

// NewTransport returns the transport the proxy uses to reach the upstream:
// many idle keep-alive connections per host, kept DefaultUpstreamIdleTimeout,
// and bounded dial, TLS and response-header waits (responseHeader; 0 means
// none). Its connections count the bytes written to them, which tells the
// proxy whether a failed request left at all (see the package doc).
func NewTransport(responseHeader time.Duration) *http.Transport {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy: nil, // the upstream is addressed directly
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &countingConn{Conn: c}, nil
		},
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       DefaultUpstreamIdleTimeout,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
		ResponseHeaderTimeout: responseHeader,
	}
}

// countingConn counts the bytes written to a connection: a request that
// failed while the count did not move never reached the upstream.
type countingConn struct {
	net.Conn
	written atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.written.Add(int64(n))
	return n, err
}

// counted returns the counting connection under c, or nil when c was not
// dialled by NewTransport. A connection that wraps another reveals it with
// NetConn, as *tls.Conn does.
func counted(c net.Conn) *countingConn {
	for range 8 { // a few layers (TLS, a test's wrapper), never a loop
		switch t := c.(type) {
		case *countingConn:
			return t
		case interface{ NetConn() net.Conn }:
			c = t.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// NotSent reports whether err, returned by a round trip, proves that the
// request never reached the upstream: the connection could not be made
// (refused, unreachable, DNS, dial timeout), its TLS handshake failed, or
// the upstream had closed the reused idle connection before the request
// was written to it. Any other error, including a reset or a timeout after
// the request was written, leaves the outcome unknown as far as the error
// tells; the proxy also traces each request to know more (see the package
// doc).
func NotSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return true
	}
	var rh tls.RecordHeaderError
	var cv *tls.CertificateVerificationError
	return errors.As(err, &rh) || errors.As(err, &cv) || serverClosedIdle(err)
}

// serverClosedIdle reports http.Transport's "server closed idle connection"
// error: the upstream closed a keep-alive connection that the transport had
// taken for this request, and the transport saw the close while no request
// was registered on it, so before a byte of this one was written. (The
// error is not exported; its text is stable.)
func serverClosedIdle(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if err.Error() == "http: server closed idle connection" {
			return true
		}
	}
	return false
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// bufferPool is httputil.BufferPool over sync.Pool, with 32 KiB buffers.
type bufferPool struct{ p sync.Pool }

func newBufferPool() *bufferPool {
	return &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}
}

func (b *bufferPool) Get() []byte  { return *b.p.Get().(*[]byte) }
func (b *bufferPool) Put(v []byte) { b.p.Put(&v) }
