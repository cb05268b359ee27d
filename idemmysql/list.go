package idemmysql

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

const (
	// afterCursor selects keys after (?, ?, ?) in primary-key order,
	// written out so that every MySQL and MariaDB version uses the index.
	afterCursor = "(scope > ? OR (scope = ? AND (operation > ? OR (operation = ? AND `key` > ?))))"
	expiredSQL  = "SELECT " + recordColumns + " FROM idem_records WHERE state = 'pending' AND lease_until <= " + nowMillis + " ORDER BY lease_until LIMIT ?"
	// purgeSQL deletes a batch of expired records by their primary keys,
	// which a derived table reads from idem_records_state_expiry in expiry
	// order, at most ? of them. Written as the single-table DELETE … ORDER
	// BY expires_at LIMIT ?, MariaDB chose the index of states and sorted
	// every completed record for each batch while holding their locks
	// (1.8 s a batch of 500 with 50,000 expired records,
	// TestPurgeUsesTheExpiryIndex). The outer WHERE checks each row again as
	// it deletes it, with the lock taken: a record reserved again since the
	// derived table read it is not deleted.
	purgeSQL = "DELETE r FROM idem_records r JOIN (SELECT scope, operation, `key` FROM idem_records FORCE INDEX (idem_records_state_expiry)" +
		" WHERE state = 'completed' AND expires_at <= " + nowMillis + " ORDER BY expires_at LIMIT ?) d" +
		" ON r.scope = d.scope AND r.operation = d.operation AND r.`key` = d.`key`" +
		" WHERE r.state = 'completed' AND r.expires_at <= " + nowMillis
)

// List pages through records in p.Order, filtered as p says, each read
// at the server's clock (ReadAt). The cursor is opaque: the last record
// returned (its key, and its CreatedAt in an order by age), encoded.
//
// A search by key or key prefix runs on idem_records_key_value (a prefix
// as a range of it, in byte order), one by label on idem_records_label, a
// listing by age on idem_records_created, one by state on
// idem_records_state and one by operation on idem_records_operation;
// InnoDB appends the primary key to each, which gives their ties the
// listing's order. The reason is a filter of what those find.
func (s *Store) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	p = p.Normalize()
	if err := p.Check(); err != nil {
		return idemstore.ListPage{}, fmt.Errorf("idemmysql: List: %w", err)
	}
	cur, err := p.DecodeCursor()
	if err != nil || p.MatchesNothing() {
		return idemstore.ListPage{}, err
	}
	query, args := listQuery(p, cur)
	recs, err := s.query(ctx, query, args...)
	if err != nil {
		return idemstore.ListPage{}, err
	}
	return p.Page(recs), nil
}

// listQuery returns List's statement and its arguments. Values compared
// with the VARBINARY key columns are cast to BINARY, so that the server
// compares bytes and reads the indexes in order.
func listQuery(p idemstore.ListParams, cur *idemstore.ListCursor) (string, []any) {
	query := "SELECT " + recordColumns + " FROM idem_records WHERE TRUE"
	var args []any
	where := func(cond string, a ...any) {
		query += " AND " + cond
		args = append(args, a...)
	}
	if p.State != "" {
		where("state = ?", string(p.State))
	}
	if p.Operation != "" {
		where("operation = CAST(? AS BINARY)", p.Operation)
	}
	if p.Key != "" {
		where("`key` = CAST(? AS BINARY)", p.Key)
	}
	if p.KeyPrefix != "" {
		// A range of the index in byte order: no LIKE, whose wildcards a
		// key may hold.
		where("`key` >= CAST(? AS BINARY)", p.KeyPrefix)
		if end, ok := idemstore.PrefixEnd(p.KeyPrefix); ok {
			where("`key` < CAST(? AS BINARY)", end)
		}
	}
	if len(p.ScopeLabels) > 0 {
		where("label_index IN (CAST(? AS BINARY)"+strings.Repeat(", CAST(? AS BINARY)", len(p.ScopeLabels)-1)+")", anys(p.ScopeLabels)...)
	}
	if p.OlderThan > 0 {
		where("created_at <= "+nowMillis+" - ?", ceilMillis(p.OlderThan))
	}
	if p.Reason != "" {
		where("LOCATE(LOWER(CONVERT(? USING utf8mb4)) COLLATE utf8mb4_bin, LOWER(CONVERT(reason USING utf8mb4)) COLLATE utf8mb4_bin) > 0", p.Reason)
	}
	order := "scope, operation, `key`"
	switch {
	case p.Order == idemstore.OrderOldest:
		order = "created_at, scope, operation, `key`"
		if cur != nil {
			cond, condArgs := after([]string{"created_at", "scope", "operation", "`key`"}, ">", cur.CreatedAt.UnixMilli(), cur.Key.Scope, cur.Key.Operation, cur.Key.Key)
			where(cond, condArgs...)
		}
	case p.Order == idemstore.OrderNewest:
		order = "created_at DESC, scope DESC, operation DESC, `key` DESC"
		if cur != nil {
			cond, condArgs := after([]string{"created_at", "scope", "operation", "`key`"}, "<", cur.CreatedAt.UnixMilli(), cur.Key.Scope, cur.Key.Operation, cur.Key.Key)
			where(cond, condArgs...)
		}
	case p.ByKeyValue():
		order = "`key`, scope, operation"
		if cur != nil {
			cond, condArgs := after([]string{"`key`", "scope", "operation"}, ">", cur.Key.Key, cur.Key.Scope, cur.Key.Operation)
			where(cond, condArgs...)
		}
	case cur != nil:
		cond, condArgs := afterKey(cur.Key, p.Operation)
		where(cond, condArgs...)
	}
	if p.Order != idemstore.OrderKey && (p.State == idemstore.StatePending || p.State == idemstore.StateNeedsReview) {
		// Pending and needs_review records are few: read them through
		// idem_records_state and sort them, whatever their ages. Ordered by
		// created_at itself, the optimizer may walk idem_records_created
		// instead, through every completed record older than the first one
		// in review.
		order = strings.Replace(order, "created_at", "created_at + 0", 1)
	}
	query += " ORDER BY " + order + " LIMIT ?"
	args = append(args, p.Limit+1)
	return query, args
}

