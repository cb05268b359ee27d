package idemproxy

import (
	"context"
	"math/rand/v2"
	"net/http/httptest"
	"testing"
)

// TestNormalHostShortcut: a host that normalHost takes as already normal
// is what the full normalisation makes of it, so the shortcut changes no
// operation's name. Checked on hosts spelt from the characters that
// matter (case, dots, colons, brackets, digits, an A-label's prefix).
func TestNormalHostShortcut(t *testing.T) {
	for _, h := range []string{"shop.example", "shop.example:8080", "127.0.0.1", "127.0.0.1:9000", "a-b.c", "1.2.3", "localhost:1"} {
		if !normalHost(h) {
			t.Errorf("normalHost(%q) = false, want the shortcut taken", h)
		}
	}
	for _, h := range []string{"", "Shop.example", "shop.example.", "shop.example:80", "shop.example:443", "shop.example:", "shop.example:080",
		"shop.example:0", "[::1]", "::1", "xn--bcher-kva.example", "a b", "shop.example:8o"} {
		if normalHost(h) {
			t.Errorf("normalHost(%q) = true, want the full normalisation", h)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "abxnz019-.:[]A_"
	b := make([]byte, 0, 24)
	for range 200_000 {
		b = b[:0]
		for range rng.IntN(cap(b)) {
			b = append(b, alphabet[rng.IntN(len(alphabet))])
		}
		h := string(b)
		if !normalHost(h) {
			continue
		}
		if got, ok := canonicalHost(h); !ok || got != h {
			t.Fatalf("normalHost(%q) took the shortcut, but the full normalisation gives %q %v", h, got, ok)
		}
	}
}

// TestRequestHostCarried: the host route.ServeHTTP normalised is what the
// operation and X-Forwarded-Host read, once per request; a request whose
// Host changed since is normalised afresh.
func TestRequestHostCarried(t *testing.T) {
	r := httptest.NewRequest("POST", "http://Shop.Example./orders", nil)
	r = withHost(context.Background(), r, "carried")
	if h, ok := requestHost(r); !ok || h != "carried" {
		t.Fatalf("requestHost = %q %v, want the carried spelling", h, ok)
	}
	r.Host = "Other.Example"
	if h, ok := requestHost(r); !ok || h != "other.example" {
		t.Fatalf("after the Host changed: %q %v, want it normalised afresh", h, ok)
	}
	if n := testing.AllocsPerRun(100, func() { normalizeHost("shop-a.example:8080") }); n != 0 {
		t.Errorf("normalizing a host already normal allocates %v times, want none", n)
	}
}
