package idemredis

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// These tests attack the search indexes from outside: through the Store's
// methods, and by deleting a record's key as its TTL would. They read no
// index set by name, so they hold whatever layout the indexes take.

// listEvery pages through p with limit and returns every record listed.
func listEvery(t *testing.T, s *Store, p idemstore.ListParams, limit int) []*idemstore.Record {
	t.Helper()
	p.Limit = limit
	var out []*idemstore.Record
	for range 1000 {
		page, err := s.List(t.Context(), p)
		if err != nil {
			t.Fatalf("List(%+v): %v", p, err)
		}
		out = append(out, page.Records...)
		if page.NextCursor == "" {
			return out
		}
		p.Cursor = page.NextCursor
	}
	t.Fatalf("List(%+v): the cursor does not advance", p)
	return nil
}

// expire deletes a record's key, as its Redis TTL does when it runs out.
func expire(t *testing.T, s *Store, k idemstore.Key) {
	t.Helper()
	if err := s.client.Do(t.Context(), s.client.B().Del().Key(s.recordKey(k)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// reserveLabelled reserves k with label and token tok.
func reserveLabelled(t *testing.T, s *Store, k idemstore.Key, tok, label string) {
	t.Helper()
	if _, created, err := s.Reserve(t.Context(), idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: time.Hour, ScopeLabel: label}); err != nil || !created {
		t.Fatalf("Reserve(%v): created %v, %v", k, created, err)
	}
}

// TestSearchLabelChanged checks that a key reserved again under another
// scope label (after a release, or after its TTL ran out) is listed once by
// a search for both labels, and not at all by a search for its old label
// alone: the old label's index entry outlives the record it was made for.
func TestSearchLabelChanged(t *testing.T) {
	t.Parallel()
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			s := newTestStore(t, topo.client(t))
			ctx := t.Context()
			released := idemstore.Key{Scope: "tenant-r", Operation: "POST /payments", Key: "relabel-released"}
			reserveLabelled(t, s, released, "t1", "acct_old")
			if err := s.Release(ctx, idemstore.ReleaseParams{Key: released, Token: "t1"}); err != nil {
				t.Fatal(err)
			}
			reserveLabelled(t, s, released, "t2", "acct_new")
			expired := idemstore.Key{Scope: "tenant-e", Operation: "POST /payments", Key: "relabel-expired"}
			reserveLabelled(t, s, expired, "t1", "acct_old")
			if err := s.Complete(ctx, idemstore.CompleteParams{Key: expired, Token: "t1", Response: &idemstore.Response{Status: 201}, Retention: time.Hour}); err != nil {
				t.Fatal(err)
			}
			expire(t, s, expired)
			reserveLabelled(t, s, expired, "t2", "acct_new")
			// Reindex, racing a relabelling, may index a record under the
			// label it had when Reindex read it: as stale an entry.
			if _, err := s.Reindex(ctx, nil); err != nil {
				t.Fatal(err)
			}
			want := []idemstore.Key{expired, released}
			for _, order := range []idemstore.Order{idemstore.OrderKey, idemstore.OrderOldest, idemstore.OrderNewest} {
				for _, limit := range []int{1, 2, 100} {
					p := idemstore.ListParams{ScopeLabels: []string{"acct_old", "acct_new"}, Order: order}
					got := keysOf(listEvery(t, s, p, limit))
					slices.SortFunc(got, func(a, b idemstore.Key) int { return strings.Compare(a.Key, b.Key) })
					if !slices.Equal(got, want) {
						t.Fatalf("List(labels old and new, order %v, limit %d) = %v, want each key once: %v", order, limit, got, want)
					}
					p.ScopeLabels = []string{"acct_old"}
					if got := listEvery(t, s, p, limit); len(got) != 0 {
						t.Fatalf("List(old label, order %v) = %v, want none", order, keysOf(got))
					}
				}
			}
		})
	}
}

