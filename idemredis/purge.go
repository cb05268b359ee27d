package idemredis

import (
	"context"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
)

// Purge deletes completed records whose expires_at is at or before the
// TIME of the node that holds them, read by each record's own delete
// script. It scans every master once and sends the conditional deletes in
// pipelines of at most p.BatchSize scripts. Records whose Redis TTL already
// ran out are gone without being counted.
func (s *Store) Purge(ctx context.Context, p idemstore.PurgeParams) (int, error) {
	p = p.Normalize()
	nodes, err := s.masters(ctx)
	if err != nil {
		return 0, err
	}
	total := 0
	for _, n := range nodes {
		if err := purgeScript.Load(ctx, n.client).Err(); err != nil {
			return total, interpretError(ctx, err)
		}
		var cursor uint64
		for {
			keys, next, err := n.client.ScanType(ctx, cursor, s.match, int64(s.cfg.ScanCount), "hash").Result()
			if err != nil {
				return total, interpretError(ctx, err)
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

// purgeBatch runs the purge script on keys in one pipeline and counts the
// records it deleted.
func (s *Store) purgeBatch(ctx context.Context, c redis.Cmdable, keys []string) (int, error) {
	pipe := c.Pipeline()
	cmds := make([]*redis.Cmd, len(keys))
	for i, k := range keys {
		cmds[i] = purgeScript.EvalSha(ctx, pipe, []string{k})
	}
	_, err := pipe.Exec(ctx)
	deleted := 0
	for _, cmd := range cmds {
		if n, _ := cmd.Int64(); n == 1 {
			deleted++
		}
	}
	return deleted, interpretError(ctx, err)
}
