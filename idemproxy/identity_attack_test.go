package idemproxy_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/idemstore"
)

// hostPost is a raw request with a Host line of its own (none when host is
// "-", as HTTP/1.0 allows), a key, a JSON body and extra header lines.
func hostPost(proto, host, key, body string, hdr ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "POST /orders %s\r\n", proto)
	if host != "-" {
		fmt.Fprintf(&b, "Host: %s\r\n", host)
	}
	fmt.Fprintf(&b, "Idempotency-Key: %s\r\n", key)
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	fmt.Fprintf(&b, "Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	return b.String()
}

// one sends req on its own connection and returns its one answer.
func (e *edgeRig) one(t *testing.T, req string) answer {
	t.Helper()
	got := e.raw(t, req, 1)
	if len(got) != 1 {
		t.Fatalf("no answer to %q", req)
	}
	return got[0]
}

// TestHostIsPartOfOperation: two shops behind one upstream, which routes
// tenants by the Host it reads as X-Forwarded-Host. One credential, key,
// path and body sent to shop B after shop A is shop B's order: it runs,
// and is not answered with shop A's. The same host spelt otherwise (case,
// a trailing dot, the default port, an IDN as Unicode or A-labels) is the
// same operation and replays.
func TestHostIsPartOfOperation(t *testing.T) {
	e := newEdgeRig(t, idemproxy.Config{})
	body := `{"sku":"tea","qty":1}`
	auth := []string{"Authorization", "Bearer one-credential"}

	a := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "k", body, auth...))
	b := e.one(t, hostPost("HTTP/1.1", "shop-b.example", "k", body, auth...))
	if a.Status != 201 || a.Body != "ran 1" || b.Status != 201 || b.Body != "ran 2" || b.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("shop B got %v after shop A's %v; want its own order run", b, a)
	}
	seen := e.up.requests()
	if got := seen[1].Header.Get("X-Forwarded-Host"); got != "shop-b.example" {
		t.Fatalf("the upstream read X-Forwarded-Host %q for shop B", got)
	}

	for _, host := range []string{"SHOP-A.Example", "shop-a.example.", "shop-a.example:80", "shop-a.example:"} {
		got := e.one(t, hostPost("HTTP/1.1", host, "k", body, auth...))
		if got.Body != "ran 1" || got.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("Host %q: %v, want shop A's answer replayed", host, got)
		}
	}
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example:8443", "k", body, auth...)); got.Body != "ran 3" {
		t.Errorf("another port: %v, want an operation of its own", got)
	}

	// An absolute-form request-target names the authority, whatever the
	// Host line says (RFC 9112 §3.2.2), and the upstream reads it so.
	abs := strings.Replace(hostPost("HTTP/1.1", "shop-a.example", "k", body, auth...), "/orders", "http://shop-c.example/orders", 1)
	if got := e.one(t, abs); got.Body != "ran 4" {
		t.Errorf("absolute-form shop C with Host shop A: %v, want shop C's order run", got)
	}
	if got := e.up.requests()[3].Header.Get("X-Forwarded-Host"); got != "shop-c.example" {
		t.Errorf("the upstream read X-Forwarded-Host %q", got)
	}

	// An internationalised name, as Unicode (percent-encoded in an
	// absolute-form target: Go's server refuses raw UTF-8 in Host) and
	// as A-labels.
	idn := strings.Replace(hostPost("HTTP/1.1", "x", "k", body, auth...), "/orders", "http://b%C3%BCcher.example/orders", 1)
	u := e.one(t, idn)
	x := e.one(t, hostPost("HTTP/1.1", "XN--BCHER-KVA.example", "k", body, auth...))
	if u.Status != 201 || x.Body != u.Body || x.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("bücher.example %v, then its A-labels %v: want one operation", u, x)
	}
	if n := len(e.up.requests()); n != 5 {
		t.Errorf("the upstream ran %d times, want 5", n)
	}
}

// TestHostMissingOnHTTP10: an HTTP/1.0 request may carry no Host. It is an
// operation of its own, apart from every host's, and still protected.
func TestHostMissingOnHTTP10(t *testing.T) {
	e := newEdgeRig(t, idemproxy.Config{})
	body := `{}`
	a := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "k", body))
	n1 := e.one(t, hostPost("HTTP/1.0", "-", "k", body))
	n2 := e.one(t, hostPost("HTTP/1.0", "-", "k", body))
	if a.Body != "ran 1" || n1.Body != "ran 2" || n2.Body != "ran 2" || n2.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("shop A %v; without Host %v, then %v; want its own operation, replayed", a, n1, n2)
	}
}

