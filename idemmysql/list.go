package idemmysql

import (
	"context"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

const (
	// afterCursor selects keys after (?, ?, ?) in primary-key order,
	// written out so that every MySQL and MariaDB version uses the index.
	afterCursor = "(scope > ? OR (scope = ? AND (operation > ? OR (operation = ? AND `key` > ?))))"
	expiredSQL  = "SELECT " + recordColumns + " FROM idem_records WHERE state = 'pending' AND lease_until <= ? ORDER BY lease_until LIMIT ?"
	purgeSQL    = "DELETE FROM idem_records WHERE state = 'completed' AND expires_at <= ? ORDER BY expires_at LIMIT ?"
)

// List pages through records in (scope, operation, key) byte order,
// optionally filtered by state. The cursor is opaque: the key of the last
// record returned, encoded.
func (s *Store) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	p = p.Normalize()
	query := "SELECT " + recordColumns + " FROM idem_records WHERE TRUE"
	var args []any
	if p.State != "" {
		query += " AND state = ?"
		args = append(args, string(p.State))
	}
	if p.Cursor != "" {
		after, err := idemstore.DecodeKeyCursor(p.Cursor)
		if err != nil {
			return idemstore.ListPage{}, err
		}
		query += " AND " + afterCursor
		args = append(args, after.Scope, after.Scope, after.Operation, after.Operation, after.Key)
	}
	query += " ORDER BY scope, operation, `key` LIMIT ?"
	args = append(args, p.Limit+1)
	recs, err := s.query(ctx, query, args...)
	if err != nil {
		return idemstore.ListPage{}, err
	}
	return idemstore.KeyPage(recs, p.Limit), nil
}

// ListExpiredLeases returns up to limit pending records whose lease expired
// at or before now, oldest lease first. limit follows
// idemstore.PageLimit.
func (s *Store) ListExpiredLeases(ctx context.Context, now time.Time, limit int) ([]*idemstore.Record, error) {
	limit = idemstore.PageLimit(limit)
	return s.query(ctx, expiredSQL, millis(now), limit)
}

func (s *Store) query(ctx context.Context, query string, args ...any) ([]*idemstore.Record, error) {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, interpretError(ctx, err)
	}
	defer rows.Close()
	var recs []*idemstore.Record
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			return nil, interpretError(ctx, err)
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, interpretError(ctx, err)
	}
	return recs, nil
}

// Purge deletes completed records whose expiry is at or before p.Before, at
// most p.BatchSize per statement (each its own short transaction), until a
// batch deletes fewer than that or ctx ends. It returns how many it deleted.
func (s *Store) Purge(ctx context.Context, p idemstore.PurgeParams) (int, error) {
	p = p.Normalize()
	return idemstore.PurgeBatches(ctx, p, func() (int, error) {
		res, err := s.db.ExecContext(ctx, purgeSQL, millis(p.Before), p.BatchSize)
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
