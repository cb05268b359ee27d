package idemproxy_test

import (
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
		mu    sync.Mutex
		seen  = map[string]int{} // requests per upstream connection
		crash = map[string]int{} // runs of /crash
	)
	tp := newTestProxy(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.RemoteAddr]++
		nth := seen[r.RemoteAddr]
		if r.URL.Path == "/crash" {
			crash[r.Header.Get("Idempotency-Key")]++
		}
		mu.Unlock()
		if r.URL.Path == "/crash" && nth > 1 {
			// Ran it, then lost the connection on a reused keep-alive
			// connection before answering.
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		io.WriteString(w, "ok")
	})
	post := func(path, key string) int {
		req, _ := http.NewRequest(http.MethodPost, tp.url+path, nil) // no body
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// The first request opens the keep-alive connection to the upstream;
	// the second reuses it, runs, and loses it.
	if code := post("/warm", "k1"); code != http.StatusOK {
		t.Fatalf("warm-up: %d", code)
	}
	code := post("/crash", "k2")
	mu.Lock()
	runs := crash["k2"]
	mu.Unlock()
	if runs != 1 {
		t.Fatalf("upstream ran the request %d times; http.Transport re-sent it", runs)
	}
	if code != http.StatusBadGateway {
		t.Fatalf("status %d, want 502 (outcome unknown)", code)
	}
	if code := post("/crash", "k2"); code != http.StatusConflict {
		t.Fatalf("retry: %d, want 409 needs review", code)
	}
}
