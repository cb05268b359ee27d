package idemproxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/idemstore"
)

// TestScopeLabelHeaderConfig: scope_label_header is read globally and per
// route, and a header that carries credentials, or that is a scope header
// of the settings it applies to, is refused with an error that names it.
func TestScopeLabelHeaderConfig(t *testing.T) {
	t.Parallel()
	c, err := idemproxy.ParseConfig([]byte(`
upstream: http://127.0.0.1:1
scope_label_header: X-Account-Id
routes:
  - match: POST /orders
    scope_label_header: X-Tenant
  - match: POST /pay
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.ScopeLabelHeader != "X-Account-Id" || c.Routes[0].ScopeLabelHeader != "X-Tenant" || c.Routes[1].ScopeLabelHeader != "" {
		t.Fatalf("parsed %q, routes %q and %q", c.ScopeLabelHeader, c.Routes[0].ScopeLabelHeader, c.Routes[1].ScopeLabelHeader)
	}
	if err := c.WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"scope_label_header: Authorization", "Authorization carries credentials"},
		{"scope_label_header: proxy-authorization", "Proxy-Authorization carries credentials"},
		{"scope_label_header: COOKIE", "Cookie carries credentials"},
		{"routes:\n  - match: POST /x\n    scope_label_header: authorization", `line 3: route "POST /x": scope_label_header (--scope-label-header): Authorization carries credentials`},
		{"scope_label_header: \"X Account\"", "is not a header name"},
		{"scope_header: [X-Api-Key, X-User]\nscope_label_header: x-user", "X-User is a scope header"},
		// A route's own scope header, against the global label header.
		{"scope_label_header: X-Api-Key\nroutes:\n  - match: POST /x\n    scope_header: x-api-key", `route "POST /x": scope_label_header (--scope-label-header): X-Api-Key is a scope header`},
		// The global scope header, against a route's label header.
		{"scope_header: X-Api-Key\nroutes:\n  - match: POST /x\n    scope_label_header: X-Api-Key", "X-Api-Key is a scope header"},
	} {
		c, err := idemproxy.ParseConfig([]byte("upstream: http://127.0.0.1:1\n" + tc.yaml))
		if err == nil {
			err = c.WithDefaults().Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "scope_label_header") {
			t.Errorf("%q: %v; want an error saying %q", tc.yaml, err, tc.want)
		}
	}
	// The label header of a route that scopes by another header is fine.
	ok := "upstream: http://127.0.0.1:1\nscope_header: X-Api-Key\nroutes:\n  - match: POST /x\n    scope_header: X-Other\n    scope_label_header: X-Api-Key\n"
	c, err = idemproxy.ParseConfig([]byte(ok))
	if err == nil {
		err = c.WithDefaults().Validate()
	}
	if err != nil {
		t.Errorf("a label header that is another route's scope header: %v", err)
	}
}

// TestProxyScopeLabel: a protected request's record keeps the label
// header's values, the route's own where it sets one; a retry with
// another label replays and keeps the first; a hostile label (tab, C1
// controls, invalid UTF-8, 10 KB) is forwarded and kept cleaned and cut.
func TestProxyScopeLabel(t *testing.T) {
	t.Parallel()
	tp := newTestProxyConfig(t, idemproxy.Config{
		Settings: idemproxy.Settings{ScopeLabelHeader: "X-Account-Id"},
		Routes:   []idemproxy.Route{{Match: idemproxy.Pattern{Pattern: "POST /orders"}, Settings: idemproxy.Settings{ScopeLabelHeader: "X-Tenant"}}},
	}, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) })
	send := func(path, key string, header ...string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("POST", tp.url+path, strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer sk_live_4f9a")
		req.Header.Set("Idempotency-Key", key)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Add(header[i], header[i+1])
		}
		resp, err := tp.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	label := func(key string) string {
		t.Helper()
		page, err := tp.store.List(context.Background(), idemstore.ListParams{Key: key})
		if err != nil || len(page.Records) != 1 {
			t.Fatalf("key %s: %d records, %v", key, len(page.Records), err)
		}
		return page.Records[0].ScopeLabel
	}

	if r := send("/pay", "k1", "X-Account-Id", "acct_8842", "X-Account-Id", "eu", "X-Tenant", "t-1"); r.StatusCode != 201 {
		t.Fatalf("first: %d", r.StatusCode)
	}
	if got := label("k1"); got != "acct_8842, eu" {
		t.Fatalf("label %q, want the header's values joined", got)
	}
	again := send("/pay", "k1", "X-Account-Id", "acct_OTHER")
	if again.Header.Get("Idempotent-Replayed") != "true" || tp.runs.Load() != 1 {
		t.Fatalf("another label did not replay: %d, %d runs", again.StatusCode, tp.runs.Load())
	}
	if got := label("k1"); got != "acct_8842, eu" {
		t.Fatalf("a retry changed the label to %q", got)
	}
	page, err := tp.store.List(context.Background(), idemstore.ListParams{ScopeLabels: []string{"acct_8842, eu"}})
	if err != nil || len(page.Records) != 1 {
		t.Fatalf("a search by the label found %d records, %v", len(page.Records), err)
	}

	if r := send("/orders", "k2", "X-Account-Id", "acct_8842", "X-Tenant", "t-1"); r.StatusCode != 201 {
		t.Fatalf("route: %d", r.StatusCode)
	}
	if got := label("k2"); got != "t-1" {
		t.Fatalf("the route's label %q, want its own header's", got)
	}

	hostile := "\t\u009b31mred\u0085\xff" + strings.Repeat("A", 10<<10)
	if r := send("/pay", "k3", "X-Account-Id", hostile); r.StatusCode != 201 {
		t.Fatalf("a hostile label failed the request: %d", r.StatusCode)
	}
	got := label("k3")
	if len(got) > idemstore.MaxScopeLabelLength || strings.ContainsAny(got, "\t\u009b\u0085") || !utf8.ValidString(got) ||
		!strings.HasPrefix(got, "\uFFFD31mred\uFFFD\uFFFDAAA") || !strings.HasSuffix(got, "…") {
		t.Fatalf("a hostile label was kept as %d bytes: %q", len(got), got)
	}

	if r := send("/pay", "k4"); r.StatusCode != 201 || label("k4") != "" {
		t.Fatalf("without the header: %d, label %q", r.StatusCode, label("k4"))
	}
	if tp.runs.Load() != 4 {
		t.Fatalf("%d upstream runs, want 4", tp.runs.Load())
	}
}

// TestScopeLabelHeaderRefusedAtNew: New refuses what Validate refuses.
func TestScopeLabelHeaderRefusedAtNew(t *testing.T) {
	t.Parallel()
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []idemproxy.Config{
		{Upstream: "http://127.0.0.1:1", Settings: idemproxy.Settings{ScopeLabelHeader: "Cookie"}},
		{Upstream: "http://127.0.0.1:1", Settings: idemproxy.Settings{ScopeLabelHeader: "authorization"}},
		{Upstream: "http://127.0.0.1:1", Settings: idemproxy.Settings{ScopeHeader: idemproxy.Names{"X-Key"}, ScopeLabelHeader: "x-key"}},
	} {
		if _, err := idemproxy.New(engine, cfg, idemproxy.Options{}); err == nil || !strings.Contains(err.Error(), "scope_label_header") {
			t.Errorf("%q: New = %v", cfg.ScopeLabelHeader, err)
		}
	}
}
