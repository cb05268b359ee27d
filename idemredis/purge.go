package idemredis

import (
	"context"
	"slices"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// Purge deletes completed records whose expires_at is at or before the
// TIME of the node that holds them, read by each record's own delete
// script. It scans every master once and sends the conditional deletes in
// pipelines of at most p.BatchSize scripts. Records whose Redis TTL already
// ran out are gone without being counted. It checks the nodes'
// maxmemory-policy first (see CheckPolicy).
func (s *Store) Purge(ctx context.Context, p idemstore.PurgeParams) (int, error) {
	s.recheck(ctx)
	p = p.Normalize()
	nodes, err := s.masters(ctx)
	if err != nil {
		return 0, err
	}
	total := 0
	for _, n := range nodes {
		var cursor uint64
		for {
			keys, next, err := s.scan(ctx, n.client, cursor)
			if err != nil {
				return total, err
			}
			for chunk := range slices.Chunk(keys, p.BatchSize) {
				deleted, err := s.purgeBatch(ctx, n.client, chunk)
				total += deleted
				p.Report(deleted, total)
				if err != nil {
					return total, err
				}
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return total, nil
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
