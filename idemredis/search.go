package idemredis

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// List returns a page of records in p.Order, filtered as p says; the
// cursor is opaque. A listing without a search field (Searches) walks the
// keyspace by SCAN (see scanList). A search reads the indexes (index.go),
// one pipeline per round over every index group:
//
//   - by key or key prefix, in key order: ZRANGEBYLEX of the key index;
//   - by label, in key order: ZRANGEBYLEX of the label index, one range a
//     label, merged by scope, operation and key;
//   - by age: the set by age of the state asked for (pending, in review,
//     or every record), ZRANGEBYSCORE, merged by creation time; with a
//     key, key prefix or labels that match at most gatherLimit records,
//     those matches instead, ordered by their score in the set of every
//     record (ZMSCORE);
//   - in key order with neither key nor label: the pending or review set
//     whole, sorted by scope, operation and key, or, for completed records
//     or every state, the key index (in key value order).
//
// Each round takes the next k candidates of the merged order, reads their
// records whole (the get script, with each node's TIME as ReadAt) and
// keeps those that pass every filter of p, until the page and one more
// record are found. Index entries whose record is gone (its TTL ran out)
// are dropped as they are met (fixScript).
func (s *Store) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	p = p.Normalize()
	if err := p.Check(); err != nil {
		return idemstore.ListPage{}, fmt.Errorf("idemredis: List: %v", err)
	}
	if !p.Searches() {
		return s.scanList(ctx, p)
	}
	cur, err := p.DecodeCursor()
	if err != nil || p.MatchesNothing() {
		return idemstore.ListPage{}, err
	}
	q := &search{s: s, p: p, byAge: p.Order != idemstore.OrderKey, desc: p.Order == idemstore.OrderNewest}
	next, err := q.source(ctx, cur)
	if err != nil {
		return idemstore.ListPage{}, err
	}
	recs, err := q.drain(ctx, next)
	if err != nil {
		return idemstore.ListPage{}, err
	}
	return p.Page(recs), nil
}

// gatherLimit bounds the matches of a key, key prefix or label that a
// search by age reads whole from the key or label index and sorts;
// past it, the search walks the set by age instead, filtering as it goes.
const gatherLimit = 20_000

// roundLimit bounds the candidates a round of a search takes.
const roundLimit = 2000

// cand is a record an index names: its key, its place in the listing's
// order (order, and score in an order by age: created-at in Unix
// microseconds) and the label index member it was found by, if any.
type cand struct {
	key   idemstore.Key
	order string
	score float64
	label string
}

// source returns candidates strictly after after (nil: from the start), in
// the listing's order, at most k; more is false when none follow them.
type source func(ctx context.Context, after *cand, k int) (cands []cand, more bool, err error)

// search is one List call that searches.
type search struct {
	s           *Store
	p           idemstore.ListParams
	byAge, desc bool
	// after is where the listing resumes (from the cursor).
	after *cand
	// fromSet is the pending or review set the candidates come from, if
	// they do: a record found there in another state is fixed.
	fromSet idemstore.State
}

// less orders candidates as the listing does.
func (q *search) less(a, b cand) int {
	if !q.byAge {
		return strings.Compare(a.order, b.order)
	}
	c := cmp.Or(cmp.Compare(a.score, b.score), strings.Compare(a.order, b.order))
	if q.desc {
		return -c
	}
	return c
}

