package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// fence is the condition every change of a pending record is tied to; its
// arguments are keyArgs(k, token).
const fence = byKey + " AND state = 'pending' AND token = ?"

// leaseExpired restricts a fenced statement to a record whose lease has
// expired by the server's clock, judged in that statement.
const leaseExpired = " AND lease_until <= " + nowMillis

// Every statement takes the server's now once (nowMillis is fixed for a
// statement) for the deadlines it writes, updated_at and any expiry it
// judges.
const (
	completeSQL = "UPDATE idem_records SET state = 'completed', response = ?, expires_at = " + nowPlus +
		", updated_at = " + nowMillis + " WHERE " + fence
	releaseSQL  = "DELETE FROM idem_records WHERE " + fence
	escalateSQL = "UPDATE idem_records SET state = 'needs_review', reason = ?, updated_at = " + nowMillis + " WHERE " + fence
	extendSQL   = "UPDATE idem_records SET lease_until = " + nowPlus + ", updated_at = " + nowMillis + " WHERE " + fence
	takeoverSQL = "UPDATE idem_records SET token = ?, lease_until = " + nowPlus + ", updated_at = " + nowMillis +
		" WHERE " + fence + leaseExpired
	// heldSQL tells an Extend that changed nothing (a second Extend in the
	// same millisecond writes the values the first one wrote, and MySQL
	// reports changed rows, not matched ones) from a lost lease.
	heldSQL = "SELECT 1 FROM idem_records WHERE " + fence
)

// dbtx is what the statements need from a *sql.DB or a *sql.Tx, so that
// Complete and CompleteTx share one path.
type dbtx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Complete stores p.Response and moves the record to completed, to expire
// p.Retention after the server's now; fenced by p.Token. It does not look at
// the lease deadline: the token alone fences. It returns
// idemstore.ErrLeaseLost when the record is no longer pending under that
// token.
func (s *Store) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	if s.batch != nil && p.Response != nil && len(p.Response.Body) <= maxBatchedValue {
		return s.do(ctx, groupcommit.CompleteOp(p))
	}
	return complete(ctx, s.db, p)
}

// CompleteTx stores the answer inside the caller's transaction tx, so that
// the business change and the stored answer commit together or not at all.
// It asks lease for the completion to apply (lease.PrepareTxComplete) and
// runs the same fenced update as Complete. On idemstore.ErrLeaseLost the
// caller must roll tx back.
//
// It works at every InnoDB isolation level: the UPDATE is a locking read of
// the latest committed row, not of tx's snapshot, so a heartbeat Extend that
// committed while tx was open does not make it fail. From the UPDATE to
// tx's end the row stays locked, and an Extend from another connection
// waits for tx (then finds the record completed, or, after a rollback,
// still pending and extends it).
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, lease idemstore.TxLease, resp *idemstore.Response) error {
	p, err := lease.PrepareTxComplete(resp)
	if err != nil {
		return err
	}
	return complete(ctx, tx, p)
}

func complete(ctx context.Context, db dbtx, p idemstore.CompleteParams) error {
	if p.Response == nil {
		return errors.New("idemmysql: complete: nil Response")
	}
	return execFenced(ctx, db, completeSQL,
		idemstore.EncodeResponse(p.Response), millis(p.Retention), p.Key.Scope, p.Key.Operation, p.Key.Key, p.Token)
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

// Release deletes the record if it is still pending under p.Token (and,
// with p.IfExpired, its lease has expired by the server's clock, judged in
// the DELETE). A record that was completed (for instance by a transaction
// whose acknowledgement was lost) or extended is left alone and
// idemstore.ErrLeaseLost is returned.
func (s *Store) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	if s.batch != nil && !p.IfExpired {
		return s.do(ctx, groupcommit.ReleaseOp(p))
	}
	return s.release(ctx, p)
}

func (s *Store) release(ctx context.Context, p idemstore.ReleaseParams) error {
	query := releaseSQL
	if p.IfExpired {
		query += leaseExpired
	}
	return execFenced(ctx, s.db, query, keyArgs(p.Key, p.Token)...)
}

// Escalate moves a pending record to needs_review with p.Reason, fenced by
// p.Token (and, with p.IfExpired, only once its lease has expired by the
// server's clock).
func (s *Store) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	if len(p.Reason) > MaxReasonLen {
		return fmt.Errorf("idemmysql: reason is %d bytes, at most %d fit", len(p.Reason), MaxReasonLen)
	}
	if s.batch != nil && !p.IfExpired {
		return s.do(ctx, groupcommit.EscalateOp(p))
	}
	return s.escalate(ctx, p)
}

func (s *Store) escalate(ctx context.Context, p idemstore.EscalateParams) error {
	query := escalateSQL
	if p.IfExpired {
		query += leaseExpired
	}
	return execFenced(ctx, s.db, query, append([]any{p.Reason}, keyArgs(p.Key, p.Token)...)...)
}

// Extend moves the lease deadline of a pending record to the server's now
// plus p.Lease, fenced by p.Token. It does not look at the deadline: a
// holder whose lease ran out but was not taken over keeps it.
func (s *Store) Extend(ctx context.Context, p idemstore.ExtendParams) error {
	if s.batch != nil {
		return s.do(ctx, groupcommit.ExtendOp(p))
	}
	return s.extend(ctx, p)
}

func (s *Store) extend(ctx context.Context, p idemstore.ExtendParams) error {
	err := execFenced(ctx, s.db, extendSQL, append([]any{millis(p.Lease)}, keyArgs(p.Key, p.Token)...)...)
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		return err
	}
	// Zero changed rows: either the lease is lost, or an Extend in the same
	// millisecond already wrote these values. A record still held now was
	// held at the UPDATE (tokens are never reused), and the UPDATE changed
	// nothing, so answering from this read is answering for the UPDATE.
	var one int
	err = s.db.QueryRowContext(ctx, heldSQL, keyArgs(p.Key, p.Token)...).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return idemstore.ErrLeaseLost
	}
	return interpretError(ctx, err)
}

// Takeover gives a pending record whose lease has expired by the server's
// clock a new token and a lease of p.Lease from that clock, fenced by
// p.OldToken, in one UPDATE. Of concurrent takeovers exactly one succeeds;
// the others get idemstore.ErrLeaseLost, as does a takeover of a lease an
// Extend renewed first. The UPDATE runs in a transaction of its own for
// the reason Reserve's INSERT does: it can wait for the row (the old
// holder's business transaction may hold it), and one whose caller left
// meanwhile must not be applied once the row comes free.
func (s *Store) Takeover(ctx context.Context, p idemstore.TakeoverParams) error {
	if len(p.NewToken) > MaxTokenLen {
		return fmt.Errorf("idemmysql: token is %d bytes, at most %d fit", len(p.NewToken), MaxTokenLen)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return interpretError(ctx, err)
	}
	err = execFenced(ctx, tx, takeoverSQL, p.NewToken, millis(p.Lease),
		p.Key.Scope, p.Key.Operation, p.Key.Key, p.OldToken)
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	return interpretError(ctx, tx.Commit())
}
