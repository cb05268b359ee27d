package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
)

// fence is the condition every change of a pending record is tied to; its
// arguments are keyArgs(k, token).
const fence = byKey + " AND state = 'pending' AND token = ?"

const (
	completeSQL = "UPDATE idem_records SET state = 'completed', response = ?, expires_at = ? WHERE " + fence
	releaseSQL  = "DELETE FROM idem_records WHERE " + fence
	escalateSQL = "UPDATE idem_records SET state = 'needs_review', reason = ? WHERE " + fence
	extendSQL   = "UPDATE idem_records SET lease_until = ? WHERE " + fence
	takeoverSQL = "UPDATE idem_records SET token = ?, lease_until = ? WHERE " + fence + " AND lease_until <= ?"
	// extendedSQL tells a no-op Extend (same deadline: MySQL reports zero
	// changed rows) from a lost lease.
	extendedSQL = "SELECT 1 FROM idem_records WHERE " + fence + " AND lease_until = ?"

	resolveCompleteSQL = "UPDATE idem_records SET state = 'completed', response = ?, expires_at = ?, reason = COALESCE(NULLIF(?, ''), reason) WHERE " + byKey + " AND state = 'needs_review'"
	resolveReleaseSQL  = "DELETE FROM idem_records WHERE " + byKey + " AND state = 'needs_review'"
	stateSQL           = "SELECT state FROM idem_records WHERE " + byKey
)

// dbtx is what the statements need from a *sql.DB or a *sql.Tx, so that
// Complete and CompleteTx share one path.
type dbtx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Complete stores p.Response and moves the record to completed, fenced by
// p.Token. It does not look at the lease deadline: the token alone fences.
// It returns idemstore.ErrLeaseLost when the record is no longer pending
// under that token.
func (s *Store) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	return complete(ctx, s.db, p)
}

// CompleteTx stores the answer inside the caller's transaction tx, so that
// the business change and the stored answer commit together or not at all.
// It asks lease for the completion to apply (lease.PrepareTxComplete) and
// runs the same fenced update as Complete. On idemstore.ErrLeaseLost the
// caller must roll tx back.
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, lease idemstore.TxLease, resp *idemstore.Response) error {
	p, err := lease.PrepareTxComplete(resp)
	if err != nil {
		return err
	}
	return complete(ctx, tx, p)
}

func complete(ctx context.Context, db dbtx, p idemstore.CompleteParams) error {
	return execFenced(ctx, db, completeSQL,
		idemstore.EncodeResponse(p.Response), nullMillis(p.ExpiresAt), p.Key.Scope, p.Key.Operation, p.Key.Key, p.Token)
}

// execFenced runs a fenced change and maps "no row changed" to
// idemstore.ErrLeaseLost.
func execFenced(ctx context.Context, db dbtx, query string, args ...any) error {
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		return interpretError(ctx, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return interpretError(ctx, err)
	}
	if n == 0 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// Release deletes the record if it is still pending under token. A record
// that was completed (for instance by a transaction whose acknowledgement
// was lost) is left alone and idemstore.ErrLeaseLost is returned.
func (s *Store) Release(ctx context.Context, k idemstore.Key, token string) error {
	return execFenced(ctx, s.db, releaseSQL, keyArgs(k, token)...)
}

// Escalate moves a pending record to needs_review with p.Reason, fenced by
// p.Token.
func (s *Store) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	if len(p.Reason) > MaxReasonLen {
		return fmt.Errorf("idemmysql: reason is %d bytes, at most %d fit", len(p.Reason), MaxReasonLen)
	}
	return execFenced(ctx, s.db, escalateSQL, append([]any{p.Reason}, keyArgs(p.Key, p.Token)...)...)
}

// Extend moves the lease deadline of a pending record to p.LeaseUntil,
// fenced by p.Token.
func (s *Store) Extend(ctx context.Context, p idemstore.ExtendParams) error {
	until := millis(p.LeaseUntil)
	err := execFenced(ctx, s.db, extendSQL, append([]any{until}, keyArgs(p.Key, p.Token)...)...)
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		return err
	}
	// MySQL counts changed rows, not matched ones: an Extend to the
	// deadline the record already has changes nothing but is no lost lease.
	var one int
	err = s.db.QueryRowContext(ctx, extendedSQL, keyArgs(p.Key, p.Token, until)...).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return idemstore.ErrLeaseLost
	}
	return interpretError(ctx, err)
}

// Takeover gives a pending record whose lease expired at or before p.Now a
// new token and lease deadline, fenced by p.OldToken. Of concurrent
// takeovers exactly one succeeds; the others get idemstore.ErrLeaseLost.
func (s *Store) Takeover(ctx context.Context, p idemstore.TakeoverParams) error {
	if len(p.NewToken) > MaxTokenLen {
		return fmt.Errorf("idemmysql: token is %d bytes, at most %d fit", len(p.NewToken), MaxTokenLen)
	}
	return execFenced(ctx, s.db, takeoverSQL, p.NewToken, millis(p.LeaseUntil),
		p.Key.Scope, p.Key.Operation, p.Key.Key, p.OldToken, millis(p.Now))
}

// Resolve settles a needs_review record: it completes it with p.Response
// (and p.Reason, p.ExpiresAt) or deletes it. A missing record gives
// idemstore.ErrNotFound, a record in another state
// idemstore.ErrNotNeedsReview.
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
		err = execFenced(ctx, s.db, resolveCompleteSQL, append([]any{
			idemstore.EncodeResponse(p.Response), nullMillis(p.ExpiresAt), p.Reason}, keyArgs(p.Key)...)...)
	case idemstore.ResolveRelease:
		err = execFenced(ctx, s.db, resolveReleaseSQL, keyArgs(p.Key)...)
	default:
		return errors.New("idemmysql: resolve: unknown action")
	}
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		return err
	}
	var state string
	err = s.db.QueryRowContext(ctx, stateSQL, keyArgs(p.Key)...).Scan(&state)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return idemstore.ErrNotFound
	case err != nil:
		return interpretError(ctx, err)
	}
	return idemstore.ErrNotNeedsReview
}
