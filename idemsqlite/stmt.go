package idemsqlite

import (
	"context"
	"database/sql"
	"sync"
)

// querier is what the store's statements run on: autocommit on the
// store's database (dbQuerier), a batch's transaction (txQuerier), or the
// caller's transaction in CompleteTx (*sql.Tx itself).
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// stmtCache holds the store's statements prepared on its database, by
// text, so that SQLite parses each once per connection rather than on
// every call (parsing was a fifth of the write path's CPU).
type stmtCache struct {
	db *sql.DB
	mu sync.RWMutex
	m  map[string]*sql.Stmt
}

// get returns query prepared, or nil if it cannot be prepared now (the
// database is closed, the schema is not migrated yet): the caller then
// runs the text, which reports the error, and the next call tries again.
func (c *stmtCache) get(ctx context.Context, query string) *sql.Stmt {
	c.mu.RLock()
	st := c.m[query]
	c.mu.RUnlock()
	if st != nil {
		return st
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if st = c.m[query]; st != nil {
		return st
	}
	st, err := c.db.PrepareContext(ctx, query)
	if err != nil {
		return nil
	}
	if c.m == nil {
		c.m = make(map[string]*sql.Stmt)
	}
	c.m[query] = st
	return st
}

// dbQuerier runs statements in autocommit, prepared.
type dbQuerier struct{ c *stmtCache }

func (q dbQuerier) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := q.c.get(ctx, query); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return q.c.db.ExecContext(ctx, query, args...)
}

func (q dbQuerier) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := q.c.get(ctx, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return q.c.db.QueryRowContext(ctx, query, args...)
}

// QueryContext runs a query that returns rows, prepared.
func (q dbQuerier) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st := q.c.get(ctx, query); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return q.c.db.QueryContext(ctx, query, args...)
}

// txQuerier runs statements in a batch's transaction, prepared: each
// statement is bound to the transaction once per batch.
type txQuerier struct {
	c     *stmtCache
	tx    *sql.Tx
	bound map[string]*sql.Stmt
}

func (q *txQuerier) stmt(ctx context.Context, query string) *sql.Stmt {
	if st := q.bound[query]; st != nil {
		return st
	}
	st := q.c.get(ctx, query)
	if st == nil {
		return nil
	}
	st = q.tx.StmtContext(ctx, st)
	if q.bound == nil {
		q.bound = make(map[string]*sql.Stmt, 4)
	}
	q.bound[query] = st
	return st
}

func (q *txQuerier) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := q.stmt(ctx, query); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return q.tx.ExecContext(ctx, query, args...)
}

func (q *txQuerier) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := q.stmt(ctx, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return q.tx.QueryRowContext(ctx, query, args...)
}
