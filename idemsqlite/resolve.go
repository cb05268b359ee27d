package idemsqlite

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idem-dev/idem/idemstore"
)

// Resolve settles a needs_review record: with idemstore.ResolveComplete it
// stores p.Response and p.Reason and completes the record (expiring at
// p.ExpiresAt); with idemstore.ResolveRelease it deletes it. A missing record
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
		res, err = s.db.ExecContext(ctx, `UPDATE idem_records
			SET state = 'completed', response = ?, reason = COALESCE(NULLIF(?, ''), reason), expires_at = ?
			WHERE scope = ? AND operation = ? AND "key" = ? AND state = 'needs_review'`,
			idemstore.EncodeResponse(p.Response), p.Reason, nullMillis(p.ExpiresAt),
			p.Key.Scope, p.Key.Operation, p.Key.Key)
	case idemstore.ResolveRelease:
		res, err = s.db.ExecContext(ctx, `DELETE FROM idem_records
			WHERE scope = ? AND operation = ? AND "key" = ? AND state = 'needs_review'`,
			p.Key.Scope, p.Key.Operation, p.Key.Key)
	default:
		return errorf("Resolve: unknown action %d", p.Action)
	}
	err = fenced(ctx, res, err)
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		return err
	}
	// Nothing matched: say why. The record is only read to choose the
	// error; it was not changed.
	var state string
	err = s.db.QueryRowContext(ctx, `SELECT state FROM idem_records
		WHERE scope = ? AND operation = ? AND "key" = ?`, p.Key.Scope, p.Key.Operation, p.Key.Key).Scan(&state)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return idemstore.ErrNotFound
	case err != nil:
		return interpretError(ctx, err)
	case state == string(idemstore.StateNeedsReview):
		// Released and escalated again between the two statements: the
		// caller may look again.
		return idemstore.ErrRetryable
	default:
		return idemstore.ErrNotNeedsReview
	}
}
