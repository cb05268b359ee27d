package idemmem

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// The store is bounded by Config.MaxRecords and Config.MaxBytes. It keeps
// two store-wide counters, records and bytes, that a new record is admitted
// against under its shard's lock. When they are at a bound, the completed
// record evicted first is the one whose expiry is queued first in the whole
// store: each shard publishes the head of its expiry queue (shard.head), so
// the choice costs one atomic load per shard and the eviction one pop of
// that shard's queue, with no lock held on the way there, and no two shard
// locks ever held at once. Pending and needs_review records are never
// queued, so never evicted.

// RecordOverhead is what every record counts against Config.MaxBytes on top
// of the bytes of its strings, request and answer: about what the record's
// structure, its index entry and its expiry item take in memory.
const RecordOverhead = 512

// Usage is what a Store holds, and what it evicted to stay within its
// bounds.
type Usage struct {
	// Records is the number of records held (expired ones included until
	// they are evicted).
	Records int64
	// Bytes is the size of the records as Config.MaxBytes counts it.
	Bytes int64
	// Evicted counts the completed records evicted to make room before
	// their retention ended: each is a key that a late retry could run
	// again. Zero while the bounds fit the traffic.
	Evicted int64
}

// Usage reports what the store holds against its bounds.
func (s *Store) Usage() Usage {
	return Usage{Records: s.count.Load(), Bytes: s.bytes.Load(), Evicted: s.evicted.Load()}
}

// bound is a configured limit, a negative one meaning none.
func bound(n int64) int64 {
	if n < 0 {
		return math.MaxInt64
	}
	return n
}

// admit counts a new record of size bytes against the bounds, and reports
// false, counting nothing, when it does not fit. Neither counter ever
// exceeds its bound on account of a record admitted here.
func (s *Store) admit(size int64) bool {
	if !addWithin(&s.count, 1, s.maxRecords) {
		return false
	}
	if !addWithin(&s.bytes, size, s.maxBytes) {
		s.count.Add(-1)
		return false
	}
	return true
}

// addWithin adds n to c unless that takes it over max.
func addWithin(c *atomic.Int64, n, max int64) bool {
	for {
		v := c.Load()
		if v+n > max {
			return false
		}
		if c.CompareAndSwap(v, v+n) {
			return true
		}
	}
}

// makeRoom evicts completed records, the first to expire first, until n
// more records of size bytes each fit within the bounds, or none is left
// to evict. It reports whether one such record fits. Concurrent
// reservations may take the room it made.
func (s *Store) makeRoom(n, size int64, now time.Time) bool {
	for !s.fits(n, size) {
		if !s.evictFirst(now) {
			return s.fits(1, size)
		}
	}
	return true
}

// fits reports whether n more records of size bytes each fit within the
// bounds.
func (s *Store) fits(n, size int64) bool {
	return s.count.Load()+n <= s.maxRecords && s.bytes.Load()+n*size <= s.maxBytes
}

// evictFirst evicts the completed record whose expiry is queued first in
// the whole store, and reports false when there is none.
func (s *Store) evictFirst(now time.Time) bool {
	for {
		var first *shard
		at := int64(math.MaxInt64)
		for i := range s.shards {
			if h := s.shards[i].head.Load(); h < at {
				first, at = &s.shards[i], h
			}
		}
		if first == nil {
			return false
		}
		first.mu.Lock()
		dropped := false
		for !dropped && first.expiry.len() > 0 {
			it := first.expiry.pop()
			early := it.e.rec.ExpiresAt().After(now)
			if dropped = first.drop(s, it.h, it.e); dropped && early {
				s.evicted.Add(1)
			}
		}
		first.syncHead()
		first.mu.Unlock()
		if dropped {
			return true
		}
		// That shard's queue held only items of records gone already (an
		// operator's Delete): it is empty now, so look again.
	}
}

// syncHead publishes the head of the shard's expiry queue. The caller holds
// sh.mu.
func (sh *shard) syncHead() {
	if at := sh.expiry.first(); at != sh.head.Load() {
		sh.head.Store(at)
	}
}

// resize counts e's size again after a change to it. The caller holds the
// lock of e's shard.
func (s *Store) resize(e *entry) {
	n := footprint(e)
	s.bytes.Add(n - e.size)
	e.size = n
}

// footprint is what e counts against MaxBytes.
func footprint(e *entry) int64 {
	r := &e.rec
	n := RecordOverhead + len(r.Key.Scope) + len(r.Key.Operation) + len(r.Key.Key) +
		len(r.Fingerprint) + len(r.Token) + len(r.Reason) + len(r.ScopeLabel) + len(e.resp)
	if e.req != nil {
		n += requestSize(e.req)
	}
	return int64(n)
}

// reserveSize is what the record p reserves counts against MaxBytes.
func reserveSize(p *idemstore.ReserveParams) int64 {
	n := RecordOverhead + len(p.Key.Scope) + len(p.Key.Operation) + len(p.Key.Key) + len(p.Fingerprint) + len(p.Token) + len(p.ScopeLabel)
	if p.Request != nil {
		n += requestSize(p.Request)
	}
	return int64(n)
}

func requestSize(q *idemstore.Request) int {
	return len(q.Method) + len(q.Path) + len(q.Query) + len(q.Body)
}
