package idemproxy

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// Slow clients. A client that does not read its answer must not hold a
// protected request's lease: while the proxy waits to write to it, it
// reads nothing more of the upstream's answer, and a key whose upstream
// answered in full would wait, and then go to review when the call ran
// past its upstream deadline. Two bounds keep the client apart from the
// key:
//
//   - each write to a client (and the flush after the handler) must be
//     taken within Config.ClientWriteTimeout, through a write deadline on
//     the connection; a client that does not take one is cut off: the
//     proxy stops writing to it (the connection is closed, the answer
//     aborted) and reads the rest of the upstream's answer without it;
//   - a protected request's upstream deadline counts against the upstream
//     only: if, when it passes, the proxy is waiting on the client (the
//     upstream's answer is there, the client is not taking it), the client
//     is cut off instead of the upstream, and the upstream gets
//     ClientWriteTimeout more to deliver the rest of its answer.
//
// Once the upstream's whole answer is read, the key completes (as not
// replayable when the answer was passing through, too big to keep or
// streamed). A slow client never sends an answered operation to review.

// clientWriter is the client's ResponseWriter as the proxy writes to it:
// every write (and flush) pushes the connection's write deadline
// ClientWriteTimeout ahead, so no write blocks longer, and the proxy can
// cut the client off.
type clientWriter struct {
	http.ResponseWriter
	timeout time.Duration

	mu       sync.Mutex
	writing  bool      // a write or flush is in progress
	cut      bool      // cut off: every later write fails
	explicit bool      // a handler set its own deadline, or hijacked
	pushed   time.Time // when the deadline was last pushed ahead
}

var errClientCut = errors.New("idemproxy: the client was cut off: it did not take the answer in time")

// newClientWriter returns w as a clientWriter, or w itself when its
// connection has no write deadlines (an httptest.ResponseRecorder). It
// clears the deadline an earlier request on the same connection left.
func newClientWriter(w http.ResponseWriter, timeout time.Duration) http.ResponseWriter {
	switch w.(type) {
	case interface{ SetWriteDeadline(time.Time) error }, interface{ Unwrap() http.ResponseWriter }:
	default:
		return w // checked first: ResponseController's refusal allocates
	}
	if timeout <= 0 || http.NewResponseController(w).SetWriteDeadline(time.Time{}) != nil {
		return w
	}
	return &clientWriter{ResponseWriter: w, timeout: timeout}
}

// push moves the deadline timeout ahead, unless it was moved lately (a
// quarter of the timeout): a write then has between 3/4 of the timeout and
// all of it. Called with mu held.
func (c *clientWriter) push() {
	if c.explicit {
		return
	}
	if now := time.Now(); now.Sub(c.pushed) > c.timeout/4 {
		c.pushed = now
		_ = http.NewResponseController(c.ResponseWriter).SetWriteDeadline(now.Add(c.timeout))
	}
}

// begin starts a write, unless the client was cut off.
func (c *clientWriter) begin() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		return false
	}
	c.writing = true
	c.push()
	return true
}

func (c *clientWriter) end() {
	c.mu.Lock()
	c.writing = false
	c.mu.Unlock()
}

// cutIfWriting cuts the client off if a write to it is in progress: the
// proxy is waiting on the client, not on the upstream.
func (c *clientWriter) cutIfWriting() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.writing || c.cut {
		return false
	}
	c.cut = true
	_ = http.NewResponseController(c.ResponseWriter).SetWriteDeadline(time.Unix(1, 0))
	return true
}

// WriteHeader pushes the deadline too: a final status goes out with the
// body, or in the flush after the handler, and a 1xx at once.
func (c *clientWriter) WriteHeader(code int) {
	if c.begin() {
		defer c.end()
	}
	c.ResponseWriter.WriteHeader(code)
}

// Write writes b in pieces of writePiece bytes, pushing the deadline
// before each: the bound is on a client's progress, not on the size of a
// write (the middleware writes a buffered answer in one).
func (c *clientWriter) Write(b []byte) (int, error) {
	n := 0
	for {
		p := b[n:min(len(b), n+writePiece)]
		if !c.begin() {
			return n, errClientCut
		}
		m, err := c.ResponseWriter.Write(p)
		c.end()
		n += m
		if err != nil || n == len(b) {
			return n, err
		}
	}
}

// writePiece is the most a write to a client may carry under one push of
// its deadline: a client must take this much within ClientWriteTimeout.
const writePiece = 32 << 10

// FlushError is Flush for http.ResponseController.
func (c *clientWriter) FlushError() error {
	if !c.begin() {
		return errClientCut
	}
	defer c.end()
	return http.NewResponseController(c.ResponseWriter).Flush()
}

// Flush implements http.Flusher.
func (c *clientWriter) Flush() { _ = c.FlushError() }

// SetWriteDeadline is a deadline of a handler's own: it replaces the
// per-write ones for the rest of the request.
func (c *clientWriter) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.explicit = true
	return http.NewResponseController(c.ResponseWriter).SetWriteDeadline(t)
}

// Hijack hands the connection over (a tunnel after 101 Switching
// Protocols) without a deadline: the tunnel's writes are not the proxy's.
func (c *clientWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c.mu.Lock()
	c.explicit = true
	c.mu.Unlock()
	rc := http.NewResponseController(c.ResponseWriter)
	_ = rc.SetWriteDeadline(time.Time{})
	return rc.Hijack()
}

// Unwrap lets http.ResponseController reach the server's writer.
func (c *clientWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// clientOf finds the clientWriter under w, through its Unwrap methods.
func clientOf(w http.ResponseWriter) *clientWriter {
	for range 8 { // a few layers, never a loop
		switch t := w.(type) {
		case *clientWriter:
			return t
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return nil
		}
	}
	return nil
}

// callDeadline ends a protected request's upstream call at its deadline:
// it cancels the call when the proxy is waiting on the upstream, and cuts
// the client off, giving the upstream grace more, when it is waiting on
// the client.
type callDeadline struct {
	cancel context.CancelCauseFunc
	cause  error
	client *clientWriter // nil: the call is ended at the deadline
	grace  time.Duration

	mu    sync.Mutex
	timer *time.Timer
	done  bool
}

// start returns ctx, ended at d from now as cd says.
func (cd *callDeadline) start(ctx context.Context, d, grace time.Duration, cause error, client *clientWriter) context.Context {
	ctx, cd.cancel = context.WithCancelCause(ctx)
	cd.cause, cd.client, cd.grace = cause, client, grace
	cd.timer = time.AfterFunc(d, cd.expire)
	return ctx
}

func (cd *callDeadline) expire() {
	cd.mu.Lock()
	defer cd.mu.Unlock()
	if cd.done {
		return
	}
	if cd.client != nil && cd.client.cutIfWriting() {
		cd.client = nil // the next expiry ends the call
		cd.timer = time.AfterFunc(cd.grace, cd.expire)
		return
	}
	cd.cancel(cd.cause)
}

// stop ends the deadline's timers and releases the call's context.
func (cd *callDeadline) stop() {
	cd.mu.Lock()
	cd.done = true
	cd.timer.Stop()
	cd.mu.Unlock()
	cd.cancel(nil)
}