// TestSearchRecreatedAfterTTL checks that a completed record whose TTL ran
// out and whose key was reserved again is listed once, as the new pending
// record with its new creation time, and counted once.
func TestSearchRecreatedAfterTTL(t *testing.T) {
	t.Parallel()
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			s := newTestStore(t, topo.client(t))
			ctx := t.Context()
			k := idemstore.Key{Scope: "tenant-1", Operation: "POST /payments", Key: "again"}
			reserveLabelled(t, s, k, "t1", "")
			first, err := s.Get(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "t1", Response: &idemstore.Response{Status: 201}, Retention: time.Hour}); err != nil {
				t.Fatal(err)
			}
			expire(t, s, k)
			reserveLabelled(t, s, k, "t2", "")
			second, err := s.Get(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if !second.CreatedAt.After(first.CreatedAt) {
				t.Fatalf("created at %v, then %v", first.CreatedAt, second.CreatedAt)
			}
			for _, p := range []idemstore.ListParams{
				{Key: "again"}, {KeyPrefix: "ag"}, {Order: idemstore.OrderOldest}, {Order: idemstore.OrderNewest},
				{Key: "again", Order: idemstore.OrderOldest}, {State: idemstore.StatePending, Order: idemstore.OrderOldest},
				{State: idemstore.StatePending, Key: "again"},
			} {
				got := listEvery(t, s, p, 1)
				if len(got) != 1 || got[0].Token != "t2" || !got[0].CreatedAt.Equal(second.CreatedAt) || got[0].State != idemstore.StatePending {
					t.Fatalf("List(%+v) = %v, want the new pending record once", p, got)
				}
			}
			for _, p := range []idemstore.ListParams{{State: idemstore.StateCompleted, Order: idemstore.OrderOldest}, {State: idemstore.StateCompleted, Key: "again"}} {
				if got := listEvery(t, s, p, 1); len(got) != 0 {
					t.Fatalf("List(%+v) = %v, want none", p, keysOf(got))
				}
			}
			c, err := s.Counts(ctx)
			if err != nil || c.Pending != 1 || c.Completed != 0 || c.NeedsReview != 0 {
				t.Fatalf("Counts = %+v, %v; want one pending", c, err)
			}
		})
	}
}

// TestSearchPagesWhileRecordsChange lists every record by age, a page of
// one at a time, while the records change state between pages (complete,
// escalate, resolve, extend, take over): a record that exists throughout
// must be listed exactly once, whatever its state when the page is read.
func TestSearchPagesWhileRecordsChange(t *testing.T) {
	t.Parallel()
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			s := newTestStore(t, topo.client(t))
			ctx := t.Context()
			const n = 12
			var keys []idemstore.Key
			for i := range n {
				k := idemstore.Key{Scope: fmt.Sprintf("tenant-%d", i%3), Operation: "POST /payments", Key: fmt.Sprintf("page-%02d", i)}
				reserveLabelled(t, s, k, "t1", "")
				keys = append(keys, k)
			}
			// change moves record i on, one step a call, through every
			// state: extended, in review, completed, then left alone.
			step := make([]int, n)
			change := func(i int) {
				k := keys[i]
				var err error
				switch step[i] {
				case 0:
					err = s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "t1", Lease: time.Hour})
				case 1:
					err = s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: "t1", Reason: "timeout"})
				case 2:
					err = s.Resolve(ctx, idemstore.ResolveParams{Key: k, Action: idemstore.ResolveComplete, Response: &idemstore.Response{Status: 200}, Retention: time.Hour})
				}
				step[i]++
				if err != nil {
					t.Fatalf("change %d of %v: %v", step[i], k, err)
				}
			}
			for _, order := range []idemstore.Order{idemstore.OrderOldest, idemstore.OrderNewest} {
				for _, p := range []idemstore.ListParams{{Order: order}, {KeyPrefix: "page-", Order: order}} {
					p.Limit = 1
					seen := map[idemstore.Key]int{}
					for pages := 0; ; pages++ {
						page, err := s.List(ctx, p)
						if err != nil {
							t.Fatal(err)
						}
						for _, r := range page.Records {
							seen[r.Key]++
						}
						// Change records on both sides of the cursor.
						change(pages % n)
						change((pages + n/2) % n)
						if page.NextCursor == "" {
							break
						}
						p.Cursor = page.NextCursor
					}
					for _, k := range keys {
						if seen[k] != 1 {
							t.Fatalf("List(%+v) paged while records changed: %v listed %d times (%v)", p, k, seen[k], seen)
						}
					}
				}
			}
		})
	}
}