// TestHostAliases: hosts a route names as one API share their operations;
// "*" makes every host one; a route's list replaces the global one.
func TestHostAliases(t *testing.T) {
	e := newEdgeRig(t, idemproxy.Config{
		Settings: idemproxy.Settings{HostAliases: []string{"Shop.Example", "www.shop.example."}},
		Routes: []idemproxy.Route{{Match: idemproxy.Pattern{Pattern: "POST /orders"},
			Settings: idemproxy.Settings{HostAliases: []string{"*"}}}},
	})
	// The route makes every host one.
	a := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "k", `{}`))
	b := e.one(t, hostPost("HTTP/1.1", "shop-b.example", "k", `{}`))
	if a.Body != "ran 1" || b.Body != "ran 1" || b.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf(`host_aliases ["*"]: %v then %v, want one operation`, a, b)
	}
	// Elsewhere, the global aliases.
	send := func(host, key string) answer {
		return e.one(t, strings.Replace(hostPost("HTTP/1.1", host, key, `{}`), "/orders", "/carts", 1))
	}
	c := send("shop.example", "k")
	d := send("WWW.shop.example:443", "k")
	f := send("api.example", "k")
	if c.Body != "ran 2" || d.Body != "ran 2" || d.Header.Get("Idempotent-Replayed") != "true" || f.Body != "ran 3" {
		t.Fatalf("aliases: %v, %v, then another host %v", c, d, f)
	}
}

