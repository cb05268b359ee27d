package idemsqlite

import (
	"context"

	"github.com/idem-dev/idem/idemstore"
)

// Purge deletes completed records whose expiry has passed by the store's
// clock, at
// most p.BatchSize per statement, each statement its own short write
// transaction so that reservations from other connections and processes
// get the write lock between batches. It stops when a batch deletes fewer
// than BatchSize records or ctx ends, and returns how many it deleted.
// Pending and needs_review records are never purged.
func (s *Store) Purge(ctx context.Context, p idemstore.PurgeParams) (int, error) {
	p = p.Normalize()
	return idemstore.PurgeBatches(ctx, p, func() (int, error) {
		res, err := s.db.ExecContext(ctx, purgeQuery, millis(s.now()), p.BatchSize)
		if err != nil {
			return 0, interpretError(ctx, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, interpretError(ctx, err)
		}
		return int(n), nil
	})
}

// purgeQuery deletes up to a batch of expired completed records, found
// through the partial index of completed records' expires_at.
const purgeQuery = `DELETE FROM idem_records WHERE rowid IN (
	SELECT rowid FROM idem_records
	WHERE state = 'completed' AND expires_at <= ?
	LIMIT ?)`
