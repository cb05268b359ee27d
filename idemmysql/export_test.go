package idemmysql

import "github.com/idem-dev/idem/internal/groupcommit"

// Batcher returns the store's batcher, nil with Config.DisableBatch, for
// tests that pause it and benchmarks that read its Stats.
func (s *Store) Batcher() *groupcommit.Batcher { return s.batch }

// PurgeSQL is Purge's statement, for the test that reads its plan.
const PurgeSQL = purgeSQL