// TestTwoUpstreamsShareStore: two proxies in front of different APIs share
// one store, as docs/capacity.md sets them up. One key and credential on
// POST /orders are two operations: each API runs its own, and neither
// gets the other's answer or a 422.
func TestTwoUpstreamsShareStore(t *testing.T) {
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	quiet := slog.New(slog.DiscardHandler)
	engine, err := idem.NewEngine(store, idem.EngineConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	front := func(name string) (*edgeRig, *recordingUpstream) {
		up := &recordingUpstream{}
		srv := httptest.NewServer(up)
		t.Cleanup(srv.Close)
		p, err := idemproxy.New(engine, idemproxy.Config{Upstream: srv.URL + "/" + name}, idemproxy.Options{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		e := &edgeRig{proxy: p, front: httptest.NewServer(p), up: up}
		t.Cleanup(e.front.Close)
		return e, up
	}
	orders, ordersUp := front("orders")
	billing, billingUp := front("billing")
	auth := []string{"Authorization", "Bearer one-credential"}
	a := orders.one(t, hostPost("HTTP/1.1", "api.example", "k", `{"n":1}`, auth...))
	b := billing.one(t, hostPost("HTTP/1.1", "api.example", "k", `{"n":1}`, auth...))
	c := billing.one(t, hostPost("HTTP/1.1", "api.example", "k2", `{"n":1}`, auth...))
	d := orders.one(t, hostPost("HTTP/1.1", "api.example", "k2", `{"n":2}`, auth...))
	if a.Status != 201 || b.Status != 201 || b.Header.Get("Idempotent-Replayed") != "" || d.Status != 201 {
		t.Fatalf("orders %v, then billing %v; billing %v, then orders with another body %v: want each run by its own API", a, b, c, d)
	}
	if len(ordersUp.requests()) != 2 || len(billingUp.requests()) != 2 {
		t.Fatalf("orders ran %d, billing %d; want 2 each", len(ordersUp.requests()), len(billingUp.requests()))
	}
}

// TestUpstreamNameJoinsProxies: proxies that reach one API by different
// URLs share its operations when they give it one upstream_name.
func TestUpstreamNameJoinsProxies(t *testing.T) {
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	quiet := slog.New(slog.DiscardHandler)
	engine, err := idem.NewEngine(store, idem.EngineConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	up := &recordingUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	var fronts []*edgeRig
	for _, u := range []string{srv.URL, strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)} {
		p, err := idemproxy.New(engine, idemproxy.Config{Upstream: u, UpstreamName: "orders"}, idemproxy.Options{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		e := &edgeRig{proxy: p, front: httptest.NewServer(p), up: up}
		t.Cleanup(e.front.Close)
		fronts = append(fronts, e)
	}
	auth := []string{"Authorization", "Bearer c"}
	a := fronts[0].one(t, hostPost("HTTP/1.1", "api.example", "k", `{}`, auth...))
	b := fronts[1].one(t, hostPost("HTTP/1.1", "api.example", "k", `{}`, auth...))
	if a.Body != "ran 1" || b.Body != "ran 1" || b.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("one upstream_name: %v then %v, want the replay", a, b)
	}
}

// TestScopeHeaderTheUpstreamNeverSees: scope headers that Go's server or
// the proxy keeps from the upstream (Host, hop-by-hop, X-Forwarded-*) are
// refused at start, from flags and YAML alike.
func TestScopeHeaderTheUpstreamNeverSees(t *testing.T) {
	for _, name := range []string{"Host", "host", "Connection", "Proxy-Authorization", "X-Forwarded-Host", "Forwarded", "Transfer-Encoding"} {
		cfg := idemproxy.Config{Upstream: "http://127.0.0.1:1", Settings: idemproxy.Settings{ScopeHeader: idemproxy.Names{name}}}
		if err := cfg.WithDefaults().Validate(); err == nil || !strings.Contains(err.Error(), "scope_header") {
			t.Errorf("scope_header %s: %v, want refused", name, err)
		}
		yml := "upstream: http://127.0.0.1:1\nroutes:\n  - match: POST /pay\n    scope_header: [Authorization, " + name + "]\n"
		if _, err := idemproxy.ParseConfig([]byte(yml)); err == nil {
			t.Errorf("YAML scope_header %s on a route: accepted", name)
		}
	}
	for _, bad := range [][]string{{"*", "a.example"}, {"a b"}, {""}} {
		cfg := idemproxy.Config{Upstream: "http://127.0.0.1:1", Settings: idemproxy.Settings{HostAliases: bad}}
		if err := cfg.WithDefaults().Validate(); err == nil {
			t.Errorf("host_aliases %q: accepted", bad)
		}
	}
	cfg := idemproxy.Config{Upstream: "http://127.0.0.1:1", UpstreamName: "two words"}
	if err := cfg.WithDefaults().Validate(); err == nil {
		t.Error("upstream_name with a space: accepted")
	}
}

// TestConnectionKeepsCredentials: a client naming its credential in
// Connection made the proxy scope the request by it, then forward it
// without it, as hop by hop: an upstream that takes a request without one
// for its default tenant ran it for the wrong tenant. The scope's header
// or cookie reaches the upstream, whatever Connection says.
func TestConnectionKeepsCredentials(t *testing.T) {
	for _, tt := range []struct {
		name   string
		cfg    idemproxy.Config
		hdr    []string
		header string // the header the upstream must see
		want   string
	}{
		{"Authorization", idemproxy.Config{}, []string{"Authorization", "Bearer tenant-a", "Connection", "Authorization"}, "Authorization", "Bearer tenant-a"},
		{"a scope header", idemproxy.Config{Settings: idemproxy.Settings{ScopeHeader: idemproxy.Names{"X-Tenant", "X-Api-Key"}}},
			[]string{"X-Api-Key", "secret-a", "Connection", "keep-alive, x-api-key"}, "X-Api-Key", "secret-a"},
		{"a scope cookie", idemproxy.Config{Settings: idemproxy.Settings{ScopeCookie: idemproxy.Names{"session"}}},
			[]string{"Cookie", "session=tenant-a; theme=dark", "Connection", "Cookie"}, "Cookie", "session=tenant-a; theme=dark"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Anonymous = idemproxy.AnonymousReject
			e := newEdgeRig(t, tt.cfg)
			got := e.one(t, hostPost("HTTP/1.1", "api.example", "k", `{}`, tt.hdr...))
			seen := e.up.requests()
			if got.Status != 201 || len(seen) != 1 {
				t.Fatalf("%v, the upstream ran %d times", got, len(seen))
			}
			if v := seen[0].Header.Get(tt.header); v != tt.want {
				t.Fatalf("the upstream got %s %q, want %q: the scope's credential must reach it", tt.header, v, tt.want)
			}
			// Unprotected requests keep hop-by-hop semantics.
			get := strings.Replace(hostPost("HTTP/1.1", "api.example", "k", ``, tt.hdr...), "POST", "GET", 1)
			e.one(t, get)
			if seen := e.up.requests(); len(seen) != 2 || seen[1].Header.Get(tt.header) != "" {
				t.Errorf("an unprotected GET naming %s in Connection: the upstream got it", tt.header)
			}
		})
	}
}

// TestLegacyOperationAcrossUpgrade: records written by an earlier version,
// named by method and path alone, still hold their retries after the
// upgrade: a completed one replays, a pending one answers 409, and a
// different body under the key answers 422; none reaches the upstream.
// Other keys get the new names.
func TestLegacyOperationAcrossUpgrade(t *testing.T) {
	e := newEdgeRig(t, idemproxy.Config{})
	engine, err := idem.NewEngine(e.store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	// The earlier version: the middleware with its operation name.
	old := idem.Middleware(engine, idem.Config{
		Scope:     idemproxy.NewScope(idemproxy.ScopeSources{}, nil, idemproxy.AnonymousShared),
		Operation: func(r *http.Request) string { return r.Method + " " + r.URL.EscapedPath() },
	})
	ran := 0
	var hold chan struct{}
	started := make(chan struct{})
	oldProxy := old(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran++
		if hold != nil {
			close(started)
			<-hold
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "old ran")
	}))
	req := httptest.NewRequest("POST", "http://shop-a.example/orders", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "done")
	req.Header.Set("Content-Type", "application/json")
	oldProxy.ServeHTTP(httptest.NewRecorder(), req)
	if rec, err := e.store.Get(t.Context(), idemstore.Key{Scope: idemproxy.AnonymousScope, Operation: "POST /orders", Key: "done"}); err != nil || rec.State != idemstore.StateCompleted {
		t.Fatalf("the earlier version stored %v %v", rec, err)
	}
	// A request in flight through the earlier version.
	hold = make(chan struct{})
	inFlight := make(chan struct{})
	go func() {
		defer close(inFlight)
		req := httptest.NewRequest("POST", "http://shop-a.example/orders", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "pending")
		req.Header.Set("Content-Type", "application/json")
		oldProxy.ServeHTTP(httptest.NewRecorder(), req)
	}()
	<-started // its key is reserved before its handler runs
	if rec, err := e.store.Get(t.Context(), idemstore.Key{Scope: idemproxy.AnonymousScope, Operation: "POST /orders", Key: "pending"}); err != nil || rec.State != idemstore.StatePending {
		t.Fatalf("the earlier version's key in flight: %v %v", rec, err)
	}

	got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "done", `{}`))
	if got.Status != 201 || got.Body != "old ran" || got.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("completed before the upgrade: %v, want its answer replayed", got)
	}
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "pending", `{}`)); got.Status != http.StatusConflict {
		t.Errorf("in flight across the upgrade: %v, want 409", got)
	}
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "done", `{"other":1}`)); got.Status != http.StatusUnprocessableEntity {
		t.Errorf("another body under a key stored before the upgrade: %v, want 422", got)
	}
	close(hold)
	<-inFlight
	if n := len(e.up.requests()); n != 0 || ran != 2 {
		t.Fatalf("the upstream ran %d times, the earlier version %d; want 0 and 2", n, ran)
	}
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "new", `{}`)); got.Body != "ran 1" {
		t.Fatalf("a new key: %v", got)
	}
	if _, err := e.store.Get(t.Context(), idemstore.Key{Scope: idemproxy.AnonymousScope, Operation: "POST /orders", Key: "new"}); !errors.Is(err, idemstore.ErrNotFound) {
		t.Errorf("a new key under the earlier name: %v, want none", err)
	}
}

