package idemmem

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// TestKeyIndexFollowsRecords: whatever reserves, completions, releases,
// evictions at MaxRecords, purges, deletes and reservations again of the
// same keys happen, in many scopes and operations, each shard's key index
// holds exactly its records, each under its own key (in the B-tree, or
// waiting for the next search to put them there), and a search by key or
// key prefix, page by page, lists exactly the records Get finds, as Get
// finds them (no record of an earlier reservation of the key, none of
// another key).
func TestKeyIndexFollowsRecords(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	s := MustNew(Config{Shards: 4, MaxRecords: 30, Now: func() time.Time { return now }})
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 11))
	keys := []string{"a", "a0", "ab", "abc", "abd", "b", "bb"}
	var universe []idemstore.Key
	for _, k := range keys {
		for sc := range 5 {
			for op := range 2 {
				universe = append(universe, idemstore.Key{Scope: fmt.Sprint("s", sc), Operation: fmt.Sprint("op", op), Key: k})
			}
		}
	}
	tokens := map[idemstore.Key]string{}
	serial := 0
	resp := &idemstore.Response{Status: 200, Body: []byte("ok")}

	live := func(match func(string) bool) []string {
		var out []string
		for _, k := range universe {
			if !match(k.Key) {
				continue
			}
			r, err := s.Get(ctx, k)
			if err == idemstore.ErrNotFound {
				continue
			} else if err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%s\x00%s\x00%s\x00%s\x00%s", r.Key.Key, r.Key.Scope, r.Key.Operation, r.Token, r.State))
		}
		slices.Sort(out) // key, scope, operation: the order of a search by key
		return out
	}
	listed := func(p idemstore.ListParams) []string {
		var out []string
		p.Limit = 3
		for {
			page, err := s.List(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range page.Records {
				out = append(out, fmt.Sprintf("%s\x00%s\x00%s\x00%s\x00%s", r.Key.Key, r.Key.Scope, r.Key.Operation, r.Token, r.State))
			}
			if page.NextCursor == "" {
				return out
			}
			p.Cursor = page.NextCursor
		}
	}
	check := func(step int, search bool) {
		t.Helper()
		for i := range s.shards {
			sh := &s.shards[i]
			sh.mu.Lock()
			n := 0
			if sh.byKey != nil {
				n = sh.byKey.Len()
				sh.byKey.Ascend(func(it keyItem) bool {
					k := idemstore.Key{Scope: it.scope, Operation: it.operation, Key: it.key}
					if it.e.rec.Key != k {
						t.Fatalf("step %d: key index holds %v for a record of %v", step, k, it.e.rec.Key)
					}
					sh2, h := s.locate(k)
					if sh2 != sh || sh.lookup(h, k) != it.e {
						t.Fatalf("step %d: key index holds a record of %v that the shard no longer has", step, k)
					}
					return true
				})
			}
			for j, e := range sh.unindexed {
				if int(e.unindexedAt) != j+1 {
					t.Fatalf("step %d: the record of %v waits for the key index at %d and says %d", step, e.rec.Key, j+1, e.unindexedAt)
				}
				sh2, h := s.locate(e.rec.Key)
				if sh2 != sh || sh.lookup(h, e.rec.Key) != e {
					t.Fatalf("step %d: a record of %v that the shard no longer has waits for the key index", step, e.rec.Key)
				}
			}
			n += len(sh.unindexed)
			if n != sh.n {
				t.Fatalf("step %d: shard %d holds %d records and its key index, with those waiting for it, %d", step, i, sh.n, n)
			}
			sh.mu.Unlock()
		}
		if !search {
			return
		}
		for _, k := range keys {
			want := live(func(x string) bool { return x == k })
			if got := listed(idemstore.ListParams{Key: k}); !slices.Equal(got, want) {
				t.Fatalf("step %d: List{Key: %q} = %q, want %q", step, k, got, want)
			}
		}
		for _, p := range []string{"a", "ab", "abc", "b"} {
			want := live(func(x string) bool { return strings.HasPrefix(x, p) })
			if got := listed(idemstore.ListParams{KeyPrefix: p}); !slices.Equal(got, want) {
				t.Fatalf("step %d: List{KeyPrefix: %q} = %q, want %q", step, p, got, want)
			}
		}
	}

	for step := range 3000 {
		k := universe[rng.IntN(len(universe))]
		switch op := rng.IntN(10); {
		case op < 4:
			serial++
			tok := fmt.Sprint("t", serial)
			if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "f", Token: tok, Lease: time.Hour}); err == nil && created {
				tokens[k] = tok
			} else if err != nil && err != ErrFull {
				t.Fatal(err)
			}
		case op < 7:
			_ = s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tokens[k], Response: resp, Retention: time.Duration(1+rng.IntN(5)) * time.Minute})
		case op == 7:
			if rng.IntN(2) == 0 {
				_ = s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: tokens[k]})
			} else {
				_ = s.Delete(ctx, idemstore.DeleteParams{Key: k})
			}
		case op == 8:
			now = now.Add(time.Duration(rng.IntN(90)) * time.Second)
		default:
			if _, err := s.Purge(ctx, idemstore.PurgeParams{}); err != nil {
				t.Fatal(err)
			}
		}
		// Searches bring the key index up to date; between them, records
		// come and go while they wait for it.
		check(step, rng.IntN(6) == 0)
	}
	if s.Usage().Evicted == 0 {
		t.Fatal("no record was evicted at MaxRecords: the test does not reach eviction")
	}
}
