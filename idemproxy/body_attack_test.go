package idemproxy_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// TestNoSilentResendOfSmallBodies: a protected request whose body the
// proxy copies into memory for the transport (up to 2 KiB) must not become
// one http.Transport re-sends after a broken keep-alive connection. An
// upstream that ran the request and then lost the connection would run it
// twice; the proxy must answer 502 and send the key to review instead.
func TestNoSilentResendOfSmallBodies(t *testing.T) {
	t.Parallel()
	for _, method := range []string{http.MethodPost, http.MethodPatch} {
		t.Run(method, func(t *testing.T) {
			t.Parallel()
			var (
				mu      sync.Mutex
				seen    = map[string]int{}
				runs    = map[string]int{}
				crashed = map[string]bool{}
			)
			tp := newTestProxy(t, func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
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
					if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
						conn.Close()
					}
					return
				}
				io.WriteString(w, "ok")
			})
			send := func(path, key string) int {
				resp, _ := tp.send(t, method, path, key, strings.NewReader(`{"amount":100}`))
				return resp.StatusCode
			}
			for attempt := range 10 {
				if code := send("/warm", fmt.Sprint("warm-", attempt)); code != http.StatusOK {
					t.Fatalf("warm-up: %d", code)
				}
				key := fmt.Sprint("crash-", attempt)
				code := send("/crash", key)
				mu.Lock()
				n, hit := runs[key], crashed[key]
				mu.Unlock()
				if !hit && n == 1 && code == http.StatusOK {
					continue
				}
				if n != 1 {
					t.Fatalf("upstream ran the request %d times; http.Transport re-sent it", n)
				}
				if code != http.StatusBadGateway {
					t.Fatalf("status %d, want 502 (outcome unknown)", code)
				}
				if code := send("/crash", key); code != http.StatusConflict {
					t.Fatalf("retry: %d, want 409 needs review", code)
				}
				return
			}
			t.Fatal("the transport never reused the upstream connection in 10 attempts")
		})
	}
}
