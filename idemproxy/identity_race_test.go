package idemproxy_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/idemstore"
)

// pauseLegacyGet is a store that holds the first look-up which finds a
// record under an earlier version's operation name (no " host="), after
// it has found it, until resume is closed.
type pauseLegacyGet struct {
	idemstore.Store
	once           sync.Once
	looked, resume chan struct{}
}

func (s *pauseLegacyGet) Get(ctx context.Context, k idemstore.Key) (*idemstore.Record, error) {
	rec, err := s.Store.Get(ctx, k)
	if err == nil && !strings.Contains(k.Operation, " host=") {
		s.once.Do(func() {
			close(s.looked)
			<-s.resume
		})
	}
	return rec, err
}

// TestLegacyRecordReleasedMeanwhile: a retry reserves its key under the
// new name and finds it held under the earlier version's name; the holder
// then releases it (its upstream answered 503) before the retry is served
// under that name. A second retry meanwhile finds the new name held (409).
// The first must not reserve the earlier name afresh and run: the key
// would run under two names. It is told to retry, and its retry runs once,
// under the new name.
func TestLegacyRecordReleasedMeanwhile(t *testing.T) {
	for _, mode := range []idemproxy.Mode{idemproxy.ModeEnforce, idemproxy.ModeObserve} {
		t.Run(string(mode), func(t *testing.T) { legacyReleasedMeanwhile(t, mode) })
	}
}

func legacyReleasedMeanwhile(t *testing.T, mode idemproxy.Mode) {
	up := &recordingUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	mem := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { mem.Close() })
	st := &pauseLegacyGet{Store: mem, looked: make(chan struct{}), resume: make(chan struct{})}
	quiet := slog.New(slog.DiscardHandler)
	engine, err := idem.NewEngine(st, idem.EngineConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p, err := idemproxy.New(engine, idemproxy.Config{Upstream: srv.URL, Settings: idemproxy.Settings{Anonymous: idemproxy.AnonymousShared, Mode: mode}},
		idemproxy.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	e := &edgeRig{proxy: p, front: httptest.NewServer(p), up: up}
	t.Cleanup(e.front.Close)

	// The earlier version's request, in flight.
	old := idemstore.Key{Scope: idemproxy.AnonymousScope, Operation: "POST /orders", Key: "k"}
	if _, created, err := mem.Reserve(t.Context(), idemstore.ReserveParams{Key: old, Fingerprint: "earlier", Token: "old", Lease: time.Hour}); err != nil || !created {
		t.Fatalf("reserving the earlier version's key: %v %v", created, err)
	}
	first := make(chan answer, 1)
	go func() { first <- e.one(t, hostPost("HTTP/1.1", "shop-a.example", "k", `{}`)) }()
	<-st.looked
	if err := mem.Release(t.Context(), idemstore.ReleaseParams{Key: old, Token: "old"}); err != nil {
		t.Fatal(err)
	}
	second := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "k", `{}`))
	close(st.resume)
	a := <-first
	if mode == idemproxy.ModeObserve {
		// Observe mode forwards every request, and refuses none.
		if a.Status != http.StatusCreated || second.Status != http.StatusCreated {
			t.Fatalf("observe mode: %v and %v, want both forwarded", a, second)
		}
		return
	}
	if n := len(up.requests()); n != 0 {
		t.Fatalf("the upstream ran %d times (first retry %v, second %v); want none yet", n, a, second)
	}
	if a.Status != http.StatusConflict || a.Header.Get("Retry-After") == "" || second.Status != http.StatusConflict {
		t.Fatalf("first retry %v, second %v; want both told to retry", a, second)
	}
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "k", `{}`)); got.Body != "ran 1" {
		t.Fatalf("the first's retry: %v, want it run", got)
	}
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "k", `{}`)); got.Body != "ran 1" || got.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the next retry: %v, want the answer replayed", got)
	}
	if _, err := mem.Get(t.Context(), old); err == nil {
		t.Errorf("a record is left under the earlier name")
	}
}

