package idem

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// Do and DoTx run a job, or any work that is not an HTTP request, at most
// once per key: Begin, a heartbeat while fn runs, then Complete, Release or
// Escalate, all through the public Engine and Lease API. fn's result is
// stored as JSON and every later call with the key gets it back.

// Errors that Do and DoTx return, wrapped in an *OutcomeError, when fn did
// not run because of what was found under the key.
var (
	// ErrInFlight: another call holds the key and is still running.
	// OutcomeError.RetryAfter says when to look again.
	ErrInFlight = errors.New("idem: another call holds the key and is still running")
	// ErrMismatch: the key was used with another fingerprint.
	ErrMismatch = errors.New("idem: the key was used with a different request")
	// ErrNeedsReview: an earlier call's outcome is unknown, and the key waits
	// for a Resolver or an operator. Do not switch to a new key: that could
	// run the operation twice.
	ErrNeedsReview = errors.New("idem: the key's earlier outcome is unknown and needs review")
	// ErrNotReplayable: the operation completed, but its result was not kept
	// (larger than EngineConfig.MaxResponseBody). It will not run again.
	ErrNotReplayable = errors.New("idem: the operation completed but its result was not kept")
	// ErrNotAResult: the key was completed with an answer that is not a
	// result of Do, a status other than 2xx: a Resolver or an operator
	// settled it so (a failure, say). OutcomeError.Record holds the answer.
	// It will not run again.
	ErrNotAResult = errors.New("idem: the key was completed with an answer that is not a result")
)

// OutcomeError is returned by Do and DoTx when fn did not run: the key is in
// flight, was used for another request, needs review, or holds a result that
// cannot be replayed as the asked type. errors.Is matches ErrInFlight,
// ErrMismatch, ErrNeedsReview, ErrNotReplayable or ErrNotAResult; a result
// that does not decode unwraps to the JSON error.
type OutcomeError struct {
	// Outcome is what Begin found: InFlight, Mismatch, NeedsReview, or
	// Replayed (a result that could not be given back).
	Outcome Outcome
	// Key is the key asked for.
	Key Key
	// RetryAfter is set with InFlight: about when the holder should be done.
	RetryAfter time.Duration
	// Record is the record found under the key (its Reason says why a key
	// needs review; its Response is the stored result).
	Record *idemstore.Record

	err error
}

// Error describes the outcome; it never contains the key.
func (e *OutcomeError) Error() string {
	err := e.Unwrap()
	switch {
	case err == nil:
		return "idem: outcome " + e.Outcome.String()
	case e.Outcome == InFlight:
		return fmt.Sprintf("%v (retry after %v)", err, e.RetryAfter)
	case e.Outcome == NeedsReview && e.Record != nil && e.Record.Reason != "":
		return err.Error() + ": " + e.Record.Reason
	case err == ErrNotReplayable && e.Record != nil && e.Record.Response != nil && e.Record.Response.NotReplayable != "":
		return err.Error() + " (" + e.Record.Response.NotReplayable + ")"
	case err == ErrNotAResult && e.Record != nil && e.Record.Response != nil:
		return fmt.Sprintf("%v (status %d)", err, e.Record.Response.Status)
	case e.Outcome == Replayed && err != ErrNotReplayable && err != ErrNotAResult:
		return "idem: the stored result does not decode: " + err.Error()
	}
	return err.Error()
}

// Unwrap returns the sentinel (ErrInFlight, ErrMismatch, ErrNeedsReview,
// ErrNotReplayable, ErrNotAResult) or the JSON decoding error.
func (e *OutcomeError) Unwrap() error {
	if e.err != nil {
		return e.err
	}
	switch e.Outcome {
	case InFlight:
		return ErrInFlight
	case Mismatch:
		return ErrMismatch
	case NeedsReview:
		return ErrNeedsReview
	case Replayed:
		return ErrNotReplayable
	}
	return nil
}

// jobFailure is an error of fn that says what became of its key.
type jobFailure struct {
	err      error
	escalate bool
}

