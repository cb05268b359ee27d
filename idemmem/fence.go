package idemmem

import (
	"context"
	"errors"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// fenced runs change on the record for key if it is pending under token
// (and, with ifExpired, its lease has expired by the store's clock), and
// wakes the key's waiters. The change runs under the shard lock, given the
// store's now. It returns idemstore.ErrLeaseLost when the record is missing
// or the condition does not hold.
func (s *Store) fenced(ctx context.Context, key idemstore.Key, token string, ifExpired bool, change func(sh *shard, h uint64, e *entry, now time.Time)) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	sh, h := s.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	e := sh.lookup(h, key)
	if e == nil || e.rec.State != idemstore.StatePending || e.rec.Token != token || (ifExpired && e.rec.LeaseUntil().After(now)) {
		return idemstore.ErrLeaseLost
	}
	change(sh, h, e, now)
	return nil
}

// roomFor makes room for an answer of n bytes before it is stored, evicting
// as Reserve does. An answer is stored whether room was made or not: what
// happened must be recorded.
func (s *Store) roomFor(n int64) {
	if s.bytes.Load()+n <= s.maxBytes {
		return
	}
	now := s.now()
	for s.bytes.Load()+n > s.maxBytes {
		if !s.evictFirst(now) {
			return
		}
	}
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
	s.roomFor(int64(len(resp)))
	return s.fenced(ctx, p.Key, p.Token, false, func(sh *shard, h uint64, e *entry, now time.Time) {
		sh.complete(s, h, e, resp, now, now.Add(p.Retention))
		sh.wake(p.Key)
	})
}

// Release deletes the record if it is still pending under p.Token (and, with
// p.IfExpired, its lease has expired).
func (s *Store) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	return s.fenced(ctx, p.Key, p.Token, p.IfExpired, func(sh *shard, h uint64, e *entry, _ time.Time) {
		sh.drop(s, h, e)
		sh.wake(p.Key)
	})
}

// Escalate moves a pending record to needs_review with p.Reason, fenced by
// p.Token (and, with p.IfExpired, only once its lease has expired).
func (s *Store) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	return s.fenced(ctx, p.Key, p.Token, p.IfExpired, func(sh *shard, _ uint64, e *entry, now time.Time) {
		e.rec.State = idemstore.StateNeedsReview
		e.rec.Reason = p.Reason
		e.rec.setUpdatedAt(now)
		s.resize(e)
		sh.wake(p.Key)
	})
}

// Extend moves the lease deadline of a pending record to now + p.Lease,
// fenced by p.Token. Nothing a waiter cares about changes, so nobody is
// woken.
func (s *Store) Extend(ctx context.Context, p idemstore.ExtendParams) error {
	return s.fenced(ctx, p.Key, p.Token, false, func(_ *shard, _ uint64, e *entry, now time.Time) {
		e.rec.setLeaseUntil(now.Add(p.Lease))
		e.rec.setUpdatedAt(now)
	})
}

// Takeover gives a pending record whose lease has expired a new token and
// lease, fenced by p.OldToken.
func (s *Store) Takeover(ctx context.Context, p idemstore.TakeoverParams) error {
	return s.fenced(ctx, p.Key, p.OldToken, true, func(sh *shard, _ uint64, e *entry, now time.Time) {
		e.rec.Token = p.NewToken
		e.rec.setLeaseUntil(now.Add(p.Lease))
		e.rec.setUpdatedAt(now)
		s.resize(e)
		sh.wake(p.Key)
	})
}

// Resolve settles a needs_review record: it completes it with p.Response
// (kept encoded) or deletes it.
func (s *Store) Resolve(ctx context.Context, p idemstore.ResolveParams) error {
	switch p.Action {
	case idemstore.ResolveComplete:
		if p.Response == nil {
			return errResolveNoResponse
		}
	case idemstore.ResolveRelease:
	default:
		return errors.New("idemmem: unknown ResolveAction")
	}
	var resp []byte
	if p.Action == idemstore.ResolveComplete {
		resp = idemstore.EncodeResponse(p.Response) // outside the lock
		s.roomFor(int64(len(resp) + len(p.Reason)))
	}
	return s.inState(ctx, p.Key, idemstore.StateNeedsReview, idemstore.ErrNotNeedsReview, p.Token, func(sh *shard, h uint64, e *entry, now time.Time) {
		if p.Action == idemstore.ResolveRelease {
			sh.drop(s, h, e)
			return
		}
		if p.Reason != "" {
			e.rec.Reason = p.Reason
		}
		sh.complete(s, h, e, resp, now, now.Add(p.Retention))
	})
}

// Delete removes a completed record before its retention ends; with
// p.Token, only the answer stored under that token.
func (s *Store) Delete(ctx context.Context, p idemstore.DeleteParams) error {
	return s.inState(ctx, p.Key, idemstore.StateCompleted, idemstore.ErrNotCompleted, p.Token, func(sh *shard, h uint64, e *entry, _ time.Time) {
		sh.drop(s, h, e)
	})
}

// inState runs change on the record for key if it is in state want (and,
// when token is not empty, carries token), and wakes the key's waiters; it
// returns idemstore.ErrNotFound for a missing record, wrong for one in
// another state, and idemstore.ErrLeaseLost for one under another token.
func (s *Store) inState(ctx context.Context, key idemstore.Key, want idemstore.State, wrong error, token string, change func(sh *shard, h uint64, e *entry, now time.Time)) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	sh, h := s.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.lookup(h, key)
	if e == nil {
		return idemstore.ErrNotFound
	}
	if e.rec.State != want {
		return wrong
	}
	if token != "" && e.rec.Token != token {
		return idemstore.ErrLeaseLost
	}
	change(sh, h, e, s.now())
	sh.wake(key)
	return nil
}
