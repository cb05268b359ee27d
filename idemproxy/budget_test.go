package idemproxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-dev/idem/idemproxy"
)

// TestBodyMemoryIsHeldByBytesReceived: max_body_memory is charged as a
// body's bytes arrive, never at the length it announces. Connections that
// announce max_body and send one byte hold 512 bytes each (their first
// room), so a protected request beside them passes, where each used to
// hold its whole announced length and leave everyone else 503 busy until
// read_timeout. Bodies that do arrive still fill the budget: the one that
// finds no room left gets 503 busy with Retry-After at once, unrun and
// unreserved. Once every connection is done, nothing is held.
func TestBodyMemoryIsHeldByBytesReceived(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var runs counter
		tr := memUpstream(t, runs.wrap(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "got %d bytes", len(b))
		}))
		const maxBody, budget = 1 << 20, 4 << 20
		cfg, err := idemproxy.ParseConfig(fmt.Appendf(nil, "upstream: http://upstream.invalid\nmax_body: %d\nmax_body_memory: %d\n", maxBody, budget))
		if err != nil {
			t.Fatal(err)
		}
		r := newRig(t, cfg, idemproxy.Options{Transport: tr})
		dial := memFront(t, r.proxy)
		head := func(key string, n int) string {
			return fmt.Sprintf("POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", key, n)
		}
		var conns []net.Conn
		send := func(req string) *bufio.Reader {
			conn := dial()
			conns = append(conns, conn)
			t.Cleanup(func() { conn.Close() }) // also when the test fails
			go io.WriteString(conn, req)
			return bufio.NewReader(conn)
		}
		read := func(br *bufio.Reader) (*http.Response, string) {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			return resp, string(b)
		}
		// Eight times max_body announced, twice the budget, one byte sent.
		for i := range 8 {
			send(head(fmt.Sprint("stall-", i), maxBody) + "x")
		}
		synctest.Wait()
		if used := idemproxy.BodyMemoryUsed(r.proxy); used != 8*512 {
			t.Fatalf("eight bodies of one byte hold %d bytes, want 8 × 512", used)
		}
		if resp, got := read(send(head("legit", 12) + `{"amount":1}`)); resp.StatusCode != http.StatusCreated {
			t.Fatalf("a protected request beside announced lengths: %d %s; want 201", resp.StatusCode, got)
		}
		// Bodies that arrive are held: three of max_body − 1 bytes, stalled
		// before their last byte, hold three times their length and a byte.
		big := strings.Repeat("y", maxBody-2)
		for i := range 3 {
			send(head(fmt.Sprint("big-", i), maxBody-1) + big)
		}
		synctest.Wait()
		if used, want := idemproxy.BodyMemoryUsed(r.proxy), int64(8*512+3*maxBody); used != want {
			t.Fatalf("three large bodies and eight bytes hold %d bytes, want %d", used, want)
		}
		resp, got := read(send(head("over", maxBody-1) + big + "y"))
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || resp.Header.Get("Idempotency-Outcome") != "busy" {
			t.Fatalf("a body that finds no room left: %d %v %s; want 503 busy with Retry-After", resp.StatusCode, resp.Header, got)
		}
		if st := r.state(t, "/pay", "over"); st != "gone" {
			t.Fatalf("a body refused busy left record %s", st)
		}
		for _, c := range conns {
			c.Close()
		}
		synctest.Wait()
		if used := idemproxy.BodyMemoryUsed(r.proxy); used != 0 {
			t.Fatalf("%d bytes held after every connection is done", used)
		}
		if n := runs.n.Load(); n != 1 {
			t.Fatalf("upstream ran %d times, want 1", n)
		}
		outlastHeartbeat()
	})
}

// TestBodyMemoryMustFitEveryBody: a max_body_memory below a route's
// max_body could never read such a body; the configuration is refused.
func TestBodyMemoryMustFitEveryBody(t *testing.T) {
	t.Parallel()
	for _, yaml := range []string{
		"upstream: http://h\nmax_body_memory: 1000\n",                 // the default max_body, 1 MiB
		"upstream: http://h\nmax_body: 1000\nmax_body_memory: 1000\n", // no room for the byte that ends it
		"upstream: http://h\nmax_body: 100\nmax_body_memory: 1000\nroutes:\n  - match: POST /upload\n    max_body: 5000\n",
		"upstream: http://h\nmax_body_memory: -1\n",
		"upstream: http://h\nmax_connections: -1\n",
		"upstream: http://h\nclient_write_timeout: -1s\n",
	} {
		cfg, err := idemproxy.ParseConfig([]byte(yaml))
		if err == nil {
			err = cfg.WithDefaults().Validate()
		}
		if err == nil {
			t.Errorf("accepted %q", yaml)
		}
	}
}

// TestOverLimitAnsweredAtOnce: a body over max_body gets 413 as soon as the
// proxy knows it, even when the client then stalls: at once for a
// Content-Length over the limit, and the moment a chunked body passes it.
// The answer closes the connection; the proxy's server used to read what
// was left of the body (up to 256 KiB) before answering, so a stalled
// client got its 413 only at read_timeout (never, here: the front has
// none, and the connection's deadline is only a guard against a hang).
func TestOverLimitAnsweredAtOnce(t *testing.T) {
	t.Parallel()
	e := newEdgeRig(t, idemproxy.Config{Settings: idemproxy.Settings{MaxBody: ptr[int64](1000)}})
	for _, tc := range []struct{ name, req string }{
		{"Content-Length", "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: a\r\nContent-Length: 2000\r\n\r\n" + strings.Repeat("x", 10)},
		{"chunked", "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: b\r\nTransfer-Encoding: chunked\r\n\r\n3e9\r\n" + strings.Repeat("x", 1001) + "\r\n"},
	} {
		conn, err := net.Dial("tcp", e.front.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(20 * time.Second)) // a guard against a hang
		if _, err := io.WriteString(conn, tc.req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: no answer while the body stalls: %v", tc.name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !resp.Close {
			t.Fatalf("%s: %d, close %v; want 413, closing the connection", tc.name, resp.StatusCode, resp.Close)
		}
	}
	if n := len(e.up.requests()); n != 0 {
		t.Fatalf("the upstream got %d requests", n)
	}
}
