package idemredis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// unavailablePrefixes start the error replies of a server that cannot
// serve the call now: the Cluster has lost slots, a replica's master is
// down, the node is loading its data set, a write reached a demoted master
// (READONLY), the node is full (OOM) or at its client limit (rueidis drops
// the "ERR " that starts that reply).
var unavailablePrefixes = []string{"CLUSTERDOWN", "MASTERDOWN", "LOADING", "READONLY", "OOM", "max number of clients"}

// interpretError turns an error from rueidis into one that callers can test
// with errors.Is against the idemstore sentinels, keeping the original error
// in the chain. It is the only place where native errors are classified.
//
//   - context cancellation and deadlines stay recognisable as such, even when
//     the connection reports them as a network timeout at ctx's deadline;
//   - a Redis nil reply becomes idemstore.ErrNotFound;
//   - TRYAGAIN (a slot being migrated) becomes idemstore.ErrRetryable;
//   - a closed client (rueidis.ErrClosing), a refused or dropped
//     connection, a slot no node serves (rueidis.ErrNoSlot) and the server
//     replies in unavailablePrefixes become idemstore.ErrUnavailable;
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
	// The connection's deadline can come from ctx, so a read can time out
	// a moment before ctx reports its own expiry.
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) && isNetError(err) {
		return fmt.Errorf("idemredis: %w: %w", context.DeadlineExceeded, err)
	}
	if errors.Is(err, rueidis.Nil) {
		return fmt.Errorf("idemredis: %w", idemstore.ErrNotFound)
	}
	var re *rueidis.RedisError
	if errors.As(err, &re) {
		if re.IsTryAgain() {
			return fmt.Errorf("idemredis: %w: %w", idemstore.ErrRetryable, err)
		}
		if re.IsClusterDown() || re.IsLoading() || hasAnyPrefix(re.Error(), unavailablePrefixes) {
			return fmt.Errorf("idemredis: %w: %w", idemstore.ErrUnavailable, err)
		}
		return fmt.Errorf("idemredis: %w", err)
	}
	if isConnError(err) {
		return fmt.Errorf("idemredis: %w: %w", idemstore.ErrUnavailable, err)
	}
	return fmt.Errorf("idemredis: %w", err)
}

// isConnError reports whether err says that the server could not be
// reached or the connection broke: what a resend may cure, and what
// callers see as idemstore.ErrUnavailable.
func isConnError(err error) bool {
	return errors.Is(err, rueidis.ErrClosing) ||
		errors.Is(err, rueidis.ErrNoSlot) ||
		errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) ||
		isNetError(err)
}

func isNetError(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr)
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