// source picks where the candidates come from (see List).
func (q *search) source(ctx context.Context, cur *idemstore.ListCursor) (source, error) {
	p := q.p
	byKeyValue := p.Key != "" || p.KeyPrefix != ""
	if cur != nil {
		q.after = &cand{order: ageMember(cur.Key)}
		if q.byAge {
			q.after.score = float64(cur.CreatedAt.UnixMicro())
		} else if byKeyValue || !q.openState() && len(p.ScopeLabels) == 0 {
			q.after.order = keyMember(cur.Key)
		}
	}
	switch {
	case byKeyValue && !q.byAge:
		return q.lexSource(func(ix indexes) string { return ix.key }, q.keyRanges(), parseKeyCand), nil
	case len(p.ScopeLabels) > 0 && !byKeyValue && !q.byAge:
		return q.lexSource(func(ix indexes) string { return ix.label }, q.labelRanges(), parseAgeCand), nil
	case !q.byAge && q.openState():
		q.fromSet = p.State
		cands, err := q.all(ctx, q.stateRanges())
		if err != nil {
			return nil, err
		}
		return q.sorted(cands), nil
	case !q.byAge:
		return q.lexSource(func(ix indexes) string { return ix.key }, []lexRange{{lo: "-", hi: "+"}}, parseKeyCand), nil
	case byKeyValue || len(p.ScopeLabels) > 0:
		cands, ok, err := q.gather(ctx)
		if err != nil {
			return nil, err
		}
		if ok {
			return q.sorted(cands), nil
		}
	}
	if q.openState() {
		q.fromSet = q.p.State
	}
	return q.scoreSource(ctx, q.stateRanges())
}

// openState reports whether the listing is of pending or needs_review
// records, which have sets of their own.
func (q *search) openState() bool {
	return q.p.State == idemstore.StatePending || q.p.State == idemstore.StateNeedsReview
}

// scoreRange is a range of a set by age: scores from lo to hi (raw, as
// stored), each the record's created-at less shift.
type scoreRange struct {
	set            func(indexes) string
	shift          float64
	lo, hi         float64
	loExcl, hiExcl bool
}

var (
	// pendingRange holds the pending records of the set by age.
	pendingRange = scoreRange{set: func(ix indexes) string { return ix.all }, shift: pendingShiftFloat, lo: math.Inf(-1), hi: 0, hiExcl: true}
	// settledRange holds the others: completed and in review.
	settledRange = scoreRange{set: func(ix indexes) string { return ix.all }, lo: 0, hi: math.Inf(1)}
	// reviewRange is the review set whole.
	reviewRange = scoreRange{set: func(ix indexes) string { return ix.review }, lo: math.Inf(-1), hi: math.Inf(1)}
)

// stateRanges returns the ranges by age that hold the records of p.State.
func (q *search) stateRanges() []scoreRange {
	switch q.p.State {
	case idemstore.StatePending:
		return []scoreRange{pendingRange}
	case idemstore.StateNeedsReview:
		return []scoreRange{reviewRange}
	case idemstore.StateCompleted:
		return []scoreRange{settledRange}
	}
	return []scoreRange{pendingRange, settledRange}
}

// atMost narrows r to created-at c and before (exclusive: before c).
func (r scoreRange) atMost(c float64, exclusive bool) scoreRange {
	if v := c - r.shift; v < r.hi || v == r.hi && exclusive {
		r.hi, r.hiExcl = v, exclusive
	}
	return r
}

// atLeast narrows r to created-at c and after (exclusive: after c).
func (r scoreRange) atLeast(c float64, exclusive bool) scoreRange {
	if v := c - r.shift; v > r.lo || v == r.lo && exclusive {
		r.lo, r.loExcl = v, exclusive
	}
	return r
}

