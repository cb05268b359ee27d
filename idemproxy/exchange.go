package idemproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"
)

// exchange is what the proxy learns about one protected request's trip to
// the upstream: whether the request may have left (traced), and how the
// round trip and the reading of the answer's body ended.
type exchange struct {
	trace httptrace.ClientTrace

	mu           sync.Mutex
	called       bool // the request reached the transport
	answered     bool // the transport returned the upstream's answer
	traced       bool // the transport reports to httptrace
	gotConn      bool
	multiplexed  bool // HTTP/2: the connection carries other streams
	wroteHeaders bool
	conn         *countingConn // nil: not dialled by NewTransport
	written      int64         // conn's count when it was taken
	info         httptrace.GotConnInfo
	rtErr        error // the round trip failed: no answer
	bodyErr      error // the answer's body could not be read whole
	// refusedUnread: the upstream refused the request (refusesRequest)
	// before the transport had taken the whole request body (see guardedBody.untaken).
	refusedUnread bool

	// One allocation for the request's wrappers and its deadline.
	out      heldWriter
	reqBody  guardedBody
	respBody upstreamBody
	deadline callDeadline
}

type exchangeKey struct{}

// newExchange returns an exchange and ctx carrying it and its trace, and
// ending at the call's deadline d (see callDeadline; client is the client's
// writer, or nil). Stop the deadline with x.deadline.stop.
func newExchange(ctx context.Context, d, grace time.Duration, cause error, client *clientWriter) (*exchange, context.Context) {
	x := &exchange{}
	ctx = x.deadline.start(ctx, d, grace, cause, client)
	x.trace = httptrace.ClientTrace{GetConn: x.getConn, GotConn: x.tookConn, WroteHeaders: x.wroteAllHeaders}
	return x, httptrace.WithClientTrace(context.WithValue(ctx, exchangeKey{}, x), &x.trace)
}

func exchangeFrom(ctx context.Context) *exchange {
	x, _ := ctx.Value(exchangeKey{}).(*exchange)
	return x
}

// getConn starts an attempt. The transport tries a request again, on
// another connection, only when the first attempt provably was not
// processed (nothing of it written, on HTTP/1; a refused stream or a
// GOAWAY, on HTTP/2), so only the last attempt counts.
func (x *exchange) getConn(string) {
	x.mu.Lock()
	x.traced, x.gotConn, x.multiplexed, x.wroteHeaders = true, false, false, false
	x.conn, x.written, x.info = nil, 0, httptrace.GotConnInfo{}
	x.mu.Unlock()
}

func (x *exchange) tookConn(info httptrace.GotConnInfo) {
	cc := counted(info.Conn)
	tc, isTLS := info.Conn.(*tls.Conn)
	h2 := isTLS && tc.ConnectionState().NegotiatedProtocol == "h2"
	x.mu.Lock()
	x.gotConn, x.multiplexed = true, h2
	x.info, x.conn = info, cc
	if cc != nil {
		x.written = cc.written.Load()
	}
	x.mu.Unlock()
}

func (x *exchange) wroteAllHeaders() {
	x.mu.Lock()
	x.wroteHeaders = true
	x.mu.Unlock()
}

