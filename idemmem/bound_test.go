package idemmem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// MaxBytes bounds pending records too: they are admitted within it.
func TestMaxBytesBoundsPendingRecords(t *testing.T) {
	t.Parallel()
	s := idemmem.MustNew(idemmem.Config{Shards: 1, MaxBytes: 64 * idemmem.RecordOverhead})
	for i := range 100 {
		if _, err := reserve(t, s, key(i)); err != nil {
			if !errors.Is(err, idemmem.ErrFull) {
				t.Fatal(err)
			}
			if u := s.Usage(); u.Records >= 64 || u.Bytes > 64*idemmem.RecordOverhead {
				t.Fatalf("full at %+v, over MaxBytes", u)
			}
			return
		}
	}
	t.Fatal("100 pending records fit in 64 records' overhead")
}

// Over MaxRecords, the completed records that expire first go first, in
// whichever shard they are; pending and needs_review records stay, and a
// new key fails with ErrFull once only they are left.
func TestMaxRecordsEvictsOldestCompleted(t *testing.T) {
	t.Parallel()
	s, clk := newStore(idemmem.Config{MaxRecords: 6})
	ctx := context.Background()
	var recs []*idemstore.Record
	for i := range 6 {
		rec, err := reserve(t, s, key(i))
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)
	}
	// 0..3 completed, one a minute, all with an hour's retention; 4 in
	// review, 5 pending.
	for i := range 4 {
		clk.set(time.Duration(i) * time.Minute)
		complete(t, s, recs[i], &idemstore.Response{Status: 200}, time.Hour)
	}
	if err := s.Escalate(ctx, idemstore.EscalateParams{Key: recs[4].Key, Token: recs[4].Token, Reason: "r"}); err != nil {
		t.Fatal(err)
	}
	// An existing key is answered at the cap without evicting anything.
	if got, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: key(5)}); err != nil || created || got.Token != recs[5].Token {
		t.Fatalf("Reserve of an existing key at the cap: %v, %v, %v", got, created, err)
	}
	if u := s.Usage(); u.Evicted != 0 || u.Records != 6 {
		t.Fatalf("usage after a replay at the cap: %+v", u)
	}

	// Two new keys evict the two oldest completed records, 0 and 1.
	for i := 6; i < 8; i++ {
		if _, err := reserve(t, s, key(i)); err != nil {
			t.Fatalf("Reserve of key %d at the cap: %v", i, err)
		}
	}
	for i := range 8 {
		_, err := s.Get(ctx, key(i))
		if gone := errors.Is(err, idemstore.ErrNotFound); gone != (i < 2) {
			t.Errorf("key %d: Get err = %v; evicted = %v, want %v", i, err, gone, i < 2)
		}
	}
	if u := s.Usage(); u.Evicted != 2 || u.Records != 6 {
		t.Fatalf("usage after two evictions: %+v, want 2 evicted, 6 records", u)
	}

	// 2 and 3 go next; then only pending and needs_review records are left.
	for i := 8; i < 10; i++ {
		if _, err := reserve(t, s, key(i)); err != nil {
			t.Fatalf("Reserve of key %d: %v", i, err)
		}
	}
	_, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: key(10), Token: "t"})
	if !errors.Is(err, idemmem.ErrFull) || !errors.Is(err, idemstore.ErrFull) || !errors.Is(err, idemstore.ErrUnavailable) || created {
		t.Fatalf("Reserve with only pending and needs_review records: created = %v, err = %v; want ErrFull", created, err)
	}
	for _, k := range []idemstore.Key{recs[4].Key, recs[5].Key, key(6), key(7), key(8), key(9)} {
		if rec, err := s.Get(ctx, k); err != nil || rec.State == idemstore.StateCompleted {
			t.Fatalf("record %v: %v, %v; want it kept", k, rec, err)
		}
	}

	// The evicted key is simply new again: a late retry runs once more.
	if err := s.Release(ctx, idemstore.ReleaseParams{Key: recs[5].Key, Token: recs[5].Token}); err != nil {
		t.Fatal(err)
	}
	if _, err := reserve(t, s, key(0)); err != nil {
		t.Fatalf("Reserve of an evicted key after a Release made room: %v", err)
	}
}

