package idemproxy_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemproxy"
)

func scopeOf(t *testing.T, f idem.ScopeFunc, r *http.Request) string {
	t.Helper()
	s, err := f(r)
	if err != nil {
		t.Fatalf("scope: %v", err)
	}
	return s
}

func requestWith(headers map[string][]string, cookies ...*http.Cookie) *http.Request {
	r := httptest.NewRequest("POST", "/payments", nil)
	for k, vs := range headers {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	for _, c := range cookies {
		r.AddCookie(c)
	}
	return r
}

func TestScopeCookies(t *testing.T) {
	t.Parallel()
	f := idemproxy.NewScope(idemproxy.ScopeSources{Cookies: []string{"session"}}, nil, idemproxy.AnonymousReject)
	alice := scopeOf(t, f, requestWith(nil, &http.Cookie{Name: "session", Value: "alice-session"}))
	mallory := scopeOf(t, f, requestWith(nil, &http.Cookie{Name: "session", Value: "mallory-session"}))
	if alice == mallory {
		t.Fatal("two session cookies gave one scope")
	}
	// With only a cookie configured, Authorization does not count.
	_, err := f(requestWith(map[string][]string{"Authorization": {"Bearer x"}}))
	if !errors.Is(err, idem.ErrScopeMissing) {
		t.Fatalf("no session cookie: %v", err)
	}
	// Other cookies do not change the scope.
	again := scopeOf(t, f, requestWith(nil, &http.Cookie{Name: "theme", Value: "dark"}, &http.Cookie{Name: "session", Value: "alice-session"}))
	if again != alice {
		t.Fatal("an unrelated cookie changed the scope")
	}
}

func TestScopeAnonymous(t *testing.T) {
	t.Parallel()
	src := idemproxy.ScopeSources{Headers: []string{"Authorization"}, Cookies: []string{"session"}}
	for _, r := range []*http.Request{
		requestWith(nil),
		requestWith(map[string][]string{"Authorization": {"", "  "}}),
		requestWith(nil, &http.Cookie{Name: "session", Value: ""}),
	} {
		if _, err := idemproxy.NewScope(src, nil, idemproxy.AnonymousReject)(r); !errors.Is(err, idem.ErrScopeMissing) {
			t.Errorf("reject: %v", err)
		}
		if s := scopeOf(t, idemproxy.NewScope(src, nil, idemproxy.AnonymousShared), r); s != idemproxy.AnonymousScope {
			t.Errorf("shared: %q", s)
		}
	}
}

func TestScopeKeyed(t *testing.T) {
	t.Parallel()
	const cred = "Basic YWxpY2U6cHc=" // alice:pw
	r := requestWith(map[string][]string{"Authorization": {cred}})
	plainSum := sha256.Sum256([]byte(cred))
	plain := hex.EncodeToString(plainSum[:])

	unkeyed := scopeOf(t, idemproxy.NewScope(idemproxy.ScopeSources{}, nil, idemproxy.AnonymousReject), r)
	if unkeyed != plain {
		t.Fatalf("unkeyed Authorization scope %s is not the SHA-256 earlier versions stored (%s)", unkeyed, plain)
	}
	a1 := scopeOf(t, idemproxy.NewScope(idemproxy.ScopeSources{}, []byte("secret number one!"), idemproxy.AnonymousReject), r)
	a2 := scopeOf(t, idemproxy.NewScope(idemproxy.ScopeSources{}, []byte("secret number one!"), idemproxy.AnonymousReject), r)
	b := scopeOf(t, idemproxy.NewScope(idemproxy.ScopeSources{}, []byte("secret number two!"), idemproxy.AnonymousReject), r)
	if a1 != a2 {
		t.Fatal("one secret gave two scopes: instances sharing a store would not agree")
	}
	if a1 == b {
		t.Fatal("two secrets gave one scope")
	}
	for _, s := range []string{a1, b} {
		if s == plain || strings.Contains(s, cred) || len(s) != 64 {
			t.Fatalf("keyed scope %q reveals the credential or its SHA-256", s)
		}
	}
}

func TestScopeFraming(t *testing.T) {
	t.Parallel()
	src := idemproxy.ScopeSources{Headers: []string{"X-Tenant", "X-User"}, Cookies: []string{"session"}}
	f := idemproxy.NewScope(src, nil, idemproxy.AnonymousReject)
	// Values that would collide if simply concatenated must not.
	cases := []*http.Request{
		requestWith(map[string][]string{"X-Tenant": {"ab"}, "X-User": {"c"}}),
		requestWith(map[string][]string{"X-Tenant": {"a"}, "X-User": {"bc"}}),
		requestWith(map[string][]string{"X-Tenant": {"a", "b"}}),
		requestWith(map[string][]string{"X-Tenant": {"a\nb"}}),
		requestWith(map[string][]string{"X-User": {"a"}}),
		requestWith(nil, &http.Cookie{Name: "session", Value: "a"}),
		requestWith(map[string][]string{"X-Tenant": {"a"}}),
	}
	seen := map[string]int{}
	for i, r := range cases {
		s := scopeOf(t, f, r)
		if j, ok := seen[s]; ok {
			t.Fatalf("requests %d and %d share scope %s", j, i, s)
		}
		seen[s] = i
	}
	// Header names match whatever their case in the configuration.
	lower := idemproxy.NewScope(idemproxy.ScopeSources{Headers: []string{"x-tenant", "x-user"}, Cookies: []string{"session"}}, nil, idemproxy.AnonymousReject)
	if scopeOf(t, lower, cases[0]) != scopeOf(t, f, cases[0]) {
		t.Fatal("the scope depends on how the header name is spelt")
	}
}

func TestScopeConfig(t *testing.T) {
	t.Parallel()
	c, err := idemproxy.ParseConfig([]byte(`
upstream: http://127.0.0.1:1
scope_header: X-Api-Key
scope_cookie: [session, tenant]
anonymous: shared
routes:
  - match: POST /public
    scope_cookie: visitor
    anonymous: reject
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.ScopeHeader) != 1 || c.ScopeHeader[0] != "X-Api-Key" || len(c.ScopeCookie) != 2 || c.Anonymous != idemproxy.AnonymousShared {
		t.Fatalf("parsed %+v", c.Settings)
	}
	if r := c.Routes[0]; len(r.ScopeCookie) != 1 || r.Anonymous != idemproxy.AnonymousReject {
		t.Fatalf("route %+v", r.Settings)
	}
	for _, bad := range []string{
		"scope_header: \"X Bad\"",
		"scope_cookie: [\"a;b\"]",
		"scope_header: {a: b}",
		"anonymous: maybe",
		"routes:\n  - match: POST /x\n    anonymous: open",
	} {
		if _, err := idemproxy.ParseConfig([]byte("upstream: http://x\n" + bad)); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

func TestProxyRejectsAnonymous(t *testing.T) {
	t.Parallel()
	tp := newTestProxyConfig(t, idemproxy.Config{}, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) })
	req, _ := http.NewRequest("POST", tp.url+"/payments", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "k")
	resp, err := tp.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || resp.Header.Get("Idempotency-Outcome") != "scope_missing" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		t.Fatalf("anonymous request: %d %v", resp.StatusCode, resp.Header)
	}
	if tp.runs.Load() != 0 {
		t.Fatal("an anonymous request was forwarded")
	}
	// Unprotected methods pass without credentials.
	if resp, err := tp.client.Get(tp.url + "/payments"); err != nil || resp.StatusCode != 201 {
		t.Fatalf("GET: %v %v", resp, err)
	}
}