// sent reports whether the failed round trip may have reached the upstream.
// It did when the upstream answered (ReverseProxy failed on the answer, a
// 101 that nobody asked for). It did not when the error says so (NotSent), when the transport never
// got a connection or never wrote the request's headers, or when it wrote
// them into its buffer but not a byte of them reached the connection (a
// reused connection that the upstream had closed fails the first write).
// On HTTP/2, where the connection carries other streams and the request is
// written by a goroutine that may outlive the round trip, a request that
// got a connection counts as sent; with a RoundTripper that reports nothing
// to httptrace, only the error can tell.
func (x *exchange) sent(err error) bool {
	if NotSent(err) {
		return false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	switch {
	case x.answered:
		return true // failed after the answer came (a 101 it did not ask for)
	case !x.called:
		return false // refused before any round trip (ReverseProxy's own checks)
	case !x.traced:
		return true
	case !x.gotConn:
		return false
	case x.multiplexed:
		return true
	case !x.wroteHeaders:
		return false
	}
	return x.conn == nil || x.conn.written.Load() != x.written
}

// connAttrs describe the connection of the last attempt, for logs.
func (x *exchange) connAttrs() slog.Attr {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.info.Conn == nil {
		return slog.Group("conn", slog.Bool("got", false))
	}
	return slog.Group("conn", slog.Bool("reused", x.info.Reused), slog.Bool("was_idle", x.info.WasIdle),
		slog.Duration("idle_time", x.info.IdleTime), slog.Bool("wrote_headers", x.wroteHeaders))
}

func (x *exchange) setRoundTripErr(err error) {
	x.mu.Lock()
	x.rtErr = err
	x.mu.Unlock()
}

func (x *exchange) setBodyErr(err error) {
	x.mu.Lock()
	if x.bodyErr == nil {
		x.bodyErr = err
	}
	x.mu.Unlock()
}

func (x *exchange) errs() (roundTrip, body error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.rtErr, x.bodyErr
}

// guard makes body, of size bytes (-1: unknown), the request body the
// transport reads. It is called before the round trip starts.
func (x *exchange) guard(body io.ReadCloser, size int64) io.ReadCloser {
	x.reqBody.r, x.reqBody.size = body, size
	return &x.reqBody
}

// endBody ends the transport's reading of the request body; see guardedBody.
func (x *exchange) endBody() { x.reqBody.end() }

// guardedBody is a protected request's body as the transport reads it. The
// transport's writer can outlive the round trip (past a deadline, on a
// broken connection), but the body belongs to the middleware's pooled state,
// reused once the handler returns: end, called before the forwarder
// returns, waits for a read in progress and fails every later one.
//
// It also counts what the transport took: an upstream cannot have read
// bytes the transport had not yet taken from the proxy.
type guardedBody struct {
	mu    sync.Mutex
	r     io.ReadCloser
	ended bool
	size  int64 // the body's length; -1 unknown, 0 not guarded
	taken int64
}

var errBodyEnded = errors.New("idemproxy: the upstream call ended before the request body was sent")

func (b *guardedBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return 0, errBodyEnded
	}
	n, err := b.r.Read(p)
	b.taken += int64(n)
	return n, err
}

// untaken reports whether some of a body of known length had not been
// taken by the transport yet: then the upstream had not received it all.
func (b *guardedBody) untaken() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.size > 0 && b.taken < b.size
}

// Close does nothing: the body is the middleware's.
func (b *guardedBody) Close() error { return nil }

func (b *guardedBody) end() {
	b.mu.Lock()
	b.ended = true
	b.mu.Unlock()
}

// upstreamBody reads the upstream's answer and notes, on the exchange, a
// body that ends early: a read error, or an end of file before the
// Content-Length the upstream announced. It does not rely on the transport
// or on an http.Server around the proxy to notice.
type upstreamBody struct {
	io.ReadCloser
	x    *exchange
	want int64 // the announced length, or -1
	n    int64
}

// watchBodies wraps the answers to protected requests in upstreamBody. It
// sits in the transport, so that what it watches does not depend on the
// RoundTripper setting Response.Request.
type watchBodies struct{ next http.RoundTripper }

func (t watchBodies) RoundTrip(r *http.Request) (*http.Response, error) {
	x := exchangeFrom(r.Context())
	if x != nil {
		x.mu.Lock()
		x.called = true
		x.mu.Unlock()
	}
	resp, err := t.next.RoundTrip(r)
	if x != nil && err == nil {
		// The upstream answered: it had the request, though the transport
		// may not have counted the bytes it wrote yet.
		x.mu.Lock()
		x.answered = true
		x.mu.Unlock()
	}
	if err != nil || resp.StatusCode < 200 { // a 101's body is the upgraded connection: left alone
		return resp, err
	}
	if x != nil && refusesRequest(resp.StatusCode) && x.reqBody.untaken() {
		// Refused before the body was all sent: the upstream refused a
		// request it did not have. Read now, when the answer came: the
		// transport may go on taking the body after it. Any other answer
		// that early is kept to the route's policy: a 400, 409 or 422 may
		// come from an upstream that acted on the part it read, and a 5xx
		// is a failure, of unknown effect.
		x.mu.Lock()
		x.refusedUnread = true
		x.mu.Unlock()
	}
	if x != nil && resp.Body != nil {
		want := resp.ContentLength
		if r.Method == http.MethodHead || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified {
			want = -1 // no body, whatever the header says
		}
		x.respBody = upstreamBody{ReadCloser: resp.Body, x: x, want: want}
		resp.Body = &x.respBody
	}
	return resp, nil
}