// TestSearchLexSyntax checks keys, prefixes and labels made of the
// characters that ZRANGEBYLEX reads as syntax ('[', '(', '-', '+') and of
// DEL (0x7f), which sorts after every other visible character.
func TestSearchLexSyntax(t *testing.T) {
	t.Parallel()
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			s := newTestStore(t, topo.client(t))
			names := []string{"[", "(", "-", "+", "[a", "(a", "-a", "+a", "\x7f", "a\x7f", "a", "a[", "a(", "a-", "a+", "+", "~"}
			names = slices.Compact(slices.Sorted(slices.Values(names)))
			var keys []idemstore.Key
			for i, name := range names {
				k := idemstore.Key{Scope: "tenant-" + name, Operation: "POST /payments", Key: name}
				reserveLabelled(t, s, k, "t1", names[len(names)-1-i])
				keys = append(keys, k)
			}
			for _, name := range names {
				k := idemstore.Key{Scope: "tenant-" + name, Operation: "POST /payments", Key: name}
				if got := keysOf(listEvery(t, s, idemstore.ListParams{Key: name}, 1)); !slices.Equal(got, []idemstore.Key{k}) {
					t.Fatalf("List(Key %q) = %v", name, got)
				}
				var want []idemstore.Key
				for _, k := range keys {
					if strings.HasPrefix(k.Key, name) {
						want = append(want, k)
					}
				}
				if got := keysOf(listEvery(t, s, idemstore.ListParams{KeyPrefix: name}, 2)); !slices.Equal(got, want) {
					t.Fatalf("List(KeyPrefix %q) = %v, want %v", name, got, want)
				}
				got := keysOf(listEvery(t, s, idemstore.ListParams{ScopeLabels: []string{name}}, 2))
				if len(got) != 1 || got[0].Key != names[len(names)-1-slices.Index(names, name)] {
					t.Fatalf("List(ScopeLabels %q) = %v", name, got)
				}
			}
		})
	}
}

// TestCountsUnderConcurrency runs reserves, completes, escalations,
// releases and resolutions on many keys at once, then checks that Counts
// and the listings by state agree with the records exactly.
func TestCountsUnderConcurrency(t *testing.T) {
	t.Parallel()
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			s := newTestStore(t, topo.client(t))
			ctx := t.Context()
			const workers, perWorker = 8, 25
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range perWorker {
						// Two workers share each key: the second finds the first's record.
						k := idemstore.Key{Scope: fmt.Sprintf("tenant-%d", w%4), Operation: fmt.Sprintf("op-%d", i%3), Key: fmt.Sprintf("c-%d", i)}
						tok := fmt.Sprintf("w%d-%d", w, i)
						_, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: time.Hour})
						if err != nil {
							errs <- err
							return
						}
						if !created {
							continue
						}
						switch i % 5 {
						case 1:
							err = s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: &idemstore.Response{Status: 201}, Retention: time.Hour})
						case 2:
							err = s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: tok, Reason: "timeout"})
						case 3:
							err = s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: tok})
						case 4:
							if err = s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: tok, Reason: "timeout"}); err == nil {
								err = s.Resolve(ctx, idemstore.ResolveParams{Key: k, Action: idemstore.ResolveRelease})
							}
						}
						if err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			// Each (scope, operation, key) is reserved by two workers; i%5
			// decides its fate: 0 pending, 1 completed, 2 in review, 3 and
			// 4 gone.
			var want idemstore.Counts
			for i := range perWorker {
				switch i % 5 {
				case 0:
					want.Pending += workers / 2
				case 1:
					want.Completed += workers / 2
				case 2:
					want.NeedsReview += workers / 2
				}
			}
			c, err := s.Counts(ctx)
			if err != nil || c.Pending != want.Pending || c.Completed != want.Completed || c.NeedsReview != want.NeedsReview || c.CompletedEstimated {
				t.Fatalf("Counts = %+v, %v; want %d pending, %d completed, %d in review", c, err, want.Pending, want.Completed, want.NeedsReview)
			}
			for st, n := range map[idemstore.State]int64{idemstore.StatePending: want.Pending, idemstore.StateCompleted: want.Completed, idemstore.StateNeedsReview: want.NeedsReview} {
				if got := listEvery(t, s, idemstore.ListParams{State: st, Order: idemstore.OrderOldest}, 7); int64(len(got)) != n {
					t.Fatalf("List(State %s) listed %d, want %d", st, len(got), n)
				}
			}
		})
	}
}
