package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/idem-dev/idem/idemstore"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// interpretError maps a database/sql or SQLite error to the idemstore
// sentinels, keeping the original error in the chain:
//
//   - a cancelled or expired ctx stays recognisable with errors.Is
//     (context.Canceled, context.DeadlineExceeded), even when SQLite reports
//     it as SQLITE_INTERRUPT;
//   - SQLITE_BUSY and SQLITE_LOCKED become idemstore.ErrRetryable: by the
//     time they surface, busy_timeout has already waited, and nothing was
//     changed;
//   - a closed *sql.DB, a lost connection and the errors that mean the file
//     cannot be used (cannot open, I/O error, not a database, corrupt, full,
//     read-only) become idemstore.ErrUnavailable;
//   - anything else (a bug, a schema mismatch) is returned unchanged.
//
// Errors that already carry a sentinel, and nil, pass through.
func interpretError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if ctx != nil && ctx.Err() != nil {
		return fmt.Errorf("idemsqlite: %w: %w", ctx.Err(), err)
	}
	for _, s := range []error{idemstore.ErrNotFound, idemstore.ErrLeaseLost, idemstore.ErrNotNeedsReview,
		idemstore.ErrUnavailable, idemstore.ErrRetryable} {
		if errors.Is(err, s) {
			return err
		}
	}
	if errors.Is(err, sql.ErrConnDone) || strings.Contains(err.Error(), "sql: database is closed") {
		return fmt.Errorf("%w: %w", idemstore.ErrUnavailable, err)
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff { // extended result codes are on; compare the primary code
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			return fmt.Errorf("%w: %w", idemstore.ErrRetryable, err)
		case sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT,
			sqlite3.SQLITE_FULL, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_NOMEM:
			return fmt.Errorf("%w: %w", idemstore.ErrUnavailable, err)
		}
	}
	return err
}
