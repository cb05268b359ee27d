package idemmysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-dev/idem/idemstore"
)

// errDuplicate marks a duplicate-key insert (1062). It is internal: Reserve
// turns it into "read the existing record".
var errDuplicate = errors.New("idemmysql: duplicate key")

// interpretError turns a database/sql or go-sql-driver/mysql error into the
// idemstore sentinels:
//
//   - context cancellation and deadlines stay recognisable with errors.Is,
//     also when the driver reports them as a broken connection;
//   - 1062 duplicate entry becomes errDuplicate (internal to Reserve);
//   - 1213 deadlock and 1205 lock wait timeout become ErrRetryable;
//   - unreachable or broken connections (driver.ErrBadConn, the driver's
//     invalid connection, network errors, a closed *sql.DB, too many
//     connections, server shutdown) become ErrUnavailable;
//   - anything else is returned with an "idemmysql:" prefix.
//
// The original error stays in the chain in every case.
func interpretError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("idemmysql: %w", err)
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("idemmysql: %w: %w", ctxErr, err)
	}
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		switch myErr.Number {
		case 1062: // ER_DUP_ENTRY
			return fmt.Errorf("%w: %w", errDuplicate, err)
		case 1213, 1205: // ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT
			return fmt.Errorf("%w: %w", idemstore.ErrRetryable, err)
		case 1040, 1053, 1077, 1078, 1079, 1080, 1152, 1158, 1159, 1160, 1161, 1927:
			// too many connections, shutdown in progress, aborted or
			// interrupted connections, connection killed
			return fmt.Errorf("%w: %w", idemstore.ErrUnavailable, err)
		}
		return fmt.Errorf("idemmysql: %w", err)
	}
	var netErr net.Error
	switch {
	case errors.Is(err, driver.ErrBadConn),
		errors.Is(err, mysql.ErrInvalidConn),
		errors.Is(err, sql.ErrConnDone),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed),
		errors.As(err, &netErr),
		// database/sql does not export this one.
		strings.Contains(err.Error(), "sql: database is closed"):
		return fmt.Errorf("%w: %w", idemstore.ErrUnavailable, err)
	}
	return fmt.Errorf("idemmysql: %w", err)
}
