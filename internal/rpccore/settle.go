package rpccore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idem-dev/idem"
)

// Settlements, as reported in Event.Settlement (idem.Event's names).
const (
	settledCompleted     = "completed"
	settledCompletedTx   = "completed_tx"
	settledNotReplayable = "not_replayable"
	settledReleased      = "released"
	settledEscalated     = "escalated"
	settledHandler       = "handler"
	settledLost          = "lost"
	settledFailed        = "failed"
)

// run calls the handler under the lease and settles the key by what it
// answered, as the HTTP middleware settles a request:
//
//   - the call ended before the handler started: it does not run, and the
//     key is released;
//   - the handler ended the lease itself (Complete, Release, Escalate,
//     Abandon): nothing more;
//   - it called a store's CompleteTx: whether its transaction committed is
//     read back; rolled back releases a Transactional key and escalates an
//     External one, whose effect may have happened outside the database;
//   - its error is marked idem.Retryable: released; idem.Ambiguous:
//     escalated; the client gets the error without its mark;
//   - it answered one of the policy's release codes (UNAVAILABLE and
//     RESOURCE_EXHAUSTED by default): nothing happened, released;
//   - it answered one of the policy's ambiguous codes (DEADLINE_EXCEEDED
//     and CANCELLED by default), or CANCELLED or DEADLINE_EXCEEDED after
//     the call itself ended: its effect is unknown, escalated in an
//     External method (released with Policy.Ambiguous "release"), and
//     released in a Transactional one;
//   - otherwise its answer, message or status, is stored and replayed. A
//     Complete that fails escalates the key: the handler ran.
//
// A panic escalates the key (or, after a CompleteTx that provably rolled
// back in a Transactional method, releases it) and goes on.
func (s *Server) run(ctx context.Context, m *method, lease *idem.Lease, ev *Event, handler func(context.Context) Result) Answer {
	if err := ctx.Err(); err != nil {
		return s.endedBeforeRun(ctx, lease, ev, err)
	}
	stop := lease.Heartbeat()
	returned := false
	defer func() {
		if returned {
			return
		}
		v := recover()
		stop()
		reason := "the handler's goroutine exited (runtime.Goexit)"
		if v != nil {
			reason = fmt.Sprintf("the handler panicked: %v", v)
		}
		ev.Settlement = s.settleUnknown(ctx, lease, reason, nil)
		ev.Code = code.Code_UNKNOWN // what the client gets is up to the recovering interceptor
		if v != nil {
			panic(v)
		}
	}()
	res := handler(idem.ContextWithLease(ctx, lease))
	returned = true
	stop()
	var st *spb.Status
	if res.Err != nil {
		st, _ = s.o.StatusOf(res.Err)
	}
	ev.Settlement = s.settle(ctx, m, lease, res, st)
	if st != nil {
		ev.Code = code.Code(st.Code)
	}
	if res.Err != nil && idem.FailureMark(res.Err) != idem.Unmarked {
		return Answer{Status: st}
	}
	return Answer{Msg: res.Msg, Err: res.Err}
}

// endedBeforeRun answers a call that ended (its client hung up, or its
// deadline passed) after its key was reserved and before its handler
// started: nothing ran, so the key is released for the retry, instead of
// a handler started for a call that is over answering CANCELLED, which
// would send the key to review.
func (s *Server) endedBeforeRun(ctx context.Context, lease *idem.Lease, ev *Event, err error) Answer {
	ev.Outcome = idem.SituationCanceled.Name
	ev.Settlement = s.release(ctx, lease, "the call ended before its handler started")
	c := code.Code_CANCELLED
	if errors.Is(err, context.DeadlineExceeded) {
		c = code.Code_DEADLINE_EXCEEDED
	}
	return Answer{Status: &spb.Status{Code: int32(c), Message: err.Error()}}
}

// settle records what the handler's answer means for the key. st is its
// error as a status.
func (s *Server) settle(ctx context.Context, m *method, lease *idem.Lease, res Result, st *spb.Status) string {
	switch lease.State() {
	case idem.LeaseOpen:
	case idem.LeaseTxPrepared:
		return s.checkTx(ctx, lease, &res, st, "")
	default:
		return settledHandler
	}
	if res.Err != nil {
		c := code.Code(st.Code)
		switch {
		case idem.FailureMark(res.Err) == idem.MarkedRetryable:
			return s.release(ctx, lease, "the handler's error was marked Retryable")
		case idem.FailureMark(res.Err) == idem.MarkedAmbiguous:
			return s.escalate(ctx, lease, "the handler failed with an ambiguous error: "+c.String()+": "+st.Message)
		case ctx.Err() != nil && (c == code.Code_CANCELLED || c == code.Code_DEADLINE_EXCEEDED):
			return s.ambiguous(ctx, m, lease, "the call ended ("+ctx.Err().Error()+") and the handler answered "+c.String()+": "+st.Message)
		case slices.Contains(m.pol.ReleaseCodes, c):
			return s.release(ctx, lease, "the handler answered "+c.String())
		case slices.Contains(m.pol.AmbiguousCodes, c):
			return s.ambiguous(ctx, m, lease, "the handler answered "+c.String()+", whose effect is unknown: "+st.Message)
		}
	} else if res.Msg == nil {
		return s.settleUnknown(ctx, lease, "the handler returned neither a message nor an error", nil)
	}
	if res.Err == nil {
		st = nil
	}
	resp, err := encode(res.Msg, st, res.Header, res.Trailer, s.keep, true)
	if err == nil && len(resp.Header) > 2 { // the handler's metadata counts against the bound on answers
		if limit := s.e.Config().MaxResponseBody; limit >= 0 && len(resp.Body) <= limit && len(resp.Body)+metadataSize(resp) > limit {
			resp = &idem.Response{Status: resp.Status, NotReplayable: NotReplayableMetadata}
		}
	}
	if err == nil {
		err = lease.Complete(ctx, resp)
		switch {
		case err == nil && resp.NotReplayable != "":
			return settledNotReplayable
		case err == nil:
			return settledCompleted
		case errors.Is(err, idem.ErrLeaseLost):
			s.log(ctx, slog.LevelError, "idem: the lease was lost before the answer could be stored (taken over, or settled by recovery)", lease, err)
			return settledLost
		}
	}
	// The handler ran; its answer could not be stored. The client still
	// gets it, and the key goes to review: neither a retry nor a takeover
	// may run it again.
	s.log(ctx, slog.LevelError, "idem: storing the answer failed; escalating the key", lease, err)
	return s.escalate(ctx, lease, fmt.Sprintf("the handler answered but storing the answer failed: %v", err))
}