func (f *jobFailure) Error() string { return f.err.Error() }
func (f *jobFailure) Unwrap() error { return f.err }

// Retryable marks an error returned by the fn of Do or DoTx as a failure that
// had no effect (nothing was sent, the provider refused before acting): the
// key is released, and the next call with it runs fn again. Do returns the
// error as fn returned it. Retryable(nil) is nil.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return &jobFailure{err: err}
}

// Ambiguous marks an error returned by the fn of Do or DoTx as a failure
// whose effect is unknown (a timeout after the request was sent): the key
// goes to needs_review with the error as its reason, and later calls get
// ErrNeedsReview until a Resolver or an operator settles it. Ambiguous(nil)
// is nil.
func Ambiguous(err error) error {
	if err == nil {
		return nil
	}
	return &jobFailure{err: err, escalate: true}
}

// Do runs fn at most once per req.Key and returns its result; every later
// call with the key gets the stored result back, decoded from JSON into T,
// without running fn. req is what Engine.Begin takes: the Key (Scope and
// Operation name whose key it is and what is done, such as a tenant and a
// job kind), the Fingerprint of the job's arguments (see Fingerprint), the
// Kind, and optionally Lease, Retention and Wait.
//
// While fn runs its lease is renewed (Lease.Heartbeat), and fn's context
// carries it (LeaseFrom). When fn returns an error the key is settled by what
// the error says and by req.Kind:
//
//   - Retryable(err): released; the next call runs fn again.
//   - Ambiguous(err): escalated to needs_review.
//   - errors joined (errors.Join): escalated if any is Ambiguous, released
//     if every one is Retryable, otherwise as for any other error.
//   - any other error, a panic (which Do passes on) or runtime.Goexit:
//     escalated when req.Kind is External (the default: fn's effect may have
//     happened), released when it is Transactional.
//
// With Do, choose Transactional only for work that may run again whenever
// it did not return success (it has no effect of its own, or an idempotent
// one); work whose effect is a database change belongs in DoTx. If the
// process dies while fn runs, its lease expires and the next call takes the
// key over (Transactional) or finds it needing review (External).
//
// To store a failure as the operation's answer (a declined card, say),
// return it inside T with a nil error.
//
// When fn did not run because of the key, Do returns an *OutcomeError:
// ErrInFlight (set req.Wait to wait for the holder and get its result
// instead), ErrMismatch, ErrNeedsReview, ErrNotReplayable or ErrNotAResult
// (an operator or a Resolver completed the key with a non-2xx answer). The
// first call returns fn's value itself; replays return its JSON round trip.
// If fn succeeded but its result could not be stored, Do returns the value
// with the error, and the key goes to review (or, on ErrLeaseLost, was
// already settled by someone else) so that fn never runs again blindly.
func Do[T any](ctx context.Context, e *Engine, req Request, fn func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	if err := checkJob(e, req, fn == nil); err != nil {
		return zero, err
	}
	v, lease, err := begin[T](ctx, e, req)
	if lease == nil {
		return v, err
	}
	runJob(lease, func() { v, err = fn(ContextWithLease(ctx, lease)) }, func(crash string) {
		_ = e.settleJob(ctx, lease, req.Kind == Transactional, crash)
	})
	if err != nil {
		release, reason := failureSettlement(err, req.Kind)
		return zero, join(err, e.settleJob(ctx, lease, release, reason))
	}
	resp, err := encodeResult(v)
	if err == nil {
		err = lease.Complete(ctx, resp)
		if err == nil {
			return v, nil
		}
	}
	if errors.Is(err, ErrLeaseLost) {
		e.jobLog(ctx, slog.LevelError, "idem: the job ran, but its lease was lost before its result was stored (taken over, or settled by recovery)", lease.Key(), err)
		return v, fmt.Errorf("idem: the job ran, but its result could not be stored: %w", err)
	}
	// fn ran; with no stored result nobody may run it again blindly.
	err = fmt.Errorf("idem: the job ran, but its result could not be stored: %w", err)
	return v, join(err, e.settleJob(ctx, lease, false, err.Error()))
}