// TestUpstreamReadsTheNamedHost: the proxy names an operation by the
// authority's one spelling (case, a trailing dot, a default port, an
// internationalised name's A-labels), and a retry in another spelling
// replays. An upstream that routes tenants by the X-Forwarded-Host it
// reads, byte for byte, must read that spelling too: reading
// "SHOP-A.Example." (no such shop: its default tenant's order) under an
// operation named shop-a.example, it had its answer replayed to shop A's
// retries, and shop A's order was never placed. A port written with
// leading zeros is the same port.
func TestUpstreamReadsTheNamedHost(t *testing.T) {
	e := newEdgeRig(t, idemproxy.Config{})
	first := e.one(t, hostPost("HTTP/1.1", "SHOP-A.Example.:80", "k", `{}`))
	retry := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "k", `{}`))
	zeros := e.one(t, hostPost("HTTP/1.1", "shop-a.example:0080", "k", `{}`))
	if first.Body != "ran 1" || retry.Header.Get("Idempotent-Replayed") != "true" || zeros.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("%v, then %v and %v: want one operation", first, retry, zeros)
	}
	// U+FF53 FULLWIDTH LATIN SMALL LETTER S, which IDNA maps to "s".
	wide := strings.Replace(hostPost("HTTP/1.1", "x", "k2", `{}`), "/orders", "http://%EF%BD%93hop-a.example/orders", 1)
	if got := e.one(t, wide); got.Status != http.StatusCreated {
		t.Fatalf("a full-width host: %v", got)
	}
	seen := e.up.requests()
	if len(seen) != 2 {
		t.Fatalf("the upstream ran %d times, want 2", len(seen))
	}
	for i, s := range seen {
		if got := s.Header.Values("X-Forwarded-Host"); len(got) != 1 || got[0] != "shop-a.example" {
			t.Errorf("request %d: the upstream read X-Forwarded-Host %q, want the operation's shop-a.example", i+1, got)
		}
	}
}

// TestLongUpstreamNameRefusedAtStart: by default the upstream URL's host
// and base path name the upstream in every operation. A base path that
// leaves no room in an operation's 1024 bytes made every protected
// request 414 from the first one on; it is refused at start, with the
// way out (upstream_name).
func TestLongUpstreamNameRefusedAtStart(t *testing.T) {
	long := "http://orders.internal:9000/" + strings.Repeat("v", 1100)
	cfg := idemproxy.Config{Upstream: long}
	if err := cfg.WithDefaults().Validate(); err == nil || !strings.Contains(err.Error(), "upstream_name") {
		t.Fatalf("an upstream whose name fills an operation: %v, want refused, naming upstream_name", err)
	}
	cfg.UpstreamName = "orders"
	if err := cfg.WithDefaults().Validate(); err != nil {
		t.Fatalf("the same upstream, named: %v", err)
	}
}

// TestForwardedHostSpellings: the upstream reads the authority the
// operation names, and no other. A client's X_Forwarded_Host (and the
// other forwarding headers spelt with underscores) is the same variable
// to an upstream behind CGI, WSGI or Rack (HTTP_X_FORWARDED_HOST), which
// then routed shop B's order under shop A's operation; it is dropped as
// the hyphenated ones are. A Host holding a comma is a list to an
// upstream reading X-Forwarded-Host (the first or the last entry), not
// one authority: refused on a protected request, not forwarded.
func TestForwardedHostSpellings(t *testing.T) {
	e := newEdgeRig(t, idemproxy.Config{})
	got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "k1", `{}`,
		"X_Forwarded_Host", "shop-b.example", "x_forwarded_proto", "https", "X_FORWARDED_FOR", "10.9.9.9"))
	if got.Status != http.StatusCreated {
		t.Fatalf("%v", got)
	}
	for name, v := range e.up.requests()[0].Header {
		if n := strings.ToLower(strings.ReplaceAll(name, "_", "-")); strings.HasPrefix(n, "x-forwarded-") && strings.Contains(name, "_") {
			t.Errorf("the upstream read %s: %q", name, v)
		}
	}
	if got := e.one(t, hostPost("HTTP/1.1", "shop-b.example,shop-a.example", "k2", `{}`)); got.Status != http.StatusBadRequest {
		t.Errorf("a Host holding a list: %v, want 400", got)
	}
	if n := len(e.up.requests()); n != 1 {
		t.Errorf("the upstream ran %d times, want 1", n)
	}
}