// ambiguous settles the open lease of a handler that answered a code whose
// effect is unknown: escalated in an External method, unless its policy
// releases such keys (its downstream deduplicates by the key itself);
// released in a Transactional one, whose effects commit only with
// CompleteTx, which it did not call.
func (s *Server) ambiguous(ctx context.Context, m *method, lease *idem.Lease, reason string) string {
	if lease.Kind() == idem.Transactional || m.pol.Ambiguous == AmbiguousRelease {
		return s.release(ctx, lease, reason)
	}
	return s.escalate(ctx, lease, reason)
}

// settleUnknown settles the key of a handler whose outcome is unknown.
func (s *Server) settleUnknown(ctx context.Context, lease *idem.Lease, reason string, res *Result) string {
	switch lease.State() {
	case idem.LeaseOpen:
		return s.escalate(ctx, lease, reason)
	case idem.LeaseTxPrepared:
		return s.checkTx(ctx, lease, res, nil, reason)
	}
	return settledHandler
}

// checkTx settles a lease whose handler called a store's CompleteTx: it
// reads back whether the business transaction committed. res is the
// handler's answer (nil after a panic), to compare with what was stored.
func (s *Server) checkTx(ctx context.Context, lease *idem.Lease, res *Result, st *spb.Status, unknown string) string {
	outcome, stored, err := lease.CheckTx(ctx)
	switch {
	case err != nil:
		s.log(ctx, slog.LevelError, "idem: checking a transactional completion failed; the key stays pending for recovery", lease, err)
		lease.Abandon()
		return settledFailed
	case outcome == idem.TxCommitted:
		if res != nil && stored != nil && !sameAnswer(stored, res, st) {
			s.log(ctx, slog.LevelError, "idem: the handler answered differently from what it stored with CompleteTx; retries will get the stored answer", lease, nil)
		}
		return settledCompletedTx
	case outcome == idem.TxLost:
		s.log(ctx, slog.LevelError, "idem: the lease was lost during a transactional completion", lease, nil)
		return settledLost
	}
	if lease.Kind() != idem.Transactional {
		reason := "the business transaction rolled back after CompleteTx; the external effect may have happened"
		if unknown != "" {
			reason = unknown + "; " + reason
		}
		return s.escalate(ctx, lease, reason)
	}
	return s.release(ctx, lease, "the business transaction rolled back")
}

// sameAnswer reports whether stored is the handler's answer res.
func sameAnswer(stored *idem.Response, res *Result, st *spb.Status) bool {
	var want []byte
	var err error
	if res.Err != nil {
		want, err = proto.Marshal(st)
	} else if res.Msg != nil {
		want, err = proto.MarshalOptions{Deterministic: true}.Marshal(res.Msg)
	}
	wantCode := "0"
	if st != nil && res.Err != nil {
		wantCode = fmt.Sprint(st.Code)
	}
	return err == nil && firstValue(stored.Header[hdrStatus]) == wantCode && bytes.Equal(stored.Body, want)
}

// release releases the key; a store that refuses is tried again, after
// the answer, until the lease would expire.
func (s *Server) release(ctx context.Context, lease *idem.Lease, why string) string {
	return s.end(ctx, lease, "releasing the key ("+why+")", lease.Release, settledReleased)
}

// escalate moves the key to review, likewise.
func (s *Server) escalate(ctx context.Context, lease *idem.Lease, reason string) string {
	return s.end(ctx, lease, "escalating the key", func(ctx context.Context) error { return lease.Escalate(ctx, reason) }, settledEscalated)
}

func (s *Server) end(ctx context.Context, lease *idem.Lease, what string, f func(context.Context) error, done string) string {
	err := f(ctx)
	switch {
	case err == nil:
		return done
	case errors.Is(err, idem.ErrLeaseLost):
		s.log(ctx, slog.LevelWarn, "idem: "+what+" found it settled already", lease, err)
		return settledLost
	}
	s.log(ctx, slog.LevelError, "idem: "+what+" failed; trying again until the lease ends", lease, err)
	s.later.Add(1)
	go func() {
		defer s.later.Done()
		dctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), lease.Deadline())
		defer cancel()
		if err := f(dctx); err != nil && !errors.Is(err, idem.ErrLeaseLost) {
			s.log(ctx, slog.LevelError, "idem: the store still refuses to settle the key; it stays pending for recovery", lease, err)
			lease.Abandon()
		}
	}()
	return settledFailed
}

func (s *Server) log(ctx context.Context, level slog.Level, msg string, lease *idem.Lease, err error) {
	attrs := []slog.Attr{slog.String("method", lease.Key().Operation)}
	if err != nil {
		attrs = append(attrs, slog.Any("error", err))
	}
	s.o.Logger.LogAttrs(context.WithoutCancel(ctx), level, msg, attrs...)
}
