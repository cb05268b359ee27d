package idemproxy_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/idemstore"
)

// TestShutdownReleasesUnforwarded: once shutdown has begun, a protected
// request that was not forwarded yet gets 503 shutting-down with
// Retry-After, the upstream never sees it, and its key is released so that
// a retry (after a restart, or on another instance) runs it.
func TestShutdownReleasesUnforwarded(t *testing.T) {
	t.Parallel()
	tp := newTestProxy(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	tp.proxy.BeginShutdown()

	resp, body := tp.send(t, http.MethodPost, "/pay", "k", strings.NewReader("{}"))
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "#shutting-down") {
		t.Fatalf("during shutdown: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if n := tp.runs.Load(); n != 0 {
		t.Fatalf("upstream ran %d times during shutdown", n)
	}
	if _, err := getRecord(t.Context(), tp.store, idemproxy.AnonymousScope, "POST /pay", "k"); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("key after a refused request: %v, want released (ErrNotFound)", err)
	}
	// Unprotected requests still pass while the server drains.
	if resp, err := tp.client.Get(tp.url + "/pay"); err != nil || resp.StatusCode != http.StatusOK || tp.runs.Load() != 1 {
		t.Fatalf("GET during shutdown: %v, %v", resp, err)
	}
}
