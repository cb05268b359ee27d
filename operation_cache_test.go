package idem

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
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

// A path longer than an operation may be is named but not remembered: a
// slot would keep it (and the request line it may be part of) for the
// middleware's life.
func TestOpCacheSkipsLongPaths(t *testing.T) {
	c := newOpCache()
	r := httptest.NewRequest("POST", "/"+strings.Repeat("a", MaxOperationLength), nil)
	if got, want := c.operation(r), DefaultOperation(r); got != want {
		t.Fatalf("cache says %q, DefaultOperation %q", got, want)
	}
	for i := range c.slots {
		if e := c.slots[i].Load(); e != nil {
			t.Fatalf("slot %d remembers a %d-byte path", i, len(e.src))
		}
	}
	r = httptest.NewRequest("POST", "/payments", nil)
	c.operation(r)
	n := 0
	for i := range c.slots {
		if c.slots[i].Load() != nil {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d slots filled after one short path, want 1", n)
	}
}

// A request whose method is longer than an operation may be (one that is
// not a token reaches the cache, to be refused as an invalid method, and
// HTTP/2 servers do not check it) is named but not remembered either.
func TestOpCacheSkipsLongMethods(t *testing.T) {
	c := newOpCache()
	r := httptest.NewRequest("POST", "/payments", nil)
	r.Method = "POST/" + strings.Repeat("a", 64<<10)
	if got, want := c.operation(r), DefaultOperation(r); got != want {
		t.Fatalf("cache says %q, DefaultOperation %q", got, want)
	}
	for i := range c.slots {
		if e := c.slots[i].Load(); e != nil {
			t.Fatalf("slot %d remembers a %d-byte method", i, len(e.method))
		}
	}
}

// Requests that differ only in what a server may normalise alike or not
// (case of the method, %2F and '/', case of an escape, dot segments,
// merged slashes, a trailing slash, a pattern spelled as a path), named
// from many goroutines at once on one cache, each get DefaultOperation's
// name for themselves, never another's: two routes never share an answer
// through the cache.
func TestOpCacheNeverLendsANameConcurrently(t *testing.T) {
	methods := []string{"POST", "post", "Post", "PATCH", "PUT"}
	paths := []string{"/a/b", "/a%2Fb", "/a%2fb", "/a//b", "/a/./b", "/a/c/../b", "/a/b/", "/%61/b", "/a/b%2F..%2Fc",
		"/a/b/../../c", "/A/B", "/a/b?x=1", "/a%252Fb", "/" + strings.Repeat("p", MaxOperationLength-10)}
	for i := 0; i < 3*opCacheSlots; i++ {
		paths = append(paths, fmt.Sprintf("/r/%d", i))
	}
	c := newOpCache()
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := 0; g < 8; g++ {
		wg.Go(func() {
			for round := 0; round < 4; round++ {
				for i, p := range paths {
					for j, m := range methods {
						r := httptest.NewRequest("POST", p, nil)
						r.Method = m
						if (i+j+g+round)%4 == 0 {
							r.Pattern = r.URL.EscapedPath()
						}
						if got, want := c.operation(r), DefaultOperation(r); got != want {
							select {
							case errs <- fmt.Sprintf("%s %s (pattern %q): cache says %q, DefaultOperation %q", m, p, r.Pattern, got, want):
							default:
							}
							return
						}
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
