package idemproxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemproxy"
)

// expectUpstream records the requests it receives (their headers, and how
// much of their bodies it read) and answers each as its answer function
// says: early (without reading the body) or after reading it.
type expectUpstream struct {
	mu     sync.Mutex
	header []http.Header
	read   []int
	// early, if set, answers a request without reading its body: the
	// status to send, and the upstream closes the connection after it
	// (Connection: close), as a server refusing a body it will not read.
	early func(n int) int
}

func (u *expectUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.header = append(u.header, r.Header.Clone())
	n := len(u.header)
	u.mu.Unlock()
	if u.early != nil {
		if code := u.early(n); code != 0 {
			u.note(0)
			w.Header().Set("Connection", "close")
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(code)
			io.WriteString(w, "refused unread")
			return
		}
	}
	b, _ := io.ReadAll(r.Body)
	u.note(len(b))
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "ran %d with %d bytes", n, len(b))
}

func (u *expectUpstream) note(n int) {
	u.mu.Lock()
	u.read = append(u.read, n)
	u.mu.Unlock()
}

func (u *expectUpstream) seen() ([]http.Header, []int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]http.Header(nil), u.header...), append([]int(nil), u.read...)
}

// expectRig is the proxy behind a real TCP listener, reached with net.Dial,
// in front of u served over in-memory connections (net.Pipe), which buffer
// nothing: an upstream that does not read a body leaves it in the proxy.
func expectRig(t *testing.T, yaml string, u http.Handler) (*rig, string) {
	t.Helper()
	cfg, err := idemproxy.ParseConfig([]byte("upstream: http://upstream.invalid\n" + yaml))
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, cfg, idemproxy.Options{Transport: memUpstream(t, u)})
	front := httptest.NewServer(r.proxy)
	t.Cleanup(front.Close)
	return r, front.Listener.Addr().String()
}

// exchange is what a raw client read off one connection: how many
// "100 Continue" lines came, and the final answer.
type exchanged struct {
	continues int
	final     *http.Response
	body      string
}

// expectExchange sends head (the request's header block, with
// "Expect: 100-continue" among its fields) on a new connection, waits for
// the first interim answer as a client that honours Expect does, then sends
// body and reads everything up to the final answer's end. wait100 false
// sends the body at once, as a client that stops waiting would.
func expectExchange(t *testing.T, addr, head, body string, wait100 bool) exchanged {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second)) // a guard against a hang
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	var x exchanged
	if wait100 {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("waiting for 100 Continue: %v", err)
		}
		if resp.StatusCode != http.StatusContinue {
			b, _ := io.ReadAll(resp.Body)
			x.final, x.body = resp, string(b)
			return x
		}
		x.continues++
	}
	go io.WriteString(conn, body) // may fail once the proxy has answered and closed
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		if resp.StatusCode == http.StatusContinue {
			x.continues++
			continue
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		x.final, x.body = resp, string(b)
		return x
	}
}

func expectHead(key string, size int, extra ...string) string {
	return fmt.Sprintf("POST /upload HTTP/1.1\r\nHost: api.example\r\nIdempotency-Key: %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n", key, size, strings.Join(extra, ""))
}

// TestExpectContinueOnce: a protected request with "Expect: 100-continue"
// gets exactly one 100 Continue, the proxy's own when it starts reading
// the body for the fingerprint; the upstream, which gets the whole body
// from the proxy at once, never sees Expect (and so never sends a second
// 100, nor makes the transport wait for one).
func TestExpectContinueOnce(t *testing.T) {
	t.Parallel()
	u := &expectUpstream{}
	_, addr := expectRig(t, "", u)
	for _, size := range []int{100, 64 << 10} { // sent with the headers, and streamed
		body := strings.Repeat("x", size)
		x := expectExchange(t, addr, expectHead(fmt.Sprint("k", size), size, "Expect: 100-continue\r\n"), body, true)
		if x.continues != 1 || x.final == nil || x.final.StatusCode != http.StatusCreated {
			t.Fatalf("%d-byte body: %d 100 Continue lines, final %v %q; want one, then 201", size, x.continues, x.final, x.body)
		}
	}
	hs, read := u.seen()
	for i, h := range hs {
		if v := h.Values("Expect"); len(v) != 0 {
			t.Errorf("request %d reached the upstream with Expect %q", i+1, v)
		}
	}
	if len(read) != 2 || read[0] != 100 || read[1] != 64<<10 {
		t.Errorf("the upstream read %v bytes, want [100 65536]", read)
	}
}

