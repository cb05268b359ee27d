package idemproxy_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/internal/testenv"
)

// TestNewKeysPerScopeUnsentRetriesCountOnce: a key the proxy released
// because its request never reached the upstream (the upstream was down)
// holds nothing in the store and ran nothing, so its reservation is given
// back to the scope's count: a client retrying one key through an outage
// does not spend its cap on it, and is not refused its next new keys when
// the upstream is back.
func TestNewKeysPerScopeUnsentRetriesCountOnce(t *testing.T) {
	t.Parallel()
	var ran atomic.Int32
	tr := memUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		ran.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	dial := tr.DialContext
	var dials atomic.Int32
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dials.Add(1) <= 3 {
			return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("connection refused")}
		}
		return dial(ctx, network, addr)
	}
	cfg, err := idemproxy.ParseConfig([]byte("upstream: http://upstream.invalid\nnew_keys_per_scope: 2/1m\n"))
	if err != nil {
		t.Fatal(err)
	}
	var clock *testenv.Clock
	r := newRig(t, cfg, idemproxy.Options{Transport: tr, Now: func() time.Time { return clock.Now() }})
	clock = r.clock
	front := httptest.NewServer(r.proxy)
	t.Cleanup(front.Close)
	addr := front.Listener.Addr().String()

	send := func(key string) *http.Response {
		t.Helper()
		x := expectExchange(t, addr, expectHead(key, 5), "hello", false)
		return x.final
	}
	for i := range 3 {
		if resp := send("k1"); resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("try %d of k1 while the upstream is down: %d, want 502", i+1, resp.StatusCode)
		}
	}
	for _, key := range []string{"k1", "k2"} {
		if resp := send(key); resp.StatusCode != http.StatusCreated {
			t.Fatalf("%s once the upstream is back: %d (%s), want 201: retries that never reached the upstream spent the cap", key, resp.StatusCode, resp.Header.Get("Idempotency-Outcome"))
		}
	}
	if resp := send("k3"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a third new key in the interval: %d, want 429", resp.StatusCode)
	}
	if n := ran.Load(); n != 2 {
		t.Fatalf("the upstream ran %d requests, want 2", n)
	}
}
