package idem

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// Settlement never belongs to the client: Complete, Release and Escalate run
// detached from the caller's cancellation, bounded by
// EngineConfig.SettleTimeout, and try again while the store fails
// transiently. A change that returned an error may have been applied all the
// same (a reply lost after the commit, a client library that resent a
// command whose first attempt went through), so after every error the record
// is read back to see.

// Backoff between settlement attempts.
const (
	settleFirstPause = 10 * time.Millisecond
	settleMaxPause   = time.Second
)

// defaultOrphanTimeout bounds the release of a reservation whose Reserve failed:
// a few quick attempts, because the caller waits to answer its error, and a
// store that is down must not make every such answer slow.
const defaultOrphanTimeout = 250 * time.Millisecond

// settle runs change on key's record until it succeeds, is refused for good,
// or timeout passes, detached from ctx's cancellation. done is given the
// record read back after every error (nil and ErrNotFound when it is gone)
// and reports whether change has taken effect, so that an applied change
// whose reply was lost counts as a success; a nil done reads nothing. (The
// lease's own settlement, on the request path, is the same loop without
// closures: Lease.settle.)
func (e *Engine) settle(ctx context.Context, key Key, timeout time.Duration, change func(context.Context) error, done func(*idemstore.Record, error) bool) error {
	dc := detach(ctx, timeout)
	defer dc.stop()
	pause := settleFirstPause
	for {
		err := change(dc)
		if err == nil {
			return nil
		}
		if done != nil {
			rec, gerr := e.store.Get(dc, key)
			if (gerr == nil || errors.Is(gerr, idemstore.ErrNotFound)) && done(rec, gerr) {
				return nil
			}
		}
		if !transient(err) || !dc.pause(pause) {
			return err
		}
		pause = min(2*pause, settleMaxPause)
	}
}

// settleBound is how long a settlement keeps trying: timeout, or until
// ctx's deadline when that is later (a caller that can wait longer, such as
// the middleware once its client has the answer, says so with a deadline).
func settleBound(ctx context.Context, timeout time.Duration) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		timeout = max(timeout, time.Until(d))
	}
	return timeout
}

// transient reports whether a failed store call may succeed if tried again.
func transient(err error) bool {
	return errors.Is(err, idemstore.ErrUnavailable) || errors.Is(err, idemstore.ErrRetryable) ||
		errors.Is(err, context.DeadlineExceeded)
}

// releaseOrphan releases token's reservation of key, which a failed Reserve
// or Takeover may have left behind with nobody holding it (the insert
// committed, the reply was lost). A record that is not pending under token
// (the usual case: nothing was written) is left alone. If the store stays
// unreachable past Engine.orphanTimeout, the reservation waits for its lease to
// expire and recovery.
func (e *Engine) releaseOrphan(ctx context.Context, key Key, token string) {
	err := e.settle(ctx, key, min(e.orphanTimeout, e.cfg.SettleTimeout),
		func(ctx context.Context) error {
			return e.store.Release(ctx, idemstore.ReleaseParams{Key: key, Token: token})
		},
		func(rec *idemstore.Record, err error) bool {
			return err != nil || rec.Token != token || rec.State != idemstore.StatePending
		})
	switch {
	case err == nil || errors.Is(err, idemstore.ErrLeaseLost):
	case errors.Is(err, idemstore.ErrUnavailable):
		// The store is down: the caller's own line says so (once in a
		// while, not per request), and nothing was likely written.
		e.cfg.Logger.LogAttrs(context.WithoutCancel(ctx), slog.LevelDebug, "idem: the store is unreachable, so a reservation its failed Reserve may have written was not released; if it was written, it stays pending until its lease expires",
			digestAttr(key), slog.Any("error", err))
	default:
		e.cfg.Logger.LogAttrs(context.WithoutCancel(ctx), slog.LevelError, "idem: releasing a reservation whose Reserve failed did not succeed; it stays pending until its lease expires",
			digestAttr(key), slog.Any("error", err))
	}
}
