package idemproxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
)

// TestLongPath checks that a protected request whose path makes the
// operation longer than idem keeps gets 414 without reaching the store or
// the upstream, while an unprotected one still passes.
func TestLongPath(t *testing.T) {
	t.Parallel()
	tp := newTestProxy(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })

	path := "/orders/" + strings.Repeat("o", idem.MaxOperationLength)
	do := func(method string) *http.Response {
		resp, _ := tp.send(t, method, path, "k", strings.NewReader("{}"))
		return resp
	}
	for range 2 {
		resp := do(http.MethodPost)
		if resp.StatusCode != http.StatusRequestURITooLong || resp.Header.Get("Idempotency-Outcome") != "too_long" {
			t.Fatalf("POST with a long path: %d, outcome %q", resp.StatusCode, resp.Header.Get("Idempotency-Outcome"))
		}
	}
	if tp.runs.Load() != 0 {
		t.Fatalf("upstream ran %d times for refused requests", tp.runs.Load())
	}
	if resp := do(http.MethodGet); resp.StatusCode != http.StatusOK || tp.runs.Load() != 1 {
		t.Fatalf("GET with a long path: %d, upstream runs %d", resp.StatusCode, tp.runs.Load())
	}
}
