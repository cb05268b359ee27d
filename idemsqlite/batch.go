package idemsqlite

import (
	"context"
	"errors"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// do runs a fenced change through the batcher and returns its outcome.
func (s *Store) do(ctx context.Context, op *groupcommit.Op) error {
	if err := s.batch.Do(ctx, op); err != nil {
		return err
	}
	return op.Err
}

// calls are the store's calls through q: the store's database
// (autocommit), or a batch's transaction.
func (s *Store) calls(q querier) groupcommit.Calls {
	return groupcommit.Calls{
		Reserve: func(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
			return s.reserveOnce(ctx, q, p)
		},
		Complete: func(ctx context.Context, p idemstore.CompleteParams) error { return s.complete(ctx, q, p) },
		Release:  func(ctx context.Context, p idemstore.ReleaseParams) error { return s.release(ctx, q, p) },
		Escalate: func(ctx context.Context, p idemstore.EscalateParams) error { return s.escalate(ctx, q, p) },
		Extend:   func(ctx context.Context, p idemstore.ExtendParams) error { return s.extend(ctx, q, p) },
	}
}

// runBatch runs ops in one write transaction (BEGIN IMMEDIATE with Open's
// settings), one after another. An outcome of the contract
// (idemstore.ErrLeaseLost) is the op's own; any other error rolls the
// whole batch back.
func (s *Store) runBatch(ctx context.Context, ops []*groupcommit.Op) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return groupcommit.Failed(interpretError(ctx, err))
	}
	calls := s.calls(&txQuerier{c: s.q.c, tx: tx})
	for _, op := range ops {
		calls.Run(ctx, op)
		if op.Err != nil && !errors.Is(op.Err, idemstore.ErrLeaseLost) {
			_ = tx.Rollback()
			return groupcommit.Failed(op.Err)
		}
	}
	if err := tx.Commit(); err != nil {
		return groupcommit.CommitUnknown("idemsqlite", len(ops), interpretError(ctx, err))
	}
	return nil
}
