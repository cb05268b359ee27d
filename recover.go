package idem

import (
	"context"
	"errors"
	"log/slog"

	"github.com/idem-dev/idem/idemstore"
)

// Verdict is a Resolver's finding about an operation whose outcome was
// unknown.
type Verdict int

const (
	// VerdictUnknown leaves the record in needs_review for a human.
	VerdictUnknown Verdict = iota
	// VerdictCompleted: the operation happened; the record is completed with
	// Resolution.Response, which every retry then gets.
	VerdictCompleted
	// VerdictNotHappened: the operation had no effect; the record is
	// released so a retry runs it.
	VerdictNotHappened
)

// Resolution is what a Resolver found.
type Resolution struct {
	Verdict Verdict
	// Response is the answer to store with VerdictCompleted.
	Response *Response
	// Reason is kept on the record, for the audit trail.
	Reason string
}

// Resolver asks the outside service what became of an external operation,
// passing the same idempotency key (payment providers such as Stripe accept
// it), and says whether it completed or never happened. It must not retry
// the operation itself.
type Resolver interface {
	Resolve(ctx context.Context, rec *idemstore.Record) (Resolution, error)
}

// ResolverFunc adapts a function to Resolver.
type ResolverFunc func(ctx context.Context, rec *idemstore.Record) (Resolution, error)

// Resolve calls f.
func (f ResolverFunc) Resolve(ctx context.Context, rec *idemstore.Record) (Resolution, error) {
	return f(ctx, rec)
}

// RecoverOptions tune Engine.Recover.
type RecoverOptions struct {
	// KindOf says whether an operation is Transactional or External.
	// Defaults to treating every operation as External.
	KindOf func(Key) Kind
	// Resolver, if set, is asked about every needs_review record.
	Resolver Resolver
	// Limit bounds the records handled in each step. Defaults to 100.
	Limit int
}

// RecoverReport counts what Engine.Recover did.
type RecoverReport struct {
	Released  int // expired transactional leases released (their work never committed)
	Escalated int // expired external leases moved to needs_review
	Completed int // needs_review records a Resolver completed
	Reopened  int // needs_review records a Resolver released
	Unknown   int // needs_review records left for a human
}

