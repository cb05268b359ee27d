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

// apply runs op's statements through q and sets its outcome.
func (s *Store) apply(ctx context.Context, q querier, op *groupcommit.Op) {
	switch op.Kind {
	case groupcommit.Reserve:
		op.Record, op.Created, op.Err = s.reserveOnce(ctx, q, op.ReserveParams())
	case groupcommit.Complete:
		op.Err = s.complete(ctx, q, op.CompleteParams())
	case groupcommit.Release:
		op.Err = s.release(ctx, q, op.ReleaseParams())
	case groupcommit.Escalate:
		op.Err = s.escalate(ctx, q, op.EscalateParams())
	case groupcommit.Extend:
		op.Err = s.extend(ctx, q, op.ExtendParams())
	}
}

// single runs op alone, in autocommit, as without batching.
func (s *Store) single(ctx context.Context, op *groupcommit.Op) { s.apply(ctx, s.q, op) }

// runBatch runs ops in one write transaction (BEGIN IMMEDIATE with Open's
// settings), one after another. An outcome of the contract
// (idemstore.ErrLeaseLost) is the op's own; any other error rolls the
// whole batch back.
func (s *Store) runBatch(ctx context.Context, ops []*groupcommit.Op) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return groupcommit.Failed(interpretError(ctx, err))
	}
	q := &txQuerier{c: s.q.c, tx: tx}
	for _, op := range ops {
		s.apply(ctx, q, op)
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
