package idemstoretest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

// populate fills a fresh store with records in every state and returns
// their keys by state. Pending records whose lease the suite treats as
// expired at base+clockLater are returned separately.
type population struct {
	live, expired, completed, review []idemstore.Key
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
		p.live = append(p.live, f.reserve(next(), leaseLong).Key)
	}
	for range 3 {
		p.expired = append(p.expired, f.reserve(next(), leaseShort).Key)
	}
	// A lease that ends exactly at base+clockLater has expired then.
	p.expired = append(p.expired, f.reserve(next(), clockLater).Key)
	for range 6 {
		rec := f.reserve(next(), leaseShort)
		f.complete(rec, jsonResponse(`{}`), expireLater)
		p.completed = append(p.completed, rec.Key)
	}
	for range 5 {
		rec := f.reserve(next(), leaseShort)
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
		for _, st := range []idemstore.State{"", idemstore.StatePending, idemstore.StateCompleted, idemstore.StateNeedsReview} {
			for _, limit := range []int{0, 1, 2, 5, 1000} {
				what := fmt.Sprintf("List(State %q, Limit %d)", st, limit)
				var got []idemstore.Key
				cursor := ""
				for page := 0; ; page++ {
					if page > 100 {
						t.Fatalf("%s: more than 100 pages for %d records; does NextCursor advance?", what, len(pop.byState("")))
					}
					res, err := f.s.List(f.ctx(), idemstore.ListParams{State: st, Cursor: cursor, Limit: limit})
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
				requireSameKeys(t, what, got, pop.byState(st))
			}
		}
	})

	t.Run("ExpiredLeases", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, h.New(t))
		pop := populate(f)
		now := f.base.Add(clockLater)
		recs, err := f.s.ListExpiredLeases(f.ctx(), now, 100)
		if err != nil {
			t.Fatalf("ListExpiredLeases: %v", err)
		}
		var got []idemstore.Key
		for _, r := range recs {
			checkUTC(t, r)
			if r.State != idemstore.StatePending || r.LeaseUntil.After(now) {
				t.Errorf("ListExpiredLeases returned %v in state %q with lease until %v (now %v)", r.Key, r.State, r.LeaseUntil, now)
			}
			got = append(got, r.Key)
		}
		requireSameKeys(t, "ListExpiredLeases", got, pop.expired)

		limited, err := f.s.ListExpiredLeases(f.ctx(), now, 2)
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
		dflt, err := f.s.ListExpiredLeases(f.ctx(), now, 0)
		if err != nil {
			t.Fatalf("ListExpiredLeases(limit 0): %v", err)
		}
		if len(dflt) == 0 || len(dflt) > idemstore.PageLimit(0) {
			t.Fatalf("ListExpiredLeases(limit 0) returned %d records, want 1 to %d (%d leases have expired)", len(dflt), idemstore.PageLimit(0), len(pop.expired))
		}

		// Before any lease has expired there is nothing to recover.
		none, err := f.s.ListExpiredLeases(f.ctx(), f.base, 100)
		if err != nil {
			t.Fatalf("ListExpiredLeases(base): %v", err)
		}
		if len(none) != 0 {
			t.Fatalf("ListExpiredLeases at the reservation time returned %d records, want 0", len(none))
		}
	})
}
