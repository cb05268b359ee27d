package idem

import (
	"hash/maphash"
	"net/http"
	"strings"
	"sync/atomic"
)

// opCache remembers the operations DefaultOperation named, so that a
// middleware using it does not build and keep a new string for every
// request: "POST /payments" is made once, and every record of that route
// shares it. A slot is filled once and never replaced, so a server whose
// paths are all different (no route patterns) costs at most opCacheSlots
// entries and otherwise what DefaultOperation costs; a lookup that misses
// calls DefaultOperation. A method and path longer together than an
// operation may be (refused by Begin) are not remembered: neither is
// bounded otherwise (a method that is not a token reaches the middleware,
// to be refused, and HTTP/2 servers do not check it).
type opCache struct {
	seed  maphash.Seed
	slots [opCacheSlots]atomic.Pointer[opEntry]
}

const opCacheSlots = 64

// opEntry is one remembered operation: the method, whether src is the
// request's route pattern or its escaped path, and the operation
// DefaultOperation gave for them.
type opEntry struct {
	method, src string
	pattern     bool
	op          string
}

func newOpCache() *opCache { return &opCache{seed: maphash.MakeSeed()} }

// operation is DefaultOperation(r).
func (c *opCache) operation(r *http.Request) string {
	src, pattern := r.Pattern, true
	if src == "" {
		src, pattern = r.URL.EscapedPath(), false
	}
	h := maphash.String(c.seed, src) ^ uint64(len(r.Method))
	if len(r.Method) > 0 {
		h ^= uint64(r.Method[0]) << 8
	}
	slot := &c.slots[h%opCacheSlots]
	if e := slot.Load(); e != nil {
		if e.pattern == pattern && e.method == r.Method && e.src == src {
			return e.op
		}
		return DefaultOperation(r)
	}
	op := DefaultOperation(r)
	if len(r.Method)+len(src) <= MaxOperationLength {
		// Copies: r's strings may be parts of its whole request line,
		// which a slot would otherwise keep for the middleware's life.
		slot.CompareAndSwap(nil, &opEntry{method: strings.Clone(r.Method), src: strings.Clone(src), pattern: pattern, op: strings.Clone(op)})
	}
	return op
}
