package idemredis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
)

// interpretError turns an error from go-redis into one that callers can test
// with errors.Is against the idemstore sentinels, keeping the original error
// in the chain. It is the only place where native errors are classified.
//
//   - context cancellation and deadlines stay recognisable as such, even when
//     go-redis reports them as a network timeout on a connection whose
//     deadline came from ctx;
//   - redis.Nil becomes idemstore.ErrNotFound;
//   - TRYAGAIN (a slot being migrated) becomes idemstore.ErrRetryable;
//   - a closed client, a refused or dropped connection, a pool timeout and
//     the server states CLUSTERDOWN, MASTERDOWN, LOADING, READONLY (a write
//     that reached a demoted master), max clients and OOM become
//     idemstore.ErrUnavailable;
//   - anything else (a script error, a wrong type) is returned wrapped but
//     unclassified.
func interpretError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("idemredis: %w", err)
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("idemredis: %w: %w", ctxErr, err)
	}
	// go-redis sets the connection deadline from ctx, so the read can time
	// out a moment before ctx reports its own expiry.
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) && isNetError(err) {
		return fmt.Errorf("idemredis: %w: %w", context.DeadlineExceeded, err)
	}
	switch {
	case errors.Is(err, redis.Nil):
		return fmt.Errorf("idemredis: %w", idemstore.ErrNotFound)
	case redis.IsTryAgainError(err):
		return fmt.Errorf("idemredis: %w: %w", idemstore.ErrRetryable, err)
	case errors.Is(err, redis.ErrClosed),
		errors.Is(err, redis.ErrPoolTimeout),
		errors.Is(err, redis.ErrPoolExhausted),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed),
		redis.IsClusterDownError(err),
		redis.IsMasterDownError(err),
		redis.IsLoadingError(err),
		redis.IsReadOnlyError(err),
		redis.IsMaxClientsError(err),
		redis.IsOOMError(err),
		isNetError(err):
		return fmt.Errorf("idemredis: %w: %w", idemstore.ErrUnavailable, err)
	}
	return fmt.Errorf("idemredis: %w", err)
}

func isNetError(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr)
}
