package idempg

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// readCommitted runs each statement the store makes alone (a lone
// Complete, Release, Escalate, Extend, Resolve or Delete, Subscribe's
// listing of a waiter, a Purge batch) in a READ COMMITTED transaction of its
// own, whatever the database's default (default_transaction_isolation):
// where the connection's default is not READ COMMITTED, BEGIN, the
// statement and COMMIT go in one pipeline, one round trip, as the implicit
// transaction of a plain statement did (see inReadCommitted). At REPEATABLE READ
// the waiter check (idem_wake) would read the statement's first snapshot
// and miss a waiter that subscribed while the statement waited for the
// record's row, so that waiter would never be woken; and a statement that
// waited for a row another transaction changed would fail with a
// serialization error where READ COMMITTED rechecks the row and answers
// (ErrLeaseLost, not pending). At SERIALIZABLE, a waiter that subscribed
// meanwhile, or any concurrent write near the rows read, fails the
// statement.
type readCommitted struct{ s *Store }

func (d readCommitted) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return readCommittedRow{d.s, ctx, sql, args}
}

// Exec runs sql in its own READ COMMITTED transaction.
func (d readCommitted) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	var tag pgconn.CommandTag
	err := d.s.inReadCommitted(ctx, sql, args, func(br pgx.BatchResults) error {
		var err error
		tag, err = br.Exec()
		return err
	})
	return tag, err
}

type readCommittedRow struct {
	s    *Store
	ctx  context.Context
	sql  string
	args []any
}

func (r readCommittedRow) Scan(dest ...any) error {
	return r.s.inReadCommitted(r.ctx, r.sql, r.args, func(br pgx.BatchResults) error {
		return br.QueryRow().Scan(dest...)
	})
}

// inReadCommitted runs sql, read reading its result, at READ COMMITTED.
// On a connection whose default is READ COMMITTED (PostgreSQL's, read once
// per connection: readCommittedByDefault) it sends sql alone, an implicit
// transaction of its own, as before there was a choice; elsewhere it sends
// BEGIN ISOLATION LEVEL READ COMMITTED, sql and COMMIT as one pipeline.
// Errors are returned as pgx gives them (pgx.ErrNoRows included), for the
// caller to interpret.
func (s *Store) inReadCommitted(ctx context.Context, sql string, args []any, read func(pgx.BatchResults) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release() // destroys a connection left in a transaction
	var b pgx.Batch
	if readCommittedByDefault(ctx, conn) {
		b.Queue(sql, args...)
		br := conn.SendBatch(ctx, &b)
		err = read(br)
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if updateConflict(err) != nil {
			// A lone statement at READ COMMITTED is never refused for a
			// serialization failure: the connection's default changed
			// since it was asked (SET default_transaction_isolation by
			// other code on the pool). Ask again next time. Nothing was
			// changed, and the error says so (ErrRetryable).
			delete(conn.Conn().PgConn().CustomData(), isolationKey)
		}
		return err
	}
	b.Queue(beginReadCommitted)
	b.Queue(sql, args...)
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, &b)
	_, err = br.Exec() // BEGIN
	if err == nil {
		err = read(br)
	}
	if err == nil || errors.Is(err, pgx.ErrNoRows) {
		if _, cerr := br.Exec(); cerr != nil { // COMMIT
			err = cerr
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		s.rollback(ctx, conn)
	}
	return err
}

// isolationKey is where a connection's CustomData keeps whether its
// default_transaction_isolation is READ COMMITTED.
const isolationKey = "idempg.readCommittedByDefault"

// readCommittedByDefault reports whether conn's statements run at READ
// COMMITTED unless told otherwise. It asks the server the first time a
// connection is used for a lone statement and keeps the answer with the
// connection (its default is fixed when it connects, unless someone runs
// SET default_transaction_isolation on it). If the question fails it
// answers false, which is always correct, only dearer, and asks again next
// time.
//
// PostgreSQL does not report changes of default_transaction_isolation to
// the client, so a SET on a pooled connection after the answer was kept
// goes unseen: code sharing the store's pool must not change the session's
// default isolation (SET LOCAL, or BEGIN ISOLATION LEVEL, is fine). At
// SERIALIZABLE the store notices by the serialization failure it then gets
// (ErrRetryable) and asks again; at REPEATABLE READ it cannot, and a
// waiter that subscribes while a settling statement waits for the record's
// row may miss its wake-up, as before statements were run at READ
// COMMITTED.
func readCommittedByDefault(ctx context.Context, conn *pgxpool.Conn) bool {
	data := conn.Conn().PgConn().CustomData()
	if rc, ok := data[isolationKey].(bool); ok {
		return rc
	}
	var rc bool
	if err := conn.QueryRow(ctx, "SELECT current_setting('default_transaction_isolation') = 'read committed'").Scan(&rc); err != nil {
		return false
	}
	data[isolationKey] = rc
	return rc
}
