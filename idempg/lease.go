package idempg

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// Release deletes the record, and its heartbeat and waiter rows, if it is
// still pending under p.Token (and, with p.IfExpired, its lease has expired
// by the server's clock). A record that was completed (for instance by a
// transaction whose acknowledgement was lost) is left alone and
// idemstore.ErrLeaseLost is returned.
func (s *Store) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	k := p.Key
	if p.IfExpired {
		return s.ifExpired(ctx, s.q.releaseExpired, k, p.Token, k.Scope, k.Operation, k.Key, p.Token)
	}
	if s.batch != nil {
		return s.do(ctx, groupcommit.ReleaseOp(p))
	}
	return s.release(ctx, p)
}

func (s *Store) release(ctx context.Context, p idemstore.ReleaseParams) error {
	k := p.Key
	return s.fenced(ctx, readCommitted{s}, s.q.release, k, k.Scope, k.Operation, k.Key, p.Token)
}

// Escalate moves a pending record to needs_review with p.Reason, fenced by
// p.Token (and, with p.IfExpired, only once its lease has expired by the
// server's clock).
func (s *Store) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	k := p.Key
	if p.IfExpired {
		return s.ifExpired(ctx, s.q.escalateExpired, k, p.Token, k.Scope, k.Operation, k.Key, p.Token, p.Reason)
	}
	if s.batch != nil {
		return s.do(ctx, groupcommit.EscalateOp(p))
	}
	return s.escalate(ctx, p)
}

func (s *Store) escalate(ctx context.Context, p idemstore.EscalateParams) error {
	k := p.Key
	return s.fenced(ctx, readCommitted{s}, s.q.escalate, k, k.Scope, k.Operation, k.Key, p.Token, p.Reason)
}

// Extend moves the lease deadline of a pending record to the server's now
// plus p.Lease, fenced by p.Token. It writes the key's heartbeat row, never
// the record's row, so that a CompleteTx in a transaction whose snapshot
// predates the heartbeat can still update the record.
func (s *Store) Extend(ctx context.Context, p idemstore.ExtendParams) error {
	if s.batch != nil {
		return s.do(ctx, groupcommit.ExtendOp(p))
	}
	return s.extend(ctx, p)
}

func (s *Store) extend(ctx context.Context, p idemstore.ExtendParams) error {
	k := p.Key
	tag, err := readCommitted{s}.Exec(ctx, s.q.extend, k.Scope, k.Operation, k.Key, p.Token, p.Lease)
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
// idemstore.ErrLeaseLost, and so does a takeover that a heartbeat beat.
func (s *Store) Takeover(ctx context.Context, p idemstore.TakeoverParams) error {
	k := p.Key
	return s.ifExpired(ctx, s.q.takeover, k, p.OldToken, k.Scope, k.Operation, k.Key, p.OldToken, p.NewToken, p.Lease)
}

// ifExpired runs sql, a settling statement conditioned on the lease having
// expired, in a READ COMMITTED transaction of its own, after locking the
// record's row FOR UPDATE. The lock waits for a heartbeat in progress (which
// holds FOR KEY SHARE), and sql, taking its snapshot after the lock, sees
// any heartbeat that committed: an Extend and a change of an expired lease
// never both succeed. A heartbeat that comes later waits for this
// transaction and then finds the record changed.
func (s *Store) ifExpired(ctx context.Context, sql string, k idemstore.Key, token string, args ...any) error {
	var inner error // already interpreted
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, s.q.lock, k.Scope, k.Operation, k.Key, token).Scan()
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			inner = idemstore.ErrLeaseLost
		case err != nil:
			inner = interpretError(ctx, err)
		default:
			inner = s.fenced(ctx, tx, sql, k, args...)
		}
		return inner
	})
	if inner != nil {
		return inner
	}
	return interpretError(ctx, err)
}
