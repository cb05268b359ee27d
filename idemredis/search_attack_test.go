package idemredis

import (
	"slices"
	"strings"
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
