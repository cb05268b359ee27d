package idemsqlite

import (
	"context"
	"strings"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// List returns a page of records in p.Order, filtered as p says. The
// cursor is opaque to callers: it encodes the last record of the previous
// page (its key, and CreatedAt in an order by age), so records added or
// removed between pages neither repeat nor shift the listing.
//
// A search by key or key prefix runs on the index of keys by value, one by
// label on the index of labels, and a listing by age on the index of
// creation times; a listing of pending or needs_review records on the
// partial index of records not completed. The reason filter is a filter
// of the rows those find, not an index.
func (s *Store) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	p = p.Normalize()
	if err := p.Check(); err != nil {
		return idemstore.ListPage{}, errorf("List: %v", err)
	}
	cur, err := p.DecodeCursor()
	if err != nil || p.MatchesNothing() {
		return idemstore.ListPage{}, err
	}
	q, args := listQuery(p, cur, s.now())
	recs, err := s.query(ctx, q, args...)
	if err != nil {
		return idemstore.ListPage{}, err
	}
	return p.Page(recs), nil
}

// listQuery returns List's statement and its arguments, at now.
func listQuery(p idemstore.ListParams, cur *idemstore.ListCursor, now time.Time) (string, []any) {
	q := `SELECT ` + recordColumns + ` FROM idem_records WHERE 1 = 1`
	var args []any
	where := func(cond string, a ...any) {
		q += ` AND ` + cond
		args = append(args, a...)
	}
	switch p.State {
	case "":
	case idemstore.StateCompleted: // nearly every record: the primary key's order, filtered
		where(`state = 'completed'`)
	default:
		// The literal term lets SQLite use the partial index of records
		// not completed, in order of age within a state.
		where(`state = ? AND state <> 'completed'`, string(p.State))
	}
	if p.Operation != "" {
		where(`operation = ?`, p.Operation)
	}
	if p.Key != "" {
		where(`"key" = ?`, p.Key)
	}
	if p.KeyPrefix != "" {
		// A range of the index in byte order (the column's BINARY
		// collation): no LIKE, whose wildcards and case folding a key may
		// hold or defeat.
		where(`"key" >= ?`, p.KeyPrefix)
		if end, ok := idemstore.PrefixEnd(p.KeyPrefix); ok {
			where(`"key" < ?`, end)
		}
	}
	if len(p.ScopeLabels) > 0 {
		where(`label_index IN (?`+strings.Repeat(`, ?`, len(p.ScopeLabels)-1)+`)`, anys(p.ScopeLabels)...)
	}
	if p.OlderThan > 0 {
		where(`created_at <= ?`, millis(now.Add(-p.OlderThan)))
	}
	if p.Reason != "" {
		where(`instr(lower(reason), lower(?)) > 0`, p.Reason)
	}
	cols, desc := `scope, operation, "key"`, ""
	switch {
	case p.Order == idemstore.OrderOldest:
		cols = `created_at, scope, operation, "key"`
	case p.Order == idemstore.OrderNewest:
		cols, desc = `created_at, scope, operation, "key"`, " DESC"
	case p.ByKeyValue():
		cols = `"key", scope, operation`
	}
	if cur != nil {
		op := ">"
		if desc != "" {
			op = "<"
		}
		switch {
		case p.Order != idemstore.OrderKey:
			where(`(`+cols+`) `+op+` (?, ?, ?, ?)`, millis(cur.CreatedAt), cur.Key.Scope, cur.Key.Operation, cur.Key.Key)
		case p.ByKeyValue():
			where(`(`+cols+`) > (?, ?, ?)`, cur.Key.Key, cur.Key.Scope, cur.Key.Operation)
		default:
			where(`(`+cols+`) > (?, ?, ?)`, cur.Key.Scope, cur.Key.Operation, cur.Key.Key)
		}
	}
	q += ` ORDER BY ` + strings.ReplaceAll(cols, ",", desc+",") + desc + ` LIMIT ?`
	args = append(args, p.Limit+1) // one more, to know whether a next page exists
	return q, args
}

// anys returns ss as arguments.
func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// Counts counts the pending and needs_review records, by operation, from
// the partial index of records not completed, and the completed ones
// exactly up to idemstore.ExactCountLimit; past it, it estimates them
// from the range of row IDs (new rows take the next one, and the purge
// deletes the oldest first), less the open records.
func (s *Store) Counts(ctx context.Context) (idemstore.Counts, error) {
	now := s.now()
	c := idemstore.Counts{ReadAt: now.UTC().Truncate(time.Millisecond)}
	rows, err := s.db.QueryContext(ctx, `SELECT state, operation, count(*), min(created_at) FROM idem_records
		WHERE state <> 'completed' GROUP BY state, operation ORDER BY operation`)
	if err != nil {
		return c, interpretError(ctx, err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			state, op string
			n, oldest int64
		)
		if err := rows.Scan(&state, &op, &n, &oldest); err != nil {
			return c, interpretError(ctx, err)
		}
		c.Add(idemstore.State(state), op, n, fromMillis(oldest))
	}
	if err := rows.Err(); err != nil {
		return c, interpretError(ctx, err)
	}
	var rows64 int64
	if err := s.db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM (SELECT 1 FROM idem_records WHERE state = 'completed' LIMIT ?)),
		COALESCE((SELECT max(rowid) FROM idem_records) - (SELECT min(rowid) FROM idem_records) + 1, 0)`,
		idemstore.ExactCountLimit+1).Scan(&c.Completed, &rows64); err != nil {
		return c, interpretError(ctx, err)
	}
	if c.Completed > idemstore.ExactCountLimit {
		c.Completed, c.CompletedEstimated = max(rows64-c.Pending-c.NeedsReview, c.Completed), true
	}
	return c, nil
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
