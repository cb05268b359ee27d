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

	"github.com/idem-dev/idem/idemproxy"
)

// TestBodyMemoryIsBounded: protected requests whose bodies are being read
// hold their length of max_body_memory (a chunked one, its route's
// max_body) until they are done; one that would go over it gets 503 busy
// with Retry-After at once, unread, and nothing is stored or run. Once a
// body is done with, its share is back.
func TestBodyMemoryIsBounded(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var runs counter
		tr := memUpstream(t, runs.wrap(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "got %d bytes", len(b))
		}))
		cfg, err := idemproxy.ParseConfig([]byte("upstream: http://upstream.invalid\nmax_body: 1000\nmax_body_memory: 2002\n"))
		if err != nil {
			t.Fatal(err)
		}
		r := newRig(t, cfg, idemproxy.Options{Transport: tr})
		dial := memFront(t, r.proxy)
		body := `{"pad":"` + strings.Repeat("x", 990) + `"}` // 1000 bytes
		head := func(key string) string {
			return fmt.Sprintf("POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", key, len(body))
		}
		send := func(req string) (net.Conn, *bufio.Reader) {
			conn := dial()
			t.Cleanup(func() { conn.Close() })
			go io.WriteString(conn, req)
			return conn, bufio.NewReader(conn)
		}
		read := func(br *bufio.Reader) (*http.Response, string) {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			return resp, string(b)
		}
		// Two bodies in flight, stalled: they hold 2 × 1001 bytes.
		c1, br1 := send(head("a") + body[:10])
		send(head("b") + body[:10])
		synctest.Wait()
		for _, req := range []string{
			head("c") + body,
			"POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: d\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
			"POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: e\r\nContent-Length: 2\r\n\r\n{}",
		} {
			_, br := send(req)
			resp, got := read(br)
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || resp.Header.Get("Idempotency-Outcome") != "busy" ||
				resp.Header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("a body over max_body_memory: %d %v %s; want 503 busy with Retry-After", resp.StatusCode, resp.Header, got)
			}
		}
		if got := r.state(t, "/pay", "c"); got != "gone" || runs.n.Load() != 0 {
			t.Fatalf("a refused request left record %s, upstream runs %d", got, runs.n.Load())
		}
		// A bodiless protected request holds nothing, and passes.
		_, br := send("POST /ping HTTP/1.1\r\nHost: x\r\nIdempotency-Key: f\r\nContent-Length: 0\r\n\r\n")
		if resp, got := read(br); resp.StatusCode != http.StatusCreated {
			t.Fatalf("a bodiless POST: %d %s", resp.StatusCode, got)
		}
		// The first body comes whole: it runs, and its share is back.
		go io.WriteString(c1, body[10:])
		if resp, got := read(br1); resp.StatusCode != http.StatusCreated || got != "got 1000 bytes" {
			t.Fatalf("the first body, finished: %d %s", resp.StatusCode, got)
		}
		_, br = send(head("c") + body)
		if resp, got := read(br); resp.StatusCode != http.StatusCreated {
			t.Fatalf("the refused request, retried: %d %s", resp.StatusCode, got)
		}
		if n := runs.n.Load(); n != 3 {
			t.Fatalf("upstream ran %d times, want 3", n)
		}
		outlastHeartbeat()
	})
}

// TestBodyMemoryMustFitEveryBody: a max_body_memory below a route's
// max_body could never read such a body; the configuration is refused.
func TestBodyMemoryMustFitEveryBody(t *testing.T) {
	t.Parallel()
	for _, yaml := range []string{
		"upstream: http://h\nmax_body_memory: 1000\n", // the default max_body, 1 MiB
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

// TestChunkedBodyCountsItsBuffer: a chunked body is read into a buffer
// grown by doubling, which ends up to twice its route's max_body (a body
// of 1 MiB − 1 byte in a 2 MiB buffer): it holds that much of
// max_body_memory, or all of it when that is less, so chunked bodies
// cannot hold twice the memory the setting allows.
func TestChunkedBodyCountsItsBuffer(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		tr := memUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusCreated)
		}))
		cfg, err := idemproxy.ParseConfig([]byte("upstream: http://upstream.invalid\nmax_body: 1000\nmax_body_memory: 2002\n"))
		if err != nil {
			t.Fatal(err)
		}
		r := newRig(t, cfg, idemproxy.Options{Transport: tr})
		dial := memFront(t, r.proxy)
		stalled := dial()
		defer stalled.Close()
		go io.WriteString(stalled, "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: a\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n")
		synctest.Wait()
		c := dial()
		defer c.Close()
		go io.WriteString(c, fmt.Sprintf("POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: b\r\nContent-Length: 1000\r\n\r\n%s", strings.Repeat("x", 1000)))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Idempotency-Outcome") != "busy" {
			t.Errorf("a body beside a chunked one that holds all of max_body_memory: %d %s; want 503 busy", resp.StatusCode, resp.Header.Get("Idempotency-Outcome"))
		}
		stalled.Close()
		synctest.Wait()
		outlastHeartbeat()
	})
}
