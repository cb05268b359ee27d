package idempg

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-dev/idem/idemstore"
)

// dbtx is what the statements need from a pool or a transaction, so that
// Complete and CompleteTx share one path.
type dbtx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Complete stores p.Response and moves the record to completed, expiring
// p.Retention after the server's now, fenced by p.Token. It does not look
// at the lease deadline: the token alone fences. It returns
// idemstore.ErrLeaseLost when the record is no longer pending under that
// token.
func (s *Store) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	return s.complete(ctx, s.pool, p)
}

// CompleteTx stores the answer inside the caller's transaction tx, so that
// the business change and the stored answer commit together or not at all.
// It asks lease for the completion to apply (lease.PrepareTxComplete) and
// runs the same fenced update as Complete, with the server's clock at that
// statement (not at the start of tx). On idemstore.ErrLeaseLost the caller
// must roll tx back. Waiters are notified when tx commits.
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, lease idemstore.TxLease, resp *idemstore.Response) error {
	p, err := lease.PrepareTxComplete(resp)
	if err != nil {
		return err
	}
	return s.complete(ctx, tx, p)
}

func (s *Store) complete(ctx context.Context, db dbtx, p idemstore.CompleteParams) error {
	if p.Response == nil {
		return errors.New("idempg: complete: nil Response")
	}
	k := p.Key
	return s.fenced(ctx, db, s.q.complete, k,
		k.Scope, k.Operation, k.Key, p.Token, idemstore.EncodeResponse(p.Response), p.Retention)
}

// fenced runs one of the notifying CTE statements and maps "no row" to
// idemstore.ErrLeaseLost.
func (s *Store) fenced(ctx context.Context, db dbtx, sql string, k idemstore.Key, args ...any) error {
	if s.q.notify {
		args = append(args, s.cfg.Channel, notifyPayload(k))
	}
	err := db.QueryRow(ctx, sql, args...).Scan(nil)
	if errors.Is(err, pgx.ErrNoRows) {
		return idemstore.ErrLeaseLost
	}
	return interpretError(ctx, err)
}

// Release deletes the record if it is still pending under p.Token (and,
// with p.IfExpired, its lease has expired by the server's clock). A record
// that was completed (for instance by a transaction whose acknowledgement
// was lost) is left alone and idemstore.ErrLeaseLost is returned.
func (s *Store) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	k, sql := p.Key, s.q.release
	if p.IfExpired {
		sql = s.q.releaseExpired
	}
	return s.fenced(ctx, s.pool, sql, k, k.Scope, k.Operation, k.Key, p.Token)
}

// Escalate moves a pending record to needs_review with p.Reason, fenced by
// p.Token (and, with p.IfExpired, only once its lease has expired by the
// server's clock).
func (s *Store) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	k, sql := p.Key, s.q.escalate
	if p.IfExpired {
		sql = s.q.escalateExpired
	}
	return s.fenced(ctx, s.pool, sql, k, k.Scope, k.Operation, k.Key, p.Token, p.Reason)
}

// Extend moves the lease deadline of a pending record to the server's now
// plus p.Lease, fenced by p.Token.
func (s *Store) Extend(ctx context.Context, p idemstore.ExtendParams) error {
	k := p.Key
	tag, err := s.pool.Exec(ctx, s.q.extend, k.Scope, k.Operation, k.Key, p.Token, p.Lease)
	if err != nil {
		return interpretError(ctx, err)
	}
	if tag.RowsAffected() == 0 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// Takeover gives a pending record whose lease has expired by the server's
// clock a new token and a lease of p.Lease from now, fenced by p.OldToken.
// Of concurrent takeovers exactly one succeeds; the others get
// idemstore.ErrLeaseLost.
func (s *Store) Takeover(ctx context.Context, p idemstore.TakeoverParams) error {
	k := p.Key
	return s.fenced(ctx, s.pool, s.q.takeover, k,
		k.Scope, k.Operation, k.Key, p.OldToken, p.NewToken, p.Lease)
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
		err = s.fenced(ctx, s.pool, s.q.resolveComplete, k, k.Scope, k.Operation, k.Key,
			idemstore.EncodeResponse(p.Response), p.Retention, p.Reason)
	case idemstore.ResolveRelease:
		err = s.fenced(ctx, s.pool, s.q.resolveRelease, k, k.Scope, k.Operation, k.Key)
	default:
		return errors.New("idempg: resolve: unknown action")
	}
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		return err
	}
	return s.wrongState(ctx, k, idemstore.ErrNotNeedsReview)
}

// Delete removes a completed record before its retention ends. A missing
// record gives idemstore.ErrNotFound, a pending or needs_review one
// idemstore.ErrNotCompleted.
func (s *Store) Delete(ctx context.Context, k idemstore.Key) error {
	tag, err := s.pool.Exec(ctx, s.q.deleteCompleted, k.Scope, k.Operation, k.Key)
	if err != nil {
		return interpretError(ctx, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	return s.wrongState(ctx, k, idemstore.ErrNotCompleted)
}

// wrongState explains why a change conditioned on the record's state
// changed nothing: idemstore.ErrNotFound if there is no record for k,
// wrong otherwise.
func (s *Store) wrongState(ctx context.Context, k idemstore.Key, wrong error) error {
	var state string
	err := s.pool.QueryRow(ctx, s.q.state, k.Scope, k.Operation, k.Key).Scan(&state)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return idemstore.ErrNotFound
	case err != nil:
		return interpretError(ctx, err)
	}
	return wrong
}
