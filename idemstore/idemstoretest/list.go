package idemstoretest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

// populate fills a fresh store with records in every state and returns
// their keys by state, pending ones with a live or an expired lease apart.
// Completed records are spread over two operations.
type population struct {
	live, expired, completed, review []idemstore.Key
}

// otherOperation is the operation of half the completed records populate
// makes.
const otherOperation = "PATCH /things/{id}"

// byOperation returns the keys of keys whose operation is op ("" for all).
func byOperation(keys []idemstore.Key, op string) []idemstore.Key {
	var out []idemstore.Key
	for _, k := range keys {
		if op == "" || k.Operation == op {
			out = append(out, k)
		}
	}
	return out
}

func (p population) byState(st idemstore.State) []idemstore.Key {
	switch st {
	case idemstore.StatePending:
		return slices.Concat(p.live, p.expired)
	case idemstore.StateCompleted:
		return p.completed
	case idemstore.StateNeedsReview:
		return p.review
	}
	return slices.Concat(p.live, p.expired, p.completed, p.review)
}

func populate(f *fixture) population {
	f.t.Helper()
	var p population
	n := 0
	next := func() idemstore.Key { n++; return f.key(fmt.Sprintf("k%03d", n)) }
	for range 4 {
		p.live = append(p.live, f.reserve(next(), leaseLive).Key)
	}
	for range 3 {
		p.expired = append(p.expired, f.reserve(next(), leaseExpired).Key)
	}
	// A lease that ends as it is granted has expired.
	p.expired = append(p.expired, f.reserve(next(), 0).Key)
	for i := range 6 {
		k := next()
		if i%2 == 1 {
			k.Operation = otherOperation
		}
		rec := f.reserve(k, leaseExpired)
		f.complete(rec, jsonResponse(`{}`), retainLive)
		p.completed = append(p.completed, rec.Key)
	}
	for range 5 {
		rec := f.reserve(next(), leaseExpired)
		f.escalate(rec, "check")
		p.review = append(p.review, rec.Key)
	}
	return p
}

func keySet(t *testing.T, what string, keys []idemstore.Key) map[idemstore.Key]bool {
	t.Helper()
	m := make(map[idemstore.Key]bool, len(keys))
	for _, k := range keys {
		if m[k] {
			t.Fatalf("%s: %v returned twice", what, k)
		}
		m[k] = true
	}
	return m
}

func requireSameKeys(t *testing.T, what string, got, want []idemstore.Key) {
	t.Helper()
	g, w := keySet(t, what, got), keySet(t, what+" (want)", want)
	for k := range w {
		if !g[k] {
			t.Errorf("%s: missing %v", what, k)
		}
	}
	for k := range g {
		if !w[k] {
			t.Errorf("%s: unexpected %v", what, k)
		}
	}
}

func testList(t *testing.T, h Harness) {
	t.Run("Pages", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, h.New(t))
		pop := populate(f)
		for _, q := range []struct {
			st idemstore.State
			op string
		}{{"", ""}, {idemstore.StatePending, ""}, {idemstore.StateCompleted, ""}, {idemstore.StateNeedsReview, ""},
			{idemstore.StateCompleted, otherOperation}, {"", otherOperation}, {idemstore.StatePending, otherOperation}} {
			st := q.st
			for _, limit := range []int{0, 1, 2, 5, 1000} {
				what := fmt.Sprintf("List(State %q, Operation %q, Limit %d)", st, q.op, limit)
				var got []idemstore.Key
				cursor := ""
				for page := 0; ; page++ {
					if page > 100 {
						t.Fatalf("%s: more than 100 pages for %d records; does NextCursor advance?", what, len(pop.byState("")))
					}
					res, err := f.s.List(f.ctx(), idemstore.ListParams{State: st, Operation: q.op, Cursor: cursor, Limit: limit})
					if err != nil {
						t.Fatalf("%s page %d: %v", what, page, err)
					}
					if n := (idemstore.ListParams{Limit: limit}).Normalize().Limit; len(res.Records) > n {
						t.Fatalf("%s page %d: %d records, more than the limit %d", what, page, len(res.Records), n)
					}
					if len(res.Records) == 0 && res.NextCursor != "" {
						t.Fatalf("%s page %d: empty page with a NextCursor", what, page)
					}
					for _, r := range res.Records {
						checkUTC(t, r)
						if st != "" && r.State != st {
							t.Fatalf("%s: record %v in state %q", what, r.Key, r.State)
						}
						if q.op != "" && r.Key.Operation != q.op {
							t.Fatalf("%s: record %v of another operation", what, r.Key)
						}
						if r.ReadAt.IsZero() {
							t.Fatalf("%s: record %v has no ReadAt", what, r.Key)
						}
						if r.Key.Scope == f.scope {
							if r.Fingerprint != "fp-"+r.Key.Key {
								t.Fatalf("%s: record %v has fingerprint %q", what, r.Key, r.Fingerprint)
							}
							got = append(got, r.Key)
						}
					}
					if res.NextCursor == "" {
						break
					}
					cursor = res.NextCursor
				}
				requireSameKeys(t, what, got, byOperation(pop.byState(st), q.op))
			}
		}
	})

	t.Run("ExpiredLeases", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, h.New(t))
		pop := populate(f)
		recs, err := f.s.ListExpiredLeases(f.ctx(), 100)
		if err != nil {
			t.Fatalf("ListExpiredLeases: %v", err)
		}
		var got []idemstore.Key
		for _, r := range recs {
			checkUTC(t, r)
			if r.State != idemstore.StatePending || !r.LeaseExpired() {
				t.Errorf("ListExpiredLeases returned %v in state %q with lease until %v, read at %v", r.Key, r.State, r.LeaseUntil, r.ReadAt)
			}
			got = append(got, r.Key)
		}
		requireSameKeys(t, "ListExpiredLeases", got, pop.expired)

		limited, err := f.s.ListExpiredLeases(f.ctx(), 2)
		if err != nil {
			t.Fatalf("ListExpiredLeases(limit 2): %v", err)
		}
		if len(limited) != 2 {
			t.Fatalf("ListExpiredLeases(limit 2) returned %d records, want 2 of %d", len(limited), len(pop.expired))
		}
		want := keySet(t, "expired", pop.expired)
		keySet(t, "ListExpiredLeases(limit 2)", []idemstore.Key{limited[0].Key, limited[1].Key})
		for _, r := range limited {
			if !want[r.Key] {
				t.Errorf("ListExpiredLeases(limit 2) returned %v, which has no expired lease", r.Key)
			}
		}

		// A limit of zero means the default page (idemstore.PageLimit), not
		// an empty one.
		dflt, err := f.s.ListExpiredLeases(f.ctx(), 0)
		if err != nil {
			t.Fatalf("ListExpiredLeases(limit 0): %v", err)
		}
		if len(dflt) == 0 || len(dflt) > idemstore.PageLimit(0) {
			t.Fatalf("ListExpiredLeases(limit 0) returned %d records, want 1 to %d (%d leases have expired)", len(dflt), idemstore.PageLimit(0), len(pop.expired))
		}

		// Oldest deadline first.
		for i := 1; i < len(recs); i++ {
			if recs[i].LeaseUntil.Before(recs[i-1].LeaseUntil) {
				t.Fatalf("ListExpiredLeases: %v (lease until %v) after %v (until %v); want the oldest deadline first",
					recs[i].Key, recs[i].LeaseUntil, recs[i-1].Key, recs[i-1].LeaseUntil)
			}
		}
	})
}
