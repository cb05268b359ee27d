package idemmem

import (
	"context"
	"errors"

	"github.com/idem-dev/idem/idemstore"
)

// fenced runs change on the record for key if it is pending under token,
// and wakes the key's waiters. The change runs under the shard lock. It
// returns idemstore.ErrLeaseLost when the record is missing or not pending
// under token.
func (s *Store) fenced(ctx context.Context, key idemstore.Key, token string, change func(sh *shard, h uint64, e *entry)) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	sh, h := s.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.lookup(h, key)
	if e == nil || e.rec.State != idemstore.StatePending || e.rec.Token != token {
		return idemstore.ErrLeaseLost
	}
	change(sh, h, e)
	sh.wake(key)
	return nil
}

var errNilResponse = errors.New("idemmem: Complete needs a response")

// Complete stores p.Response and moves the record to completed, fenced by
// p.Token. The lease deadline is not checked: the token alone fences. The
// answer is kept encoded, so the caller may reuse p.Response afterwards;
// readers always get a copy.
func (s *Store) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	if p.Response == nil {
		return errNilResponse
	}
	resp := idemstore.EncodeResponse(p.Response) // outside the lock
	return s.fenced(ctx, p.Key, p.Token, func(sh *shard, h uint64, e *entry) {
		sh.complete(h, e, resp, p.ExpiresAt)
	})
}

// Release deletes the record if it is still pending under token.
func (s *Store) Release(ctx context.Context, key idemstore.Key, token string) error {
	return s.fenced(ctx, key, token, func(sh *shard, h uint64, e *entry) {
		sh.drop(s, h, e)
	})
}

// Escalate moves a pending record to needs_review with p.Reason, fenced by
// p.Token.
func (s *Store) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	return s.fenced(ctx, p.Key, p.Token, func(_ *shard, _ uint64, e *entry) {
		e.rec.State = idemstore.StateNeedsReview
		e.rec.Reason = p.Reason
	})
}

// Extend moves the lease deadline of a pending record, fenced by p.Token.
func (s *Store) Extend(ctx context.Context, p idemstore.ExtendParams) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	sh, h := s.locate(p.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.lookup(h, p.Key)
	if e == nil || e.rec.State != idemstore.StatePending || e.rec.Token != p.Token {
		return idemstore.ErrLeaseLost
	}
	// Nothing a waiter cares about changed, so nobody is woken.
	e.rec.LeaseUntil = p.LeaseUntil.UTC()
	return nil
}

// Takeover gives a pending record whose lease expired at or before p.Now a
// new token and lease, fenced by p.OldToken.
func (s *Store) Takeover(ctx context.Context, p idemstore.TakeoverParams) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	sh, h := s.locate(p.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.lookup(h, p.Key)
	if e == nil || e.rec.State != idemstore.StatePending || e.rec.Token != p.OldToken || e.rec.LeaseUntil.After(p.Now) {
		return idemstore.ErrLeaseLost
	}
	e.rec.Token = p.NewToken
	e.rec.LeaseUntil = p.LeaseUntil.UTC()
	sh.wake(p.Key)
	return nil
}

// Resolve settles a needs_review record: it completes it with p.Response
// (kept encoded) or deletes it.
func (s *Store) Resolve(ctx context.Context, p idemstore.ResolveParams) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	switch p.Action {
	case idemstore.ResolveComplete:
		if p.Response == nil {
			return errResolveNoResponse
		}
	case idemstore.ResolveRelease:
	default:
		return errors.New("idemmem: unknown ResolveAction")
	}
	sh, h := s.locate(p.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.lookup(h, p.Key)
	if e == nil {
		return idemstore.ErrNotFound
	}
	if e.rec.State != idemstore.StateNeedsReview {
		return idemstore.ErrNotNeedsReview
	}
	if p.Action == idemstore.ResolveRelease {
		sh.drop(s, h, e)
	} else {
		if p.Reason != "" {
			e.rec.Reason = p.Reason
		}
		sh.complete(h, e, idemstore.EncodeResponse(p.Response), p.ExpiresAt)
	}
	sh.wake(p.Key)
	return nil
}
