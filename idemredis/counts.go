package idemredis

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

var _ idemstore.Counter = (*Store)(nil)

// Counts counts the records for an overview from the indexes, in one
// pipeline over every index group: ZCARD of the set by age, its pending
// range and the review set whole (their members name each record's
// operation, their scores its age), which hold the open records only. The
// completed records are the rest of the set by age; that set
// still holds records whose TTL ran out until a search meets them or
// Purge sweeps them, so when it says at most idemstore.ExactCountLimit,
// Counts checks that each still exists (EXISTS, pipelined) and counts
// exactly; past it, the figure is an estimate (CompletedEstimated).
func (s *Store) Counts(ctx context.Context) (idemstore.Counts, error) {
	now, err := serverTime(s.client.Do(ctx, s.client.B().Time().Build()))
	if err != nil {
		return idemstore.Counts{}, interpretError(ctx, err)
	}
	c := idemstore.Counts{ReadAt: now}
	cmds := make(rueidis.Commands, 0, 3*s.groups())
	for g := range s.groups() {
		ix := s.indexes(g)
		b := s.client.B()
		cmds = append(cmds,
			b.Zcard().Key(ix.all).Build().Pin(),
			b.Zrangebyscore().Key(ix.all).Min("-inf").Max("(0").Withscores().Build().Pin(),
			b.Zrange().Key(ix.review).Min("0").Max("-1").Withscores().Build().Pin())
	}
	type row struct {
		pending, review int64
		oldest          float64
	}
	ops := map[string]*row{}
	var all int64
	var nonEmpty []int
	res := s.client.DoMulti(ctx, cmds...)
	for g := range s.groups() {
		n, err := res[3*g].AsInt64()
		if err != nil {
			return c, interpretError(ctx, err)
		}
		if all += n; n > 0 {
			nonEmpty = append(nonEmpty, g)
		}
		for i, st := range []idemstore.State{idemstore.StatePending, idemstore.StateNeedsReview} {
			zs, err := res[3*g+1+i].AsZScores()
			if err != nil {
				return c, interpretError(ctx, err)
			}
			for _, z := range zs {
				k, ok := parseAgeMember(z.Member)
				if !ok {
					continue
				}
				r := ops[k.Operation]
				if r == nil {
					r = &row{}
					ops[k.Operation] = r
				}
				if st == idemstore.StatePending {
					r.pending++
				} else if r.review++; r.oldest == 0 || z.Score < r.oldest {
					r.oldest = z.Score
				}
			}
		}
	}
	for _, op := range slices.Sorted(maps.Keys(ops)) {
		r := ops[op]
		if r.pending > 0 {
			c.Add(idemstore.StatePending, op, r.pending, time.Time{})
		}
		if r.review > 0 {
			c.Add(idemstore.StateNeedsReview, op, r.review, time.UnixMicro(int64(r.oldest)))
		}
	}
	c.Completed = max(all-c.Pending-c.NeedsReview, 0)
	if c.Completed > idemstore.ExactCountLimit {
		c.CompletedEstimated = true
		return c, nil
	}
	if c.Completed, err = s.countCompleted(ctx, nonEmpty); err != nil {
		return c, err
	}
	return c, nil
}

// countCompleted counts the members of the sets by age of groups whose
// record still exists and is neither pending nor in review.
func (s *Store) countCompleted(ctx context.Context, groups []int) (int64, error) {
	cmds := make(rueidis.Commands, 0, 2*len(groups))
	for _, g := range groups {
		ix := s.indexes(g)
		b := s.client.B()
		cmds = append(cmds, b.Zrangebyscore().Key(ix.all).Min("0").Max("+inf").Build().Pin(),
			b.Zrange().Key(ix.review).Min("0").Max("-1").Build().Pin())
	}
	res := s.client.DoMulti(ctx, cmds...)
	var exists rueidis.Commands
	for i := range groups {
		var sets [2][]string
		for j := range sets {
			var err error
			if sets[j], err = res[2*i+j].AsStrSlice(); err != nil {
				return 0, interpretError(ctx, err)
			}
		}
		open := map[string]bool{}
		for _, m := range sets[1] {
			open[m] = true
		}
		for _, m := range sets[0] {
			if k, ok := parseAgeMember(m); ok && !open[m] {
				exists = append(exists, s.client.B().Exists().Key(s.recordKey(k)).Build().Pin())
			}
		}
	}
	if len(exists) == 0 {
		return 0, nil
	}
	var n int64
	for _, res := range s.client.DoMulti(ctx, exists...) {
		e, err := res.AsInt64()
		if err != nil {
			return 0, interpretError(ctx, err)
		}
		n += e
	}
	return n, nil
}