// The order is by expiry: a record kept for a minute goes before an older
// one kept for a day.
func TestEvictionFollowsExpiry(t *testing.T) {
	t.Parallel()
	s, clk := newStore(idemmem.Config{MaxRecords: 2, Shards: 1})
	ctx := context.Background()
	a, _ := reserve(t, s, key(1))
	complete(t, s, a, &idemstore.Response{Status: 200}, 24*time.Hour)
	clk.set(time.Second)
	b, _ := reserve(t, s, key(2))
	complete(t, s, b, &idemstore.Response{Status: 200}, time.Minute)
	if _, err := reserve(t, s, key(3)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, key(2)); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("the record expiring first was kept: %v", err)
	}
	if _, err := s.Get(ctx, key(1)); err != nil {
		t.Fatalf("the record expiring last was evicted: %v", err)
	}
}

// MaxBytes counts the answer's headers as well as its body.
func TestMaxBytesCountsHeaders(t *testing.T) {
	t.Parallel()
	s, _ := newStore(idemmem.Config{})
	rec, _ := reserve(t, s, key(1))
	before := s.Usage().Bytes
	h := http.Header{"X-Big": {strings.Repeat("h", 10000)}}
	complete(t, s, rec, &idemstore.Response{Status: 200, Header: h, Body: []byte("b")}, time.Hour)
	if grew := s.Usage().Bytes - before; grew < 10001 {
		t.Fatalf("an answer with 10000 bytes of header grew the store by %d bytes", grew)
	}

	// So a store whose bytes are spent on headers evicts for a new key.
	s2, _ := newStore(idemmem.Config{MaxBytes: 16 * idemmem.RecordOverhead})
	big := http.Header{"X-Big": {strings.Repeat("h", 8*idemmem.RecordOverhead)}}
	for i := range 4 {
		rec, err := reserve(t, s2, key(i))
		if err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
		complete(t, s2, rec, &idemstore.Response{Status: 200, Header: big}, time.Hour)
		if u := s2.Usage(); u.Bytes > 16*idemmem.RecordOverhead {
			t.Fatalf("after key %d: %+v, over MaxBytes", i, u)
		}
	}
	if u := s2.Usage(); u.Evicted == 0 || u.Records > 2 {
		t.Fatalf("usage %+v: want evictions, at most 2 records of 9 overheads each", u)
	}
}

// A record that could never fit fails at once and evicts nothing.
func TestRecordLargerThanMaxBytes(t *testing.T) {
	t.Parallel()
	s, _ := newStore(idemmem.Config{MaxBytes: 8 * idemmem.RecordOverhead})
	rec, _ := reserve(t, s, key(1))
	complete(t, s, rec, &idemstore.Response{Status: 200}, time.Hour)
	_, _, err := s.Reserve(context.Background(), idemstore.ReserveParams{Key: key(2), Token: "t",
		Request: &idemstore.Request{Method: "POST", Body: make([]byte, 8*idemmem.RecordOverhead)}})
	if !errors.Is(err, idemmem.ErrFull) {
		t.Fatalf("Reserve of a record over MaxBytes: %v, want ErrFull", err)
	}
	if u := s.Usage(); u.Records != 1 || u.Evicted != 0 {
		t.Fatalf("usage %+v: the record that could not fit evicted another", u)
	}
}

// An answer is stored even when only pending records are left to make
// room; the store then refuses new keys until evictions bring it back
// under MaxBytes.
func TestCompleteNeverDropsTheAnswer(t *testing.T) {
	t.Parallel()
	const max = 8 * idemmem.RecordOverhead
	s, _ := newStore(idemmem.Config{MaxBytes: max})
	ctx := context.Background()
	var recs []*idemstore.Record
	for i := 0; ; i++ {
		rec, err := reserve(t, s, key(i))
		if errors.Is(err, idemmem.ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)
	}
	body := make([]byte, 2*idemmem.RecordOverhead)
	complete(t, s, recs[0], &idemstore.Response{Status: 200, Body: body}, time.Hour)
	got, err := s.Get(ctx, recs[0].Key)
	if err != nil || len(got.Response.Body) != len(body) {
		t.Fatalf("answer stored over the bound: %v, %v", got, err)
	}
	if u := s.Usage(); u.Bytes <= max {
		t.Fatalf("usage %+v: the answer should have taken the store over MaxBytes", u)
	}
	// The next new key evicts that answer to get back under the bound.
	if err := s.Release(ctx, idemstore.ReleaseParams{Key: recs[1].Key, Token: recs[1].Token}); err != nil {
		t.Fatal(err)
	}
	if _, err := reserve(t, s, key(1000)); err != nil {
		t.Fatalf("Reserve after a Release: %v", err)
	}
	if u := s.Usage(); u.Bytes > max || u.Evicted != 1 {
		t.Fatalf("usage %+v: want back under %d with one eviction", u, max)
	}
	for _, r := range recs[2:] {
		if _, err := s.Get(ctx, r.Key); err != nil {
			t.Fatalf("pending record %v evicted: %v", r.Key, err)
		}
	}
}

