package idempg

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/idemstore"
)

// List pages through records in p.Order, filtered as p says. The cursor
// is opaque: the last record returned (its key, and its CreatedAt in an
// order by age), encoded.
//
// A search by key or key prefix runs on the index of keys by value (a
// prefix as a range of it, in the "C" collation's byte order), one by
// label on the partial index of labels, a listing by age on the index of
// creation times, one of pending or needs_review records on the partial
// index of open records, and one of completed records on the primary key
// (nearly every record is completed); the reason is a filter of what those
// find.
func (s *Store) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	p = p.Normalize()
	if err := p.Check(); err != nil {
		return idemstore.ListPage{}, fmt.Errorf("idempg: List: %w", err)
	}
	cur, err := p.DecodeCursor()
	if err != nil || p.MatchesNothing() {
		return idemstore.ListPage{}, err
	}
	sql, args := listQuery(s.q.list, p, cur)
	recs, err := s.query(ctx, sql, args...)
	if err != nil {
		return idemstore.ListPage{}, err
	}
	return p.Page(recs), nil
}

// listQuery returns List's statement, after prefix (the SELECT up to its
// WHERE), and its arguments.
func listQuery(prefix string, p idemstore.ListParams, cur *idemstore.ListCursor) (string, []any) {
	var (
		conds []string
		args  []any
	)
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	switch {
	case openState(p.State):
		// The literal term lets a generic plan of the prepared statement
		// use the partial index of open records, whose predicate it is.
		conds = append(conds, "r.state = "+arg(string(p.State)), "r.state <> 'completed'")
	case p.State != "":
		conds = append(conds, "r.state = "+arg(string(p.State)))
	}
	if p.Operation != "" {
		conds = append(conds, "r.operation = "+arg(p.Operation))
	}
	if p.Key != "" {
		conds = append(conds, "r.key = "+arg(p.Key))
	}
	if p.KeyPrefix != "" {
		// A range of the index: no LIKE, whose wildcards a key may hold.
		conds = append(conds, "r.key >= "+arg(p.KeyPrefix))
		if end, ok := idemstore.RunePrefixEnd(p.KeyPrefix); ok {
			conds = append(conds, "r.key < "+arg(end))
		}
	}
	if len(p.ScopeLabels) > 0 {
		conds = append(conds, "r.label_index = ANY("+arg(p.ScopeLabels)+"::text[])")
	}
	if p.OlderThan > 0 {
		conds = append(conds, "r.created_at <= statement_timestamp() - "+arg(p.OlderThan)+"::interval")
	}
	if p.Reason != "" {
		conds = append(conds, "strpos(lower(r.reason), lower("+arg(p.Reason)+")) > 0")
	}
	cols, desc := "r.scope, r.operation, r.key", ""
	switch {
	case p.Order == idemstore.OrderOldest:
		cols = "r.created_at, r.scope, r.operation, r.key"
	case p.Order == idemstore.OrderNewest:
		cols, desc = "r.created_at, r.scope, r.operation, r.key", " DESC"
	case p.ByKeyValue():
		cols = "r.key, r.scope, r.operation"
	}
	if cur != nil {
		switch {
		case p.Order == idemstore.OrderOldest:
			// The first column alone, too, so that the index on it starts
			// the scan there.
			conds = append(conds, "r.created_at >= "+arg(cur.CreatedAt),
				"("+cols+") > ("+arg(cur.CreatedAt)+", "+arg(cur.Key.Scope)+", "+arg(cur.Key.Operation)+", "+arg(cur.Key.Key)+")")
		case p.Order == idemstore.OrderNewest:
			conds = append(conds, "r.created_at <= "+arg(cur.CreatedAt),
				"("+cols+") < ("+arg(cur.CreatedAt)+", "+arg(cur.Key.Scope)+", "+arg(cur.Key.Operation)+", "+arg(cur.Key.Key)+")")
		case p.ByKeyValue():
			conds = append(conds, "r.key >= "+arg(cur.Key.Key),
				"("+cols+") > ("+arg(cur.Key.Key)+", "+arg(cur.Key.Scope)+", "+arg(cur.Key.Operation)+")")
		default:
			conds = append(conds, "("+cols+") > ("+arg(cur.Key.Scope)+", "+arg(cur.Key.Operation)+", "+arg(cur.Key.Key)+")")
		}
	}
	where := "TRUE"
	if len(conds) > 0 {
		where = strings.Join(conds, " AND ")
	}
	if p.Order != idemstore.OrderKey && openState(p.State) {
		// Pending and needs_review records are few: read them through the
		// index of open records and sort them, whatever their ages. Ordered by
		// created_at itself, the planner may walk the index of creation
		// times instead, through every completed record older than the
		// first one in review.
		cols = strings.Replace(cols, "r.created_at", "(r.created_at + interval '0 s')", 1)
	}
	return prefix + where + " ORDER BY " + strings.ReplaceAll(cols, ",", desc+",") + desc + " LIMIT " + arg(p.Limit+1), args
}

// openState reports whether st is pending or needs_review.
func openState(st idemstore.State) bool {
	return st == idemstore.StatePending || st == idemstore.StateNeedsReview
}

// Counts counts the pending and needs_review records of each operation
// exactly, from the index of open records, and the completed ones exactly up to
// idemstore.ExactCountLimit; past it, it estimates them from the table's
// statistics (pg_class.reltuples, which autovacuum's ANALYZE keeps).
func (s *Store) Counts(ctx context.Context) (idemstore.Counts, error) {
	var c idemstore.Counts
	rows, _ := s.pool.Query(ctx, s.q.countOpen)
	var (
		state, op string
		n         int64
		oldest    time.Time
	)
	_, err := pgx.ForEachRow(rows, []any{&state, &op, &n, &oldest}, func() error {
		c.Add(idemstore.State(state), op, n, oldest)
		return nil
	})
	if err != nil {
		return c, interpretError(ctx, err)
	}
	var (
		completed int64
		estimate  float64
	)
	if err := s.pool.QueryRow(ctx, s.q.countCompleted, idemstore.ExactCountLimit+1, pgx.Identifier{s.cfg.Schema, "idem_records"}.Sanitize()).Scan(&c.ReadAt, &completed, &estimate); err != nil {
		return c, interpretError(ctx, err)
	}
	c.ReadAt = c.ReadAt.UTC()
	c.Completed = completed
	if completed > idemstore.ExactCountLimit {
		c.Completed, c.CompletedEstimated = max(int64(estimate)-c.Pending-c.NeedsReview, completed), true
	}
	return c, nil
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
		if err := (readCommitted{s}).QueryRow(ctx, s.q.purge, p.BatchSize).Scan(&n); err != nil {
			return 0, interpretError(ctx, err)
		}
		return n, nil
	})
}
