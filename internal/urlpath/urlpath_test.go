package urlpath

import (
	"net/url"
	"path"
	"strings"
	"testing"
)

func TestNormalize(t *testing.T) {
	t.Parallel()
	merge := Options{MergeSlashes: true}
	for _, tc := range []struct {
		in, want string
		o        Options
	}{
		{"/pay", "/pay", merge},
		{"/%70ay", "/pay", merge},
		{"/p%61y", "/pay", merge},
		{"/%70%61%79", "/pay", merge},
		{"/%7e%2d%5F%2E", "/~-_.", merge},
		{"//pay", "/pay", merge},
		{"//pay", "//pay", Options{}},
		{"/./pay", "/pay", merge},
		{"/x/../pay", "/pay", merge},
		{"/%2E/pay", "/pay", merge},
		{"/%2e%2E/pay", "/pay", merge},
		{"/a/b/../../../pay", "/pay", merge},
		{"/pay/.", "/pay/", merge},
		{"/pay/..", "/", merge},
		{"/x//../pay", "/pay", merge},
		{"/x//../pay", "/x/pay", Options{}}, // RFC 3986 alone: the empty segment is the one removed
		{"/.well-known/x", "/.well-known/x", merge},
		{"/a%2fb", "/a%2Fb", merge},
		{"/a%2Fb/../c", "/c", merge},
		{"/a%2Fb", "/a/b", Options{MergeSlashes: true, DecodeSlashes: true}},
		{"/a%2F%2Fb", "/a/b", Options{MergeSlashes: true, DecodeSlashes: true}},
		{"/caf%c3%a9", "/caf%C3%A9", merge},
		{"/a%20b", "/a%20b", merge},
		{"/100%25", "/100%25", merge},
		{"/pay;x=1", "/pay;x=1", merge},
		{"/pay;x=1/a;b", "/pay/a", Options{MergeSlashes: true, StripParams: true}},
		{"/x/..;/pay", "/pay", Options{MergeSlashes: true, StripParams: true}},
		{"/x/..;/pay", "/x/..;/pay", merge},
		{"*", "*", merge},
		{"", "", merge},
	} {
		if got := Normalize(tc.in, tc.o); got != tc.want {
			t.Errorf("Normalize(%q, %+v) = %q, want %q", tc.in, tc.o, got, tc.want)
		}
	}
}

// TestNormalizePlainPathDoesNotAllocate: the usual path costs nothing.
func TestNormalizePlainPathDoesNotAllocate(t *testing.T) {
	o := Options{MergeSlashes: true}
	if n := testing.AllocsPerRun(100, func() { _ = Normalize("/v1/payments/pay_123/refunds", o) }); n != 0 {
		t.Fatalf("%v allocations for a plain path", n)
	}
}

// FuzzNormalize holds Normalize to what a server makes of a path: it is
// idempotent, leaves no dot segment and no escape of an unreserved
// character, and, for a path without %2F or ';', unescapes to what
// path.Clean makes of the unescaped path (ServeMux's reading), but for
// the trailing slash RFC 3986 keeps after a final dot segment.
func FuzzNormalize(f *testing.F) {
	for _, s := range []string{"/pay", "/%70ay", "//pay", "/./pay", "/x/../pay", "/%2e%2E/", "/a%2Fb", "/pay;x=1", "/a/b/../../..", "/~%7E"} {
		f.Add(s, true, false, false)
	}
	f.Fuzz(func(t *testing.T, p string, merge, decode, strip bool) {
		if _, err := url.PathUnescape(p); err != nil || !strings.HasPrefix(p, "/") {
			return // not an escaped path a server accepts
		}
		o := Options{MergeSlashes: merge, DecodeSlashes: decode, StripParams: strip}
		n := Normalize(p, o)
		if again := Normalize(n, o); again != n {
			t.Fatalf("Normalize(%q) = %q, and again %q", p, n, again)
		}
		for _, seg := range strings.Split(n, "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("Normalize(%q) = %q keeps a dot segment", p, n)
			}
		}
		for i := 0; i+2 < len(n); i++ {
			if n[i] == '%' {
				d, err := url.PathUnescape(n[i : i+3])
				if err == nil && len(d) == 1 && unreserved(d[0]) {
					t.Fatalf("Normalize(%q) = %q keeps %s encoded", p, n, n[i:i+3])
				}
			}
		}
		if !merge || strings.Contains(strings.ToUpper(p), "%2F") || strings.Contains(p, ";") {
			return
		}
		raw, _ := url.PathUnescape(p)
		got, _ := url.PathUnescape(n)
		want := path.Clean(raw)
		if strings.HasSuffix(raw, "/") || strings.HasSuffix(raw, "/.") || strings.HasSuffix(raw, "/..") {
			if want != "/" {
				want += "/"
			}
		}
		if got != want {
			t.Fatalf("Normalize(%q) = %q, which unescapes to %q; path.Clean reads %q", p, n, got, want)
		}
	})
}