// TxFunc runs f in a new transaction of the store's database: it commits
// when f returns nil and rolls back otherwise, also when f panics. DoTx
// calls it once per run; a TxFunc that retries serialization failures may
// call f again, each time in a fresh transaction, and fn runs again with
// it. Build one with SQLTx for database/sql (idemsqlite, idemmysql); with
// pgx (idempg), pgx.BeginFunc is one already:
//
//	func(ctx context.Context, f func(pgx.Tx) error) error { return pgx.BeginFunc(ctx, pool, f) }
type TxFunc[Tx any] func(ctx context.Context, f func(tx Tx) error) error

// SQLTx returns the TxFunc of db for DoTx, with the transaction options opts
// (nil for the driver's defaults). The transaction is begun with the context
// DoTx is given, so that cancelling it rolls back an uncommitted change.
func SQLTx(db *sql.DB, opts *sql.TxOptions) TxFunc[*sql.Tx] {
	return func(ctx context.Context, f func(*sql.Tx) error) error {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return err
		}
		defer tx.Rollback() // after Commit a no-op; on an error or a panic, the rollback
		if err := f(tx); err != nil {
			return err
		}
		return tx.Commit()
	}
}

// TxCompleter is a store that completes a lease inside the caller's own
// transaction: *idemsqlite.Store and *idemmysql.Store with *sql.Tx,
// *idempg.Store with pgx.Tx.
type TxCompleter[Tx any] interface {
	CompleteTx(ctx context.Context, tx Tx, lease idemstore.TxLease, resp *Response) error
}

// DoTx is Do for work whose effect is a change in the store's own database:
// fn makes its change in tx, and DoTx stores fn's result with the store's
// CompleteTx in the same transaction, so the change and the result commit
// together or not at all. The engine's store must be a TxCompleter of Tx;
// inTx begins and ends the transactions (SQLTx, or pgx.BeginFunc).
//
// What committed decides, read back after inTx returns (Lease.CheckTx):
// committed returns fn's value, even if the commit reported an error (its
// acknowledgement was lost); rolled back settles the key as Do does for an
// error (Retryable releases, Ambiguous escalates, other errors, panics and
// runtime.Goexit go by req.Kind); a lease lost meanwhile returns an error
// wrapping ErrLeaseLost, with nothing committed.
//
// Set req.Kind to Transactional when fn acts only through tx, which is what
// DoTx is for: nothing outlives a rollback, so a failure releases the key
// and a crashed holder's key is taken over once its lease expires. The
// default, External, is for an fn that also acts outside the database: a
// rolled-back failure then goes to review.
func DoTx[T, Tx any](ctx context.Context, e *Engine, req Request, inTx TxFunc[Tx], fn func(ctx context.Context, tx Tx) (T, error)) (T, error) {
	var zero T
	if err := checkJob(e, req, fn == nil || inTx == nil); err != nil {
		return zero, err
	}
	store, ok := e.Store().(TxCompleter[Tx])
	if !ok {
		return zero, fmt.Errorf("idem: DoTx: the engine's store %T does not complete leases in a %T transaction", e.Store(), *new(Tx))
	}
	v, lease, err := begin[T](ctx, e, req)
	if lease == nil {
		return v, err
	}
	lctx := ContextWithLease(ctx, lease)
	var ferr, txErr error
	runJob(lease, func() {
		txErr = inTx(ctx, func(tx Tx) error {
			v, ferr = fn(lctx, tx)
			if ferr != nil {
				return ferr
			}
			resp, err := encodeResult(v)
			if err != nil {
				return fmt.Errorf("idem: the job's result could not be stored: %w", err)
			}
			return store.CompleteTx(ctx, tx, lease, resp)
		})
	}, func(crash string) {
		_, _ = e.settleTx(ctx, lease, req.Kind, nil, crash)
	})
	cause := ferr
	if cause == nil {
		cause = txErr
	}
	committed, err := e.settleTx(ctx, lease, req.Kind, cause, "")
	if committed {
		if txErr != nil {
			e.jobLog(ctx, slog.LevelWarn, "idem: the transaction committed, though ending it reported an error", lease.Key(), txErr)
		}
		return v, nil
	}
	return zero, err
}

