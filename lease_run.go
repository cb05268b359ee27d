package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
)

// Run runs fn, the work the lease guards, and settles the lease by how fn
// ended. It is Do for front doors whose answer is not a Go value but a
// Response of their own (a broker consumer storing the messages its handler
// produced, say), and which map what happened to their own protocol. While
// fn runs, the lease is renewed (Heartbeat) and fn's context carries it
// (LeaseFrom), so that fn can complete it with a store's CompleteTx.
//
//   - fn returns an answer: it is stored with Complete and returned. If fn
//     called a store's CompleteTx instead, what its transaction did is read
//     back (CheckTx): committed returns the answer stored (the one that
//     committed, if fn called CompleteTx more than once); rolled back
//     settles the key as a failure.
//   - fn returns an error: the key is settled as Do settles it (Retryable
//     releases, Ambiguous escalates, any other error is escalated when the
//     lease's Kind is External and released when it is Transactional), and
//     the error is returned.
//   - fn panics or calls runtime.Goexit: the key is escalated, as the HTTP
//     middleware does, unless fn's CompleteTx provably rolled back in a
//     Transactional operation, which releases it; then the panic goes on.
//   - fn settled the lease itself (Complete, Release, Escalate, Abandon):
//     nothing more is done.
//
// If fn succeeded but its answer could not be stored, Run returns an error
// and escalates the key (unless the lease was lost meanwhile): fn ran, and
// with no stored answer nobody may run it again blindly. A release or an
// escalation the store refuses is tried again until the lease would
// expire, and then the lease is abandoned: the key stays pending for
// recovery. Afterwards Lease.State tells how the lease ended
// (LeaseCompleted, LeaseReleased, LeaseEscalated or LeaseAbandoned).
func (l *Lease) Run(ctx context.Context, fn func(ctx context.Context) (*Response, error)) (*Response, error) {
	e := l.e
	var (
		resp *Response
		err  error
	)
	runJob(l, func() { resp, err = fn(ContextWithLease(ctx, l)) }, func(crash string) {
		switch l.State() {
		case LeaseOpen:
			_ = e.settleJob(ctx, l, false, crash)
		case LeaseTxPrepared:
			_, _ = e.settleTx(ctx, l, l.kind, nil, crash)
		}
	})
	switch s := l.State(); {
	case s == LeaseTxPrepared:
		// What committed is read back: fn may have called CompleteTx more
		// than once, and only the record knows which one committed.
		if outcome, stored, cerr := l.CheckTx(ctx); cerr == nil && outcome == TxCommitted {
			if stored == nil { // sealed, and it does not open (logged)
				stored, _ = l.PreparedTx()
			}
			return stored, nil
		}
		committed, serr := e.settleTx(ctx, l, l.kind, err, "")
		if !committed {
			return nil, serr
		}
		stored, _ := l.PreparedTx()
		return stored, nil
	case s != LeaseOpen:
		return resp, err // settled by fn
	case err != nil:
		release, reason := failureSettlement(err, l.kind)
		return nil, join(err, e.settleJob(ctx, l, release, reason))
	}
	cerr := l.Complete(ctx, resp)
	if cerr == nil {
		return resp, nil
	}
	err = fmt.Errorf("idem: the work ran, but its answer could not be stored: %w", cerr)
	if errors.Is(cerr, ErrLeaseLost) {
		e.jobLog(ctx, slog.LevelError, "idem: the work ran, but its lease was lost before its answer was stored (taken over, or settled by recovery)", l.key, cerr)
		return nil, err
	}
	return nil, join(err, e.settleJob(ctx, l, false, err.Error()))
}