// Recover settles records whose holders died. An expired lease of a
// transactional operation is released, since its work never committed; an
// expired lease of an external operation goes to needs_review. Then, with a
// Resolver, every needs_review record is resolved by asking the outside
// service. Run it periodically (idem's proxy does) or from an admin command.
//
// Every change is fenced: a holder that was merely slow and completes later
// gets ErrLeaseLost, and one Recover running beside another changes nothing
// twice.
func (e *Engine) Recover(ctx context.Context, opts RecoverOptions) (RecoverReport, error) {
	var rep RecoverReport
	if opts.Limit <= 0 {
		opts.Limit = 100
	}
	kindOf := opts.KindOf
	if kindOf == nil {
		kindOf = func(Key) Kind { return External }
	}
	expired, err := e.store.ListExpiredLeases(ctx, opts.Limit)
	if err != nil {
		return rep, err
	}
	var errs []error
	for _, rec := range expired {
		// Both changes check the expiry again, on the store's clock, in the
		// same statement: a heartbeat that extended the lease since the
		// listing wins, and the change reports ErrLeaseLost.
		// A change that failed may have been applied (a lost reply): the
		// record read back says. One record's error does not stop the
		// others.
		if kindOf(rec.Key) == Transactional {
			err := e.store.Release(ctx, idemstore.ReleaseParams{Key: rec.Key, Token: rec.Token, IfExpired: true})
			if err != nil && !errors.Is(err, idemstore.ErrLeaseLost) {
				if _, gerr := e.store.Get(ctx, rec.Key); errors.Is(gerr, idemstore.ErrNotFound) {
					err = nil
				}
			}
			switch {
			case err == nil:
				rep.Released++
			case !errors.Is(err, idemstore.ErrLeaseLost):
				errs = append(errs, err)
			}
			continue
		}
		const reason = "lease expired with the outcome of an external operation unknown"
		err := e.store.Escalate(ctx, idemstore.EscalateParams{Key: rec.Key, Token: rec.Token, Reason: reason, IfExpired: true})
		if err != nil && !errors.Is(err, idemstore.ErrLeaseLost) && e.escalatedUnder(ctx, rec.Key, rec.Token) {
			err = nil
		}
		switch {
		case err == nil:
			rep.Escalated++
			e.reviewed(ctx, rec.Key, reason)
		case !errors.Is(err, idemstore.ErrLeaseLost):
			errs = append(errs, err)
		}
	}
	if opts.Resolver == nil {
		return rep, errors.Join(errs...)
	}
	// Each pass asks about the next page of the review queue, wrapping
	// around at its end, so that keys left for a human do not keep the
	// resolver from ever reaching the ones behind them.
	e.resolveMu.Lock()
	cursor := e.resolveCursor
	e.resolveMu.Unlock()
	page, err := e.store.List(ctx, idemstore.ListParams{State: idemstore.StateNeedsReview, Limit: opts.Limit, Cursor: cursor})
	if err != nil {
		return rep, errors.Join(append(errs, err)...)
	}
	e.resolveMu.Lock()
	e.resolveCursor = page.NextCursor
	e.resolveMu.Unlock()
	for _, rec := range page.Records {
		if err := e.open(ctx, rec); err != nil {
			rep.Unknown++ // logged; a resolver is not asked about what it cannot read
			continue
		}
		res, err := opts.Resolver.Resolve(ctx, rec)
		if err != nil {
			e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: resolver failed", digestAttr(rec.Key), slog.Any("error", err))
			rep.Unknown++
			continue
		}
		// Fenced by the token of the attempt the resolver was asked about:
		// if that attempt was released and a retry went to review since,
		// this verdict is not about it.
		p := idemstore.ResolveParams{Key: rec.Key, Token: rec.Token, Reason: res.Reason}
		switch res.Verdict {
		case VerdictCompleted:
			if res.Response == nil {
				rep.Unknown++
				continue
			}
			if p.Response, err = e.sealResponse(rec.Key, res.Response); err != nil {
				errs = append(errs, err)
				continue
			}
			p.Action = idemstore.ResolveComplete
			p.Retention = e.cfg.Retention
		case VerdictNotHappened:
			p.Action = idemstore.ResolveRelease
		default:
			rep.Unknown++
			continue
		}
		err = e.store.Resolve(ctx, p)
		switch {
		case err == nil && p.Action == idemstore.ResolveComplete:
			rep.Completed++
		case err == nil:
			rep.Reopened++
		case errors.Is(err, idemstore.ErrNotNeedsReview), errors.Is(err, idemstore.ErrNotFound), errors.Is(err, idemstore.ErrLeaseLost):
			// Someone else settled it first, or it is another attempt now.
		default:
			errs = append(errs, err)
		}
	}
	return rep, errors.Join(errs...)
}

// escalatedUnder reports whether key's record is in review under token: an
// Escalate that returned an error was applied all the same.
func (e *Engine) escalatedUnder(ctx context.Context, key Key, token string) bool {
	rec, err := e.store.Get(ctx, key)
	return err == nil && rec.State == idemstore.StateNeedsReview && rec.Token == token
}

// ResolveRecord settles one needs_review record by hand, as an operator
// would: with a response (the operation happened) or with nil (it did not,
// so the key is released).
func (e *Engine) ResolveRecord(ctx context.Context, key Key, resp *Response, reason string) error {
	p := idemstore.ResolveParams{Key: key, Action: idemstore.ResolveRelease, Reason: reason}
	if resp != nil {
		sealed, err := e.sealResponse(key, resp)
		if err != nil {
			return err
		}
		p.Action = idemstore.ResolveComplete
		p.Response = sealed
		p.Retention = e.cfg.Retention
	}
	return e.store.Resolve(ctx, p)
}
