package idempg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/idem-dev/idem/idemstore"
)

// interpretError turns a pgx error into the idemstore sentinels:
//
//   - context cancellation and deadlines stay recognisable with errors.Is,
//     also when pgx reports them as a broken connection;
//   - 40001 serialization_failure and 40P01 deadlock_detected become
//     ErrRetryable (the server changed nothing);
//   - connection failures (dial errors, network errors, a closed pool or
//     connection, connection-class SQLSTATEs, server shutdown) become
//     ErrUnavailable;
//   - anything else is returned with an "idempg:" prefix.
//
// The original error stays in the chain in every case.
func interpretError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("idempg: %w", err)
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		// pgx closes the connection when a query's context ends, and the
		// error it returns does not always say why.
		return fmt.Errorf("idempg: %w: %w", ctxErr, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "40001", pgErr.Code == "40P01":
			return fmt.Errorf("%w: %w", idemstore.ErrRetryable, err)
		case len(pgErr.Code) == 5 && pgErr.Code[:2] == "08", // connection exception
			pgErr.Code == "53300", // too_many_connections
			pgErr.Code == "57P01", // admin_shutdown
			pgErr.Code == "57P02", // crash_shutdown
			pgErr.Code == "57P03": // cannot_connect_now
			return fmt.Errorf("%w: %w", idemstore.ErrUnavailable, err)
		}
		return fmt.Errorf("idempg: %w", err)
	}
	var (
		connectErr *pgconn.ConnectError
		netErr     net.Error
	)
	switch {
	case errors.As(err, &connectErr),
		errors.As(err, &netErr),
		errors.Is(err, puddle.ErrClosedPool),
		errors.Is(err, pgconn.ErrConnClosed),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed):
		return fmt.Errorf("%w: %w", idemstore.ErrUnavailable, err)
	}
	return fmt.Errorf("idempg: %w", err)
}
