package idemmem

import (
	"encoding/binary"
	"slices"
	"strings"

	"github.com/google/btree"

	"github.com/idem-dev/idem/idemstore"
)

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
	sh.index(e)
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
		sh.unindex(e)
		return true
	}
	for p := head; p != nil; p = p.next {
		if p.next == e {
			p.next = e.next
			e.next = nil
			sh.n--
			sh.unindex(e)
			return true
		}
	}
	return false
}

// A shard also indexes its records by key value (byKey, in key, scope,
// operation order), for a search by key or key prefix, and by scope label
// (byLabel, by idemstore.ScopeLabelIndex), for a search by label. Neither
// changes after Reserve, so only insert and remove touch them.
//
// The key index is brought up to date by the searches that read it
// (syncKeyIndex), not by every Reserve: a new record waits in
// sh.unindexed, where adding it and removing it (when it expires or is
// released before any search) costs O(1), and the first search after it
// moves the waiting records into the B-tree, sorted. A B-tree insert at a
// random place, with the cache misses of the nodes it walks and the
// garbage its nodes make, is the most a Reserve on a large store spent,
// for searches an operator makes now and then; now a record that expires
// between two searches never enters the B-tree at all, and one search pays
// at most one insert per record added since the last.

// keyItem is an entry of the key index: the record's key, held by value in
// the B-tree's nodes so that comparing two needs no visit to their
// records, and the entry. hi and lo are the key's first 16 bytes, big
// endian, padded with zeros: two keys whose first 16 bytes differ compare
// as those integers do, without reading the strings' bytes (scattered
// through the heap, one cache miss each), and only the rest go on to
// compare the strings.
type keyItem struct {
	hi, lo                uint64
	key, scope, operation string
	e                     *entry
}

func keyItemOf(e *entry) keyItem {
	return newKeyItem(e.rec.Key.Key, e.rec.Key.Scope, e.rec.Key.Operation, e)
}

func newKeyItem(key, scope, operation string, e *entry) keyItem {
	var b [16]byte
	copy(b[:], key)
	return keyItem{hi: binary.BigEndian.Uint64(b[:8]), lo: binary.BigEndian.Uint64(b[8:]),
		key: key, scope: scope, operation: operation, e: e}
}

// byKeyValue orders the key index by key, scope and operation, comparing
// the scope and operation only for equal keys. Ordering by the prefix
// first is ordering by key: keys that differ in their first 16 bytes
// differ there as their prefixes do (a key that ends sooner is padded
// with zeros, which sort first), and the others have equal prefixes.
func byKeyValue(a, b keyItem) bool {
	if a.hi != b.hi {
		return a.hi < b.hi
	}
	if a.lo != b.lo {
		return a.lo < b.lo
	}
	if c := strings.Compare(a.key, b.key); c != 0 {
		return c < 0
	}
	if c := strings.Compare(a.scope, b.scope); c != 0 {
		return c < 0
	}
	return a.operation < b.operation
}

// keyIndexDegree is the B-tree degree of the key index.
const keyIndexDegree = 16

func (sh *shard) index(e *entry) {
	sh.unindexed = append(sh.unindexed, e)
	e.unindexedAt = int32(len(sh.unindexed))
	if e.rec.ScopeLabel != "" {
		ix := idemstore.ScopeLabelIndex(e.rec.ScopeLabel)
		if sh.byLabel == nil {
			sh.byLabel = make(map[string]map[*entry]struct{})
		}
		set := sh.byLabel[ix]
		if set == nil {
			set = make(map[*entry]struct{})
			sh.byLabel[ix] = set
		}
		set[e] = struct{}{}
	}
}

func (sh *shard) unindex(e *entry) {
	if i := int(e.unindexedAt) - 1; i >= 0 { // still waiting: swap the last one into its place
		last := sh.unindexed[len(sh.unindexed)-1]
		sh.unindexed[i], last.unindexedAt = last, int32(i+1)
		sh.unindexed[len(sh.unindexed)-1] = nil
		sh.unindexed = sh.unindexed[:len(sh.unindexed)-1]
		e.unindexedAt = 0
	} else {
		sh.byKey.Delete(keyItemOf(e))
	}
	if e.rec.ScopeLabel != "" {
		ix := idemstore.ScopeLabelIndex(e.rec.ScopeLabel)
		if set := sh.byLabel[ix]; set != nil {
			delete(set, e)
			if len(set) == 0 {
				delete(sh.byLabel, ix)
			}
		}
	}
}

// syncKeyIndex moves the records waiting in sh.unindexed into the key
// index, in order (inserts next to the previous one walk nodes already in
// the cache). The caller holds sh.mu.
func (sh *shard) syncKeyIndex() {
	if len(sh.unindexed) == 0 {
		return
	}
	if sh.byKey == nil {
		sh.byKey = btree.NewG(keyIndexDegree, byKeyValue)
	}
	items := make([]keyItem, len(sh.unindexed))
	for i, e := range sh.unindexed {
		items[i] = keyItemOf(e)
		e.unindexedAt = 0
	}
	slices.SortFunc(items, func(a, b keyItem) int {
		if byKeyValue(a, b) {
			return -1
		}
		return 1 // never equal: no two records share a key
	})
	for _, it := range items {
		sh.byKey.ReplaceOrInsert(it)
	}
	clear(sh.unindexed)
	sh.unindexed = sh.unindexed[:0]
}

// clearIndexes drops every record from the indexes.
func (sh *shard) clearIndexes() {
	sh.byKey, sh.byLabel, sh.unindexed = nil, nil, nil
}

// each calls f for every record in the shard, in no order.
func (sh *shard) each(f func(*entry)) {
	for _, head := range sh.recs {
		for e := head; e != nil; e = e.next {
			f(e)
		}
	}
}
