package idemsqlite

import (
	"context"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// Release deletes the record if it is still pending under p.Token (and,
// with p.IfExpired, its lease has expired by the store's clock). A record
// that was completed, escalated, taken over or extended past now is left
// alone and idemstore.ErrLeaseLost is returned.
func (s *Store) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	if s.batch != nil && !p.IfExpired {
		return s.do(ctx, groupcommit.ReleaseOp(p))
	}
	return s.release(ctx, s.q, p)
}

func (s *Store) release(ctx context.Context, ex querier, p idemstore.ReleaseParams) error {
	res, err := ex.ExecContext(ctx, `DELETE FROM idem_records
		WHERE scope = ? AND operation = ? AND "key" = ? AND state = 'pending' AND token = ?
		AND (? = 0 OR lease_until <= ?)`,
		p.Key.Scope, p.Key.Operation, p.Key.Key, p.Token, p.IfExpired, millis(s.now()))
	return fenced(ctx, res, err)
}

// Escalate moves a record pending under p.Token (whose lease has expired,
// with p.IfExpired) to needs_review with p.Reason, or returns
// idemstore.ErrLeaseLost.
func (s *Store) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	if s.batch != nil && !p.IfExpired {
		return s.do(ctx, groupcommit.EscalateOp(p))
	}
	return s.escalate(ctx, s.q, p)
}

func (s *Store) escalate(ctx context.Context, ex querier, p idemstore.EscalateParams) error {
	now := millis(s.now())
	res, err := ex.ExecContext(ctx, `UPDATE idem_records SET state = 'needs_review', reason = ?, updated_at = ?
		WHERE scope = ? AND operation = ? AND "key" = ? AND state = 'pending' AND token = ?
		AND (? = 0 OR lease_until <= ?)`,
		p.Reason, now, p.Key.Scope, p.Key.Operation, p.Key.Key, p.Token, p.IfExpired, now)
	return fenced(ctx, res, err)
}

// Extend moves the lease deadline of a record pending under p.Token to now
// plus p.Lease, or returns idemstore.ErrLeaseLost.
func (s *Store) Extend(ctx context.Context, p idemstore.ExtendParams) error {
	if s.batch != nil {
		return s.do(ctx, groupcommit.ExtendOp(p))
	}
	return s.extend(ctx, s.q, p)
}

func (s *Store) extend(ctx context.Context, ex querier, p idemstore.ExtendParams) error {
	now := s.now()
	res, err := ex.ExecContext(ctx, `UPDATE idem_records SET lease_until = ?, updated_at = ?
		WHERE scope = ? AND operation = ? AND "key" = ? AND state = 'pending' AND token = ?`,
		millis(now.Add(p.Lease)), millis(now), p.Key.Scope, p.Key.Operation, p.Key.Key, p.Token)
	return fenced(ctx, res, err)
}

// Takeover gives a record pending under p.OldToken whose lease has expired
// the token p.NewToken and a lease of p.Lease from now. One statement does
// the check and the change, so of several concurrent takeovers exactly one
// succeeds; the others, and a takeover of a live lease, get
// idemstore.ErrLeaseLost.
func (s *Store) Takeover(ctx context.Context, p idemstore.TakeoverParams) error {
	now := s.now()
	res, err := s.db.ExecContext(ctx, `UPDATE idem_records SET token = ?, lease_until = ?, updated_at = ?
		WHERE scope = ? AND operation = ? AND "key" = ? AND state = 'pending' AND token = ?
		AND lease_until <= ?`,
		p.NewToken, millis(now.Add(p.Lease)), millis(now), p.Key.Scope, p.Key.Operation, p.Key.Key, p.OldToken, millis(now))
	return fenced(ctx, res, err)
}
