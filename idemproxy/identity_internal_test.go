package idemproxy

import (
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
