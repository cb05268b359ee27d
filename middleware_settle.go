package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
)

// Settlement after the handler, through the public Lease API only (a gRPC
// interceptor or a job runner could do the same). What is recorded:
//
//   - the handler ended the lease itself (Complete, Release, Escalate,
//     Abandon): nothing more;
//   - it called a store's CompleteTx: the record is read back to see
//     whether the transaction committed (stored), rolled back (a
//     transactional key is released; an external one, whose effect may
//     have happened outside the database, goes to review) or lost;
//   - otherwise its answer is stored, or the key released for the
//     policy's release statuses. A Complete that fails escalates the key:
//     the handler ran, and with no stored answer nobody may run it again
//     blindly. If even that fails, the key is left pending for recovery.
//
// A panic settles the same way, except that a lease that was never
// completed in a transaction is escalated whatever its kind: only a
// transaction that provably rolled back lets a key be released.
//
// A release or an escalation that the store refuses for longer than
// EngineConfig.SettleTimeout is tried again until the lease would expire,
// after the client has its answer, so that a store that is down for a
// while does not leave a key that no one holds for recovery or a takeover
// to find. Only if that fails too is the lease abandoned (left pending).
//
// Lease.Complete, Release and Escalate run detached from the request's
// context with their own bound, so a client that leaves mid-settlement
// cancels nothing.

// Settlements, as reported in Event.Settlement.
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

// run calls the handler under the lease, then stores, releases or escalates.
// It records the status and the settlement in ev, also when the handler
// panics.
func (h *handler) run(w http.ResponseWriter, r *http.Request, lease *Lease, pol *Policy, st *reqState, ev *Event) {
	m := h.m
	st.cw.w, st.cw.limit, st.cw.buf = w, m.maxBody, &st.respBuf
	st.cw.bufferFlushes, st.cw.observe = pol.BufferFlushes, pol.Observe
	cw := &st.cw
	ctx := r.Context()
	// The heartbeat stops once, on whichever way the handler leaves: before
	// the answer is stored, or before a panic settles the key.
	stop := lease.Heartbeat()

	panicked := true
	defer func() {
		if !panicked {
			return
		}
		v := recover()
		stop()
		var later pendingSettle
		ev.Settlement = m.settleUnknown(ctx, lease, fmt.Sprintf("handler panicked: %v", v), &later)
		ev.Settlement = m.settleLater(ctx, lease, &later, ev.Settlement)
		panic(v)
	}()
	h.next.ServeHTTP(cw, r.WithContext(ContextWithLease(ctx, lease)))
	panicked = false
	stop()

	if ctx.Err() != nil && cw.status == 0 && cw.buf.Len() == 0 && !cw.passthrough {
		// The client left and the handler returned without answering (the
		// usual `<-ctx.Done(); return`): an empty 200 would be stored and
		// replayed, though whether the work happened is unknown.
		var later pendingSettle
		ev.Settlement = m.settleUnknown(ctx, lease, "the client left and the handler answered nothing", &later)
		ev.Settlement = m.settleLater(ctx, lease, &later, ev.Settlement)
		ev.Status = SituationCanceled.Status
		return
	}
	var later pendingSettle
	ev.Settlement = m.settle(ctx, r, cw, lease, pol, &later)
	cw.finish()
	ev.Status = cw.finalStatus()
	if later.op != 0 {
		// The client gets its answer now; the key's settlement goes on.
		_ = http.NewResponseController(cw.w).Flush()
		ev.Settlement = m.settleLater(ctx, lease, &later, ev.Settlement)
	}
}

// pendingSettle is a release or an escalation that the store refused for
// SettleTimeout, to try again until the lease would expire.
type pendingSettle struct {
	op     uint8 // 0: none; settleRelease or settleEscalate
	reason string
}

// settleLater tries the pending settlement again, detached, until the
// lease's deadline; settled is what the first try reported. If the store
// still refuses, the lease is abandoned: the key stays pending under its
// token for recovery.
func (m *middleware) settleLater(ctx context.Context, lease *Lease, p *pendingSettle, settled string) string {
	if p.op == 0 {
		return settled
	}
	dctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), lease.Deadline())
	defer cancel()
	var err error
	if p.op == uint8(settleRelease) {
		err = lease.Release(dctx)
	} else {
		err = lease.Escalate(dctx, p.reason)
	}
	switch {
	case err == nil && p.op == uint8(settleRelease):
		return settledReleased
	case err == nil:
		return settledEscalated
	case errors.Is(err, ErrLeaseLost):
		return settledLost
	}
	m.log(ctx, slog.LevelError, "idem: the store still refuses to settle the key; it stays pending for recovery", lease, err)
	lease.Abandon()
	return settledFailed
}

