package idemsqlite

import (
	"context"
	"database/sql"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// Complete stores p.Response and moves the record to completed, if it is
// still pending under p.Token; otherwise it returns idemstore.ErrLeaseLost
// and changes nothing. The lease deadline is not checked: the token alone
// fences.
func (s *Store) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	if s.batch != nil {
		return s.do(ctx, groupcommit.CompleteOp(p))
	}
	return s.complete(ctx, s.q, p)
}

// CompleteTx completes the lease inside tx, the caller's own transaction on
// the same database, so that the business change and the stored answer
// commit together or not at all. It asks lease for the completion to apply
// (lease.PrepareTxComplete) and runs the same fenced update as Complete. On
// idemstore.ErrLeaseLost (the lease was taken over or the record is no
// longer pending) the caller must roll tx back.
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, lease idemstore.TxLease, resp *idemstore.Response) error {
	if tx == nil {
		return errorf("CompleteTx: nil *sql.Tx")
	}
	if lease == nil {
		return errorf("CompleteTx: nil lease")
	}
	p, err := lease.PrepareTxComplete(resp)
	if err != nil {
		return err
	}
	return s.complete(ctx, tx, p)
}

// complete is the fenced completion shared by Complete and CompleteTx.
func (s *Store) complete(ctx context.Context, ex querier, p idemstore.CompleteParams) error {
	now := s.now()
	res, err := ex.ExecContext(ctx, `UPDATE idem_records
		SET state = 'completed', response = ?, expires_at = ?, updated_at = ?
		WHERE scope = ? AND operation = ? AND "key" = ? AND state = 'pending' AND token = ?`,
		idemstore.EncodeResponse(p.Response), millis(now.Add(p.Retention)), millis(now),
		p.Key.Scope, p.Key.Operation, p.Key.Key, p.Token)
	return fenced(ctx, res, err)
}

// fenced turns the result of a fenced statement into nil, when it changed
// the record, or idemstore.ErrLeaseLost, when it matched no row.
func fenced(ctx context.Context, res sql.Result, err error) error {
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
