package idempg

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// dbtx is what the statements need from a pool or a transaction, so that
// Complete and CompleteTx share one path.
type dbtx interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Complete stores p.Response and moves the record to completed, expiring
// p.Retention after the server's now, fenced by p.Token. It does not look
// at the lease deadline: the token alone fences. It returns
// idemstore.ErrLeaseLost when the record is no longer pending under that
// token.
func (s *Store) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	if s.batch != nil && p.Response != nil {
		return s.do(ctx, groupcommit.CompleteOp(p))
	}
	return s.complete(ctx, readCommitted{s}, s.q.complete, p)
}

// CompleteTx stores the answer inside the caller's transaction tx, so that
// the business change and the stored answer commit together or not at all.
// It asks lease for the completion to apply (lease.PrepareTxComplete) and
// runs the same fenced update as Complete, with the server's clock at that
// statement (not at the start of tx). On idemstore.ErrLeaseLost the caller
// must roll tx back. Waiters are notified when tx commits.
//
// It works at every isolation level. At REPEATABLE READ and SERIALIZABLE,
// PostgreSQL fails an update of a row that another transaction changed
// since tx's snapshot; heartbeats and waiters never change the record's row
// (see the package documentation), so that only happens when the lease was
// really lost (taken over, released, escalated), and CompleteTx then
// returns idemstore.ErrLeaseLost rather than the serialization failure. A
// CompleteTx at those levels always notifies at commit, since its snapshot
// cannot see a waiter that subscribed after tx began.
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, lease idemstore.TxLease, resp *idemstore.Response) error {
	p, err := lease.PrepareTxComplete(resp)
	if err != nil {
		return err
	}
	return s.complete(ctx, tx, s.q.completeTx, p)
}

func (s *Store) complete(ctx context.Context, db dbtx, sql string, p idemstore.CompleteParams) error {
	if p.Response == nil {
		return errors.New("idempg: complete: nil Response")
	}
	k := p.Key
	err := s.fenced(ctx, db, sql, k, k.Scope, k.Operation, k.Key, p.Token, idemstore.EncodeResponse(p.Response), p.Retention)
	conflict := updateConflict(err)
	if conflict == nil {
		return err
	}
	// The record's row changed after the snapshot. If it is no longer
	// pending under the token, the lease was lost: say so, as READ
	// COMMITTED would. Otherwise it is a plain serialization failure.
	var gone bool
	switch qerr := s.pool.QueryRow(ctx, s.q.pending, k.Scope, k.Operation, k.Key, p.Token).Scan(); {
	case errors.Is(qerr, pgx.ErrNoRows):
		gone = true
	case qerr != nil:
		return err
	}
	if gone {
		return fmt.Errorf("%w: %w", idemstore.ErrLeaseLost, conflict)
	}
	return err
}

// updateConflict returns the serialization failure in err, if any: what a
// statement at REPEATABLE READ or SERIALIZABLE gets when the row it
// updates changed after its snapshot.
func updateConflict(err error) *pgconn.PgError {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "40001" {
		return pgErr
	}
	return nil
}

// notifyArgs appends to args, the arguments of a settling statement for k,
// the channel and payload it notifies waiters with, if notifications are on.
func (s *Store) notifyArgs(k idemstore.Key, args []any) []any {
	if !s.cfg.DisableNotify {
		args = append(args, s.cfg.Channel, notifyPayload(k))
	}
	return args
}

// fenced runs one of the settling CTE statements and maps "no row" to
// idemstore.ErrLeaseLost.
func (s *Store) fenced(ctx context.Context, db dbtx, sql string, k idemstore.Key, args ...any) error {
	err := db.QueryRow(ctx, sql, s.notifyArgs(k, args)...).Scan(nil)
	if errors.Is(err, pgx.ErrNoRows) {
		return idemstore.ErrLeaseLost
	}
	return interpretError(ctx, err)
}

// Resolve settles a needs_review record: it completes it with p.Response
// (and p.Reason, expiring p.Retention after now) or deletes it. A missing
// record gives idemstore.ErrNotFound, a record in another state
// idemstore.ErrNotNeedsReview.
func (s *Store) Resolve(ctx context.Context, p idemstore.ResolveParams) error {
	k := p.Key
	var err error
	switch p.Action {
	case idemstore.ResolveComplete:
		if p.Response == nil {
			return errors.New("idempg: resolve: ResolveComplete needs a Response")
		}
		err = s.fenced(ctx, readCommitted{s}, s.q.resolveComplete, k, k.Scope, k.Operation, k.Key,
			idemstore.EncodeResponse(p.Response), p.Retention, p.Reason, p.Token)
	case idemstore.ResolveRelease:
		err = s.fenced(ctx, readCommitted{s}, s.q.resolveRelease, k, k.Scope, k.Operation, k.Key, p.Token)
	default:
		return errors.New("idempg: resolve: unknown action")
	}
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		return err
	}
	return s.wrongState(ctx, k, idemstore.ErrNotNeedsReview, idemstore.StateNeedsReview, p.Token)
}

// Delete removes a completed record (and its side rows) before its
// retention ends (with p.Token, only the answer stored under that token).
// A missing record gives idemstore.ErrNotFound, a pending or needs_review
// one idemstore.ErrNotCompleted, one completed under another token
// idemstore.ErrLeaseLost.
func (s *Store) Delete(ctx context.Context, p idemstore.DeleteParams) error {
	k := p.Key
	var n int
	if err := (readCommitted{s}).QueryRow(ctx, s.q.deleteCompleted, k.Scope, k.Operation, k.Key, p.Token).Scan(&n); err != nil {
		return interpretError(ctx, err)
	}
	if n == 1 {
		return nil
	}
	return s.wrongState(ctx, k, idemstore.ErrNotCompleted, idemstore.StateCompleted, p.Token)
}

// wrongState explains why a change conditioned on the record's state (want)
// and token (when not empty) changed nothing: idemstore.ErrNotFound if there
// is no record for k, else what idemstore.Unmatched says.
func (s *Store) wrongState(ctx context.Context, k idemstore.Key, wrong error, want idemstore.State, token string) error {
	var state, tok string
	err := s.pool.QueryRow(ctx, s.q.state, k.Scope, k.Operation, k.Key).Scan(&state, &tok)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return idemstore.ErrNotFound
	case err != nil:
		return interpretError(ctx, err)
	}
	return idemstore.Unmatched(idemstore.State(state), tok, want, token, wrong)
}
