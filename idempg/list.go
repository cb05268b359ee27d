package idempg

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/idemstore"
)

// List pages through records in (scope, operation, key) byte order,
// optionally filtered by state and operation. The cursor is opaque: the key of the last
// record returned, encoded.
func (s *Store) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	p = p.Normalize()
	var (
		where = "TRUE"
		args  []any
	)
	if p.Cursor != "" {
		after, err := idemstore.DecodeKeyCursor(p.Cursor)
		if err != nil {
			return idemstore.ListPage{}, err
		}
		where = "(r.scope, r.operation, r.key) > ($1, $2, $3)"
		args = append(args, after.Scope, after.Operation, after.Key)
	}
	if p.State != "" {
		args = append(args, string(p.State))
		where += fmt.Sprintf(" AND r.state = $%d", len(args))
	}
	if p.Operation != "" {
		args = append(args, p.Operation)
		where += fmt.Sprintf(" AND r.operation = $%d", len(args))
	}
	args = append(args, p.Limit+1)
	sql := s.q.list + where + fmt.Sprintf(" ORDER BY r.scope, r.operation, r.key LIMIT $%d", len(args))
	recs, err := s.query(ctx, sql, args...)
	if err != nil {
		return idemstore.ListPage{}, err
	}
	return idemstore.KeyPage(recs, p.Limit), nil
}

// ListExpiredLeases returns up to limit pending records whose lease has
// expired by the server's clock, oldest deadline first. limit follows
// idemstore.PageLimit.
func (s *Store) ListExpiredLeases(ctx context.Context, limit int) ([]*idemstore.Record, error) {
	limit = idemstore.PageLimit(limit)
	return s.query(ctx, s.q.expired, limit)
}

func (s *Store) query(ctx context.Context, sql string, args ...any) ([]*idemstore.Record, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, interpretError(ctx, err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*idemstore.Record, error) {
		return scanRecord(row)
	})
	if err != nil {
		return nil, interpretError(ctx, err)
	}
	return recs, nil
}

// Purge deletes completed records whose expiry is at or before the server's
// now, with their heartbeat and waiter rows, at most p.BatchSize records
// per statement (each its own short transaction), until a batch deletes
// fewer than that or ctx ends. It returns how many records it deleted.
func (s *Store) Purge(ctx context.Context, p idemstore.PurgeParams) (int, error) {
	p = p.Normalize()
	return idemstore.PurgeBatches(ctx, p, func() (int, error) {
		var n int
		if err := s.pool.QueryRow(ctx, s.q.purge, p.BatchSize).Scan(&n); err != nil {
			return 0, interpretError(ctx, err)
		}
		return n, nil
	})
}
