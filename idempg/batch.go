package idempg

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// do runs a fenced change through the batcher and returns its outcome.
func (s *Store) do(ctx context.Context, op *groupcommit.Op) error {
	if err := s.batch.Do(ctx, op); err != nil {
		return interpretError(ctx, err)
	}
	return op.Err
}

// alone are the store's calls as it makes them without batching.
func (s *Store) alone() groupcommit.Calls {
	return groupcommit.Calls{
		Reserve: s.reserveOnce,
		Complete: func(ctx context.Context, p idemstore.CompleteParams) error {
			return s.complete(ctx, s.pool, s.q.complete, p)
		},
		Release:  s.release,
		Escalate: s.escalate,
		Extend:   s.extend,
	}
}

// runBatch sends ops as one pipeline (one round trip) that PostgreSQL runs
// as one implicit transaction, committed at its end: the same statements
// as without batching, each with its own result, except that a Reserve
// reads a conflicting record in its own statement. A statement that fails
// makes the server skip the rest and roll everything back.
func (s *Store) runBatch(ctx context.Context, ops []*groupcommit.Op) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil { // nothing sent
		return groupcommit.Failed(interpretError(ctx, err))
	}
	defer conn.Release()
	var b pgx.Batch
	for _, op := range ops {
		k := op.Key
		switch op.Kind {
		case groupcommit.Reserve:
			b.Queue(s.q.reserveRead, k.Scope, k.Operation, k.Key, op.Fingerprint, op.Token, op.Lease, idemstore.EncodeRequest(op.Request))
		case groupcommit.Complete:
			b.Queue(s.q.complete, s.notifyArgs(k, []any{k.Scope, k.Operation, k.Key, op.Token, idemstore.EncodeResponse(op.Response), op.Retention})...)
		case groupcommit.Release:
			b.Queue(s.q.release, s.notifyArgs(k, []any{k.Scope, k.Operation, k.Key, op.Token})...)
		case groupcommit.Escalate:
			b.Queue(s.q.escalate, s.notifyArgs(k, []any{k.Scope, k.Operation, k.Key, op.Token, op.Reason})...)
		case groupcommit.Extend:
			b.Queue(s.q.extend, k.Scope, k.Operation, k.Key, op.Token, op.Lease)
		}
	}
	br := conn.SendBatch(ctx, &b)
	err = readBatch(br, ops)
	if cerr := br.Close(); err == nil {
		err = cerr // the commit's own error, at the end of the pipeline
	}
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) { // the server refused: it rolled back
		return groupcommit.Failed(interpretError(ctx, err))
	}
	return groupcommit.CommitUnknown("idempg", len(ops), interpretError(ctx, err))
}

// readBatch reads the result of each op's statement, in order, into its
// outcome, and returns the first error that is not an outcome.
func readBatch(br pgx.BatchResults, ops []*groupcommit.Op) error {
	for _, op := range ops {
		switch op.Kind {
		case groupcommit.Reserve:
			rows, err := br.Query()
			if err == nil {
				op.Record, op.Created, err = scanReserved(rows)
			}
			if err != nil {
				return err
			}
		case groupcommit.Extend:
			tag, err := br.Exec()
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				op.Err = idemstore.ErrLeaseLost
			}
		default:
			err := br.QueryRow().Scan(nil)
			if errors.Is(err, pgx.ErrNoRows) {
				op.Err = idemstore.ErrLeaseLost
			} else if err != nil {
				return err
			}
		}
	}
	return nil
}

// scanReserved reads the one row of reserveRead: created, or the existing
// record, or neither when that record vanished before the read.
func scanReserved(rows pgx.Rows) (rec *idemstore.Record, created bool, err error) {
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return nil, false, err
		}
		return nil, false, errors.New("idempg: reserve in a batch returned no row")
	}
	var scope *string
	dest := make([]any, 15)
	dest[0], dest[1] = &created, &scope
	if err := rows.Scan(dest...); err != nil {
		return nil, false, err
	}
	if !created && scope != nil {
		rec, err = scanRecord(afterFirst{rows})
	}
	if err != nil {
		return nil, false, err
	}
	rows.Close()
	return rec, created, rows.Err()
}

// afterFirst scans a row without its first column.
type afterFirst struct{ pgx.Rows }

func (r afterFirst) Scan(dest ...any) error {
	return r.Rows.Scan(append([]any{nil}, dest...)...)
}
