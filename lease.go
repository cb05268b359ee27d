package idem

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// ErrLeaseLost means the lease no longer holds its key: the record was
// completed, released, escalated, or taken over after the lease expired.
// A caller inside a business transaction must roll it back.
var ErrLeaseLost = idemstore.ErrLeaseLost

// LeaseState is what the holder has done with a lease so far.
type LeaseState uint8

// The states of a Lease.
const (
	// LeaseOpen: the operation is running; nothing has ended the lease.
	LeaseOpen LeaseState = iota
	// LeaseTxPrepared: a store's CompleteTx was called inside a business
	// transaction, which may have committed or rolled back (see CheckTx).
	LeaseTxPrepared
	// LeaseCompleted: Complete stored the answer.
	LeaseCompleted
	// LeaseReleased: Release deleted the reservation.
	LeaseReleased
	// LeaseEscalated: Escalate moved the key to needs_review.
	LeaseEscalated
	// LeaseAbandoned: the holder gave up without ending the lease (see
	// Abandon); the record stays pending for recovery.
	LeaseAbandoned
)

var leaseStateNames = [...]string{"open", "tx_prepared", "completed", "released", "escalated", "abandoned"}

// String returns the state's lower-case name.
func (s LeaseState) String() string {
	if int(s) < len(leaseStateNames) {
		return leaseStateNames[s]
	}
	return "LeaseState(" + strconv.Itoa(int(s)) + ")"
}

// Lease is the right to run one operation for one key. It is returned by
// Begin with Outcome Acquired. Exactly one of Complete, Release or Escalate
// should end it (or a store's CompleteTx inside a business transaction);
// Extend renews it while the work goes on. Every call is fenced by the
// lease's token, so a holder whose lease was taken over changes nothing and
// gets ErrLeaseLost.
//
// Complete, Release and Escalate record what happened, so they run detached
// from the caller's cancellation (a client that hangs up must not cancel
// them), try again while the store fails transiently, and give up after
// EngineConfig.SettleTimeout, or at the context's deadline when that is
// later. Once one of them has ended the lease, the others return
// ErrLeaseLost.
//
// A Lease is safe for concurrent use (a heartbeat may Extend while the
// holder completes).
type Lease struct {
	e     *Engine
	key   Key
	token string
	kind  Kind
	// lease and retention are the durations this operation runs with.
	lease, retention time.Duration

	// renewAt and renewing belong to the engine's heartbeat, under its lock.
	renewAt  time.Time
	renewing bool

	mu         sync.Mutex
	leaseUntil time.Time
	state      LeaseState
	txResp     *Response // what PrepareTxComplete was given

	ctx     leaseContext // see ContextWithLease
	ctxUsed atomic.Bool

	// sctx is the context of the lease's settlement, kept here so that
	// settling costs no allocation; a second settlement running at the same
	// time (a misuse, but a safe one) makes its own, and so does every
	// settlement after one that ran out of time (see settle).
	sctx      detached
	sctxInUse atomic.Bool
}

func (e *Engine) newLease(req Request, token string, leaseUntil time.Time) *Lease {
	return &Lease{e: e, key: req.Key, token: token, kind: req.Kind, leaseUntil: leaseUntil,
		lease: req.leaseDuration(e), retention: req.retention(e)}
}

// Key returns the key the lease holds.
func (l *Lease) Key() Key { return l.key }

// Token returns the fencing token.
func (l *Lease) Token() string { return l.token }

// Kind returns the operation kind given to Begin.
func (l *Lease) Kind() Kind { return l.kind }

// Duration returns the lease duration the operation runs with.
func (l *Lease) Duration() time.Duration { return l.lease }

// Deadline returns when the lease expires unless extended, estimated on the
// local clock from when it was taken or last extended. The store decides on
// its own clock; this estimate is never later than its decision when the two
// clocks run at the same rate.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leaseUntil
}

// Complete stores resp as the answer every retry will get, and ends the
// lease. Headers that must not be replayed are dropped, and a body over
// EngineConfig.MaxResponseBody is recorded as not replayable. Stores copy or
// encode what they keep, so resp may be reused once Complete returns.
func (l *Lease) Complete(ctx context.Context, resp *Response) error {
	if resp == nil {
		return errors.New("idem: Complete needs a response")
	}
	p, _, err := l.completeParams(resp)
	if err != nil {
		return err
	}
	err = l.settle(ctx, settleComplete, &p, "")
	if err == nil {
		l.setState(LeaseCompleted)
	}
	return err
}

// How Lease.settle ends a lease.
type settleOp uint8

const (
	settleComplete settleOp = iota
	settleRelease
	settleEscalate
)

