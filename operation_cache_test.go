package idem

import (
	"fmt"
	"net/http/httptest"
	"testing"
)

// TestOpCacheNamesAsDefaultOperation checks that the middleware's cache of
// operations answers what DefaultOperation answers, for more paths than it
// has slots (so that slots collide and stay filled), for patterns, and for
// a path and a pattern that are the same string.
func TestOpCacheNamesAsDefaultOperation(t *testing.T) {
	c := newOpCache()
	methods := []string{"POST", "PATCH", "PUT", "DELETE", "post"}
	for round := 0; round < 3; round++ {
		for i := 0; i < 4*opCacheSlots; i++ {
			for _, m := range methods {
				r := httptest.NewRequest(m, fmt.Sprintf("/orders/%d/refund", i%(2*opCacheSlots)), nil)
				if i%3 == 0 {
					r.Pattern = "/orders/{id}/refund"
				}
				if i%5 == 0 {
					r.Pattern = m + " /orders/{id}/refund"
				}
				if i%7 == 0 {
					r.URL.Path = "//orders/./x/../" + fmt.Sprint(i)
				}
				if got, want := c.operation(r), DefaultOperation(r); got != want {
					t.Fatalf("round %d, %s %s (pattern %q): cache says %q, DefaultOperation %q", round, m, r.URL.Path, r.Pattern, got, want)
				}
			}
		}
	}
	// A pattern spelled like a path is still told apart from that path.
	c = newOpCache()
	for _, pattern := range []bool{false, true, false} {
		r := httptest.NewRequest("POST", "/a//b", nil)
		if pattern {
			r.Pattern = "/a//b"
		}
		if got, want := c.operation(r), DefaultOperation(r); got != want {
			t.Fatalf("pattern %v: cache says %q, DefaultOperation %q", pattern, got, want)
		}
	}
}
