package idemsqlite

import (
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// Batcher returns the store's batcher, nil with Config.DisableBatch, for
// tests that pause it and benchmarks that read its Stats.
func (s *Store) Batcher() *groupcommit.Batcher { return s.batch }

// The statements whose query plans TestQueryPlans checks.
const (
	ExpiredLeasesQuery = expiredLeasesQuery
	PurgeQuery         = purgeQuery
)

// ListQuery returns List's statement for p and after, and its arguments.
func ListQuery(p idemstore.ListParams, after *idemstore.ListCursor) (string, []any) {
	return listQuery(p.Normalize(), after, time.Now())
}