// settle applies op until it succeeds, is refused for good, or
// EngineConfig.SettleTimeout passes, detached from ctx's cancellation (see
// Engine.settle). After every error it reads the record back: a change whose
// reply was lost, or that a client library resent after it went through,
// shows as the record in the state op produces (completed or needs_review
// under this lease's token, or gone), and counts as done.
func (l *Lease) settle(ctx context.Context, op settleOp, p *idemstore.CompleteParams, reason string) error {
	if s := l.State(); s >= LeaseCompleted {
		// Nothing of this lease is left to settle; and what the record
		// shows now may be an operator's answer under the same token.
		return fmt.Errorf("idem: lease already %s: %w", s, ErrLeaseLost)
	}
	st := l.e.store
	var dc *detached
	if l.sctxInUse.CompareAndSwap(false, true) {
		dc = &l.sctx
		dc.reset(ctx, settleBound(ctx, l.e.cfg.SettleTimeout))
		defer func() {
			// A store call that returned because dc ended may still be
			// running with it (a group-commit batch in flight): dc is
			// then never reset for another settlement of this lease.
			if dc.Err() == nil {
				l.sctxInUse.Store(false)
			}
		}()
	} else {
		dc = detach(ctx, settleBound(ctx, l.e.cfg.SettleTimeout))
	}
	defer dc.stop()
	pause := settleFirstPause
	for {
		var err error
		switch op {
		case settleComplete:
			err = st.Complete(dc, *p)
		case settleRelease:
			err = st.Release(dc, idemstore.ReleaseParams{Key: l.key, Token: l.token})
		case settleEscalate:
			err = st.Escalate(dc, idemstore.EscalateParams{Key: l.key, Token: l.token, Reason: reason})
		}
		if err == nil {
			return nil
		}
		rec, gerr := st.Get(dc, l.key)
		switch {
		case op == settleRelease && errors.Is(gerr, idemstore.ErrNotFound):
			return nil // gone: released
		case gerr == nil && rec.Token == l.token && (op == settleComplete && rec.State == idemstore.StateCompleted && sameResponse(rec.Response, p.Response) ||
			op == settleEscalate && rec.State == idemstore.StateNeedsReview && rec.Reason == reason):
			return nil // this very change, applied; its reply was lost
		}
		if !transient(err) || !dc.pause(pause) {
			return err
		}
		pause = min(2*pause, settleMaxPause)
	}
}

// sameResponse reports whether stored is the answer want describes, so that
// a settlement reading the record back tells its own completion from
// another one under the same token (an operator's, say).
func sameResponse(stored, want *Response) bool {
	if stored == nil || want == nil {
		return stored == want
	}
	if stored.Status != want.Status || stored.NotReplayable != want.NotReplayable || !bytes.Equal(stored.Body, want.Body) || len(stored.Header) != len(want.Header) {
		return false
	}
	for name, vs := range want.Header {
		if !slices.Equal(stored.Header[name], vs) {
			return false
		}
	}
	return true
}

