package main

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

// sqliteDB is the shop on one SQLite file, idem's records included.
type sqliteDB struct {
	sqlQuerier
	db *sql.DB
	st *idemsqlite.Store
}

var _ database = (*sqliteDB)(nil)

// openSQLite opens (creating) the SQLite file at path. The idem store's
// lease deadlines are taken from clk.
func openSQLite(path string, clk clock) (*sqliteDB, error) {
	db, err := idemsqlite.Open(path, idemsqlite.OpenOptions{})
	if err != nil {
		return nil, err
	}
	st, err := idemsqlite.New(db, idemsqlite.Config{Now: clk.Now})
	if err != nil {
		db.Close()
		return nil, err
	}
	return &sqliteDB{sqlQuerier: sqlQuerier{db}, db: db, st: st}, nil
}

func (d *sqliteDB) store() idemstore.Store { return d.st }
func (d *sqliteDB) close()                 { d.db.Close() }

func (d *sqliteDB) migrate(ctx context.Context) error {
	_, err := d.db.ExecContext(ctx, schema("INTEGER PRIMARY KEY AUTOINCREMENT"))
	return err
}

// inTx begins with BEGIN IMMEDIATE (idemsqlite.Open sets it), so the
// transaction holds the write lock from its start and never fails midway
// to upgrade it.
func (d *sqliteDB) inTx(ctx context.Context, fn func(tx txQuerier) error) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := fn(sqliteTx{sqlQuerier{tx}, tx, d.st}); err != nil {
		return err
	}
	return tx.Commit()
}

type sqliteTx struct {
	sqlQuerier
	tx *sql.Tx
	st *idemsqlite.Store
}

func (t sqliteTx) completeTx(ctx context.Context, lease *idem.Lease, resp *idem.Response) error {
	return t.st.CompleteTx(ctx, t.tx, lease, resp)
}

// sqlConn is *sql.DB or *sql.Tx.
type sqlConn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// sqlQuerier is the querier of a database/sql connection or transaction.
type sqlQuerier struct{ c sqlConn }

func (q sqlQuerier) exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := q.c.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (q sqlQuerier) queryRow(ctx context.Context, query string, args ...any) row {
	return noRowsRow{q.c.QueryRowContext(ctx, query, args...), isSQLNoRows}
}

func (q sqlQuerier) each(ctx context.Context, query string, args []any, fn func(row) error) error {
	rows, err := q.c.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	return eachRow(rows, fn)
}

func isSQLNoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) }