// getFails is a store whose reads fail: the look-up of an earlier
// version's record cannot tell whether there is one.
type getFails struct{ idemstore.Store }

func (getFails) Get(context.Context, idemstore.Key) (*idemstore.Record, error) {
	return nil, errors.New("connection reset")
}

// TestLegacyLookupFailsClosed: when the store cannot say whether a record
// of an earlier version holds the key, the request gets 503 and is not
// forwarded: forwarding it under the new name could run a retry of a
// request that already ran. Without the look-up it is forwarded.
func TestLegacyLookupFailsClosed(t *testing.T) {
	for _, legacy := range []bool{true, false} {
		up := &recordingUpstream{}
		srv := httptest.NewServer(up)
		t.Cleanup(srv.Close)
		mem := idemmem.MustNew(idemmem.Config{})
		t.Cleanup(func() { mem.Close() })
		quiet := slog.New(slog.DiscardHandler)
		engine, err := idem.NewEngine(getFails{mem}, idem.EngineConfig{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		p, err := idemproxy.New(engine, idemproxy.Config{Upstream: srv.URL, LegacyOperations: &legacy, Settings: idemproxy.Settings{Anonymous: idemproxy.AnonymousShared}},
			idemproxy.Options{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		e := &edgeRig{proxy: p, front: httptest.NewServer(p), up: up}
		t.Cleanup(e.front.Close)
		got := e.one(t, hostPost("HTTP/1.1", "api.example", "k", `{}`))
		switch {
		case legacy && (got.Status != http.StatusServiceUnavailable || got.Header.Get("Retry-After") == "" || len(up.requests()) != 0):
			t.Errorf("the look-up failed: %v, the upstream ran %d times; want 503 with Retry-After, not forwarded", got, len(up.requests()))
		case !legacy && got.Status != http.StatusCreated:
			t.Errorf("legacy_operations off: %v, want forwarded", got)
		}
	}
}