// PrepareTxComplete implements idemstore.TxLease for the stores' CompleteTx:
// it returns the fenced completion of resp and notes that the lease is being
// completed inside the caller's transaction.
func (l *Lease) PrepareTxComplete(resp *Response) (idemstore.CompleteParams, error) {
	if resp == nil {
		return idemstore.CompleteParams{}, errors.New("idem: CompleteTx needs a response")
	}
	p, stored, err := l.completeParams(resp)
	if err != nil {
		return idemstore.CompleteParams{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != LeaseOpen && l.state != LeaseTxPrepared {
		return idemstore.CompleteParams{}, fmt.Errorf("idem: lease already ended: %w", ErrLeaseLost)
	}
	l.state = LeaseTxPrepared
	l.txResp = stored
	return p, nil
}

// completeParams returns the fenced completion of resp, its answer sealed
// when the engine has a Sealer, and stored, the answer as it is kept
// before sealing. A settlement reading the record back compares it with
// p.Response, sealed: the very bytes it wrote, random nonce and all.
func (l *Lease) completeParams(resp *Response) (p idemstore.CompleteParams, stored *Response, err error) {
	stored = resp
	switch {
	case resp.NotReplayable != "":
		stored = &Response{Status: resp.Status, NotReplayable: resp.NotReplayable}
	case l.e.cfg.MaxResponseBody >= 0 && len(resp.Body) > l.e.cfg.MaxResponseBody:
		stored = &Response{Status: resp.Status, NotReplayable: NotReplayableTooLarge}
	default:
		if h := storableHeader(resp.Header); len(h) != len(resp.Header) || (h == nil) != (resp.Header == nil) {
			stored = &Response{Status: resp.Status, Header: h, Body: resp.Body}
		}
	}
	sealed, err := l.e.sealResponse(l.key, stored)
	if err != nil {
		return idemstore.CompleteParams{}, nil, err
	}
	return idemstore.CompleteParams{Key: l.key, Token: l.token, Response: sealed, Retention: l.retention}, stored, nil
}

// Release deletes the reservation if it is still pending under this lease,
// so a retry runs the operation again. Call it only when the operation
// certainly had no effect. If the record was already completed (a commit
// whose acknowledgement was lost), Release leaves it alone and returns
// ErrLeaseLost.
func (l *Lease) Release(ctx context.Context) error {
	err := l.settle(ctx, settleRelease, nil, "")
	if err == nil {
		l.setState(LeaseReleased)
	}
	return err
}

// Escalate marks the record needs_review with reason: the outcome is
// unknown, and a resolver or an operator must decide. Retries get
// NeedsReview until then.
func (l *Lease) Escalate(ctx context.Context, reason string) error {
	err := l.settle(ctx, settleEscalate, nil, reason)
	if err == nil {
		l.setState(LeaseEscalated)
		l.e.reviewed(ctx, l.key, reason)
	}
	return err
}

// Abandon gives the lease up without ending it, when the outcome is unknown
// and neither Escalate nor Release could be recorded: the record stays
// pending under this lease's token until the lease expires, and then
// recovery settles it by the operation's kind. Whoever settles the lease
// afterwards (the middleware, for one) must store nothing. Abandon changes
// nothing in the store, and nothing once the lease has ended.
func (l *Lease) Abandon() {
	l.mu.Lock()
	if l.state == LeaseOpen || l.state == LeaseTxPrepared {
		l.state = LeaseAbandoned
	}
	l.mu.Unlock()
}

// Extend renews the lease for another lease duration (Request.Lease, or
// EngineConfig.Lease) from the store's now.
func (l *Lease) Extend(ctx context.Context) error {
	start := l.e.cfg.Now()
	err := l.e.store.Extend(ctx, idemstore.ExtendParams{Key: l.key, Token: l.token, Lease: l.lease})
	if err == nil {
		until := start.Add(l.lease)
		l.mu.Lock()
		if until.After(l.leaseUntil) {
			l.leaseUntil = until
		}
		l.mu.Unlock()
	}
	return err
}

// State returns what the holder has done with the lease so far.
func (l *Lease) State() LeaseState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state
}

// Ended reports whether Complete, Release or Escalate succeeded on the
// lease, or it was abandoned: nothing is left for its holder to settle.
func (l *Lease) Ended() bool { return l.State() >= LeaseCompleted }

// TxOutcome is what became of a business transaction in which a store's
// CompleteTx completed a lease.
type TxOutcome int

// The outcomes CheckTx reports.
const (
	// TxCommitted: the record is completed under this lease: the business
	// change and the stored answer committed together.
	TxCommitted TxOutcome = iota + 1
	// TxRolledBack: the record is still pending under this lease, so
	// neither committed; Release is safe.
	TxRolledBack
	// TxLost: the record is neither; the lease was lost (taken over,
	// escalated, released by recovery).
	TxLost
)

// CheckTx reads the record after a handler's business transaction ended,
// to learn whether the CompleteTx inside it committed. With TxCommitted it
// also returns the stored answer (nil, and logged, if it is sealed and does
// not open), and marks the lease completed. It runs
// detached from ctx's cancellation. Call it only once the transaction is
// over: a transaction still open looks rolled back.
func (l *Lease) CheckTx(ctx context.Context) (TxOutcome, *Response, error) {
	var (
		rec *idemstore.Record
		err error
	)
	err = l.e.settle(ctx, l.key, l.e.cfg.SettleTimeout,
		func(ctx context.Context) error {
			rec, err = l.e.store.Get(ctx, l.key)
			if errors.Is(err, idemstore.ErrNotFound) {
				return nil
			}
			return err
		}, nil)
	switch {
	case err != nil:
		return 0, nil, err
	case rec != nil && rec.Token == l.token && rec.State == idemstore.StateCompleted:
		l.setState(LeaseCompleted)
		if l.e.open(ctx, rec) != nil {
			return TxCommitted, nil, nil // committed all the same; logged
		}
		return TxCommitted, rec.Response, nil
	case rec != nil && rec.Token == l.token && rec.State == idemstore.StatePending:
		return TxRolledBack, nil, nil
	}
	return TxLost, nil, nil
}

// PreparedTx reports whether a store's CompleteTx was called on the lease,
// and with what answer (as it was to be stored).
func (l *Lease) PreparedTx() (*Response, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.txResp, l.state == LeaseTxPrepared
}

func (l *Lease) setState(s LeaseState) {
	l.mu.Lock()
	l.state = s
	l.mu.Unlock()
}

// leaseContext carries a lease in a context without an allocation of its
// own: it lives inside the Lease.
type leaseContext struct {
	context.Context
	l *Lease
}

func (c *leaseContext) Value(key any) any {
	if key == (leaseKey{}) {
		return c.l
	}
	return c.Context.Value(key)
}

// redact returns a short, stable digest of a key for logs, so that keys
// (which may be guessable or sensitive) never appear in clear text.
func redact(k Key) string {
	h := sha256.New()
	h.Write([]byte(k.Scope))
	h.Write([]byte{0})
	h.Write([]byte(k.Operation))
	h.Write([]byte{0})
	h.Write([]byte(k.Key))
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:6])
}
