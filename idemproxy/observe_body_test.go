package idemproxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/idem-dev/idem/idemproxy"
)

// earlyAnswer is a RoundTripper that answers a request carrying X-Read at
// once and reads its body only after, in a goroutine of its own, as
// http.Transport's writer does when an upstream answers before it has read
// the body (and as it always may over HTTP/2): when X-Read is "later",
// once read is closed (by a request carrying X-Release, which waits for
// that read before it reads its own body); when it is "now", at once,
// unsynchronised with the handler. Other requests are read whole and
// answered.
type earlyAnswer struct {
	mu   sync.Mutex
	got  map[string]string // the bodies read, by X-Tag
	read chan struct{}
	done chan struct{}
}

func (e *earlyAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	tag := r.Header.Get("X-Tag")
	record := func() {
		b, _ := io.ReadAll(r.Body)
		e.mu.Lock()
		e.got[tag] = string(b)
		e.mu.Unlock()
	}
	when := r.Header.Get("X-Read")
	switch when {
	case "":
		if r.Header.Get("X-Release") != "" {
			// The finding's body is read while this request, whose body
			// the middleware read into its pooled buffer, is in flight.
			close(e.read)
			<-e.done
		}
		record()
	default:
		read, done := e.read, e.done
		go func() {
			defer close(done)
			if when == "later" {
				<-read
			}
			record()
		}()
	}
	return &http.Response{StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{},
		Body: io.NopCloser(strings.NewReader("early")), ContentLength: 5, Request: r}, nil
}

// TestObserveFindingBodyOutlivesTheHandler: in observe mode a request that
// enforcement would have answered itself (here a replay) is forwarded with
// the body the middleware read, which goes back to the middleware's pool
// when the handler returns. When the upstream answers before reading the
// body, the transport is still sending that body after the handler has
// returned; the next request reads its own body into the pooled buffer,
// and that must never be what the upstream reads as the first one's. The
// proxy guards the body as it does in enforce mode: once the handler
// returns, the transport reads no more of it (the upstream sees a body
// cut short). Under -race (as make test runs it) the unguarded body is a
// data race with the middleware's reuse of it; without, another request's
// bytes show only when the pool hands the state to it on the same P.
func TestObserveFindingBodyOutlivesTheHandler(t *testing.T) {
	t.Parallel()
	up := &earlyAnswer{got: map[string]string{}}
	cfg, err := idemproxy.ParseConfig([]byte("upstream: http://upstream.invalid\nmode: observe\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, cfg, idemproxy.Options{Transport: up})
	send := func(key, tag, body string, hdr ...string) {
		t.Helper()
		req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Tag", tag)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		rec := httptest.NewRecorder()
		r.proxy.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: %d %s", tag, rec.Code, rec.Body)
		}
	}
	mine := `{"pad":"` + strings.Repeat("a", 64<<10) + `"}`
	theirs := `{"pad":"` + strings.Repeat("b", 64<<10) + `"}`
	for round := range 40 {
		k := "k" + strconv.Itoa(round)
		when := []string{"later", "now"}[round%2]
		up.read, up.done = make(chan struct{}), make(chan struct{})
		send(k, k+" first", mine)
		send(k, k+" again", mine, "X-Read", when) // would_replay: forwarded unprotected
		release := "X-Release"
		if when == "now" {
			close(up.read)
			<-up.done
			release = "X-None"
		}
		send("other-"+k, k+" other", theirs, release, "1")
		up.mu.Lock()
		body := up.got[k+" again"]
		up.mu.Unlock()
		if strings.Contains(body, "b") || !strings.HasPrefix(mine, body) {
			t.Fatalf("round %d (read %s): the upstream read %d bytes as the finding's body, %d of them another request's",
				round, when, len(body), strings.Count(body, "b"))
		}
	}
}
