package idemproxy_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
)

// TestLongPath checks that a protected request whose path makes the
// operation longer than idem keeps gets 414 without reaching the store or
// the upstream, while an unprotected one still passes.
func TestLongPath(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		io.WriteString(w, "ok")
	}))
	defer api.Close()
	store := idemmem.MustNew(idemmem.Config{})
	defer store.Close()
	engine, err := idem.NewEngine(store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := idemproxy.New(engine, idemproxy.Config{Upstream: api.URL}, idemproxy.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(proxy)
	defer front.Close()

	path := "/orders/" + strings.Repeat("o", idem.MaxOperationLength)
	do := func(method string) *http.Response {
		req, _ := http.NewRequest(method, front.URL+path, strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	for range 2 {
		resp := do(http.MethodPost)
		if resp.StatusCode != http.StatusRequestURITooLong || resp.Header.Get("Idempotency-Outcome") != "too_long" {
			t.Fatalf("POST with a long path: %d, outcome %q", resp.StatusCode, resp.Header.Get("Idempotency-Outcome"))
		}
	}
	if runs.Load() != 0 {
		t.Fatalf("upstream ran %d times for refused requests", runs.Load())
	}
	if resp := do(http.MethodGet); resp.StatusCode != http.StatusOK || runs.Load() != 1 {
		t.Fatalf("GET with a long path: %d, upstream runs %d", resp.StatusCode, runs.Load())
	}
}