// after is the condition for rows after (op ">") or before (op "<")
// vals in the order of cols, and its arguments: the first column alone
// bounds the scan, so that the server reads the index from there (MySQL
// and MariaDB read no index range from a row comparison), and the rest
// breaks ties, written out. Values of VARBINARY columns are cast to
// BINARY.
func after(cols []string, op string, vals ...any) (string, []any) {
	cast := func(i int) string {
		if cols[i] == "created_at" {
			return "?"
		}
		return "CAST(? AS BINARY)"
	}
	last := len(cols) - 1
	cond, args := cols[last]+" "+op+" "+cast(last), []any{vals[last]}
	for i := last - 1; i >= 0; i-- {
		cond = cols[i] + " " + op + " " + cast(i) + " OR (" + cols[i] + " = " + cast(i) + " AND (" + cond + "))"
		args = append([]any{vals[i], vals[i]}, args...)
	}
	return "(" + cols[0] + " " + op + "= " + cast(0) + " AND (" + cond + "))", append([]any{vals[0]}, args...)
}

// anys returns ss as arguments.
func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// ceilMillis is d in milliseconds, rounded up.
func ceilMillis(d time.Duration) int64 { return (d + time.Millisecond - 1).Milliseconds() }

// Counts counts the pending and needs_review records of each operation
// exactly, from idem_records_state, and the completed ones exactly up to
// idemstore.ExactCountLimit; past it, it estimates them from the table's
// statistics (information_schema.TABLES.TABLE_ROWS).
func (s *Store) Counts(ctx context.Context) (idemstore.Counts, error) {
	var c idemstore.Counts
	rows, err := s.db.QueryContext(ctx, "SELECT state, operation, COUNT(*), MIN(created_at) FROM idem_records "+
		"WHERE state IN ('pending', 'needs_review') GROUP BY operation, state ORDER BY operation, state")
	if err != nil {
		return c, interpretError(ctx, err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			state, op []byte
			n, oldest int64
		)
		if err := rows.Scan(&state, &op, &n, &oldest); err != nil {
			return c, interpretError(ctx, err)
		}
		c.Add(idemstore.State(state), string(op), n, fromMillis(oldest))
	}
	if err := rows.Err(); err != nil {
		return c, interpretError(ctx, err)
	}
	var (
		now, completed int64
		estimate       sql.NullInt64
	)
	err = s.db.QueryRowContext(ctx, "SELECT "+nowMillis+", "+
		"(SELECT COUNT(*) FROM (SELECT 1 FROM idem_records WHERE state = 'completed' LIMIT ?) c), "+
		"(SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'idem_records')",
		idemstore.ExactCountLimit+1).Scan(&now, &completed, &estimate)
	if err != nil {
		return c, interpretError(ctx, err)
	}
	c.ReadAt, c.Completed = fromMillis(now), completed
	if completed > idemstore.ExactCountLimit {
		c.Completed, c.CompletedEstimated = max(estimate.Int64-c.Pending-c.NeedsReview, completed), true
	}
	return c, nil
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
