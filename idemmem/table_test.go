package idemmem

import (
	"context"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/idem-dev/idem/idemstore"
)

// Keys whose hashes collide share one chain; lookup, remove and each must
// keep them apart. Real 64-bit collisions are too rare to meet in a test,
// so the entries are put under one made-up hash.
func TestTableCollisions(t *testing.T) {
	sh := &shard{recs: make(map[uint64]*entry)}
	const h = 42
	es := make([]*entry, 4)
	for i := range es {
		es[i] = &entry{rec: record{Key: idemstore.Key{Scope: "s", Operation: "op", Key: string(rune('a' + i))}}}
		sh.insert(h, es[i])
	}
	other := &entry{rec: record{Key: idemstore.Key{Scope: "s", Operation: "op", Key: "z"}}}
	sh.insert(7, other)
	if sh.n != 5 {
		t.Fatalf("n = %d after 5 inserts", sh.n)
	}
	for _, e := range es {
		if got := sh.lookup(h, e.rec.Key); got != e {
			t.Fatalf("lookup %q: got %v", e.rec.Key.Key, got)
		}
	}
	if got := sh.lookup(h, other.rec.Key); got != nil {
		t.Fatal("lookup found a key under another hash")
	}
	// Remove from the middle, the head and the tail of the chain.
	for _, i := range []int{1, 3, 0} {
		if !sh.remove(h, es[i]) {
			t.Fatalf("remove %d: not found", i)
		}
		if sh.lookup(h, es[i].rec.Key) != nil {
			t.Fatalf("entry %d still found after remove", i)
		}
		if sh.remove(h, es[i]) {
			t.Fatalf("entry %d removed twice", i)
		}
	}
	if sh.lookup(h, es[2].rec.Key) != es[2] || sh.n != 2 {
		t.Fatalf("survivor lost: n=%d", sh.n)
	}
	var seen []string
	sh.each(func(e *entry) { seen = append(seen, e.rec.Key.Key) })
	if len(seen) != 2 {
		t.Fatalf("each visited %v", seen)
	}
	if !sh.remove(h, es[2]) || len(sh.recs) != 1 || sh.n != 1 {
		t.Fatalf("after emptying the chain: %d hashes, n=%d", len(sh.recs), sh.n)
	}
}

// An expiry item whose record was replaced after it expired must not
// evict the record that replaced it.
func TestEvictSkipsReplacedRecord(t *testing.T) {
	s := MustNew(Config{Shards: 1})
	k := idemstore.Key{Scope: "s", Operation: "op", Key: "k"}
	sh, h := s.locate(k)
	at := time.Unix(1_700_000_000, 0)
	old := &entry{rec: record{Key: k, State: idemstore.StateCompleted}}
	old.rec.setExpiresAt(at)
	sh.insert(h, old)
	sh.expiry.push(expiryItem{at: at.UnixNano(), h: h, e: old})
	sh.remove(h, old)
	fresh := &entry{rec: record{Key: k, State: idemstore.StateCompleted}}
	fresh.rec.setExpiresAt(at.Add(time.Hour))
	sh.insert(h, fresh)
	sh.evictExpired(s, at)
	if sh.lookup(h, k) != fresh || sh.expiry.len() != 0 {
		t.Fatalf("the replacing record was evicted, or the item kept: %d queued", sh.expiry.len())
	}
}

// The expiry queue pops in order of at whether items arrived in order (the
// FIFO) or not (the heap), and reuses the FIFO's popped space.
func TestExpiryQueueOrder(t *testing.T) {
	var q expiryQueue
	ats := []int64{10, 20, 20, 30, 5, 25, 40, 1, 50}
	for _, at := range ats {
		q.push(expiryItem{at: at})
	}
	if q.len() != len(ats) || len(q.heap) != 3 {
		t.Fatalf("len %d, %d in the heap; want %d, 3", q.len(), len(q.heap), len(ats))
	}
	var got []int64
	for q.due(35) {
		got = append(got, q.pop().at)
	}
	want := []int64{1, 5, 10, 20, 20, 25, 30}
	if !slices.Equal(got, want) {
		t.Fatalf("popped %v, want %v", got, want)
	}
	for i := int64(0); i < 1000; i++ {
		q.push(expiryItem{at: 100 + i})
		if q.pop().at > 100+i {
			t.Fatal("pop skipped an item")
		}
	}
	if q.len() != 2 || cap(q.fifo) > 64 {
		t.Fatalf("len %d, fifo cap %d: popped space not reused", q.len(), cap(q.fifo))
	}
}

// The key index compares the first 16 bytes of keys as integers before it
// compares the strings: that must order keys exactly as comparing the
// strings does, for keys shorter than 16 bytes (padded with zeros), keys
// that differ only past their 16th byte, keys one of which begins the
// other, and bytes past ASCII.
func TestKeyIndexOrdersByKeyValue(t *testing.T) {
	keys := []string{"", "a", "a\x00", "a\x00\x00", "ab", "b", "\x7f", "\x80", "\xff", "\xff\xff",
		"0190a0e0-0000-7", "0190a0e0-0000-70", "0190a0e0-0000-700", "0190a0e0-0000-7001", "0190a0e0-0000-7002",
		"0190a0e0-0000-6fff", "0190a0e0-0000-70\x00", "0190a0e0-0000-70\xff", "0190a0e1", "0190a0e0-0000-8"}
	type k struct{ key, scope, op string }
	var all []k
	for _, key := range keys {
		for _, scope := range []string{"s1", "s2"} {
			for _, op := range []string{"op1", "op2"} {
				all = append(all, k{key, scope, op})
			}
		}
	}
	for _, a := range all {
		for _, b := range all {
			want := a.key < b.key || a.key == b.key && (a.scope < b.scope || a.scope == b.scope && a.op < b.op)
			if got := byKeyValue(newKeyItem(a.key, a.scope, a.op, nil), newKeyItem(b.key, b.scope, b.op, nil)); got != want {
				t.Errorf("%q < %q = %v, want %v", a, b, got, want)
			}
		}
	}
}

