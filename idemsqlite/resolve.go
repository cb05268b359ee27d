package idemsqlite

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idem-dev/idem/idemstore"
)

// Resolve settles a needs_review record: with idemstore.ResolveComplete it
// stores p.Response and p.Reason and completes the record (expiring
// p.Retention from now); with idemstore.ResolveRelease it deletes it. A missing record
// gives idemstore.ErrNotFound, a record in another state
// idemstore.ErrNotNeedsReview; neither is changed.
func (s *Store) Resolve(ctx context.Context, p idemstore.ResolveParams) error {
	var (
		res sql.Result
		err error
	)
	switch p.Action {
	case idemstore.ResolveComplete:
		if p.Response == nil {
			return errorf("Resolve: ResolveComplete needs a Response")
		}
		now := s.now()
		res, err = s.db.ExecContext(ctx, `UPDATE idem_records
			SET state = 'completed', response = ?, reason = COALESCE(NULLIF(?, ''), reason), expires_at = ?, updated_at = ?
			WHERE scope = ? AND operation = ? AND "key" = ? AND state = 'needs_review' AND (? = '' OR token = ?)`,
			idemstore.EncodeResponse(p.Response), p.Reason, millis(now.Add(p.Retention)), millis(now),
			p.Key.Scope, p.Key.Operation, p.Key.Key, p.Token, p.Token)
	case idemstore.ResolveRelease:
		res, err = s.db.ExecContext(ctx, `DELETE FROM idem_records
			WHERE scope = ? AND operation = ? AND "key" = ? AND state = 'needs_review' AND (? = '' OR token = ?)`,
			p.Key.Scope, p.Key.Operation, p.Key.Key, p.Token, p.Token)
	default:
		return errorf("Resolve: unknown action %d", p.Action)
	}
	return s.explain(ctx, p.Key, fenced(ctx, res, err), idemstore.StateNeedsReview, idemstore.ErrNotNeedsReview, p.Token)
}

// Delete removes a completed record before its retention ends (with
// p.Token, only the answer stored under that token). A pending or
// needs_review record is left alone and idemstore.ErrNotCompleted is
// returned; a missing one gives idemstore.ErrNotFound, one completed under
// another token idemstore.ErrLeaseLost.
func (s *Store) Delete(ctx context.Context, p idemstore.DeleteParams) error {
	key := p.Key
	res, err := s.db.ExecContext(ctx, `DELETE FROM idem_records
		WHERE scope = ? AND operation = ? AND "key" = ? AND state = 'completed' AND (? = '' OR token = ?)`,
		key.Scope, key.Operation, key.Key, p.Token, p.Token)
	return s.explain(ctx, key, fenced(ctx, res, err), idemstore.StateCompleted, idemstore.ErrNotCompleted, p.Token)
}

// explain turns the ErrLeaseLost of a change conditioned on state want (and
// token, when not empty) into why it matched nothing: idemstore.ErrNotFound,
// wrong (another state), idemstore.ErrLeaseLost (another token), or
// idemstore.ErrRetryable when the record is as wanted again (changed
// between the two statements). Other results pass through. The record is
// only read to choose the error.
func (s *Store) explain(ctx context.Context, k idemstore.Key, err error, want idemstore.State, wrong error, token string) error {
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		return err
	}
	var state, tok string
	err = s.db.QueryRowContext(ctx, `SELECT state, token FROM idem_records
		WHERE scope = ? AND operation = ? AND "key" = ?`, k.Scope, k.Operation, k.Key).Scan(&state, &tok)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return idemstore.ErrNotFound
	case err != nil:
		return interpretError(ctx, err)
	}
	return idemstore.Unmatched(idemstore.State(state), tok, want, token, wrong)
}
