package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// do runs a fenced change through the batcher and returns its outcome.
func (s *Store) do(ctx context.Context, op *groupcommit.Op) error {
	if err := s.batch.Do(ctx, op); err != nil {
		return interpretError(ctx, err)
	}
	return op.Err
}

// alone are the store's calls as it makes them without batching.
func (s *Store) alone() groupcommit.Calls {
	return groupcommit.Calls{
		Reserve:  s.reserveOnce,
		Complete: func(ctx context.Context, p idemstore.CompleteParams) error { return complete(ctx, s.db, p) },
		Release:  s.release,
		Escalate: s.escalate,
		Extend:   s.extend,
	}
}

// runBatch writes ops in one transaction, in rounds of distinct keys (see
// groupcommit.Rounds). Each round takes a few multi-row statements
// whatever its size:
//
//   - Reserves are one INSERT IGNORE of every new record (the inputs are
//     checked before they queue, so IGNORE can only skip a duplicate key);
//     when it inserted fewer rows than it was given, one read tells which
//     records are ours (their token is the Reserve's own: every Reserve
//     offers a fresh token) and returns the others' existing records;
//   - the fenced changes (Complete, Release, Escalate, Extend) are one
//     UPDATE or DELETE per kind, each conditioned on every record being
//     pending under its token: the Completes' joined to a derived table of
//     their keys (completeJoined), the others' values chosen by CASE on
//     the key.
//
// That is the optimistic try, in a transaction at the session's own
// isolation level: the usual case, where every fenced change matches, takes
// no other statement. If a change matched fewer records than it was given
// (a lease was lost, or an Extend rewrote the same deadline), or the
// server rolled the try back as a deadlock's victim (errDeadlocked), the
// batch runs again, locking first: in a
// READ COMMITTED transaction, one SELECT … FOR UPDATE per round reads the
// records the fenced changes aim at (locking the rows found, and no gap),
// the changes whose record is not pending under their token get
// idemstore.ErrLeaseLost there, and the others, whose rows stay locked,
// are applied as above.
//
// The server's clock is read in each statement, as without batching.
func (s *Store) runBatch(ctx context.Context, ops []*groupcommit.Op) error {
	err := s.runTx(ctx, ops, false)
	for try := 0; try < lockingTries && (errors.Is(err, errUnmatched) || errors.Is(err, errDeadlocked)) && ctx.Err() == nil; try++ {
		for _, op := range ops {
			op.Record, op.Created, op.Err = nil, false, nil
		}
		err = s.runTx(ctx, ops, true)
	}
	if errors.Is(err, errDeadlocked) { // every try was rolled back
		return groupcommit.Failed(interpretError(ctx, err))
	}
	return err
}

// lockingTries is how many times a batch runs locking first after its
// optimistic try: a locking run can still be a deadlock's victim, against
// another process's optimistic try, which then goes on to commit; two
// locking runs take their rows in one order and cannot deadlock.
const lockingTries = 3

// errUnmatched says that an optimistic batch's fenced change matched fewer
// records than it was given; the batch was rolled back.
var errUnmatched = errors.New("idemmysql: a fenced change in a batch matched fewer records than it was given")

// errDeadlocked says that the server chose a batch as the victim of a
// deadlock and rolled it back whole. The optimistic try locks
// by kind of call, then by key (the Completes' statement, then the
// Escalates', …), so that two processes' batches with different kinds on
// the same keys can lock them in opposite orders; the locking rerun takes
// every fenced record in key order first.
var errDeadlocked = errors.New("idemmysql: an optimistic batch was a deadlock's victim")

// runTx runs ops in one transaction, optimistically or locking first (see
// runBatch).
func (s *Store) runTx(ctx context.Context, ops []*groupcommit.Op, locking bool) error {
	var opts *sql.TxOptions
	if locking {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return groupcommit.Failed(interpretError(ctx, err))
	}
	for _, round := range groupcommit.Rounds(ops) {
		if err := runRound(ctx, tx, round, locking); err != nil {
			_ = tx.Rollback()
			if errors.Is(err, errUnmatched) {
				return err
			}
			var me *mysql.MySQLError
			if errors.As(err, &me) && me.Number == 1213 { // ER_LOCK_DEADLOCK: all rolled back
				return fmt.Errorf("%w: %w", errDeadlocked, err)
			}
			return groupcommit.Failed(interpretError(ctx, err))
		}
	}
	if err := tx.Commit(); err != nil {
		return groupcommit.CommitUnknown("idemmysql", len(ops), interpretError(ctx, err))
	}
	return nil
}

