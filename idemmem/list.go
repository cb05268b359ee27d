package idemmem

import (
	"cmp"
	"context"
	"slices"

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
	now := s.now()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.each(func(e *entry) {
			if keep(&e.rec) {
				out = append(out, copyRecord(e, now))
			}
		})
		sh.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b *idemstore.Record) int { return compareKeys(a.Key, b.Key) })
	return out
}

// List pages through records ordered by scope, operation and key. The
// cursor is the last key of the previous page.
func (s *Store) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	if err := s.check(ctx); err != nil {
		return idemstore.ListPage{}, err
	}
	p = p.Normalize()
	var after *idemstore.Key
	if p.Cursor != "" {
		k, err := idemstore.DecodeKeyCursor(p.Cursor)
		if err != nil {
			return idemstore.ListPage{}, err
		}
		after = &k
	}
	recs := s.collect(func(r *idemstore.Record) bool {
		return (p.State == "" || r.State == p.State) && (p.Operation == "" || r.Key.Operation == p.Operation) &&
			(after == nil || compareKeys(r.Key, *after) > 0)
	})
	return idemstore.KeyPage(recs, p.Limit), nil
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