// bounds formats r's bounds for ZRANGEBYSCORE.
func (r scoreRange) bounds() (lo, hi string) {
	f := func(v float64, ex bool) string {
		switch {
		case math.IsInf(v, -1):
			return "-inf"
		case math.IsInf(v, 1):
			return "+inf"
		case ex:
			return "(" + strconv.FormatFloat(v, 'f', 0, 64)
		}
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return f(r.lo, r.loExcl), f(r.hi, r.hiExcl)
}

// lexRange is a range of an index in byte order: members from lo to hi
// in ZRANGEBYLEX's notation, each starting with pfx, which the
// candidate's order leaves out.
type lexRange struct{ pfx, lo, hi string }

// keyRanges returns the range of the key index that p's Key or KeyPrefix
// selects.
func (q *search) keyRanges() []lexRange {
	if q.p.Key != "" {
		k := esc(q.p.Key)
		return []lexRange{{lo: "[" + k + "\x00", hi: "(" + k + "\x01"}}
	}
	pfx := esc(q.p.KeyPrefix)
	r := lexRange{lo: "[" + pfx, hi: "+"}
	if end, ok := idemstore.PrefixEnd(pfx); ok {
		r.hi = "(" + end
	}
	return []lexRange{r}
}

// labelRanges returns a range of the label index per label of p.
func (q *search) labelRanges() []lexRange {
	var out []lexRange
	for _, l := range slices.Compact(slices.Sorted(slices.Values(q.p.ScopeLabels))) {
		e := esc(l)
		out = append(out, lexRange{pfx: e + "\x00", lo: "[" + e + "\x00", hi: "(" + e + "\x01"})
	}
	return out
}

func parseKeyCand(m string) (cand, bool) {
	k, ok := parseKeyMember(m)
	return cand{key: k, order: m}, ok
}

// parseAgeCand reads a member of a set by age, or of the label index
// without its label part, which the range has cut off.
func parseAgeCand(m string) (cand, bool) {
	k, ok := parseAgeMember(m)
	return cand{key: k, order: m}, ok
}

// ranger builds the commands that read one group's part of an ordered
// index: its elements strictly after after (nil: from the start), and,
// with upTo, none past upTo, at most limit of them (ties of an order by
// age whole); and reads their replies.
type ranger struct {
	cmds  func(g int, after, upTo *cand, limit int) rueidis.Commands
	parse func(res []rueidis.RedisResult, after *cand, limit int) (cands []cand, full bool, err error)
}

// walk returns a source that merges the groups' parts of an ordered
// index. On a Cluster, a first pipeline asks every group for its first
// element only; the k-th smallest of those, upTo, bounds a second
// pipeline to the groups whose first comes at or before it (at most k):
// each returns its elements up to upTo, at most k. At least k elements
// lie at or before upTo, so the k first of what the second pipeline
// returns are the k first of the whole index, and a round costs one
// command a group and k more, not k a group. A single node is one group:
// one pipeline.
func (q *search) walk(r ranger) source {
	s := q.s
	return func(ctx context.Context, after *cand, k int) ([]cand, bool, error) {
		groups := make([]int, s.groups())
		for g := range groups {
			groups[g] = g
		}
		var upTo *cand
		if len(groups) > 1 {
			firsts, nonEmpty, err := q.read(ctx, r, groups, after, nil, 1)
			if err != nil {
				return nil, false, err
			}
			if len(nonEmpty) == 0 {
				return nil, false, nil
			}
			groups = nonEmpty
			if len(firsts) >= k {
				sorted := slices.SortedFunc(slices.Values(firsts), q.less)
				upTo = &sorted[k-1]
				// Only the groups whose first comes at or before upTo hold
				// any of the k first: at most k groups, not every one.
				groups = nil
				for i, f := range firsts {
					if q.less(f, *upTo) <= 0 {
						groups = append(groups, nonEmpty[i])
					}
				}
			}
		}
		cands, full, err := q.read(ctx, r, groups, after, upTo, k)
		if err != nil {
			return nil, false, err
		}
		slices.SortFunc(cands, q.less)
		// A record listed twice by one round is one candidate: the ranges
		// of a round are read by commands of one pipeline, between which
		// another client's script may run, and a record that completes
		// in between moves from the pending range of the set by age,
		// read first, to the settled one, read after (same member, same
		// created-at: equal candidates).
		cands = slices.CompactFunc(cands, func(a, b cand) bool { return q.less(a, b) == 0 })
		if len(cands) > k {
			return cands[:k], true, nil
		}
		return cands, len(full) > 0 || upTo != nil, nil
	}
}

// read runs r's commands for groups in one pipeline; it returns the
// elements found, and the groups that had any (with limit 1) or that
// returned limit of them (otherwise).
func (q *search) read(ctx context.Context, r ranger, groups []int, after, upTo *cand, limit int) ([]cand, []int, error) {
	var cmds rueidis.Commands
	ends := make([]int, len(groups))
	for i, g := range groups {
		cmds = append(cmds, r.cmds(g, after, upTo, limit)...)
		ends[i] = len(cmds)
	}
	res := q.s.client.DoMulti(ctx, cmds...)
	var out []cand
	var marked []int
	start := 0
	for i, g := range groups {
		cands, full, err := r.parse(res[start:ends[i]], after, limit)
		if err != nil {
			return nil, nil, interpretError(ctx, err)
		}
		start = ends[i]
		if limit == 1 && len(cands) > 0 {
			slices.SortFunc(cands, q.less)
			cands = cands[:1]
			marked = append(marked, g)
		} else if limit > 1 && full {
			marked = append(marked, g)
		}
		out = append(out, cands...)
	}
	return out, marked, nil
}

// lexSource reads ranges of the index set of every group (see walk).
func (q *search) lexSource(set func(indexes) string, ranges []lexRange, parse func(string) (cand, bool)) source {
	s := q.s
	return q.walk(ranger{
		cmds: func(g int, after, upTo *cand, limit int) rueidis.Commands {
			name := set(s.indexes(g))
			cmds := make(rueidis.Commands, len(ranges))
			for i, r := range ranges {
				lo, hi := r.lo, r.hi
				if after != nil && r.pfx+after.order >= lo[1:] {
					lo = "(" + r.pfx + after.order
				}
				if upTo != nil {
					hi = "[" + r.pfx + upTo.order
				}
				cmds[i] = s.client.B().Zrangebylex().Key(name).Min(lo).Max(hi).Limit(0, int64(limit)).Build().Pin()
			}
			return cmds
		},
		parse: func(res []rueidis.RedisResult, _ *cand, limit int) ([]cand, bool, error) {
			var cands []cand
			full := false
			for i, r := range res {
				members, err := r.AsStrSlice()
				if err != nil {
					return nil, false, err
				}
				full = full || len(members) >= limit
				for _, m := range members {
					c, ok := parse(strings.TrimPrefix(m, ranges[i].pfx))
					if !ok {
						continue
					}
					if ranges[i].pfx != "" {
						c.label = m
					}
					cands = append(cands, c)
				}
			}
			return cands, full, nil
		},
	})
}

// scoreSource walks ranges of the sets by age of every group in the
// listing's order (see walk), from the newest record old enough for
// p.OlderThan when it lists the newest first.
func (q *search) scoreSource(ctx context.Context, ranges []scoreRange) (source, error) {
	s := q.s
	if q.p.OlderThan > 0 {
		now, err := serverTime(s.client.Do(ctx, s.client.B().Time().Build()))
		if err != nil {
			return nil, interpretError(ctx, err)
		}
		for i := range ranges {
			ranges[i] = ranges[i].atMost(float64(now.Add(-q.p.OlderThan).UnixMicro()), false)
		}
	}
	return q.walk(ranger{
		cmds: func(g int, after, upTo *cand, limit int) rueidis.Commands {
			b := s.client.B()
			var cmds rueidis.Commands
			for _, r := range ranges {
				name := r.set(s.indexes(g))
				if after != nil {
					at := strconv.FormatFloat(after.score-r.shift, 'f', 0, 64)
					cmds = append(cmds, b.Zrangebyscore().Key(name).Min(at).Max(at).Withscores().Build().Pin())
					if q.desc {
						r = r.atMost(after.score, true)
					} else {
						r = r.atLeast(after.score, true)
					}
				}
				if upTo != nil {
					if q.desc {
						r = r.atLeast(upTo.score, false)
					} else {
						r = r.atMost(upTo.score, false)
					}
				}
				lo, hi := r.bounds()
				if q.desc {
					cmds = append(cmds, b.Zrevrangebyscore().Key(name).Max(hi).Min(lo).Withscores().Limit(0, int64(limit)).Build().Pin())
				} else {
					cmds = append(cmds, b.Zrangebyscore().Key(name).Min(lo).Max(hi).Withscores().Limit(0, int64(limit)).Build().Pin())
				}
			}
			return cmds
		},
		parse: func(res []rueidis.RedisResult, after *cand, limit int) ([]cand, bool, error) {
			var cands []cand
			full := false
			i := 0
			for _, r := range ranges {
				for _, ties := range []bool{true, false} {
					if ties && after == nil {
						continue
					}
					zs, err := res[i].AsZScores()
					i++
					if err != nil {
						return nil, false, err
					}
					full = full || !ties && len(zs) >= limit
					for _, z := range zs {
						c, ok := parseAgeCand(z.Member)
						if !ok {
							continue
						}
						c.score = z.Score + r.shift
						if ties && q.less(c, *after) <= 0 {
							continue
						}
						cands = append(cands, c)
					}
				}
			}
			return cands, full, nil
		},
	}), nil
}

// all reads ranges of the sets by age of every group whole.
func (q *search) all(ctx context.Context, ranges []scoreRange) ([]cand, error) {
	s := q.s
	cmds := make(rueidis.Commands, 0, s.groups()*len(ranges))
	for g := range s.groups() {
		for _, r := range ranges {
			lo, hi := r.bounds()
			cmds = append(cmds, s.client.B().Zrangebyscore().Key(r.set(s.indexes(g))).Min(lo).Max(hi).Withscores().Build().Pin())
		}
	}
	var cands []cand
	for i, res := range s.client.DoMulti(ctx, cmds...) {
		zs, err := res.AsZScores()
		if err != nil {
			return nil, interpretError(ctx, err)
		}
		for _, z := range zs {
			if c, ok := parseAgeCand(z.Member); ok {
				c.score = z.Score + ranges[i%len(ranges)].shift
				cands = append(cands, c)
			}
		}
	}
	return cands, nil
}

// gather reads every match of p's Key, KeyPrefix or labels from the key
// or label index, with each one's creation time from the set of every
// record (ZMSCORE), for a search by age. ok is false when there are more
// than gatherLimit.
func (q *search) gather(ctx context.Context) (cands []cand, ok bool, err error) {
	s := q.s
	set, ranges, parse := func(ix indexes) string { return ix.key }, q.keyRanges(), parseKeyCand
	if q.p.Key == "" && q.p.KeyPrefix == "" {
		set, ranges, parse = func(ix indexes) string { return ix.label }, q.labelRanges(), parseAgeCand
	}
	cmds := make(rueidis.Commands, 0, s.groups()*len(ranges))
	var groupOf []int
	for g := range s.groups() {
		for _, r := range ranges {
			cmds = append(cmds, s.client.B().Zrangebylex().Key(set(s.indexes(g))).Min(r.lo).Max(r.hi).Limit(0, gatherLimit+1).Build().Pin())
			groupOf = append(groupOf, g)
		}
	}
	byGroup := map[int][]cand{}
	n := 0
	for i, res := range s.client.DoMulti(ctx, cmds...) {
		members, err := res.AsStrSlice()
		if err != nil {
			return nil, false, interpretError(ctx, err)
		}
		if n += len(members); n > gatherLimit {
			return nil, false, nil
		}
		pfx := ranges[i%len(ranges)].pfx
		for _, m := range members {
			if c, ok := parse(strings.TrimPrefix(m, pfx)); ok {
				if pfx != "" {
					c.label = m
				}
				c.order = ageMember(c.key)
				byGroup[groupOf[i]] = append(byGroup[groupOf[i]], c)
			}
		}
	}
	cmds = cmds[:0]
	var groups []int
	for g, cs := range byGroup {
		members := make([]string, len(cs))
		for i, c := range cs {
			members[i] = c.order
		}
		cmds = append(cmds, s.client.B().Zmscore().Key(s.indexes(g).all).Member(members...).Build().Pin())
		groups = append(groups, g)
	}
	for i, res := range s.client.DoMulti(ctx, cmds...) {
		scores, err := res.ToArray()
		if err != nil {
			return nil, false, interpretError(ctx, err)
		}
		for j, c := range byGroup[groups[i]] {
			if j >= len(scores) || scores[j].IsNil() {
				continue // gone, or not indexed: no age to list it by
			}
			if c.score, err = scores[j].AsFloat64(); err == nil {
				if c.score < 0 {
					c.score += pendingShiftFloat // pending
				}
				cands = append(cands, c)
			}
		}
	}
	return cands, true, nil
}

// sorted serves candidates read whole, in the listing's order, from after
// the cursor on.
func (q *search) sorted(cands []cand) source {
	slices.SortFunc(cands, q.less)
	return func(_ context.Context, after *cand, k int) ([]cand, bool, error) {
		i := 0
		if after != nil {
			i, _ = slices.BinarySearchFunc(cands, *after, q.less)
			for i < len(cands) && q.less(cands[i], *after) <= 0 {
				i++
			}
		}
		rest := cands[i:]
		if len(rest) > k {
			return rest[:k], true, nil
		}
		return rest, false, nil
	}
}

// drain takes candidates from next, round after round, reads their
// records and keeps those that pass p's filters, until it has p.Limit+1
// (one more than a page says whether more follow) or none are left.
func (q *search) drain(ctx context.Context, next source) ([]*idemstore.Record, error) {
	var out []*idemstore.Record
	after := q.after
	k := q.p.Limit + 1
	for {
		cands, more, err := next(ctx, after, k)
		if err != nil {
			return nil, err
		}
		if len(cands) == 0 {
			return out, nil
		}
		var read []cand
		for _, c := range cands {
			if q.keyMatches(c.key) {
				read = append(read, c)
			}
		}
		recs, err := q.s.readRecords(ctx, read)
		if err != nil {
			return nil, err
		}
		var stale []cand
		for i, c := range read {
			rec := recs[i]
			if rec == nil || q.fromSet != "" && rec.State != q.fromSet {
				stale = append(stale, c)
				continue
			}
			if !q.matches(rec, c) {
				continue
			}
			if out = append(out, rec); len(out) > q.p.Limit {
				q.s.fix(ctx, stale)
				return out, nil
			}
		}
		q.s.fix(ctx, stale)
		if !more {
			return out, nil
		}
		after = &cands[len(cands)-1]
		k = min(4*k, roundLimit)
	}
}

// keyMatches applies p's Key and KeyPrefix to a candidate's key, before
// its record is read.
func (q *search) keyMatches(k idemstore.Key) bool {
	return (q.p.Key == "" || k.Key == q.p.Key) && strings.HasPrefix(k.Key, q.p.KeyPrefix) &&
		(q.p.Operation == "" || k.Operation == q.p.Operation)
}

// matches applies every filter of p to a record found as c.
func (q *search) matches(rec *idemstore.Record, c cand) bool {
	p := q.p
	switch {
	case p.State != "" && rec.State != p.State:
		return false
	case len(p.ScopeLabels) > 0 && !slices.Contains(p.ScopeLabels, idemstore.ScopeLabelIndex(rec.ScopeLabel)):
		return false
	case c.label != "" && c.label != labelMember(idemstore.ScopeLabelIndex(rec.ScopeLabel), rec.Key):
		// An entry of the label the key had before it was released, or
		// its TTL ran out, and reserved again under another label: the
		// record is listed by its own label's entry, once.
		return false
	case p.OlderThan > 0 && rec.CreatedAt.After(rec.ReadAt.Add(-p.OlderThan)):
		return false
	case p.Reason != "" && !containsFold(rec.Reason, p.Reason):
		return false
	case q.byAge && float64(rec.CreatedAt.UnixMicro()) != c.score:
		return false // created again since the index was read: listed at its new age
	}
	return true
}

// containsFold reports whether s contains sub, ignoring the case of ASCII
// letters only.
func containsFold(s, sub string) bool {
	return strings.Contains(asciiLower(s), asciiLower(sub))
}

func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// readRecords reads the records of cands whole with the get script, in
// one pipeline (rueidis sends each to its slot's master), each with its
// node's TIME as ReadAt; nil for a record that is gone.
func (s *Store) readRecords(ctx context.Context, cands []cand) ([]*idemstore.Record, error) {
	if len(cands) == 0 {
		return nil, nil
	}
	execs := make([]rueidis.LuaExec, len(cands))
	for i, c := range cands {
		execs[i] = rueidis.LuaExec{Keys: []string{s.recordKey(c.key)}}
	}
	out := make([]*idemstore.Record, len(cands))
	for i, res := range s.scripts().get.ExecMulti(ctx, s.client, execs...) {
		msg, err := res.ToMessage()
		if err != nil {
			return nil, interpretError(ctx, err)
		}
		if out[i], err = s.checked(cands[i].key, msg); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// fix runs fixScript for index entries whose record is gone or has left
// the set they were found in, and ignores its errors: the entries are
// filtered out when met anyway, and Purge sweeps them.
func (s *Store) fix(ctx context.Context, cands []cand) { _ = s.fixAll(ctx, cands) }
