package idemproxy_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemproxy"
)

// routesConfig parses a configuration of routes for an edge rig.
func routesConfig(t *testing.T, yaml string) idemproxy.Config {
	t.Helper()
	cfg, err := idemproxy.ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestProxyMethodSpellings: a protected method spelt in another case
// ("post /pay") is refused with 400 invalid_method and never reaches the
// upstream, which would upper-case it and charge on every retry; nor does
// a method that is no token. Spellings of methods the route leaves alone
// pass, as sent. HEAD goes with a protected GET, as the same operation;
// and a misspelt method of a disabled route passes where the route sends
// it.
func TestProxyMethodSpellings(t *testing.T) {
	t.Parallel()
	e := newEdgeRig(t, routesConfig(t, `
routes:
  - match: GET /items
  - match: POST /health
    disabled: true
`))
	for _, m := range []string{"post", "Post", "pOST", "patch", "PaTcH"} {
		for range 2 {
			a := e.raw(t, post(m, "/pay", "k-"+m, `{"amount":1}`), 1)
			if len(a) != 1 || a[0].Status != http.StatusBadRequest || a[0].Header.Get("Idempotency-Outcome") != "invalid_method" {
				t.Fatalf("%s /pay: %v; want 400 invalid_method", m, a)
			}
		}
	}
	for _, m := range []string{"get", "head", "hEAD", "Get"} {
		a := e.raw(t, post(m, "/items", "k-"+m, ""), 1)
		if len(a) != 1 || a[0].Status != http.StatusBadRequest || a[0].Header.Get("Idempotency-Outcome") != "invalid_method" {
			t.Fatalf("%s /items (GET protected): %v; want 400 invalid_method", m, a)
		}
	}
	if got := e.up.requests(); len(got) != 0 {
		t.Fatalf("the upstream ran %d refused requests: %+v", len(got), got)
	}

	// A method that is no token never gets past Go's server; behind another
	// server it would reach the handler, which refuses it too.
	req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
	req.Method = "POſT" // strings.ToUpper makes it POST
	req.Header.Set("Idempotency-Key", "k")
	rec := httptest.NewRecorder()
	e.proxy.ServeHTTP(rec, req)
	if rec.Code != http.StatusBadRequest || rec.Header().Get("Idempotency-Outcome") != "invalid_method" {
		t.Fatalf("POſT /pay: %d %s; want 400 invalid_method", rec.Code, rec.Body)
	}

	// POST is protected, once.
	for i, want := range []string{"acquired", "replayed"} {
		a := e.raw(t, post("POST", "/pay", "k", `{"amount":1}`), 1)
		if len(a) != 1 || a[0].Status != http.StatusCreated || a[0].Header.Get("Idempotency-Outcome") != want {
			t.Fatalf("POST /pay %d: %v; want 201 %s", i+1, a, want)
		}
	}
	// HEAD goes with the protected GET: one operation, GET /items.
	if a := e.raw(t, "HEAD /items HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 1); len(a) != 1 || a[0].Status != http.StatusBadRequest {
		t.Fatalf("HEAD /items without a key: %v; want 400", a)
	}
	for i, want := range []string{"acquired", "replayed"} {
		a := e.raw(t, "HEAD /items HTTP/1.1\r\nHost: x\r\nIdempotency-Key: h\r\nConnection: close\r\n\r\n", 1)
		if len(a) != 1 || a[0].Status != http.StatusCreated || a[0].Header.Get("Idempotency-Outcome") != want {
			t.Fatalf("HEAD /items %d: %v; want 201 %s", i+1, a, want)
		}
	}
	if a := e.raw(t, "GET /items HTTP/1.1\r\nHost: x\r\nIdempotency-Key: h\r\nConnection: close\r\n\r\n", 1); len(a) != 1 || a[0].Status != http.StatusUnprocessableEntity {
		t.Fatalf("GET /items with the HEAD's key: %v; want 422", a)
	}
	if st := e.state(t, "GET /items", "h"); st != "completed 201" {
		t.Fatalf("record GET /items h: %s", st)
	}
	// Unprotected spellings pass as sent: get on the default route, post on
	// the disabled one.
	for _, tc := range []struct{ method, target string }{{"get", "/pay"}, {"post", "/health"}, {"Delete", "/pay"}} {
		if a := e.raw(t, post(tc.method, tc.target, "", `{}`), 1); len(a) != 1 || a[0].Status != http.StatusCreated {
			t.Fatalf("%s %s: %v; want it forwarded", tc.method, tc.target, a)
		}
	}
	got := e.up.requests()
	var methods []string
	for _, s := range got {
		methods = append(methods, s.Method+" "+s.Target)
	}
	if want := "POST /pay,HEAD /items,get /pay,post /health,Delete /pay"; strings.Join(methods, ",") != want {
		t.Fatalf("the upstream ran %q; want %q", methods, want)
	}
}

// TestRouteMethodMustBeUpperCase: a route for "post /pay" would protect
// only requests spelt so, while POST /pay went to the default route: the
// configuration is refused.
func TestRouteMethodMustBeUpperCase(t *testing.T) {
	t.Parallel()
	if _, err := idemproxy.ParseConfig([]byte("routes:\n  - match: post /pay\n")); err == nil || !strings.Contains(err.Error(), "upper case") {
		t.Fatalf("ParseConfig: %v; want the lower-case method refused", err)
	}
	cfg := idemproxy.Config{Upstream: "http://127.0.0.1:1", Routes: []idemproxy.Route{{Match: idemproxy.Pattern{Pattern: "Post /pay"}}}}
	if err := cfg.WithDefaults().Validate(); err == nil {
		t.Fatal("Validate accepted a route for Post /pay")
	}
}

// TestProxyMethodOverride: upstreams that honour X-HTTP-Method-Override,
// X-HTTP-Method or X-Method-Override (or their CGI spellings with '_')
// run a GET or PUT that carries one as the method it names. By default
// such a request is protected as that method (the same operation as a
// plain request of it), and forwarded as it came; headers that disagree,
// or name no method, are refused. A route may strip them or refuse them
// instead.
func TestProxyMethodOverride(t *testing.T) {
	t.Parallel()
	e := newEdgeRig(t, routesConfig(t, `
routes:
  - match: /legacy/
    method_override: strip
  - match: /strict/
    method_override: refuse
`))
	body := `{"amount":1}`
	for i, tc := range []struct {
		name string
		req  string
		want int
	}{
		{"GET overridden to POST", post("GET", "/pay", "k", body, "X-HTTP-Method-Override", "POST"), http.StatusCreated},
		{"the same as POST itself: replayed", post("POST", "/pay", "k", body), http.StatusCreated},
		{"PUT as post, lower-case", post("PUT", "/pay", "k", body, "X-HTTP-Method", "post"), http.StatusCreated},
		{"CGI spelling", post("GET", "/pay", "k", body, "X_HTTP_METHOD_OVERRIDE", "POST"), http.StatusCreated},
		{"no key", post("GET", "/pay", "", body, "X-Method-Override", "PATCH"), http.StatusBadRequest},
		{"headers that disagree", post("GET", "/pay", "k2", body, "X-HTTP-Method-Override", "POST", "X-HTTP-Method", "DELETE"), http.StatusBadRequest},
		{"no method", post("GET", "/pay", "k3", body, "X-HTTP-Method-Override", "PO ST"), http.StatusBadRequest},
		{"not ASCII", post("GET", "/pay", "k4", body, "X-HTTP-Method-Override", "po\u017ft"), http.StatusBadRequest},
		{"refused by the route", post("GET", "/strict/x", "k5", body, "X-HTTP-Method-Override", "GET"), http.StatusBadRequest},
	} {
		a := e.raw(t, tc.req, 1)
		if len(a) != 1 || a[0].Status != tc.want {
			t.Fatalf("%d, %s: %v; want %d", i, tc.name, a, tc.want)
		}
		if i > 0 && tc.want == http.StatusCreated && a[0].Header.Get("Idempotency-Outcome") != "replayed" {
			t.Fatalf("%s: %v; want the first answer replayed", tc.name, a)
		}
	}
	// An override of an unprotected method, and a stripped one, pass: the
	// first as sent, the second without its header.
	for _, req := range []string{
		post("GET", "/pay", "", "", "X-HTTP-Method-Override", "DELETE"),
		post("GET", "/legacy/x", "", "", "X-HTTP-Method-Override", "POST", "X_Method_Override", "POST"),
	} {
		if a := e.raw(t, req, 1); len(a) != 1 || a[0].Status != http.StatusCreated {
			t.Fatalf("%q: %v", req, a)
		}
	}
	got := e.up.requests()
	if len(got) != 3 {
		t.Fatalf("the upstream ran %d times, want 3: %+v", len(got), got)
	}
	if s := got[0]; s.Method != http.MethodGet || s.Header.Get("X-HTTP-Method-Override") != "POST" || s.Body != body {
		t.Errorf("the protected override reached the upstream as %+v; want it as sent", s)
	}
	if s := got[1]; s.Method != http.MethodGet || s.Header.Get("X-HTTP-Method-Override") != "DELETE" {
		t.Errorf("an unprotected override reached the upstream as %+v", s)
	}
	if s := got[2]; s.Header.Get("X-HTTP-Method-Override") != "" || s.Header.Get("X_Method_Override") != "" {
		t.Errorf("a stripped override reached the upstream: %v", s.Header)
	}
	if st := e.state(t, "POST /pay", "k"); st != "completed 201" {
		t.Errorf("record POST /pay k: %s", st)
	}
}
