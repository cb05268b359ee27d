package idemmysql

import (
	"context"

	"github.com/idem-dev/idem/idemstore"
)

const (
	// afterCursor selects keys after (?, ?, ?) in primary-key order,
	// written out so that every MySQL and MariaDB version uses the index.
	afterCursor = "(scope > ? OR (scope = ? AND (operation > ? OR (operation = ? AND `key` > ?))))"
	expiredSQL  = "SELECT " + recordColumns + " FROM idem_records WHERE state = 'pending' AND lease_until <= " + nowMillis + " ORDER BY lease_until LIMIT ?"
	purgeSQL    = "DELETE FROM idem_records WHERE state = 'completed' AND expires_at <= " + nowMillis + " ORDER BY expires_at LIMIT ?"
)

// List pages through records in (scope, operation, key) byte order,
// optionally filtered by state and operation, each read at the server's
// clock (ReadAt). The cursor is opaque: the key of the last record
// returned, encoded.
func (s *Store) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	p = p.Normalize()
	query := "SELECT " + recordColumns + " FROM idem_records WHERE TRUE"
	var args []any
	if p.State != "" {
		query += " AND state = ?"
		args = append(args, string(p.State))
	}
	if p.Operation != "" {
		// Compared as bytes, like the column: a parameter in the
		// connection's character set would keep the server from reading
		// idem_records_operation in order.
		query += " AND operation = CAST(? AS BINARY)"
		args = append(args, p.Operation)
	}
	if p.Cursor != "" {
		after, err := idemstore.DecodeKeyCursor(p.Cursor)
		if err != nil {
			return idemstore.ListPage{}, err
		}
		cond, condArgs := afterKey(after, p.Operation)
		query += " AND " + cond
		args = append(args, condArgs...)
	}
	query += " ORDER BY scope, operation, `key` LIMIT ?"
	args = append(args, p.Limit+1)
	recs, err := s.query(ctx, query, args...)
	if err != nil {
		return idemstore.ListPage{}, err
	}
	return idemstore.KeyPage(recs, p.Limit), nil
}

// afterKey is the condition for keys after the cursor key after, in
// primary-key order. With an operation filter the operation is fixed, and
// the condition is written on (scope, key) alone, which the server turns
// into a range of idem_records_operation (whose entries end with the
// primary key).
func afterKey(after idemstore.Key, operation string) (string, []any) {
	switch {
	case operation == "":
		return afterCursor, []any{after.Scope, after.Scope, after.Operation, after.Operation, after.Key}
	case operation == after.Operation:
		return "(scope > ? OR (scope = ? AND `key` > ?))", []any{after.Scope, after.Scope, after.Key}
	case operation > after.Operation:
		return "scope >= ?", []any{after.Scope}
	default:
		return "scope > ?", []any{after.Scope}
	}
}

// ListExpiredLeases returns up to limit pending records whose lease has
// expired by the server's clock, oldest deadline first, each read at that
// clock (ReadAt). limit follows idemstore.PageLimit.
func (s *Store) ListExpiredLeases(ctx context.Context, limit int) ([]*idemstore.Record, error) {
	return s.query(ctx, expiredSQL, idemstore.PageLimit(limit))
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

// Purge deletes completed records whose expiry is at or before the server's
// now (taken afresh by every batch), at most p.BatchSize per statement (each
// its own short transaction), until a batch deletes fewer than that or ctx
// ends. It returns how many it deleted.
func (s *Store) Purge(ctx context.Context, p idemstore.PurgeParams) (int, error) {
	p = p.Normalize()
	return idemstore.PurgeBatches(ctx, p, func() (int, error) {
		res, err := s.db.ExecContext(ctx, purgeSQL, p.BatchSize)
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
