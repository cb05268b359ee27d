package idemmem

import (
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// expiryItem says that the record for key, completed with expiry at, may
// be evicted from then on. An item can outlive its record (purged,
// released after a restart of the key); eviction checks the record again.
type expiryItem struct {
	at  int64 // ExpiresAt in Unix nanoseconds
	key idemstore.Key
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

// evictExpired removes the shard's completed records whose ExpiresAt is at
// or before now. The caller holds sh.mu. It costs one comparison when
// nothing has expired.
func (sh *shard) evictExpired(s *Store, now time.Time) {
	n := now.UnixNano()
	for len(sh.expiry) > 0 && sh.expiry[0].at <= n {
		it := sh.expiry.pop()
		if e, ok := sh.recs[it.key]; ok && expired(e, now) {
			sh.drop(s, it.key)
		}
	}
}
