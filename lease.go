package idem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// ErrLeaseLost means the lease no longer holds its key: the record was
// completed, released, escalated, or taken over after the lease expired.
// A caller inside a business transaction must roll it back.
var ErrLeaseLost = idemstore.ErrLeaseLost

// leaseState tracks what the holder did with a lease.
type leaseState uint8

const (
	leaseOpen leaseState = iota
	leaseTxPrepared
	leaseCompleted
	leaseReleased
	leaseEscalated
)

// Lease is the right to run one operation for one key. It is returned by
// Begin with Outcome Acquired. Exactly one of Complete, Release or Escalate
// should end it (or a store's CompleteTx inside a business transaction);
// Extend renews it while the work goes on. Every call is fenced by the
// lease's token, so a holder whose lease was taken over changes nothing and
// gets ErrLeaseLost.
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
	state      leaseState
	txResp     *Response // what PrepareTxComplete was given

	ctx leaseContext // see context
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

// Deadline returns when the lease expires unless extended.
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
	p := l.completeParams(resp)
	err := l.e.store.Complete(ctx, p)
	if err != nil && l.applied(ctx, idemstore.StateCompleted) {
		err = nil
	}
	if err == nil {
		l.setState(leaseCompleted)
	}
	return err
}

// applied reports whether a change that returned an error was applied all
// the same: a reply lost after the store committed, or a client library
// that resent a command whose first attempt had gone through. The record
// then shows this lease's token in the state the change was to produce.
func (l *Lease) applied(ctx context.Context, want idemstore.State) bool {
	rec, err := l.e.store.Get(context.WithoutCancel(ctx), l.key)
	return err == nil && rec.State == want && rec.Token == l.token
}

// PrepareTxComplete implements idemstore.TxLease for the stores' CompleteTx:
// it returns the fenced completion of resp and notes that the lease is being
// completed inside the caller's transaction.
func (l *Lease) PrepareTxComplete(resp *Response) (idemstore.CompleteParams, error) {
	if resp == nil {
		return idemstore.CompleteParams{}, errors.New("idem: CompleteTx needs a response")
	}
	p := l.completeParams(resp)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != leaseOpen && l.state != leaseTxPrepared {
		return idemstore.CompleteParams{}, fmt.Errorf("idem: lease already ended: %w", ErrLeaseLost)
	}
	l.state = leaseTxPrepared
	l.txResp = p.Response
	return p, nil
}

func (l *Lease) completeParams(resp *Response) idemstore.CompleteParams {
	now := l.e.cfg.Now()
	stored := resp
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
	return idemstore.CompleteParams{
		Key:       l.key,
		Token:     l.token,
		Response:  stored,
		Now:       now,
		ExpiresAt: now.Add(l.retention),
	}
}

// Release deletes the reservation if it is still pending under this lease,
// so a retry runs the operation again. Call it only when the operation
// certainly had no effect. If the record was already completed (a commit
// whose acknowledgement was lost), Release leaves it alone and returns
// ErrLeaseLost.
func (l *Lease) Release(ctx context.Context) error {
	err := l.e.store.Release(ctx, l.key, l.token)
	if err == nil {
		l.setState(leaseReleased)
	}
	return err
}

// Escalate marks the record needs_review with reason: the outcome is
// unknown, and a resolver or an operator must decide. Retries get
// NeedsReview until then.
func (l *Lease) Escalate(ctx context.Context, reason string) error {
	err := l.e.store.Escalate(ctx, idemstore.EscalateParams{Key: l.key, Token: l.token, Reason: reason, Now: l.e.cfg.Now()})
	if err != nil && l.applied(ctx, idemstore.StateNeedsReview) {
		err = nil
	}
	if err == nil {
		l.setState(leaseEscalated)
	}
	return err
}

// Extend renews the lease for another lease duration (Request.Lease, or
// EngineConfig.Lease) from now.
func (l *Lease) Extend(ctx context.Context) error {
	now := l.e.cfg.Now()
	until := now.Add(l.lease)
	err := l.e.store.Extend(ctx, idemstore.ExtendParams{Key: l.key, Token: l.token, LeaseUntil: until, Now: now})
	if err == nil {
		l.mu.Lock()
		if until.After(l.leaseUntil) {
			l.leaseUntil = until
		}
		l.mu.Unlock()
	}
	return err
}

// Ended reports whether Complete, Release or Escalate succeeded on the lease.
func (l *Lease) Ended() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state >= leaseCompleted
}

// txPrepared reports whether a store's CompleteTx was called, and with what.
func (l *Lease) txPrepared() (*Response, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.txResp, l.state == leaseTxPrepared
}

func (l *Lease) setState(s leaseState) {
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

// context returns parent carrying l, for LeaseFrom.
func (l *Lease) context(parent context.Context) context.Context {
	l.ctx = leaseContext{Context: parent, l: l}
	return &l.ctx
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
