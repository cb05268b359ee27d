package idemmem

import (
	"math"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// expiryItem says that e, completed with expiry at and indexed under h,
// may be evicted from then on. Eviction drops e only if it is still in the
// shard and expired, so an item that outlived its record never drops
// another.
type expiryItem struct {
	at int64 // ExpiresAt in Unix nanoseconds
	h  uint64
	e  *entry
}

// expiryQueue orders expiryItems by at. Records are completed with a
// retention that is usually the same for all of them, so items mostly
// arrive in order: those go to a FIFO, where push and pop cost O(1). An item
// that arrives earlier than the FIFO's last one (a shorter retention, a
// clock step back) goes to a min-heap instead. The earliest item is at the
// head of one of the two.
type expiryQueue struct {
	fifo []expiryItem // nondecreasing at, from head on
	head int
	heap expiryHeap
}

// len returns the number of items queued.
func (q *expiryQueue) len() int { return len(q.fifo) - q.head + len(q.heap) }

// push queues it.
func (q *expiryQueue) push(it expiryItem) {
	if n := len(q.fifo); n > q.head && it.at < q.fifo[n-1].at {
		q.heap.push(it)
		return
	}
	if q.head > 0 && len(q.fifo) == cap(q.fifo) {
		// Reuse the popped space instead of growing.
		n := copy(q.fifo, q.fifo[q.head:])
		clear(q.fifo[n:])
		q.fifo, q.head = q.fifo[:n], 0
	}
	q.fifo = append(q.fifo, it)
}

// first returns the earliest item's at, or math.MaxInt64 when the queue is
// empty.
func (q *expiryQueue) first() int64 {
	at := int64(math.MaxInt64)
	if q.head < len(q.fifo) {
		at = q.fifo[q.head].at
	}
	if len(q.heap) > 0 && q.heap[0].at < at {
		at = q.heap[0].at
	}
	return at
}

// due reports whether the earliest item is at or before n (Unix
// nanoseconds).
func (q *expiryQueue) due(n int64) bool {
	return (q.head < len(q.fifo) && q.fifo[q.head].at <= n) || (len(q.heap) > 0 && q.heap[0].at <= n)
}

// pop removes and returns the earliest item. The queue must not be empty.
func (q *expiryQueue) pop() expiryItem {
	if q.head == len(q.fifo) || (len(q.heap) > 0 && q.heap[0].at < q.fifo[q.head].at) {
		return q.heap.pop()
	}
	it := q.fifo[q.head]
	q.fifo[q.head] = expiryItem{}
	q.head++
	if q.head == len(q.fifo) {
		q.fifo, q.head = q.fifo[:0], 0
	}
	return it
}

// expiryHeap is a min-heap of expiryItems by at. It is written out instead
// of using container/heap to keep Complete free of interface boxing.
type expiryHeap []expiryItem

func (h *expiryHeap) push(it expiryItem) {
	*h = append(*h, it)
	a := *h
	i := len(a) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if a[parent].at <= a[i].at {
			break
		}
		a[parent], a[i] = a[i], a[parent]
		i = parent
	}
}

func (h *expiryHeap) pop() expiryItem {
	a := *h
	top := a[0]
	last := len(a) - 1
	a[0] = a[last]
	a[last] = expiryItem{}
	a = a[:last]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(a) && a[l].at < a[m].at {
			m = l
		}
		if r < len(a) && a[r].at < a[m].at {
			m = r
		}
		if m == i {
			break
		}
		a[i], a[m] = a[m], a[i]
		i = m
	}
	*h = a
	return top
}

// complete moves e, whose key hashes to h, to completed at now with the
// encoded answer resp, counts its new size, and queues its expiry. The
// caller holds sh.mu.
func (sh *shard) complete(s *Store, h uint64, e *entry, resp []byte, now, expiresAt time.Time) {
	e.rec.State = idemstore.StateCompleted
	e.resp = resp
	e.rec.setUpdatedAt(now)
	e.rec.setExpiresAt(expiresAt.UTC())
	s.resize(e)
	sh.expiry.push(expiryItem{at: expiresAt.UnixNano(), h: h, e: e})
	sh.syncHead()
}

// evictNext pops the earliest expiry and drops its record if that is still
// in the shard and expired at now. It reports whether a record was dropped.
// The caller holds sh.mu and has checked that the queue is not empty.
func (sh *shard) evictNext(s *Store, now time.Time) bool {
	it := sh.expiry.pop()
	sh.syncHead()
	return expired(it.e, now) && sh.drop(s, it.h, it.e)
}

// evictExpired removes the shard's completed records whose ExpiresAt is at
// or before now. The caller holds sh.mu. It costs one comparison when
// nothing has expired.
func (sh *shard) evictExpired(s *Store, now time.Time) {
	n := now.UnixNano()
	for sh.expiry.due(n) {
		sh.evictNext(s, now)
	}
}