// TestEarlyAnswerIsNotStored: an upstream that answers before it has taken
// the request's body (here 417, then it closes the connection, as servers
// refusing an expectation do) never ran the operation with it. Its answer
// reaches the client but is not stored: the key is released, and the
// retry RFC 9110 §10.1.1 prescribes (the same request, without Expect) is
// forwarded and runs, instead of replaying 417 until retention ends.
func TestEarlyAnswerIsNotStored(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusExpectationFailed, http.StatusRequestEntityTooLarge, http.StatusServiceUnavailable} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			t.Parallel()
			u := &expectUpstream{early: func(n int) int {
				if n == 1 {
					return code
				}
				return 0
			}}
			// A body past net/http's own discard of an unread body (256
			// KiB after the handler returns), so that the upstream's server
			// never drains it and the transport cannot have handed it all
			// over when the answer comes.
			r, addr := expectRig(t, "max_body: 2097152\nmax_body_memory: 8388608\n", u)
			const size = 1 << 20
			body := strings.Repeat("x", size)
			x := expectExchange(t, addr, expectHead("k", size, "Expect: 100-continue\r\n"), body, true)
			if x.final == nil || x.final.StatusCode != code || x.body != "refused unread" || x.continues != 1 {
				t.Fatalf("first try: %d 100 Continue, final %v %q; want one, then the upstream's %d", x.continues, x.final, x.body, code)
			}
			if got := r.state(t, "/upload", "k"); got != "gone" {
				t.Fatalf("after an answer given without the body the record is %s, want gone (released)", got)
			}
			x = expectExchange(t, addr, expectHead("k", size), body, false)
			if x.final.StatusCode != http.StatusCreated || x.final.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("the retry without Expect: %d (replayed %q) %q; want 201, run", x.final.StatusCode, x.final.Header.Get("Idempotent-Replayed"), x.body)
			}
			x = expectExchange(t, addr, expectHead("k", size), body, false)
			if x.final.StatusCode != http.StatusCreated || x.final.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("a second retry: %d (replayed %q); want the stored 201", x.final.StatusCode, x.final.Header.Get("Idempotent-Replayed"))
			}
			if _, read := u.seen(); len(read) != 2 || read[1] != size {
				t.Fatalf("the upstream read %v bytes; want [0 %d]: refused once, run once", read, size)
			}
		})
	}
}

// TestEarlyOtherAnswersFollowThePolicy: only a refusal (4xx) given before
// the body is passed on unstored. A 2xx that early is the upstream acting
// on the headers alone, and a 500 a failure of unknown effect: both are
// stored as the route's policy says, and replayed.
func TestEarlyOtherAnswersFollowThePolicy(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusAccepted, http.StatusInternalServerError} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			t.Parallel()
			u := &expectUpstream{early: func(int) int { return code }}
			r, addr := expectRig(t, "", u)
			const size = 256 << 10
			body := strings.Repeat("x", size)
			if x := expectExchange(t, addr, expectHead("k", size), body, false); x.final.StatusCode != code {
				t.Fatalf("first try: %d %q", x.final.StatusCode, x.body)
			}
			if got, want := r.state(t, "/upload", "k"), fmt.Sprint("completed ", code); string(got) != want {
				t.Fatalf("record %s, want %s", got, want)
			}
			if x := expectExchange(t, addr, expectHead("k", size), body, false); x.final.StatusCode != code || x.final.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("retry: %d (replayed %q); want the stored %d", x.final.StatusCode, x.final.Header.Get("Idempotent-Replayed"), code)
			}
		})
	}
}
