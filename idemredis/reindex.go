package idemredis

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// Reindex puts every record of the store into the search indexes (see
// "Search" in the package documentation): the records that versions
// before the indexes wrote have none, so searches and Counts do not see
// them until it has run (plain listings, Purge and the engine's reads by
// key do). It walks every master by SCAN, reads each batch's records with
// the get script, and adds each to the indexes its state and creation
// time call for with one script per record (indexScript), which changes
// nothing when the record is gone meanwhile. It is idempotent and safe
// while the store serves: records changed meanwhile were indexed by the
// scripts that changed them. It returns how many records it indexed,
// calling progress (when set) with the running total after every batch.
// idem migrate runs it on a Redis store; run it once after upgrading, and
// again after moving records between a single node and a Cluster.
func (s *Store) Reindex(ctx context.Context, progress func(indexed int)) (int, error) {
	total := 0
	err := s.scanAll(ctx, func(_ node, keys []string) error {
		done, err := s.reindexBatch(ctx, keys)
		total += done
		if done > 0 && progress != nil {
			progress(total)
		}
		return err
	})
	return total, err
}

// reindexBatch reads the records under keys and indexes those that exist.
func (s *Store) reindexBatch(ctx context.Context, keys []string) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	execs := make([]rueidis.LuaExec, len(keys))
	for i, k := range keys {
		execs[i] = rueidis.LuaExec{Keys: []string{k}}
	}
	var index []rueidis.LuaExec
	for i, res := range s.scripts().get.ExecMulti(ctx, s.client, execs...) {
		vals, err := res.ToArray()
		if err != nil {
			return 0, interpretError(ctx, err)
		}
		rec, err := decodeRead(vals)
		if err != nil {
			return 0, fmt.Errorf("%w (key %s)", err, keys[i])
		}
		if rec == nil || s.recordKey(rec.Key) != keys[i] {
			continue // gone, or not under its own name
		}
		label := ""
		if rec.ScopeLabel != "" {
			label = labelMember(idemstore.ScopeLabelIndex(rec.ScopeLabel), rec.Key)
		}
		index = append(index, rueidis.LuaExec{Keys: s.keys(rec.Key).indexed(), Args: []string{keyMember(rec.Key), ageMember(rec.Key), label}})
	}
	if len(index) == 0 {
		return 0, nil
	}
	n := 0
	for _, res := range s.scripts().index.ExecMulti(ctx, s.client, index...) {
		ok, err := res.AsInt64()
		if err != nil {
			return n, interpretError(ctx, err)
		}
		n += int(ok)
	}
	return n, nil
}