// runRound runs calls on distinct keys in tx and sets their outcomes.
func runRound(ctx context.Context, tx *sql.Tx, round []*groupcommit.Op, locking bool) error {
	var (
		reserves, fenced []*groupcommit.Op
		held             [groupcommit.Extend + 1][]*groupcommit.Op
	)
	for _, op := range round {
		if op.Kind == groupcommit.Reserve {
			reserves = append(reserves, op)
		} else {
			fenced = append(fenced, op)
		}
	}
	if locking && len(fenced) > 0 {
		tokens, err := lockPending(ctx, tx, fenced)
		if err != nil {
			return err
		}
		for _, op := range fenced {
			if tok, ok := tokens[op.Key]; ok && tok == op.Token {
				held[op.Kind] = append(held[op.Kind], op)
			} else {
				op.Err = idemstore.ErrLeaseLost
			}
		}
	} else {
		for _, op := range fenced {
			held[op.Kind] = append(held[op.Kind], op)
		}
	}
	for _, part := range chunks(reserves, func(op *groupcommit.Op) int {
		if op.Request == nil {
			return 0
		}
		return len(op.Request.Body)
	}) {
		if err := insertReserves(ctx, tx, part); err != nil {
			return err
		}
	}
	for _, part := range chunks(held[groupcommit.Complete], func(op *groupcommit.Op) int { return len(op.Response.Body) }) {
		if err := completeJoined(ctx, tx, part, locking); err != nil {
			return err
		}
	}
	for _, part := range chunks(held[groupcommit.Escalate], func(op *groupcommit.Op) int { return len(op.Reason) }) {
		var b stmt
		b.add("UPDATE " + byPrimaryKey + " SET state = 'needs_review', reason = ")
		b.caseArg(part, func(op *groupcommit.Op) any { return op.Reason })
		b.add(", updated_at = " + nowMillis)
		if err := b.fenced(ctx, tx, part, locking); err != nil {
			return err
		}
	}
	for _, part := range chunks(held[groupcommit.Extend], nil) {
		var b stmt
		b.add("UPDATE " + byPrimaryKey + " SET lease_until = " + nowMillis + " + ")
		b.caseLit(part, func(op *groupcommit.Op) int64 { return millis(op.Lease) })
		b.add(", updated_at = " + nowMillis)
		if err := b.fenced(ctx, tx, part, locking); err != nil {
			return err
		}
	}
	for _, part := range chunks(held[groupcommit.Release], nil) {
		var b stmt
		b.add("DELETE idem_records FROM " + byPrimaryKey) // the multi-table form, which takes an index hint
		if err := b.fenced(ctx, tx, part, locking); err != nil {
			return err
		}
	}
	return nil
}

// byPrimaryKey is idem_records read through its primary key, as every
// batched statement that finds records by their keys does, whatever a
// small table's statistics make MariaDB estimate: through the index on
// (state, lease_until) a fenced change would read, and lock, every pending
// record, and through the index on operation every record of the
// operation, and so wait for the transactions that hold them (another
// batch, an application's CompleteTx).
const byPrimaryKey = "idem_records FORCE INDEX (PRIMARY)"

