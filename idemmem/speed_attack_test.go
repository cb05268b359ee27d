package idemmem

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// TestKeyIndexUnderConcurrentSearchesAndWrites: searches by key and key
// prefix, page by page, run while other goroutines reserve, complete,
// release, delete, purge and evict at MaxRecords, so that the records
// waiting for the key index are moved into it while records come and go.
// Every page is in key order, within its key or prefix, and holds each
// record at most once; once the writers stop, each shard's key index, with
// the records waiting for it, holds exactly its records, and a search lists
// exactly what Get finds. Run with -race: searches change the key index
// that writers change too.
func TestKeyIndexUnderConcurrentSearchesAndWrites(t *testing.T) {
	t.Parallel()
	var clock atomic.Int64
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	s := MustNew(Config{Shards: 4, MaxRecords: 60, Now: func() time.Time { return base.Add(time.Duration(clock.Load())) }})
	ctx := context.Background()
	var universe []idemstore.Key
	for _, k := range []string{"a", "a0", "ab", "abc", "abd", "0123456789abcdef", "0123456789abcdef0", "0123456789abcdeg", "b", "bb"} {
		for sc := range 6 {
			for op := range 3 {
				universe = append(universe, idemstore.Key{Scope: fmt.Sprint("s", sc), Operation: fmt.Sprint("op", op), Key: k})
			}
		}
	}
	resp := &idemstore.Response{Status: 200, Body: []byte("ok")}
	req := &idemstore.Request{Method: "RPC", Path: "/pkg.S/M"}

	const writers, steps = 4, 3000
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for i := range steps {
				k := universe[rng.IntN(len(universe))]
				tok := fmt.Sprint("w", w, "-", i)
				switch op := rng.IntN(10); {
				case op < 4:
					_, _, _ = s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "f", Token: tok, Lease: time.Hour, Request: req})
				case op < 7:
					if r, err := s.Get(ctx, k); err == nil && r.State == idemstore.StatePending {
						_ = s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: r.Token, Response: resp, Retention: time.Duration(1+rng.IntN(5)) * time.Minute})
					}
				case op == 7:
					if r, err := s.Get(ctx, k); err == nil {
						_ = s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: r.Token})
						_ = s.Delete(ctx, idemstore.DeleteParams{Key: k})
					}
				case op == 8:
					clock.Add(int64(rng.IntN(60)) * int64(time.Second))
				default:
					if _, err := s.Purge(ctx, idemstore.PurgeParams{}); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	list := func(p idemstore.ListParams) []string {
		var out []string
		p.Limit = 4
		for {
			page, err := s.List(ctx, p)
			if err != nil {
				t.Error(err)
				return out
			}
			for _, r := range page.Records {
				if (p.Key != "" && r.Key.Key != p.Key) || !strings.HasPrefix(r.Key.Key, p.KeyPrefix) {
					t.Errorf("List(%+v) found %v", p, r.Key)
				}
				if q := r.Request; q == nil || q.Method != "RPC" || q.Path != "/pkg.S/M" || q.Query != "" || q.Body != nil {
					t.Errorf("record %v has request %+v", r.Key, r.Request)
				} else {
					r.Request.Path = "changed by a reader" // a copy: nobody else sees it
				}
				out = append(out, r.Key.Key+"\x00"+r.Key.Scope+"\x00"+r.Key.Operation)
			}
			if page.NextCursor == "" {
				return out
			}
			p.Cursor = page.NextCursor
		}
	}
	stop := make(chan struct{})
	var searchers sync.WaitGroup
	for i := range 2 {
		searchers.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				p := idemstore.ListParams{KeyPrefix: []string{"a", "ab", "0123456789abcdef", "b"}[n%4]}
				if (n+i)%3 == 0 {
					p = idemstore.ListParams{Key: "abc"}
				}
				got := list(p)
				// A paged search may miss records that come and go, but
				// its pages follow one another in order, each record once.
				if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
					t.Errorf("List(%+v) pages out of order or repeating: %q", p, got)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	searchers.Wait()

	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n := len(sh.unindexed)
		if sh.byKey != nil {
			n += sh.byKey.Len()
		}
		for j, e := range sh.unindexed {
			if int(e.unindexedAt) != j+1 {
				t.Errorf("shard %d: a record waits at %d and says %d", i, j+1, e.unindexedAt)
			}
		}
		if n != sh.n {
			t.Errorf("shard %d holds %d records and its key index, with those waiting for it, %d", i, sh.n, n)
		}
		sh.mu.Unlock()
	}
	for _, prefix := range []string{"", "a", "0123456789abcdef", "b"} {
		var want []string
		for _, k := range universe {
			if r, err := s.Get(ctx, k); err == nil && strings.HasPrefix(r.Key.Key, prefix) {
				want = append(want, k.Key+"\x00"+k.Scope+"\x00"+k.Operation)
			}
		}
		slices.Sort(want)
		p := idemstore.ListParams{KeyPrefix: prefix}
		if prefix == "" {
			p.KeyPrefix, p.Key = "", "abc"
			want = slices.DeleteFunc(want, func(x string) bool { return !strings.HasPrefix(x, "abc\x00") })
		}
		if got := list(p); !slices.Equal(got, want) {
			t.Errorf("List(%+v) = %q, want %q", p, got, want)
		}
	}
	if s.Usage().Evicted == 0 {
		t.Error("no record was evicted at MaxRecords: the test does not reach eviction")
	}
}
