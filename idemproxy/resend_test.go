package idemproxy_test

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
)

// TestNoSilentResendOfBodilessRequests guards the at-most-once promise
// against http.Transport: it re-sends a request whose reused keep-alive
// connection broke before an answer came, if the request has no body and
// carries an Idempotency-Key (it counts as replayable then). An upstream
// that ran the request and then lost the connection would run it twice.
// The proxy must answer 502 and send the key to review instead.
func TestNoSilentResendOfBodilessRequests(t *testing.T) {
	t.Parallel()
	var (
		mu      sync.Mutex
		seen    = map[string]int{}  // requests per upstream connection
		runs    = map[string]int{}  // runs of /crash per key
		crashed = map[string]bool{} // keys whose run lost its connection
	)
	tp := newTestProxy(t, func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		seen[r.RemoteAddr]++
		reused := seen[r.RemoteAddr] > 1
		if r.URL.Path == "/crash" {
			runs[key]++
			crashed[key] = crashed[key] || reused
		}
		mu.Unlock()
		if r.URL.Path == "/crash" && reused {
			// Ran it, then lost the reused keep-alive connection before
			// answering.
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		io.WriteString(w, "ok")
	})
	post := func(path, key string) int {
		resp, _ := tp.send(t, http.MethodPost, path, key, nil) // no body
		return resp.StatusCode
	}
	// A warm-up request leaves a keep-alive connection to the upstream, and
	// the next one normally reuses it. If the transport dialled afresh
	// instead (it puts a connection back as idle asynchronously), the crash
	// did not happen: try again with new keys.
	for attempt := range 10 {
		if code := post("/warm", fmt.Sprint("warm-", attempt)); code != http.StatusOK {
			t.Fatalf("warm-up: %d", code)
		}
		key := fmt.Sprint("crash-", attempt)
		code := post("/crash", key)
		mu.Lock()
		n, hit := runs[key], crashed[key]
		mu.Unlock()
		if !hit && n == 1 && code == http.StatusOK {
			continue // ran on a fresh connection; nothing to test this time
		}
		if n != 1 {
			t.Fatalf("upstream ran the request %d times; http.Transport re-sent it", n)
		}
		if code != http.StatusBadGateway {
			t.Fatalf("status %d, want 502 (outcome unknown)", code)
		}
		if code := post("/crash", key); code != http.StatusConflict {
			t.Fatalf("retry: %d, want 409 needs review", code)
		}
		return
	}
	t.Fatal("in 10 attempts the transport never reused the upstream connection, so the resend case was never exercised")
}