// runJob runs body while lease's heartbeat renews it. If body panics or
// calls runtime.Goexit, crashed is given the reason before the panic (or the
// exit) goes on.
func runJob(lease *Lease, body func(), crashed func(reason string)) {
	stop := lease.Heartbeat()
	returned := false
	defer func() {
		if returned {
			return
		}
		p := recover()
		stop()
		crashed(crashReason(p))
		if p != nil {
			panic(p)
		}
	}()
	body()
	returned = true
	stop()
}

// settleTx settles the lease of a DoTx run after its transaction ended,
// from what the store shows: committed (the result is stored), rolled back
// (the key is settled as for a failure with cause; a nil cause is a
// transaction that did not commit), or lost. crash, when set, is why the run
// ended without returning. It returns the error DoTx returns.
func (e *Engine) settleTx(ctx context.Context, lease *Lease, kind Kind, cause error, crash string) (committed bool, err error) {
	if _, prepared := lease.PreparedTx(); prepared {
		outcome, _, cerr := lease.CheckTx(ctx)
		switch {
		case cerr != nil:
			lease.Abandon()
			e.jobLog(ctx, slog.LevelError, "idem: checking whether the job's transaction committed failed; the key stays pending for recovery", lease.Key(), cerr)
			return false, join(cause, fmt.Errorf("idem: whether the job's transaction committed is unknown; its key stays pending for recovery: %w", cerr))
		case outcome == TxCommitted:
			return true, nil
		case outcome == TxLost:
			e.jobLog(ctx, slog.LevelError, "idem: the lease was lost during the job's transaction; nothing committed", lease.Key(), nil)
			return false, join(cause, fmt.Errorf("idem: the job's transaction did not commit: %w", ErrLeaseLost))
		}
	}
	// Rolled back, or never completed: nothing of the transaction committed.
	if crash != "" {
		return false, e.settleJob(ctx, lease, kind == Transactional, crash)
	}
	if cause == nil {
		cause = errors.New("idem: the job's transaction did not commit")
	}
	release, reason := failureSettlement(cause, kind)
	return false, join(cause, e.settleJob(ctx, lease, release, reason))
}

// join returns err, with also (when not nil) joined to it: fn's own error
// stays the very value fn returned when nothing else went wrong.
func join(err, also error) error {
	switch {
	case also == nil:
		return err
	case err == nil:
		return also
	}
	return errors.Join(err, also)
}

// checkJob refuses what Do and DoTx cannot run.
func checkJob(e *Engine, req Request, nilFunc bool) error {
	switch {
	case e == nil:
		return errors.New("idem: Do needs an engine")
	case nilFunc:
		return errors.New("idem: Do needs a function to run")
	case req.Kind != External && req.Kind != Transactional:
		return fmt.Errorf("idem: Request.Kind %v is unknown", req.Kind)
	}
	return nil
}

// begin reserves req.Key for Do and DoTx. It returns the lease when the
// caller must run the job, or else the replayed value or the error to
// return.
func begin[T any](ctx context.Context, e *Engine, req Request) (T, *Lease, error) {
	var v T
	res, err := e.Begin(ctx, req)
	if err != nil {
		return v, nil, err
	}
	oe := &OutcomeError{Outcome: res.Outcome, Key: req.Key, RetryAfter: res.RetryAfter, Record: res.Record}
	switch res.Outcome {
	case Acquired:
		return v, res.Lease, nil
	case Replayed:
		switch {
		case res.Response == nil || res.Response.NotReplayable != "":
			oe.err = ErrNotReplayable
		case res.Response.Status < 200 || res.Response.Status > 299:
			// Do stores 200; someone else settled the key with a failure.
			oe.err = ErrNotAResult
		default:
			if oe.err = json.Unmarshal(res.Response.Body, &v); oe.err == nil {
				return v, nil, nil
			}
		}
	case InFlight, Mismatch, NeedsReview:
		// Unwrap gives the sentinel.
	default:
		return v, nil, fmt.Errorf("idem: Begin returned outcome %v", res.Outcome)
	}
	var zero T
	return zero, nil, oe
}

