package idemproxy_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemproxy"
)

// TestPathSpellingsAreOneOperation: the same key and body sent to
// spellings of one path that the upstream reads as one resource
// (percent-encoded unreserved characters, doubled slashes, dot segments)
// run once: the first is forwarded, as /pay, and the others replay its
// answer; the same key with another amount on another spelling gets 422.
// A ';' parameter is refused, and %2F stays a path of its own, forwarded
// as it came.
func TestPathSpellingsAreOneOperation(t *testing.T) {
	t.Parallel()
	e := newEdgeRig(t, idemproxy.Config{})
	body := `{"amount":100}`
	for i, target := range []string{"/pay", "/%70ay", "/p%61y", "/%70%61y", "//pay", "/./pay", "/x/../pay", "/%2E/pay", "/%2e%2E/pay", "http://api.example/%70ay"} {
		a := e.raw(t, post("POST", target, "k", body), 1)
		want := "replayed"
		if i == 0 {
			want = "acquired"
		}
		if len(a) != 1 || a[0].Status != http.StatusCreated || a[0].Header.Get("Idempotency-Outcome") != want {
			t.Fatalf("POST %s: %v; want 201 %s", target, a, want)
		}
	}
	if a := e.raw(t, post("POST", "/pa%79", "k", `{"amount":999}`), 1); len(a) != 1 || a[0].Status != http.StatusUnprocessableEntity {
		t.Fatalf("POST /pa%%79 with another amount: %v; want 422", a)
	}
	for _, target := range []string{"/pay;x=1", "/x/..;/pay", "*"} {
		if a := e.raw(t, post("POST", target, "k", body), 1); len(a) != 1 || a[0].Status != http.StatusBadRequest || a[0].Header.Get("Idempotency-Outcome") != "invalid_path" {
			t.Fatalf("POST %s: %v; want 400 invalid_path", target, a)
		}
	}
	// An unprotected request keeps its ';' (nothing is keyed by it).
	if a := e.raw(t, "GET /pay;jsessionid=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 1); len(a) != 1 || a[0].Status != http.StatusCreated {
		t.Fatalf("GET /pay;jsessionid=1: %v", a)
	}
	for i, target := range []string{"/acct/a%2fb/charge", "/acct/a%2Fb/charge", "/acct/a/b/charge"} {
		a := e.raw(t, post("POST", target, "s", body), 1)
		want := []string{"acquired", "replayed", "acquired"}[i]
		if len(a) != 1 || a[0].Status != http.StatusCreated || a[0].Header.Get("Idempotency-Outcome") != want {
			t.Fatalf("POST %s: %v; want 201 %s", target, a, want)
		}
	}
	var targets []string
	for _, s := range e.up.requests() {
		targets = append(targets, s.Method+" "+s.Target)
	}
	if want := "POST /pay,GET /pay;jsessionid=1,POST /acct/a%2Fb/charge,POST /acct/a/b/charge"; strings.Join(targets, ",") != want {
		t.Fatalf("the upstream ran %q; want %q", targets, want)
	}
	if st := e.state(t, "POST /pay", "k"); st != "completed 201" {
		t.Fatalf("record POST /pay: %s", st)
	}
}

// TestPathOptions: what to configure for upstreams that read paths
// otherwise. path_params: strip (servlet containers) keys and forwards the
// path without its parameters; keep makes it a path of its own.
// merge_slashes: false keeps "//" apart and forwards it, with routes too
// (ServeMux would redirect it). escaped_slashes: decode reads %2F as '/'
// (WSGI servers); reject refuses it.
func TestPathOptions(t *testing.T) {
	t.Parallel()
	body := `{"amount":1}`
	for _, tc := range []struct {
		name, yaml string
		targets    []string // sent in order with one key
		outcomes   []string // Idempotency-Outcome of each ("" for a 400)
		upstream   string   // the request-targets the upstream ran
	}{
		{"path_params strip", "path_params: strip\n", []string{"/pay;jsessionid=1", "/pay", "/x/..;/pay"}, []string{"acquired", "replayed", "replayed"}, "/pay"},
		{"path_params keep", "path_params: keep\n", []string{"/pay;x=1", "/pay"}, []string{"acquired", "acquired"}, "/pay;x=1,/pay"},
		{"merge_slashes false", "merge_slashes: false\nroutes:\n  - match: POST /pay\n", []string{"//pay", "/pay", "/./pay"}, []string{"acquired", "acquired", "replayed"}, "//pay,/pay"},
		{"escaped_slashes decode", "escaped_slashes: decode\n", []string{"/a%2Fb", "/a/b", "/a%2f%2Fb"}, []string{"acquired", "replayed", "replayed"}, "/a/b"},
		{"escaped_slashes reject", "escaped_slashes: reject\n", []string{"/a%2Fb", "/a/b"}, []string{"", "acquired"}, "/a/b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEdgeRig(t, routesConfig(t, tc.yaml))
			for i, target := range tc.targets {
				a := e.raw(t, post("POST", target, "k", body), 1)
				want := tc.outcomes[i]
				if len(a) != 1 || a[0].Header.Get("Idempotency-Outcome") != want && !(want == "" && a[0].Status == http.StatusBadRequest) {
					t.Fatalf("POST %s: %v; want %q", target, a, want)
				}
			}
			var targets []string
			for _, s := range e.up.requests() {
				targets = append(targets, s.Target)
			}
			if strings.Join(targets, ",") != tc.upstream {
				t.Fatalf("the upstream ran %q; want %q", targets, tc.upstream)
			}
		})
	}
}