// Usage counts exactly what the records hold, through every change, and
// drops back to nothing once they are gone.
func TestUsageAccounting(t *testing.T) {
	t.Parallel()
	s, clk := newStore(idemmem.Config{})
	ctx := context.Background()
	req := &idemstore.Request{Method: "POST", Path: "/p", Query: "a=1", Body: []byte("body")}
	for i := range 5 {
		if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: key(i), Fingerprint: "fp", Token: "t", Lease: time.Minute, Request: req}); err != nil {
			t.Fatal(err)
		}
	}
	resp := &idemstore.Response{Status: 201, Header: http.Header{"A": {"1"}}, Body: []byte("answer")}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Complete(ctx, idemstore.CompleteParams{Key: key(0), Token: "t", Response: resp, Retention: time.Minute}))
	must(s.Escalate(ctx, idemstore.EscalateParams{Key: key(1), Token: "t", Reason: "why"}))
	must(s.Resolve(ctx, idemstore.ResolveParams{Key: key(1), Action: idemstore.ResolveComplete, Response: resp, Reason: "settled", Retention: time.Hour}))
	must(s.Escalate(ctx, idemstore.EscalateParams{Key: key(2), Token: "t", Reason: "why"}))
	clk.set(time.Minute)
	must(s.Takeover(ctx, idemstore.TakeoverParams{Key: key(3), OldToken: "t", NewToken: "a-longer-token", Lease: time.Minute}))
	must(s.Extend(ctx, idemstore.ExtendParams{Key: key(3), Token: "a-longer-token", Lease: time.Minute}))
	u := s.Usage()
	if u.Records != 5 || u.Bytes < 5*idemmem.RecordOverhead+5*int64(len("POST/pa=1body")) {
		t.Fatalf("usage %+v", u)
	}
	must(s.Delete(ctx, idemstore.DeleteParams{Key: key(1)}))
	must(s.Resolve(ctx, idemstore.ResolveParams{Key: key(2), Action: idemstore.ResolveRelease}))
	must(s.Release(ctx, idemstore.ReleaseParams{Key: key(3), Token: "a-longer-token"}))
	must(s.Release(ctx, idemstore.ReleaseParams{Key: key(4), Token: "t"}))
	if n, err := s.Purge(ctx, idemstore.PurgeParams{}); n != 1 || err != nil {
		t.Fatalf("Purge = %d, %v", n, err)
	}
	if u := s.Usage(); u != (idemmem.Usage{}) {
		t.Fatalf("usage with no records left: %+v", u)
	}
}

