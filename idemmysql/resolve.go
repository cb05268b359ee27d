package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
)

const (
	resolveCompleteSQL = "UPDATE idem_records SET state = 'completed', response = ?, expires_at = " + nowPlus +
		", updated_at = " + nowMillis + ", reason = COALESCE(NULLIF(?, ''), reason) WHERE " + byKey + " AND state = 'needs_review' AND (? = '' OR token = ?)"
	resolveReleaseSQL = "DELETE FROM idem_records WHERE " + byKey + " AND state = 'needs_review' AND (? = '' OR token = ?)"
	deleteSQL         = "DELETE FROM idem_records WHERE " + byKey + " AND state = 'completed' AND (? = '' OR token = ?)"
	stateSQL          = "SELECT state, token FROM idem_records WHERE " + byKey
)

// Resolve settles a needs_review record: it completes it with p.Response
// (and p.Reason), to expire p.Retention after the server's now, or deletes
// it. A missing record gives idemstore.ErrNotFound, a record in another
// state idemstore.ErrNotNeedsReview.
func (s *Store) Resolve(ctx context.Context, p idemstore.ResolveParams) error {
	var err error
	switch p.Action {
	case idemstore.ResolveComplete:
		if p.Response == nil {
			return errors.New("idemmysql: resolve: ResolveComplete needs a Response")
		}
		if len(p.Reason) > MaxReasonLen {
			return fmt.Errorf("idemmysql: reason is %d bytes, at most %d fit", len(p.Reason), MaxReasonLen)
		}
		err = execFenced(ctx, s.db, resolveCompleteSQL, append(append([]any{
			idemstore.EncodeResponse(p.Response), millis(p.Retention), p.Reason}, keyArgs(p.Key)...), p.Token, p.Token)...)
	case idemstore.ResolveRelease:
		err = execFenced(ctx, s.db, resolveReleaseSQL, append(keyArgs(p.Key), p.Token, p.Token)...)
	default:
		return errors.New("idemmysql: resolve: unknown action")
	}
	return s.whyNot(ctx, p.Key, err, idemstore.ErrNotNeedsReview, idemstore.StateNeedsReview, p.Token)
}

// Delete removes a completed record before its retention ends (with
// p.Token, only the answer stored under that token). A missing record
// gives idemstore.ErrNotFound, a pending or needs_review one
// idemstore.ErrNotCompleted, one completed under another token
// idemstore.ErrLeaseLost.
func (s *Store) Delete(ctx context.Context, p idemstore.DeleteParams) error {
	err := execFenced(ctx, s.db, deleteSQL, append(keyArgs(p.Key), p.Token, p.Token)...)
	return s.whyNot(ctx, p.Key, err, idemstore.ErrNotCompleted, idemstore.StateCompleted, p.Token)
}

// whyNot passes err on, unless it says that a statement conditioned on the
// record's state (want) and token (when not empty) changed nothing
// (idemstore.ErrLeaseLost from execFenced): then it reads the record and
// returns idemstore.ErrNotFound if it is gone, or what idemstore.Unmatched
// says.
func (s *Store) whyNot(ctx context.Context, k idemstore.Key, err, wrongState error, want idemstore.State, token string) error {
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		return err
	}
	var state, tok string
	err = s.db.QueryRowContext(ctx, stateSQL, keyArgs(k)...).Scan(&state, &tok)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return idemstore.ErrNotFound
	case err != nil:
		return interpretError(ctx, err)
	}
	return idemstore.Unmatched(idemstore.State(state), tok, want, token, wrongState)
}
