package idemsqlite

import (
	"context"

	"github.com/idem-dev/idem/idemstore"
)

// List returns a page of records in (scope, operation, key) order, filtered
// by p.State when it is set. The cursor is opaque to callers: it encodes the
// last key of the previous page, so records added or removed between pages
// neither repeat nor shift the listing.
func (s *Store) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	p = p.Normalize()
	if p.State != "" && !p.State.Valid() {
		return idemstore.ListPage{}, errorf("List: unknown state %q", p.State)
	}
	var after *idemstore.Key
	if p.Cursor != "" {
		k, err := idemstore.DecodeKeyCursor(p.Cursor)
		if err != nil {
			return idemstore.ListPage{}, err
		}
		after = &k
	}
	q, args := listQuery(p, after)
	recs, err := s.query(ctx, q, args...)
	if err != nil {
		return idemstore.ListPage{}, err
	}
	return idemstore.KeyPage(recs, p.Limit), nil
}

// listQuery returns List's statement and its arguments. A listing of
// pending or needs_review records runs on the partial index of records not
// completed, in key order; any other on the primary key's order.
func listQuery(p idemstore.ListParams, after *idemstore.Key) (string, []any) {
	q := `SELECT ` + recordColumns + ` FROM idem_records WHERE 1 = 1`
	var args []any
	switch p.State {
	case "":
	case idemstore.StateCompleted: // nearly every record: the primary key's order, filtered
		q += ` AND state = 'completed'`
	default:
		// The literal term lets SQLite use the partial index of records
		// not completed, in key order.
		q += ` AND state = ? AND state <> 'completed'`
		args = append(args, string(p.State))
	}
	if p.Operation != "" {
		q += ` AND operation = ?`
		args = append(args, p.Operation)
	}
	if after != nil {
		q += ` AND (scope, operation, "key") > (?, ?, ?)`
		args = append(args, after.Scope, after.Operation, after.Key)
	}
	q += ` ORDER BY scope, operation, "key" LIMIT ?`
	args = append(args, p.Limit+1) // one more, to know whether a next page exists
	return q, args
}

// ListExpiredLeases returns up to limit pending records whose lease has
// expired by the store's clock, oldest deadline first (straight from the
// partial index of pending records' lease_until, without a sort). limit follows
// idemstore.PageLimit.
func (s *Store) ListExpiredLeases(ctx context.Context, limit int) ([]*idemstore.Record, error) {
	limit = idemstore.PageLimit(limit)
	return s.query(ctx, expiredLeasesQuery, millis(s.now()), limit)
}

const expiredLeasesQuery = `SELECT ` + recordColumns + ` FROM idem_records
	WHERE state = 'pending' AND lease_until <= ?
	ORDER BY lease_until LIMIT ?`

// query runs a SELECT of recordColumns and scans every row.
func (s *Store) query(ctx context.Context, q string, args ...any) (recs []*idemstore.Record, err error) {
	now := s.now()
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, interpretError(ctx, err)
	}
	defer func() {
		if cerr := rows.Close(); err == nil && cerr != nil {
			err = interpretError(ctx, cerr)
		}
	}()
	for rows.Next() {
		rec, err := scanRecord(rows, now)
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
