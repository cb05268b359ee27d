package idem

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/idem-dev/idem/idemstore"
)

// Header values the middleware sets, shared so that setting them costs no
// allocation. Their capacity is 1, so an Add by a handler copies them.
var (
	valAcquired = []string{"acquired"}[:1:1]
	valReplayed = []string{"replayed"}[:1:1]
	valTrue     = []string{"true"}[:1:1]
)

const outcomeHeader = "Idempotency-Outcome"

// reqState is what one protected request needs, pooled: the request body
// buffer and reader, and the response capture.
type reqState struct {
	info    idemstore.Request
	fp      FingerprintSource
	reqBuf  bytes.Buffer
	body    bodyReader
	respBuf bytes.Buffer
	cw      captureWriter
}

var statePool = sync.Pool{New: func() any { return new(reqState) }}

// maxPooledBuffer keeps huge buffers out of the pool.
const maxPooledBuffer = 1 << 20

func getState() *reqState { return statePool.Get().(*reqState) }

func putState(s *reqState) {
	if s.reqBuf.Cap() > maxPooledBuffer || s.respBuf.Cap() > maxPooledBuffer || len(s.cw.header) > maxPooledHeaders {
		return
	}
	s.reqBuf.Reset()
	s.respBuf.Reset()
	s.body = bodyReader{}
	s.info = idemstore.Request{}
	s.fp = FingerprintSource{}
	// The header map is reused: stores do not keep a response's header
	// (idemstore.CompleteParams), and the real response holds only its
	// value slices, which are never written again.
	h := s.cw.header
	clear(h)
	s.cw = captureWriter{header: h}
	statePool.Put(s)
}

// maxPooledHeaders keeps unusually large header maps out of the pool.
const maxPooledHeaders = 64

// bodyReader gives the handler the request body the middleware read.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

// captureWriter buffers a handler's answer so that it can be stored before
// the client sees it: a client that has an answer always gets the same one
// on retry. When the handler streams (Flush), hijacks, or writes more than
// the storable limit, it switches to writing through, and the answer is
// recorded as not replayable.
//
// The handler writes its headers into a map of the capture's own, which
// becomes the stored headers; they are copied to the real response when it
// is sent. captureWriter implements http.Flusher and http.Hijacker, and
// Unwrap for http.ResponseController, so deadlines and full duplex keep
// working.
type captureWriter struct {
	w     http.ResponseWriter
	limit int // bytes that may be buffered; negative: no limit

	header        http.Header
	resp          Response // what response() returns; pooled with the writer
	status        int
	buf           *bytes.Buffer
	passthrough   bool
	bufferFlushes bool // Policy.BufferFlushes
	observe       bool // Policy.Observe: no Idempotency-Outcome header
	sent          bool // status line and headers went out
	notReplayable string
}

func (c *captureWriter) Header() http.Header {
	if c.header == nil {
		c.header = make(http.Header)
	}
	return c.header
}

// send writes the status line and headers to the client.
func (c *captureWriter) send() {
	if c.sent {
		return
	}
	c.sent = true
	h := c.w.Header()
	for k, v := range c.header {
		// A buffered answer has its trailers (which a reverse proxy copies
		// in after the body) among its headers already; announcing them
		// again as trailers would make the first answer differ from the
		// replay, which has no trailers.
		if !c.passthrough && k == "Trailer" {
			continue
		}
		h[k] = v
	}
	if _, ok := c.header[outcomeHeader]; !ok && !c.observe {
		h[outcomeHeader] = valAcquired
	}
	c.w.WriteHeader(c.status)
}

func (c *captureWriter) WriteHeader(code int) {
	if c.status != 0 {
		return
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		// Informational answers (103 Early Hints) go out as they come,
		// with the headers set so far; those then leave the real header
		// map, which net/http keeps after a 1xx, so the final answer
		// carries only its own (as its replay does).
		h := c.w.Header()
		for k, v := range c.header {
			h[k] = v
		}
		c.w.WriteHeader(code)
		for k := range c.header {
			delete(h, k)
		}
		return
	}
	c.status = code
	if c.passthrough {
		c.send()
	}
}

func (c *captureWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if c.passthrough {
		return c.w.Write(b)
	}
	if c.limit >= 0 && c.buf.Len()+len(b) > c.limit {
		c.startPassthrough(NotReplayableTooLarge)
		return c.w.Write(b)
	}
	return c.buf.Write(b)
}

// startPassthrough sends what was buffered and writes through from now on.
func (c *captureWriter) startPassthrough(reason string) {
	if c.notReplayable == "" {
		c.notReplayable = reason
	}
	if c.passthrough {
		return
	}
	c.passthrough = true
	if c.status != 0 {
		c.send()
		if c.buf.Len() > 0 {
			_, _ = c.w.Write(c.buf.Bytes())
		}
		c.buf.Reset()
	}
}

// Flush implements http.Flusher: the handler streams, so its answer goes out
// now and cannot be replayed.
func (c *captureWriter) Flush() { _ = c.FlushError() }

// FlushError is Flush for http.ResponseController.
func (c *captureWriter) FlushError() error {
	if c.bufferFlushes && !c.passthrough && !strings.HasPrefix(headerValue(c.header, "Content-Type"), "text/event-stream") {
		return nil // Policy.BufferFlushes: keep buffering
	}
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	c.startPassthrough(NotReplayableStreamed)
	return http.NewResponseController(c.w).Flush()
}

// Hijack implements http.Hijacker: the connection leaves HTTP, so nothing
// can be replayed.
func (c *captureWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(c.w).Hijack()
	if err == nil {
		c.notReplayable = NotReplayableHijacked
		c.passthrough, c.sent = true, true
		if c.status == 0 {
			c.status = http.StatusSwitchingProtocols
		}
	}
	return conn, rw, err
}

// Unwrap lets http.ResponseController reach the underlying writer for the
// methods captureWriter does not implement.
func (c *captureWriter) Unwrap() http.ResponseWriter { return c.w }

// finalStatus is the status the handler answered (200 if it wrote nothing).
func (c *captureWriter) finalStatus() int {
	if c.status == 0 {
		return http.StatusOK
	}
	return c.status
}

// response returns what the handler answered, for storing. It shares the
// capture's header map and buffer, which stay untouched until the request
// state goes back to the pool; a store copies or encodes what it keeps.
func (c *captureWriter) response() *Response {
	if c.notReplayable != "" {
		c.resp = Response{Status: c.finalStatus(), NotReplayable: c.notReplayable}
		return &c.resp
	}
	body := c.buf.Bytes()
	if body == nil {
		body = []byte{}
	}
	c.resp = Response{Status: c.finalStatus(), Header: c.header, Body: body}
	return &c.resp
}

// finish sends the buffered answer to the client.
func (c *captureWriter) finish() {
	if c.passthrough {
		return
	}
	c.status = c.finalStatus()
	c.send()
	if c.buf.Len() > 0 {
		_, _ = c.w.Write(c.buf.Bytes())
	}
}
