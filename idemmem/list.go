package idemmem

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

func compareKeys(a, b idemstore.Key) int {
	return cmp.Or(cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Operation, b.Operation), cmp.Compare(a.Key, b.Key))
}

// collect returns copies of every record for which keep is true, ordered
// by scope, operation and key. Each shard is locked in turn, so the result
// is not one snapshot of the whole store; that is fine for admin listings.
func (s *Store) collect(keep func(*idemstore.Record) bool) []*idemstore.Record {
	var out []*idemstore.Record
	var r idemstore.Record // what keep is shown of each record in turn
	now := s.now()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.each(func(e *entry) {
			if r = e.rec.view(); keep(&r) {
				out = append(out, copyRecord(e, now))
			}
		})
		sh.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b *idemstore.Record) int { return compareKeys(a.Key, b.Key) })
	return out
}

// List pages through records, in p.Order, filtered as p says. A search by
// key or key prefix walks each shard's key index from the key, and one by
// scope label reads the label index; other listings look at every record,
// which the store's bounds keep to a size a listing can afford. The cursor
// is the last record's key (and CreatedAt, in an order by age).
func (s *Store) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	if err := s.check(ctx); err != nil {
		return idemstore.ListPage{}, err
	}
	p = p.Normalize()
	if err := p.Check(); err != nil {
		return idemstore.ListPage{}, fmt.Errorf("idemmem: List: %w", err)
	}
	cur, err := p.DecodeCursor()
	if err != nil || p.MatchesNothing() {
		return idemstore.ListPage{}, err
	}
	order := recordOrder(p)
	now := s.now()
	var labels map[string]bool
	if len(p.ScopeLabels) > 0 {
		labels = make(map[string]bool, len(p.ScopeLabels))
		for _, l := range p.ScopeLabels {
			labels[l] = true
		}
	}
	reason := strings.ToLower(p.Reason)
	var after *idemstore.Record
	if cur != nil {
		after = &idemstore.Record{Key: cur.Key, CreatedAt: cur.CreatedAt}
	}
	keep := func(r *idemstore.Record) bool {
		return (p.State == "" || r.State == p.State) &&
			(p.Operation == "" || r.Key.Operation == p.Operation) &&
			(p.Key == "" || r.Key.Key == p.Key) &&
			strings.HasPrefix(r.Key.Key, p.KeyPrefix) &&
			(labels == nil || labels[idemstore.ScopeLabelIndex(r.ScopeLabel)]) &&
			(p.OlderThan <= 0 || now.Sub(r.CreatedAt) >= p.OlderThan) &&
			(reason == "" || strings.Contains(strings.ToLower(r.Reason), reason)) &&
			(after == nil || order(r, after) > 0)
	}
	want := p.Limit + 1 // one more, to know whether a next page exists
	var out []*idemstore.Record
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		out = append(out, sh.search(p, after, keep, order, want, now)...)
		sh.mu.Unlock()
	}
	slices.SortFunc(out, order)
	if len(out) > want {
		out = out[:want]
	}
	return p.Page(out), nil
}

// search returns copies of the first want records of the shard, in order,
// for which keep is true. The caller holds sh.mu.
func (sh *shard) search(p idemstore.ListParams, after *idemstore.Record, keep func(*idemstore.Record) bool, order func(a, b *idemstore.Record) int, want int, now time.Time) []*idemstore.Record {
	var found []*entry
	var r idemstore.Record // what keep is shown of each record in turn
	switch {
	case p.Key != "" || p.KeyPrefix != "":
		sh.syncKeyIndex()
		if sh.byKey == nil {
			return nil
		}
		from := newKeyItem(p.KeyPrefix, "", "", nil)
		if p.Key != "" {
			from = newKeyItem(p.Key, "", "", nil)
		}
		if after != nil && p.ByKeyValue() && after.Key.Key >= from.key {
			from = newKeyItem(after.Key.Key, after.Key.Scope, after.Key.Operation, nil) // the next page starts there
		}
		sh.byKey.AscendGreaterOrEqual(from, func(it keyItem) bool {
			e, k := it.e, it.key
			if (p.Key != "" && k != p.Key) || !strings.HasPrefix(k, p.KeyPrefix) {
				return false // past the key, or the prefix
			}
			if r = e.rec.view(); keep(&r) {
				found = append(found, e)
			}
			// In the key index's order, the first want are all a page needs.
			return !p.ByKeyValue() || len(found) < want
		})
	case len(p.ScopeLabels) > 0:
		for _, l := range p.ScopeLabels {
			for e := range sh.byLabel[l] {
				if r = e.rec.view(); keep(&r) {
					found = append(found, e)
				}
			}
		}
	default:
		sh.each(func(e *entry) {
			if r = e.rec.view(); keep(&r) {
				found = append(found, e)
			}
		})
	}
	var ra, rb idemstore.Record
	slices.SortFunc(found, func(a, b *entry) int {
		ra, rb = a.rec.view(), b.rec.view()
		return order(&ra, &rb)
	})
	if len(found) > want {
		found = found[:want]
	}
	out := make([]*idemstore.Record, len(found))
	for i, e := range found {
		out[i] = copyRecord(e, now)
	}
	return out
}