// lockPending locks the records ops aim at with SELECT … FOR UPDATE and
// returns the tokens of those that are pending, by key.
func lockPending(ctx context.Context, tx *sql.Tx, ops []*groupcommit.Op) (map[idemstore.Key]string, error) {
	var b stmt
	b.add("SELECT scope, operation, `key`, token FROM " + byPrimaryKey + " WHERE (")
	b.keys(ops)
	b.add(") AND state = 'pending' FOR UPDATE")
	rows, err := tx.QueryContext(ctx, b.String(), b.args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	tokens := make(map[idemstore.Key]string, len(ops))
	for rows.Next() {
		var scope, operation, key, token []byte
		if err := rows.Scan(&scope, &operation, &key, &token); err != nil {
			return nil, err
		}
		tokens[idemstore.Key{Scope: string(scope), Operation: string(operation), Key: string(key)}] = string(token)
	}
	return tokens, rows.Err()
}

// insertReserves inserts the new records of reserves (on distinct keys)
// and sets each Reserve's outcome.
func insertReserves(ctx context.Context, tx *sql.Tx, reserves []*groupcommit.Op) error {
	var b stmt
	b.add("INSERT IGNORE INTO idem_records (scope, operation, `key`, fingerprint, state, token, lease_until, reason, request, created_at, updated_at, scope_label, label_index) VALUES ")
	for i, op := range reserves {
		if i > 0 {
			b.add(", ")
		}
		b.add("(?, ?, ?, ?, 'pending', ?, "+nowMillis+" + "+literal(millis(op.Lease))+", '', ?, "+nowMillis+", "+nowMillis+", ?, ?)",
			op.Key.Scope, op.Key.Operation, op.Key.Key, op.Fingerprint, op.Token, requestArg(op.Request),
			labelArg(op.ScopeLabel), labelArg(idemstore.ScopeLabelIndex(op.ScopeLabel)))
	}
	res, err := tx.ExecContext(ctx, b.String(), b.args...)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if int(n) == len(reserves) {
		for _, op := range reserves {
			op.Created = true
		}
		return nil
	}
	// Some keys existed: read which records are ours.
	b = stmt{}
	b.add("SELECT " + inlineBefore)
	b.caseLit(reserves, func(op *groupcommit.Op) int64 { return inlineLimit(op.InlineResponse) })
	b.add(inlineAfter + " FROM idem_records WHERE ")
	b.keys(reserves)
	rows, err := tx.QueryContext(ctx, b.String(), b.args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	found := make(map[idemstore.Key]*idemstore.Record, len(reserves))
	sizes := make(map[idemstore.Key]sql.NullInt64, len(reserves))
	for rows.Next() {
		var size sql.NullInt64
		rec, err := scanRecord(extraColumn{rows, &size})
		if err != nil {
			return err
		}
		found[rec.Key], sizes[rec.Key] = rec, size
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, op := range reserves {
		switch rec := found[op.Key]; {
		case rec == nil: // gone again before the read: the caller inserts again
		case rec.Token == op.Token:
			op.Created = true
		default:
			leftOut(rec, sizes[op.Key], op.InlineResponse)
			op.Record = rec
		}
	}
	return nil
}

// stmt builds a statement and its arguments together.
type stmt struct {
	strings.Builder
	args []any
}

func (b *stmt) add(sql string, args ...any) {
	b.WriteString(sql)
	b.args = append(b.args, args...)
}

// keys writes the condition "the record of one of ops": by key for
// Reserves, by key and token (fenced) for the others.
func (b *stmt) keys(ops []*groupcommit.Op) {
	for i, op := range ops {
		if i > 0 {
			b.add(" OR ")
		}
		if op.Kind == groupcommit.Reserve {
			b.add("("+byKey+")", op.Key.Scope, op.Key.Operation, op.Key.Key)
		} else {
			b.add("("+byKey+" AND token = ?)", op.Key.Scope, op.Key.Operation, op.Key.Key, op.Token)
		}
	}
}

// caseArg writes a CASE that is, for the record of each op, the argument
// val(op).
func (b *stmt) caseArg(ops []*groupcommit.Op, val func(*groupcommit.Op) any) {
	b.add("CASE")
	for _, op := range ops {
		b.add(" WHEN "+byKey+" THEN ?", op.Key.Scope, op.Key.Operation, op.Key.Key, val(op))
	}
	b.add(" END")
}

// caseLit writes a CASE that is, for the record of each op, the integer
// val(op) as a literal, or just that literal when it is the same for all.
func (b *stmt) caseLit(ops []*groupcommit.Op, val func(*groupcommit.Op) int64) {
	first := val(ops[0])
	if !slices.ContainsFunc(ops, func(op *groupcommit.Op) bool { return val(op) != first }) {
		b.add(literal(first))
		return
	}
	b.add("CASE")
	for _, op := range ops {
		b.add(" WHEN "+byKey+" THEN "+literal(val(op)), op.Key.Scope, op.Key.Operation, op.Key.Key)
	}
	b.add(" END")
}

// fenced ends a change of the records of ops, each pending under its
// token, with its WHERE, and runs it (see run).
func (b *stmt) fenced(ctx context.Context, tx *sql.Tx, ops []*groupcommit.Op, locked bool) error {
	b.add(" WHERE state = 'pending' AND (")
	b.keys(ops)
	b.add(")")
	return b.run(ctx, tx, len(ops), locked)
}

// run runs a fenced change of want records. When the records were not
// locked first, a change that matched fewer (some were not pending under
// their tokens) returns errUnmatched.
func (b *stmt) run(ctx context.Context, tx *sql.Tx, want int, locked bool) error {
	res, err := tx.ExecContext(ctx, b.String(), b.args...)
	if err != nil || locked {
		return err
	}
	n, err := res.RowsAffected()
	if err == nil && int(n) != want {
		err = errUnmatched
	}
	return err
}

// completeJoined completes the records of ops, each pending under its
// token, in one UPDATE. The calls' keys, tokens and retentions are a
// derived table joined on the primary key: one lookup per call, in key
// order, where a WHERE of one OR per call costs MariaDB's range optimizer
// an index dive per call (a third of the server's time in a batch). The
// answers are picked by position (ELT) rather than carried in the derived
// table, which keeps it free of BLOB columns and so in memory. Keys and
// tokens go as binary strings, compared byte for byte.
//
// STRAIGHT_JOIN keeps that join order: on a small table MariaDB otherwise
// scans idem_records and looks each row up in the derived table, which in
// the optimistic (REPEATABLE READ) try locks every row and gap of the
// table, so that the batch waits for, and deadlocks with, writers of
// other records. FORCE INDEX (PRIMARY) keeps the lookups on the primary
// key (see byPrimaryKey).
func completeJoined(ctx context.Context, tx *sql.Tx, ops []*groupcommit.Op, locked bool) error {
	var b stmt
	b.add("UPDATE (")
	for i, op := range ops {
		args := []any{[]byte(op.Key.Scope), []byte(op.Key.Operation), []byte(op.Key.Key), []byte(op.Token)}
		if i == 0 {
			b.add("SELECT 1 AS n, CAST(? AS BINARY) AS scope, CAST(? AS BINARY) AS operation, CAST(? AS BINARY) AS k, "+
				"CAST(? AS BINARY) AS token, "+literal(millis(op.Retention))+" AS retention", args...)
		} else {
			b.add(" UNION ALL SELECT "+literal(int64(i+1))+", CAST(? AS BINARY), CAST(? AS BINARY), CAST(? AS BINARY), "+
				"CAST(? AS BINARY), "+literal(millis(op.Retention)), args...)
		}
	}
	b.add(") v STRAIGHT_JOIN idem_records r FORCE INDEX (PRIMARY) ON r.scope = v.scope AND r.operation = v.operation AND r.`key` = v.k AND r.token = v.token")
	b.add(" SET r.state = 'completed', r.response = ELT(v.n")
	for _, op := range ops {
		b.add(", ?", idemstore.EncodeResponse(op.Response))
	}
	b.add("), r.expires_at = " + nowMillis + " + v.retention, r.updated_at = " + nowMillis + " WHERE r.state = 'pending'")
	return b.run(ctx, tx, len(ops), locked)
}

// literal is an integer as SQL text: durations are written into the
// statement rather than passed, so that their type is plain.
func literal(n int64) string { return strconv.FormatInt(n, 10) }

// Bounds of one multi-row statement, well under max_allowed_packet and
// the placeholder limit.
const (
	maxChunkOps   = 256
	maxChunkBytes = 1 << 20
)

// maxBatchedValue is the largest response or request body a call may carry
// into a batch. Larger ones run alone: a value over the server's
// max_allowed_packet fails its statement and breaks the connection, which
// must not fail the calls batched with it.
const maxBatchedValue = 256 << 10

// chunks splits ops into runs of at most maxChunkOps calls and, by size,
// about maxChunkBytes of values (one call at least).
func chunks(ops []*groupcommit.Op, size func(*groupcommit.Op) int) [][]*groupcommit.Op {
	return groupcommit.Chunks(ops, maxChunkOps, maxChunkBytes, size)
}
