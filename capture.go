package idem

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"sync"
)

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBuffer keeps huge buffers out of the pool.
const maxPooledBuffer = 1 << 20

func getBuffer() *bytes.Buffer { return bufPool.Get().(*bytes.Buffer) }

func putBuffer(b *bytes.Buffer) {
	if b.Cap() <= maxPooledBuffer {
		b.Reset()
		bufPool.Put(b)
	}
}

// captureWriter buffers a handler's answer so that it can be stored before
// the client sees it: a client that has an answer always gets the same one
// on retry. When the handler streams (Flush), hijacks, or writes more than
// the storable limit, it switches to writing through, and the answer is
// recorded as not replayable.
//
// It implements http.Flusher and http.Hijacker, and Unwrap for
// http.ResponseController, so deadlines and full duplex keep working.
type captureWriter struct {
	w       http.ResponseWriter
	limit   int // bytes that may be buffered; negative: no limit
	outcome string

	status        int
	header        http.Header // snapshot at WriteHeader
	buf           *bytes.Buffer
	passthrough   bool
	notReplayable string
}

func (c *captureWriter) Header() http.Header { return c.w.Header() }

func (c *captureWriter) WriteHeader(code int) {
	if c.status != 0 {
		return
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		c.w.WriteHeader(code) // informational answers go out as they come
		return
	}
	c.status = code
	h := c.w.Header()
	h.Set("Idempotency-Outcome", c.outcome)
	c.header = h.Clone()
	if c.passthrough {
		c.w.WriteHeader(code)
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
		c.w.WriteHeader(c.status)
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
		c.passthrough = true
		if c.status == 0 {
			c.status = http.StatusSwitchingProtocols
		}
	}
	return conn, rw, err
}

// Unwrap lets http.ResponseController reach the underlying writer for the
// methods captureWriter does not implement.
func (c *captureWriter) Unwrap() http.ResponseWriter { return c.w }

// response returns what the handler answered, for storing.
func (c *captureWriter) response() *Response {
	status := c.status
	if status == 0 {
		status = http.StatusOK
	}
	if c.notReplayable != "" {
		return &Response{Status: status, NotReplayable: c.notReplayable}
	}
	body := bytes.Clone(c.buf.Bytes())
	if body == nil {
		body = []byte{}
	}
	h := c.header
	if h != nil {
		h.Del("Idempotency-Outcome")
	}
	return &Response{Status: status, Header: h, Body: body}
}

// finish sends the buffered answer to the client.
func (c *captureWriter) finish() {
	if c.passthrough {
		return
	}
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	c.w.WriteHeader(c.status)
	if c.buf.Len() > 0 {
		_, _ = c.w.Write(c.buf.Bytes())
	}
}
