package idemproxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// TestNormalizeHost: the spellings of one authority are one; others stay
// apart; what is no authority is refused.
func TestNormalizeHost(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"Shop.Example", "shop.example"},
		{"shop.example.", "shop.example"},
		{"shop.example:80", "shop.example"},
		{"shop.example:443", "shop.example"},
		{"shop.example:", "shop.example"},
		{"Shop.Example.:8080", "shop.example:8080"},
		{"shop.example:0080", "shop.example"},
		{"shop.example:08080", "shop.example:8080"},
		{"shop.example:000", "shop.example:0"},
		{"shop.example:0x50", "shop.example:0x50"},
		{"bücher.example", "xn--bcher-kva.example"},
		{"XN--BCHER-KVA.EXAMPLE", "xn--bcher-kva.example"},
		{"BÜCHER.example", "xn--bcher-kva.example"},
		{"127.0.0.1:80", "127.0.0.1"},
		{"[::1]:80", "[::1]"},
		{"[0:0:0::1]", "[::1]"},
		{"[0:0::1]:8443", "[::1]:8443"},
		{"[::FFFF:127.0.0.1]", "[::ffff:127.0.0.1]"},
		{"my_host.Example", "my_host.example"},
	} {
		got, ok := normalizeHost(tc.in)
		if !ok || got != tc.want {
			t.Errorf("normalizeHost(%q) = %q, %v; want %q", tc.in, got, ok, tc.want)
		}
	}
	for _, bad := range []string{"a b", "a\x00b", "a/b", "user@host", "a.example,b.example", strings.Repeat("a", maxHostLength+1)} {
		if got, ok := normalizeHost(bad); ok {
			t.Errorf("normalizeHost(%q) = %q, accepted", bad, got)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"http://127.0.0.1:3000", "127.0.0.1:3000"},
		{"https://Orders.Internal:443/v1/", "orders.internal/v1"},
		{"http://user:secret@orders.internal/", "orders.internal"},
	} {
		u, _ := url.Parse(tc.in)
		if got := upstreamName(u); got != tc.want {
			t.Errorf("upstreamName(%s) = %q, want %q", tc.in, got, tc.want)
		}
	}
	for _, op := range []string{"POST /pay host=a.example upstream=up:1", "POST /pay"} {
		if m, p := splitOperation(op); m != "POST" || p != "/pay" {
			t.Errorf("splitOperation(%q) = %q %q", op, m, p)
		}
	}
}

// TestResolverIsToldTheHost: one credential may use one key at two shops
// behind one upstream, and both keys may go to review. A resolver asked
// by method, path and key alone could settle shop B's record with shop
// A's outcome; it is told the host the operation names (none for a
// record of an earlier version).
func TestResolverIsToldTheHost(t *testing.T) {
	for op, want := range map[string]string{
		"POST /payments host=shop-b.example upstream=pay.internal:9000": "shop-b.example",
		"POST /payments host= upstream=pay.internal:9000":               "",
		"POST /payments": "",
	} {
		got := make(chan resolverQuestion, 1)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var q resolverQuestion
			json.NewDecoder(r.Body).Decode(&q)
			got <- q
			fmt.Fprint(w, `{"outcome":"unknown"}`)
		}))
		rec := reviewRecord("k1")
		rec.Key.Operation = op
		r, _ := testResolver(srv.URL)
		if _, err := r.Resolve(t.Context(), rec); err != nil {
			t.Fatal(err)
		}
		srv.Close()
		if q := <-got; q.Host != want {
			t.Errorf("%s: the resolver was told host %q, want %q", op, q.Host, want)
		}
	}
}