// A record's entry fits the 240-byte size class of Go's allocator: every
// byte past it takes 16 more per record, which a store of a day's records
// pays in memory and in the garbage collector's work.
func TestEntryFitsItsSizeClass(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n > 240 {
		t.Fatalf("an entry takes %d bytes; keep it within 240", n)
	}
}

// TestRecordKeepsTimesExactly: a record's times, kept as seconds and
// nanoseconds, read back as the times they were, the zero time (a time
// never set) included, and a record reads back as the idemstore.Record it
// was made from.
func TestRecordKeepsTimesExactly(t *testing.T) {
	t.Parallel()
	for _, tm := range []time.Time{{}, time.Unix(0, 0).UTC(), time.Unix(-1, 999_999_999).UTC(),
		time.Date(2026, 12, 2, 3, 4, 5, 123_456_789, time.UTC), time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC), time.Date(1500, 6, 1, 0, 0, 0, 7, time.UTC)} {
		var r record
		r.setLeaseUntil(tm)
		r.setCreatedAt(tm.Add(time.Nanosecond))
		r.setUpdatedAt(tm.Add(time.Second))
		r.setExpiresAt(tm.Add(-time.Nanosecond))
		if r.LeaseUntil() != tm || r.CreatedAt() != tm.Add(time.Nanosecond) || r.UpdatedAt() != tm.Add(time.Second) || r.ExpiresAt() != tm.Add(-time.Nanosecond) {
			t.Errorf("%v: read back %v, %v, %v, %v", tm, r.LeaseUntil(), r.CreatedAt(), r.UpdatedAt(), r.ExpiresAt())
		}
	}
	var zero record
	if v := zero.view(); v != (idemstore.Record{}) {
		t.Errorf("a zero record reads as %+v", v)
	}
	want := idemstore.Record{Key: idemstore.Key{Scope: "s", Operation: "o", Key: "k"}, Fingerprint: "f", State: idemstore.StateCompleted,
		Token: "t", Reason: "r", ScopeLabel: "l", LeaseUntil: time.Unix(10, 1).UTC(), CreatedAt: time.Unix(20, 2).UTC(),
		UpdatedAt: time.Unix(30, 3).UTC(), ExpiresAt: time.Unix(40, 4).UTC()}
	r := record{Key: want.Key, Fingerprint: want.Fingerprint, State: want.State, Token: want.Token, Reason: want.Reason, ScopeLabel: want.ScopeLabel}
	r.setLeaseUntil(want.LeaseUntil)
	r.setCreatedAt(want.CreatedAt)
	r.setUpdatedAt(want.UpdatedAt)
	r.setExpiresAt(want.ExpiresAt)
	if v := r.view(); v != want {
		t.Errorf("read back %+v, want %+v", v, want)
	}
}

// TestRecordsShareTheirRequest: records whose requests kept for operators
// are equal and have no body share one copy, never the caller's; a
// request with a body, or another request, has its own; and what a
// caller does with its request or with a record it read changes nothing
// stored.
func TestRecordsShareTheirRequest(t *testing.T) {
	t.Parallel()
	s := MustNew(Config{Shards: 1})
	ctx := context.Background()
	reserve := func(key string, q *idemstore.Request) *entry {
		t.Helper()
		k := idemstore.Key{Scope: "s", Operation: "/pkg.S/M", Key: key}
		if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "f", Token: "t", Lease: time.Hour, Request: q}); err != nil || !created {
			t.Fatalf("Reserve %s: created %v, %v", key, created, err)
		}
		sh, h := s.locate(k)
		return sh.lookup(h, k)
	}
	q := &idemstore.Request{Method: "RPC", Path: "/pkg.S/M"}
	a := reserve("a", q)
	b := reserve("b", &idemstore.Request{Method: "RPC", Path: "/pkg.S/M"})
	if a.req == q || a.req != b.req {
		t.Errorf("equal requests: a %p, b %p, the caller's %p; want one copy, shared", a.req, b.req, q)
	}
	q.Path = "changed"
	if a.req.Path != "/pkg.S/M" {
		t.Errorf("the caller changed the stored request: %+v", a.req)
	}
	c := reserve("c", &idemstore.Request{Method: "RPC", Path: "/pkg.S/N"})
	withBody := &idemstore.Request{Method: "RPC", Path: "/pkg.S/N", Body: []byte("x")}
	d := reserve("d", withBody)
	e := reserve("e", &idemstore.Request{Method: "RPC", Path: "/pkg.S/N"})
	if c.req == a.req || d.req == c.req || e.req != c.req {
		t.Errorf("another request shares a's, or one with a body is shared: a %p c %p d %p e %p", a.req, c.req, d.req, e.req)
	}
	withBody.Body[0] = 'y'
	r, err := s.Get(ctx, idemstore.Key{Scope: "s", Operation: "/pkg.S/M", Key: "b"})
	if err != nil {
		t.Fatal(err)
	}
	r.Request.Path = "read and changed"
	for _, x := range []*entry{a, b, c, d, e} {
		if x.req.Path == "read and changed" || string(x.req.Body) == "y" {
			t.Errorf("a record's request changed: %+v", x.req)
		}
	}
}