// A flood of unique keys from many goroutines keeps the store within its
// bounds, and never evicts a pending or needs_review record: once they
// fill it, new keys get ErrFull. Records never exceed MaxRecords. A new
// record is admitted only within MaxBytes; what records grow by afterwards
// is stored regardless (an answer completed while nothing can be evicted,
// a review's reason), so bytes may pass MaxBytes by at most one answer per
// goroutine completing at that moment, and by the reasons.
func TestFloodStaysBounded(t *testing.T) {
	t.Parallel()
	const (
		maxRecords = 500
		maxBytes   = 300 * (idemmem.RecordOverhead + 256)
		workers    = 8
		perWorker  = 2000
		reason     = "unknown"
	)
	s, _ := newStore(idemmem.Config{MaxRecords: maxRecords, MaxBytes: maxBytes})
	ctx := context.Background()
	answer := &idemstore.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: make([]byte, 200)}
	answerBytes := int64(len(idemstore.EncodeResponse(answer)))
	var (
		mu        sync.Mutex
		kept      []idemstore.Key // pending or needs_review: never to be evicted
		escalated int
		full      int
		most      idemmem.Usage
		failures  []string
	)
	observe := func() {
		u := s.Usage()
		most.Records = max(most.Records, u.Records)
		most.Bytes = max(most.Bytes, u.Bytes)
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				k := idemstore.Key{Scope: "anon", Operation: "POST /x", Key: fmt.Sprintf("w%d-%d", w, i)}
				tok := "t-" + k.Key
				_, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: time.Hour,
					Request: &idemstore.Request{Method: "POST", Path: "/x", Body: []byte(k.Key)}})
				mu.Lock()
				observe()
				if errors.Is(err, idemmem.ErrFull) {
					full++
				} else if err != nil || !created {
					failures = append(failures, fmt.Sprintf("%s: created %v, %v", k.Key, created, err))
				}
				mu.Unlock()
				if err != nil {
					continue
				}
				switch i % 50 {
				case 0: // left pending, as by a holder still at work
				case 1:
					err = s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: tok, Reason: reason})
				default:
					err = s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: answer, Retention: 24 * time.Hour})
				}
				mu.Lock()
				observe()
				if err != nil {
					failures = append(failures, fmt.Sprintf("%s: %v", k.Key, err))
				}
				if i%50 < 2 {
					kept = append(kept, k)
					escalated += i % 50
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d unexpected results, first %s", len(failures), failures[0])
	}
	// The flood may have ended short of filling the store with kept
	// records (a kept key refused only while others' pending records took
	// the room). Keys left pending, one at a time, fill it: each evicts
	// completed records first, and the one refused has evicted them all.
	var topped int
	for i := 0; ; i++ {
		if i > maxRecords {
			t.Fatalf("%d more pending keys admitted after the flood, over MaxRecords %d", i, maxRecords)
		}
		k := idemstore.Key{Scope: "anon", Operation: "POST /x", Key: fmt.Sprintf("fill-%d", i)}
		_, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "t", Lease: time.Hour,
			Request: &idemstore.Request{Method: "POST", Path: "/x", Body: []byte(k.Key)}})
		if errors.Is(err, idemmem.ErrFull) {
			break
		}
		if err != nil || !created {
			t.Fatalf("Reserve %s after the flood: created %v, %v", k.Key, created, err)
		}
		observe()
		kept = append(kept, k)
		topped++
	}
	u := s.Usage()
	t.Logf("usage %+v, most seen %+v, %d refused as full in the flood, %d kept, %d of them after it", u, most, full, len(kept), topped)
	if most.Records > maxRecords || most.Bytes > maxBytes+workers*answerBytes+int64(escalated*len(reason)) {
		t.Fatalf("most seen %+v, over the bounds of %d records, %d bytes", most, maxRecords, maxBytes)
	}
	if u.Bytes > maxBytes+int64(escalated*len(reason)) {
		t.Fatalf("usage %+v, over %d bytes with only kept records left", u, maxBytes)
	}
	if u.Evicted == 0 {
		t.Fatalf("usage %+v: a flood of %d keys into %d records evicted none", u, workers*perWorker, maxRecords)
	}
	for _, k := range kept {
		rec, err := s.Get(ctx, k)
		if err != nil || rec.State == idemstore.StateCompleted {
			t.Fatalf("kept record %v evicted: %v, %v", k, rec, err)
		}
	}
	if n := s.Len(); int64(n) != u.Records || n != len(kept) {
		t.Fatalf("Len = %d, Usage.Records = %d, kept = %d; want only the kept records left", n, u.Records, len(kept))
	}
}

// Reservations racing at the bound take each other's room; none of them
// may fail while completed records are left to evict (each holder has one
// record pending at a time, far fewer than the bound).
func TestReserveUnderContentionAtTheBound(t *testing.T) {
	t.Parallel()
	for _, cfg := range []idemmem.Config{{MaxRecords: 64}, {MaxBytes: 64 * (idemmem.RecordOverhead + 64)}, {MaxRecords: 64, Shards: 1}} {
		s := idemmem.MustNew(cfg)
		ctx := context.Background()
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := range 5000 {
					k := idemstore.Key{Scope: "s", Operation: "op", Key: fmt.Sprintf("%d-%d", w, i)}
					if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Token: "t", Lease: time.Minute}); err != nil {
						t.Errorf("%+v: worker %d, key %d: %v (usage %+v)", cfg, w, i, err, s.Usage())
						return
					}
					if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "t", Response: &idemstore.Response{Status: 200}, Retention: time.Hour}); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		u := s.Usage()
		if (cfg.MaxRecords > 0 && u.Records > int64(cfg.MaxRecords)) || (cfg.MaxBytes > 0 && u.Bytes > cfg.MaxBytes) || u.Evicted != 8*5000-u.Records {
			t.Fatalf("%+v: usage %+v", cfg, u)
		}
	}
}
