package idemsqlite

import (
	"context"

	"github.com/idem-dev/idem/idemstore"
)

// Release deletes the record if it is still pending under token. A record
// that was completed, escalated or taken over is left alone and
// idemstore.ErrLeaseLost is returned.
func (s *Store) Release(ctx context.Context, key idemstore.Key, token string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM idem_records
		WHERE scope = ? AND operation = ? AND "key" = ? AND state = 'pending' AND token = ?`,
		key.Scope, key.Operation, key.Key, token)
	return fenced(ctx, res, err)
}

// Escalate moves a record pending under p.Token to needs_review with
// p.Reason, or returns idemstore.ErrLeaseLost.
func (s *Store) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	res, err := s.db.ExecContext(ctx, `UPDATE idem_records SET state = 'needs_review', reason = ?
		WHERE scope = ? AND operation = ? AND "key" = ? AND state = 'pending' AND token = ?`,
		p.Reason, p.Key.Scope, p.Key.Operation, p.Key.Key, p.Token)
	return fenced(ctx, res, err)
}

// Extend moves the lease deadline of a record pending under p.Token to
// p.LeaseUntil, or returns idemstore.ErrLeaseLost.
func (s *Store) Extend(ctx context.Context, p idemstore.ExtendParams) error {
	res, err := s.db.ExecContext(ctx, `UPDATE idem_records SET lease_until = ?
		WHERE scope = ? AND operation = ? AND "key" = ? AND state = 'pending' AND token = ?`,
		millis(p.LeaseUntil), p.Key.Scope, p.Key.Operation, p.Key.Key, p.Token)
	return fenced(ctx, res, err)
}

// Takeover gives a record pending under p.OldToken whose lease expired at or
// before p.Now the token p.NewToken and the deadline p.LeaseUntil. One
// statement does the check and the change, so of several concurrent
// takeovers exactly one succeeds; the others, and a takeover of a live
// lease, get idemstore.ErrLeaseLost.
func (s *Store) Takeover(ctx context.Context, p idemstore.TakeoverParams) error {
	res, err := s.db.ExecContext(ctx, `UPDATE idem_records SET token = ?, lease_until = ?
		WHERE scope = ? AND operation = ? AND "key" = ? AND state = 'pending' AND token = ?
		AND lease_until <= ?`,
		p.NewToken, millis(p.LeaseUntil), p.Key.Scope, p.Key.Operation, p.Key.Key, p.OldToken, millis(p.Now))
	return fenced(ctx, res, err)
}