// refusesRequest reports whether status refuses a request as such, on its
// headers, its size or its expectation, rather than reporting what came of
// running it: an upstream that gives it before it has the whole body did
// not act on the part it had. A 400, 409 or 422 says what the upstream
// found in the body, and one that streams its body (an import that stores
// rows as it parses them) gives it after acting on the rows before.
func refusesRequest(status int) bool {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusMethodNotAllowed,
		http.StatusProxyAuthRequired, http.StatusLengthRequired, http.StatusRequestEntityTooLarge,
		http.StatusRequestURITooLong, http.StatusUnsupportedMediaType, http.StatusExpectationFailed,
		http.StatusRequestHeaderFieldsTooLarge:
		return true
	}
	return false
}

func (b *upstreamBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	switch {
	case err == io.EOF && b.want >= 0 && b.n != b.want:
		err = io.ErrUnexpectedEOF
		fallthrough
	case err != nil && err != io.EOF:
		b.x.setBodyErr(err)
	}
	return n, err
}

// heldWriter passes the upstream's answer on to the middleware, holding its
// status back until the first byte of body: an upstream that fails after
// its headers but before any body can still be answered with a problem
// document instead of a half answer. Informational answers (1xx) go
// through at once, but for 100 Continue, which is dropped; Flush before any
// body passes only for event streams,
// whose headers the client waits for.
//
// Once the answer is passing through, a client that has gone does not end
// the upstream call: writes to it are discarded, so the reverse proxy reads
// the upstream's answer to its end (bounded by the upstream deadline) and
// the key is completed as not replayable, instead of the call being aborted
// as if the upstream had failed.
type heldWriter struct {
	w          http.ResponseWriter
	status     int
	committed  bool
	clientGone bool
}

func (h *heldWriter) Header() http.Header { return h.w.Header() }

func (h *heldWriter) WriteHeader(code int) {
	if code == http.StatusContinue {
		// The proxy read the whole body before forwarding it, and the
		// client had its 100 Continue then, from the proxy's server (or
		// sent its body without one): a second is noise, and the
		// upstream, which gets no Expect, has no business asking.
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		h.w.WriteHeader(code)
		return
	}
	if h.status == 0 {
		h.status = code
	}
}

// commit passes the held status on, if there is one.
func (h *heldWriter) commit() {
	if !h.committed && h.status != 0 {
		h.committed = true
		h.w.WriteHeader(h.status)
	}
}

func (h *heldWriter) Write(b []byte) (int, error) {
	if !h.committed {
		if h.status == 0 {
			h.status = http.StatusOK
		}
		h.commit()
	}
	if h.clientGone {
		return len(b), nil
	}
	if _, err := h.w.Write(b); err != nil {
		h.clientGone = true // the client left: read the upstream to its end anyway
	}
	return len(b), nil
}

// FlushError is Flush for http.ResponseController (ReverseProxy flushes
// through one).
func (h *heldWriter) FlushError() error {
	if !h.committed {
		ct, _, _ := mime.ParseMediaType(h.w.Header().Get("Content-Type"))
		if ct != "text/event-stream" {
			return nil
		}
		h.commit()
	}
	if h.clientGone {
		return nil
	}
	if err := http.NewResponseController(h.w).Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		h.clientGone = true
	}
	return nil
}

// Flush implements http.Flusher.
func (h *heldWriter) Flush() { _ = h.FlushError() }

// Unwrap lets http.ResponseController reach the middleware's writer
// (Hijack for upgrades, deadlines).
func (h *heldWriter) Unwrap() http.ResponseWriter { return h.w }

// deadlineCause is the cause of the context of an upstream call that ran
// past its route's upstream deadline.
type deadlineCause struct{ d time.Duration }

func (c deadlineCause) Error() string {
	return "the upstream call ran past its deadline of " + c.d.String()
}

// refusedUnreadBody reports whether the upstream refused the request before
// it had all of its body (see watchBodies).
func (x *exchange) refusedUnreadBody() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.refusedUnread
}