// recordOrder returns the comparison of records in p's order.
func recordOrder(p idemstore.ListParams) func(a, b *idemstore.Record) int {
	byKey := func(a, b *idemstore.Record) int { return compareKeys(a.Key, b.Key) }
	switch {
	case p.Order == idemstore.OrderOldest:
		return func(a, b *idemstore.Record) int { return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), byKey(a, b)) }
	case p.Order == idemstore.OrderNewest:
		return func(a, b *idemstore.Record) int { return -cmp.Or(a.CreatedAt.Compare(b.CreatedAt), byKey(a, b)) }
	case p.ByKeyValue():
		return func(a, b *idemstore.Record) int {
			return cmp.Or(cmp.Compare(a.Key.Key, b.Key.Key), cmp.Compare(a.Key.Scope, b.Key.Scope), cmp.Compare(a.Key.Operation, b.Key.Operation))
		}
	}
	return byKey
}

// Counts counts the records in each state, and the open ones of each
// operation, exactly, looking at every record (the store's bounds keep
// them few enough).
func (s *Store) Counts(ctx context.Context) (idemstore.Counts, error) {
	if err := s.check(ctx); err != nil {
		return idemstore.Counts{}, err
	}
	var c idemstore.Counts
	ops := map[string]*idemstore.OperationCounts{}
	now := s.now()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.each(func(e *entry) {
			r := &e.rec
			if r.State == idemstore.StateCompleted {
				c.Completed++
				return
			}
			oc := ops[r.Key.Operation]
			if oc == nil {
				oc = &idemstore.OperationCounts{Operation: r.Key.Operation}
				ops[r.Key.Operation] = oc
			}
			if r.State == idemstore.StatePending {
				c.Pending++
				oc.Pending++
				return
			}
			c.NeedsReview++
			oc.NeedsReview++
			if created := r.CreatedAt(); c.OldestNeedsReview.IsZero() || created.Before(c.OldestNeedsReview) {
				c.OldestNeedsReview = created
			}
		})
		sh.mu.Unlock()
	}
	for _, oc := range ops {
		c.Operations = append(c.Operations, *oc)
	}
	slices.SortFunc(c.Operations, func(a, b idemstore.OperationCounts) int { return cmp.Compare(a.Operation, b.Operation) })
	c.ReadAt = now
	return c, nil
}

// ListExpiredLeases returns up to limit pending records whose lease has
// expired, oldest deadline first. limit follows idemstore.PageLimit.
func (s *Store) ListExpiredLeases(ctx context.Context, limit int) ([]*idemstore.Record, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	limit = idemstore.PageLimit(limit)
	now := s.now()
	recs := s.collect(func(r *idemstore.Record) bool {
		return r.State == idemstore.StatePending && !r.LeaseUntil.After(now)
	})
	slices.SortStableFunc(recs, func(a, b *idemstore.Record) int { return a.LeaseUntil.Compare(b.LeaseUntil) })
	if len(recs) > limit {
		recs = recs[:limit]
	}
	return recs, nil
}

// Purge deletes completed records whose retention has ended, at most
// p.BatchSize per shard lock, and returns how many it deleted.
func (s *Store) Purge(ctx context.Context, p idemstore.PurgeParams) (int, error) {
	p = p.Normalize()
	now := s.now()
	before := now.UnixNano()
	total := 0
	for i := range s.shards {
		sh := &s.shards[i]
		for {
			if err := s.check(ctx); err != nil {
				return total, err
			}
			n := 0
			sh.mu.Lock()
			for n < p.BatchSize && sh.expiry.due(before) {
				if sh.evictNext(s, now) {
					n++
				}
			}
			sh.mu.Unlock()
			total += n
			p.Report(n, total)
			if n < p.BatchSize {
				break
			}
		}
	}
	return total, nil
}
