package idemmem

import "github.com/idem-dev/idem/idemstore"

// A shard's records are indexed by the 64-bit hash of their key
// (Store.locate) rather than by the key itself: Go's map then hashes and
// compares one integer instead of three strings, and the expiry queue can
// drop a record by its hash without reading its key. Records whose keys'
// hashes collide are chained through entry.next.

// lookup returns the record for k, whose hash is h, or nil.
func (sh *shard) lookup(h uint64, k idemstore.Key) *entry {
	for e := sh.recs[h]; e != nil; e = e.next {
		if e.rec.Key == k {
			return e
		}
	}
	return nil
}

// insert adds e, whose key hashes to h and is not in the shard yet.
func (sh *shard) insert(h uint64, e *entry) {
	e.next = sh.recs[h]
	sh.recs[h] = e
	sh.n++
}

// remove takes e, whose key hashes to h, out of the shard. It reports
// false, changing nothing, when e is no longer there (an expiry item that
// outlived its record).
func (sh *shard) remove(h uint64, e *entry) bool {
	head := sh.recs[h]
	if head == e {
		if e.next == nil {
			delete(sh.recs, h)
		} else {
			sh.recs[h] = e.next
		}
		e.next = nil
		sh.n--
		return true
	}
	for p := head; p != nil; p = p.next {
		if p.next == e {
			p.next = e.next
			e.next = nil
			sh.n--
			return true
		}
	}
	return false
}

// each calls f for every record in the shard, in no order.
func (sh *shard) each(f func(*entry)) {
	for _, head := range sh.recs {
		for e := head; e != nil; e = e.next {
			f(e)
		}
	}
}
