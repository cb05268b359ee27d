package idemproxy_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
)

// TestServerReload: Reload swaps routes and policies and the log level in
// a running server, refuses a bad configuration whole, and names what only
// a restart applies.
func TestServerReload(t *testing.T) {
	t.Parallel()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }))
	t.Cleanup(upstream.Close)
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	parse := func(yaml string) idemproxy.Config {
		t.Helper()
		if !strings.Contains(yaml, "listen:") {
			yaml = "listen: 127.0.0.1:0\n" + yaml
		}
		c, err := idemproxy.ParseConfig([]byte("upstream: " + upstream.URL + "\nanonymous: shared\n" + yaml))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	level := new(slog.LevelVar)
	srv := &idemproxy.Server{Config: parse("routes:\n  - match: POST /pay\n    mode: observe\n"), Store: store,
		Logger: slog.New(slog.DiscardHandler), LogLevel: level}
	if _, err := srv.Reload(srv.Config); err != idemproxy.ErrNotRunning {
		t.Errorf("Reload before Run: %v", err)
	}
	ready := make(chan net.Addr, 1)
	srv.Ready = func(proxy, _ net.Addr) { ready <- proxy }
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	base := "http://" + (<-ready).String()
	// A transport of its own: httptest.Server.Close in a parallel test
	// closes http.DefaultTransport's idle connections.
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	status := func() int {
		t.Helper()
		resp, err := client.Post(base+"/pay", "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := status(); got != http.StatusCreated {
		t.Fatalf("observed keyless POST: %d", got)
	}

	restart, err := srv.Reload(parse("log_level: debug\nroutes:\n  - match: POST /pay\n    mode: enforce\n"))
	if err != nil || len(restart) != 0 {
		t.Fatalf("Reload: %v, restart %v", err, restart)
	}
	if got := status(); got != http.StatusBadRequest {
		t.Errorf("enforced keyless POST after Reload: %d", got)
	}
	if level.Level() != slog.LevelDebug {
		t.Errorf("log level %v after Reload", level.Level())
	}

	bad := parse("routes:\n  - match: POST /pay\n    mode: observe\n  - match: POST /pay\n")
	if _, err := srv.Reload(bad); err == nil || !strings.Contains(err.Error(), "conflicts") {
		t.Errorf("Reload of conflicting routes: %v", err)
	}
	if got := status(); got != http.StatusBadRequest {
		t.Errorf("after a refused Reload: %d, want the running routes (400)", got)
	}

	c := parse("listen: 127.0.0.1:1\nstore: memory://\nroutes:\n  - match: POST /pay\n    mode: observe\n    resolver_url: http://127.0.0.1:1/r\n")
	restart, err = srv.Reload(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"listen", "store", "resolver_url"} {
		if !slices.Contains(restart, want) {
			t.Errorf("restart %v lacks %s", restart, want)
		}
	}
	if got := status(); got != http.StatusCreated {
		t.Errorf("observed again after Reload: %d", got)
	}
	// What needs a restart was kept: the next reload does not name it again.
	if restart, _ := srv.Reload(parse("listen: 127.0.0.1:2\n")); !slices.Equal(restart, []string{"listen"}) {
		t.Errorf("second Reload: restart %v, want [listen]", restart)
	}
}