// encodeResult is the stored answer of a job that returned v.
func encodeResult(v any) (*Response, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("idem: encoding the job's result as JSON: %w", err)
	}
	return &Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: b}, nil
}

// failureSettlement says whether a job that failed with err is released
// (else escalated, with reason). An error that joins several (errors.Join)
// is escalated if any of them is Ambiguous, released if every one is
// Retryable, and otherwise settled by kind.
func failureSettlement(err error, kind Kind) (release bool, reason string) {
	ambiguous, retryable := failureMarks(err)
	switch {
	case ambiguous != nil:
		return false, "the job failed with an ambiguous error: " + ambiguous.err.Error()
	case retryable:
		return true, ""
	}
	return kind == Transactional, "the job failed and its effect is unknown: " + err.Error()
}

// failureMarks walks err's tree: ambiguous is an Ambiguous mark found
// anywhere in it; retryable reports that every branch ends in a Retryable
// mark.
func failureMarks(err error) (ambiguous *jobFailure, retryable bool) {
	switch x := err.(type) {
	case *jobFailure:
		if x.escalate {
			return x, false
		}
		if a, _ := failureMarks(x.err); a != nil {
			return a, false
		}
		return nil, true
	case interface{ Unwrap() error }:
		return failureMarks(x.Unwrap())
	case interface{ Unwrap() []error }:
		errs := x.Unwrap()
		retryable = len(errs) > 0
		for _, e := range errs {
			a, r := failureMarks(e)
			if a != nil {
				return a, false
			}
			retryable = retryable && r
		}
		return nil, retryable
	}
	return nil, false
}

// crashReason describes a job that ended without returning: a panic with
// value p, or runtime.Goexit when p is nil.
func crashReason(p any) string {
	if p != nil {
		return fmt.Sprintf("the job panicked: %v", p)
	}
	return "the job's goroutine exited (runtime.Goexit) before the job returned"
}

// settleJob releases the job's key, or escalates it with reason. A store
// that refuses for longer than EngineConfig.SettleTimeout is tried again
// until the lease would expire; after that the lease is abandoned (the key
// stays pending, for recovery to settle by its kind) and the error is
// returned. A lease someone else settled first is not an error.
func (e *Engine) settleJob(ctx context.Context, lease *Lease, release bool, reason string) error {
	settle := func(ctx context.Context) error {
		if release {
			return lease.Release(ctx)
		}
		return lease.Escalate(ctx, reason)
	}
	err := settle(ctx)
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		dctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), lease.Deadline())
		err = settle(dctx)
		cancel()
	}
	what := "releasing"
	if !release {
		what = "escalating"
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrLeaseLost):
		e.jobLog(ctx, slog.LevelWarn, "idem: "+what+" the job's key found it settled already", lease.Key(), err)
		return nil
	}
	lease.Abandon()
	e.jobLog(ctx, slog.LevelError, "idem: "+what+" the job's key failed; it stays pending until its lease expires, for recovery", lease.Key(), err)
	return fmt.Errorf("idem: %s the job's key failed; it stays pending until its lease expires: %w", what, err)
}

func (e *Engine) jobLog(ctx context.Context, level slog.Level, msg string, key Key, err error) {
	attrs := []slog.Attr{digestAttr(key), slog.String("operation", key.Operation)}
	if err != nil {
		attrs = append(attrs, slog.Any("error", err))
	}
	e.cfg.Logger.LogAttrs(context.WithoutCancel(ctx), level, msg, attrs...)
}