// settle records what the handler's answer means for the key.
func (m *middleware) settle(ctx context.Context, r *http.Request, cw *captureWriter, lease *Lease, pol *Policy, later *pendingSettle) string {
	switch lease.State() {
	case LeaseOpen:
	case LeaseTxPrepared:
		return m.checkTx(ctx, cw.response(), cw.status, lease, "", later)
	default:
		return settledHandler
	}
	resp := cw.response()
	if slices.Contains(pol.ReleaseStatuses, resp.Status) {
		return m.release(ctx, lease, "the handler answered a release status", later)
	}
	resp = m.withVaryDigests(pol.storedResponse(resp), r)
	err := lease.Complete(ctx, resp)
	switch {
	case err == nil && resp.NotReplayable != "":
		return settledNotReplayable
	case err == nil:
		return settledCompleted
	case errors.Is(err, ErrLeaseLost):
		m.log(ctx, slog.LevelError, "idem: the lease was lost before the answer could be stored (taken over, or settled by recovery)", lease, err)
		return settledLost
	}
	// The handler ran; its answer could not be stored. The client still
	// gets it, and the key goes to review: neither a retry nor a takeover
	// may run it again.
	m.log(ctx, slog.LevelError, "idem: storing the answer failed; escalating the key", lease, err)
	return m.escalate(ctx, lease, fmt.Sprintf("the handler answered %d but storing the answer failed: %v", resp.Status, err), later)
}

// settleUnknown settles the key of a handler whose outcome is unknown (it
// panicked, or returned without answering after its client left): reason
// goes on the record if it is escalated.
func (m *middleware) settleUnknown(ctx context.Context, lease *Lease, reason string, later *pendingSettle) string {
	switch lease.State() {
	case LeaseOpen:
		return m.escalate(ctx, lease, reason, later)
	case LeaseTxPrepared:
		return m.checkTx(ctx, nil, 0, lease, reason, later)
	}
	return settledHandler
}

// checkTx settles a lease whose handler called a store's CompleteTx: it
// reads back whether the business transaction committed. written is the
// handler's answer (nil after a panic), to compare with what was stored.
func (m *middleware) checkTx(ctx context.Context, written *Response, status int, lease *Lease, panicked string, later *pendingSettle) string {
	outcome, stored, err := lease.CheckTx(ctx)
	switch {
	case err != nil:
		m.log(ctx, slog.LevelError, "idem: checking a transactional completion failed; the key stays pending for recovery", lease, err)
		lease.Abandon()
		return settledFailed
	case outcome == TxCommitted:
		if written != nil && stored != nil && (stored.Status != written.Status || !bytes.Equal(stored.Body, written.Body) || stored.NotReplayable != written.NotReplayable) {
			m.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem: the handler answered differently from what it stored with CompleteTx; retries will get the stored answer",
				digestAttr(lease.Key()), slog.Int("written_status", written.Status), slog.Int("stored_status", stored.Status))
		}
		return settledCompletedTx
	case outcome == TxLost:
		m.log(ctx, slog.LevelError, "idem: the lease was lost during a transactional completion", lease, nil)
		return settledLost
	}
	// Rolled back: nothing committed in the database.
	if lease.Kind() != Transactional {
		reason := "the business transaction rolled back after CompleteTx; the external effect may have happened"
		if panicked != "" {
			reason = panicked + "; " + reason
		}
		return m.escalate(ctx, lease, reason, later)
	}
	if status >= 200 && status < 300 {
		m.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: the handler answered success but its transaction did not commit; the key was released",
			digestAttr(lease.Key()), slog.Int("status", status))
	}
	return m.release(ctx, lease, "the business transaction rolled back", later)
}

// release releases the key. When the store refuses it, later is set to try
// again once the client has its answer.
func (m *middleware) release(ctx context.Context, lease *Lease, why string, later *pendingSettle) string {
	err := lease.Release(ctx)
	switch {
	case err == nil:
		return settledReleased
	case errors.Is(err, ErrLeaseLost):
		m.log(ctx, slog.LevelWarn, "idem: releasing the key found it settled already ("+why+")", lease, err)
		return settledLost
	}
	m.log(ctx, slog.LevelError, "idem: releasing the key failed ("+why+"); trying again until the lease ends", lease, err)
	*later = pendingSettle{op: uint8(settleRelease)}
	return settledFailed
}

// escalate moves the key to review. When the store refuses it, later is set
// to try again once the client has its answer.
func (m *middleware) escalate(ctx context.Context, lease *Lease, reason string, later *pendingSettle) string {
	err := lease.Escalate(ctx, reason)
	switch {
	case err == nil:
		return settledEscalated
	case errors.Is(err, ErrLeaseLost):
		m.log(ctx, slog.LevelWarn, "idem: escalating the key found it settled already", lease, err)
		return settledLost
	}
	m.log(ctx, slog.LevelError, "idem: escalating the key failed; trying again until the lease ends", lease, err)
	*later = pendingSettle{op: uint8(settleEscalate), reason: reason}
	return settledFailed
}

func (m *middleware) log(ctx context.Context, level slog.Level, msg string, lease *Lease, err error) {
	attrs := []slog.Attr{digestAttr(lease.Key()), slog.String("operation", lease.Key().Operation)}
	if err != nil {
		attrs = append(attrs, slog.Any("error", err))
	}
	m.cfg.Logger.LogAttrs(context.WithoutCancel(ctx), level, msg, attrs...)
}
