package idemproxy_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/idemstore"
)

// TestRoutePatternsAsServeMuxReadsThem: a route's pattern protects the
// requests ServeMux routes to it, however the pattern is spelled: a tab
// between method and path, a blank before the path, and a route that
// matches every request (which leaves no requests to the default route).
func TestRoutePatternsAsServeMuxReadsThem(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, match, method string
	}{
		{"tab after method", `"PUT\t/items"`, http.MethodPut},
		{"blanks after method", `"PUT  \t /items"`, http.MethodPut},
		{"blank before path", `" /"`, http.MethodPost},
		{"catch-all wildcard", `"/{rest...}"`, http.MethodPost},
		{"blanks before catch-all", `"  /{rest...}"`, http.MethodPatch},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := idemproxy.ParseConfig([]byte("anonymous: shared\nroutes:\n  - match: " + tt.match + "\n    optional_key: false\n"))
			if err != nil {
				t.Fatal(err)
			}
			tp := newTestProxyConfig(t, cfg, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
			})
			for range 2 {
				if resp, body := tp.send(t, tt.method, "/items", "k1", strings.NewReader("{}")); resp.StatusCode != http.StatusCreated {
					t.Fatalf("%s with a key: %d %s", tt.method, resp.StatusCode, body)
				}
			}
			if n := tp.runs.Load(); n != 1 {
				t.Errorf("the upstream ran %s /items %d times for one key, want 1", tt.method, n)
			}
			if resp, body := tp.send(t, tt.method, "/items", "", strings.NewReader("{}")); resp.StatusCode != http.StatusBadRequest {
				t.Errorf("%s without a key: %d %s, want 400", tt.method, resp.StatusCode, body)
			}
			if rec, err := getRecord(t.Context(), tp.store, idemproxy.AnonymousScope, tt.method+" /items", "k1"); err != nil || rec.State != idemstore.StateCompleted {
				t.Errorf("record %s /items k1: %+v, %v; want it completed", tt.method, rec, err)
			}
		})
	}
}