// TestRoutesSeeTheNormalisedPath: a route's settings apply to every
// spelling of its path, and its key is the route's path: ServeMux and the
// operation agree.
func TestRoutesSeeTheNormalisedPath(t *testing.T) {
	t.Parallel()
	e := newEdgeRig(t, routesConfig(t, "routes:\n  - match: POST /pay\n    max_body: 8\n"))
	for _, target := range []string{"/%70ay", "//pay", "/x/../pay"} {
		if a := e.raw(t, post("POST", target, "k", `{"amount":100}`), 1); len(a) != 1 || a[0].Status != http.StatusRequestEntityTooLarge {
			t.Fatalf("POST %s over the route's max_body: %v; want 413", target, a)
		}
	}
	if a := e.raw(t, post("POST", "/p%61y", "k", `{}`), 1); len(a) != 1 || a[0].Status != http.StatusCreated {
		t.Fatalf("POST /p%%61y: %v", a)
	}
	if st := e.state(t, "POST /pay", "k"); st != "completed 201" {
		t.Fatalf("record POST /pay: %s", st)
	}
}

// TestRefusedPathsOnEveryRoute: a path that path_params or
// escaped_slashes: reject refuse is refused when the route of any reading
// of it protects the method: the servlet that strips ";a=1" runs
// "PUT /items;a=1/5" as "PUT /items/5", and a WSGI server "PUT /items%2F5"
// so, though ServeMux gives both to the route of everything else (here a
// disabled one, or the default's, which leaves PUT alone). The misspelt
// method and the override on such a path are refused too; a request no
// reading protects passes with its ';'.
func TestRefusedPathsOnEveryRoute(t *testing.T) {
	t.Parallel()
	e := newEdgeRig(t, routesConfig(t, `
escaped_slashes: reject
routes:
  - match: PUT /items/{id}
  - match: POST /pay
  - match: /{rest...}
    disabled: true
`))
	for _, tc := range []struct{ req, want string }{
		{post("PUT", "/items;a=1/5", "k", `{}`), "invalid_path"},
		{post("PUT", "/items%2F5", "k", `{}`), "invalid_path"},
		{post("PUT", "/x/..;/items/5", "k", `{}`), "invalid_path"},
		{post("POST", "/pay;x=1", "k", `{}`), "invalid_path"},
		{post("put", "/items;a=1/5", "k", `{}`), "invalid_method"},
		{post("GET", "/pay;x=1", "k", `{}`, "X-HTTP-Method-Override", "POST"), "invalid_path"},
	} {
		if a := e.raw(t, tc.req, 1); len(a) != 1 || a[0].Status != http.StatusBadRequest || a[0].Header.Get("Idempotency-Outcome") != tc.want {
			t.Fatalf("%q: %v; want 400 %s", tc.req, a, tc.want)
		}
	}
	if a := e.raw(t, post("GET", "/items;a=1/5", "", ""), 1); len(a) != 1 || a[0].Status != http.StatusCreated {
		t.Fatalf("GET /items;a=1/5: %v; want it passed", a)
	}
	if got := e.up.requests(); len(got) != 1 || got[0].Target != "/items;a=1/5" {
		t.Fatalf("the upstream ran %+v; want only the GET", got)
	}
}
