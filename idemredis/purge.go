package idemredis

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// Purge deletes completed records whose expires_at is at or before the
// TIME of the node that holds them, read by each record's own delete
// script. It scans every master once and sends the conditional deletes in
// pipelines of at most p.BatchSize scripts. Records whose Redis TTL already
// ran out are gone without being counted. Then it sweeps the search
// indexes (see sweep), so that the entries of records it deleted, or
// whose TTL ran out, do not pile up. It checks the nodes'
// maxmemory-policy first (see CheckPolicy).
func (s *Store) Purge(ctx context.Context, p idemstore.PurgeParams) (int, error) {
	s.recheck(ctx)
	p = p.Normalize()
	total := 0
	err := s.scanAll(ctx, func(n node, keys []string) error {
		for chunk := range slices.Chunk(keys, p.BatchSize) {
			deleted, err := s.purgeBatch(ctx, n.client, chunk)
			total += deleted
			p.Report(deleted, total)
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return total, err
	}
	return total, s.sweep(ctx, p.BatchSize)
}

// purgeBatch runs the purge script on keys in one pipeline (after loading
// it on the node) and counts the records it deleted.
func (s *Store) purgeBatch(ctx context.Context, c rueidis.Client, keys []string) (int, error) {
	execs := make([]rueidis.LuaExec, len(keys))
	for i, k := range keys {
		execs[i] = rueidis.LuaExec{Keys: []string{k}}
	}
	deleted := 0
	var firstErr error
	for _, res := range s.scripts().purge.ExecMulti(ctx, c, execs...) {
		n, err := res.AsInt64()
		switch {
		case err == nil && n == 1:
			deleted++
		case err != nil && firstErr == nil:
			firstErr = err
		}
	}
	return deleted, interpretError(ctx, firstErr)
}

// sweep drops the index entries of records that are gone: it reads the
// key index and the label index of every group in order, batch records a
// group a round (one pipeline of ZRANGEBYLEX for every group still being
// read), asks whether each record exists (EXISTS, pipelined), and runs
// fixScript for those that do not, which checks again in the same atomic
// step. The pending records of the set by age and the review set, which
// only hold open records and so stay small, are checked whole by
// fixScript, which also fixes the entries of a record that another
// version of this package settled without touching the indexes.
func (s *Store) sweep(ctx context.Context, batch int) error {
	for _, label := range []bool{false, true} {
		if err := s.sweepSet(ctx, label, batch); err != nil {
			return err
		}
	}
	open, err := (&search{s: s}).all(ctx, []scoreRange{pendingRange, reviewRange})
	if err != nil {
		return err
	}
	for chunk := range slices.Chunk(open, batch) {
		if err := s.fixAll(ctx, chunk); err != nil {
			return err
		}
	}
	return nil
}

// sweepSet sweeps the key index, or the label index, of every group.
func (s *Store) sweepSet(ctx context.Context, label bool, batch int) error {
	set := func(ix indexes) string { return ix.key }
	if label {
		set = func(ix indexes) string { return ix.label }
	}
	from := make(map[int]string, s.groups())
	for g := range s.groups() {
		from[g] = "-"
	}
	for len(from) > 0 {
		groups := slices.Sorted(maps.Keys(from))
		cmds := make(rueidis.Commands, len(groups))
		for i, g := range groups {
			cmds[i] = s.client.B().Zrangebylex().Key(set(s.indexes(g))).Min(from[g]).Max("+").Limit(0, int64(batch)).Build().Pin()
		}
		var cands []cand
		for i, res := range s.client.DoMulti(ctx, cmds...) {
			members, err := res.AsStrSlice()
			if err != nil {
				return interpretError(ctx, err)
			}
			g := groups[i]
			if len(members) < batch {
				delete(from, g)
			} else {
				from[g] = "(" + members[len(members)-1]
			}
			for _, m := range members {
				if c, ok := sweptCand(m, label); ok {
					cands = append(cands, c)
				}
			}
		}
		for chunk := range slices.Chunk(cands, batch) {
			if err := s.fixGone(ctx, chunk); err != nil {
				return err
			}
		}
	}
	return nil
}

// sweptCand reads a member of the key index, or of the label index.
func sweptCand(m string, label bool) (cand, bool) {
	if !label {
		return parseKeyCand(m)
	}
	i := strings.IndexByte(m, 0)
	if i < 0 {
		return cand{}, false
	}
	c, ok := parseAgeCand(m[i+1:])
	c.label = m
	return c, ok
}

// fixGone runs fixScript for those of cands whose record does not exist.
func (s *Store) fixGone(ctx context.Context, cands []cand) error {
	cmds := make(rueidis.Commands, len(cands))
	for i, c := range cands {
		cmds[i] = s.client.B().Exists().Key(s.recordKey(c.key)).Build().Pin()
	}
	var gone []cand
	for i, res := range s.client.DoMulti(ctx, cmds...) {
		n, err := res.AsInt64()
		if err != nil {
			return interpretError(ctx, err)
		}
		if n == 0 {
			gone = append(gone, cands[i])
		}
	}
	return s.fixAll(ctx, gone)
}

// fixAll runs fixScript for cands, pipelined, and returns its first error.
func (s *Store) fixAll(ctx context.Context, cands []cand) error {
	if len(cands) == 0 {
		return nil
	}
	execs := make([]rueidis.LuaExec, len(cands))
	for i, c := range cands {
		execs[i] = rueidis.LuaExec{Keys: s.keys(c.key).indexed(), Args: []string{keyMember(c.key), ageMember(c.key), c.label}}
	}
	for _, res := range s.scripts().fix.ExecMulti(ctx, s.client, execs...) {
		if err := res.Error(); err != nil {
			return interpretError(ctx, err)
		}
	}
	return nil
}
