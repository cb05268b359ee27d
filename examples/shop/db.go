package main

import (
	"context"
	"errors"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// database holds the shop's tables and idem's records in one database, so
// that an order and the answer that reports it commit in one transaction
// (the store's CompleteTx). It is SQLite (sqliteDB) or PostgreSQL (pgDB).
// Statements are written with ? placeholders; the PostgreSQL side numbers
// them.
type database interface {
	querier
	// store is the idem store kept in this database.
	store() idemstore.Store
	// inTx runs fn in a transaction and commits it when fn returns nil; any
	// error rolls it back.
	inTx(ctx context.Context, fn func(tx txQuerier) error) error
	// migrate creates the shop's tables (idem's are created by its store).
	migrate(ctx context.Context) error
	close()
}

// querier runs single statements.
type querier interface {
	// exec runs a statement and returns how many rows it changed.
	exec(ctx context.Context, query string, args ...any) (int64, error)
	// queryRow runs a query expected to return at most one row; its Scan
	// returns errNoRows when there is none.
	queryRow(ctx context.Context, query string, args ...any) row
	// each runs a query and calls fn on each row it returns.
	each(ctx context.Context, query string, args []any, fn func(row) error) error
}

// txQuerier is a querier inside a transaction, which can also complete the
// request's idempotency lease in that transaction.
type txQuerier interface {
	querier
	completeTx(ctx context.Context, lease *idem.Lease, resp *idem.Response) error
}

// row is *sql.Row or pgx.Row.
type row interface {
	Scan(dest ...any) error
}

// rows is *sql.Rows or pgx.Rows.
type rows interface {
	row
	Next() bool
	Err() error
}

// eachRow calls fn on each of rs, until it fails.
func eachRow(rs rows, fn func(row) error) error {
	for rs.Next() {
		if err := fn(rs); err != nil {
			return err
		}
	}
	return rs.Err()
}

// errNoRows is what row.Scan returns for a query that found nothing, on
// either database.
var errNoRows = errors.New("no rows")

// noRowsRow is a row whose Scan maps the driver's "no rows" error to
// errNoRows.
type noRowsRow struct {
	row
	isNoRows func(error) bool
}

func (r noRowsRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if err != nil && r.isNoRows(err) {
		return errNoRows
	}
	return err
}
