package idempg

import (
	"context"
	"errors"
	"fmt"
	"time"

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
// as one implicit transaction, committed at its end. The calls go in
// rounds of distinct keys (same-key calls one round after another, in
// order); in each round, the Reserves are one statement, which also reads
// the existing records of the keys it did not insert, and the Completes
// another, each taking its calls' values as arrays; Release, Escalate and
// Extend, rare on the request path, run the statement each runs alone. A
// statement that fails makes the server skip the rest and roll everything
// back.
func (s *Store) runBatch(ctx context.Context, ops []*groupcommit.Op) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil { // nothing sent
		return groupcommit.Failed(interpretError(ctx, err))
	}
	defer conn.Release()
	var (
		b       pgx.Batch
		readers []func(pgx.BatchResults) error // one per queued statement, in order
	)
	for _, round := range groupcommit.Rounds(ops) {
		var reserves, completes []*groupcommit.Op
		for _, op := range round {
			switch op.Kind {
			case groupcommit.Reserve:
				reserves = append(reserves, op)
			case groupcommit.Complete:
				completes = append(completes, op)
			default:
				s.queueAlone(&b, op)
				readers = append(readers, func(br pgx.BatchResults) error { return readAlone(br, op) })
			}
		}
		if len(reserves) > 0 {
			s.queueReserves(&b, reserves)
			readers = append(readers, func(br pgx.BatchResults) error { return readReserves(br, reserves) })
		}
		if len(completes) > 0 {
			s.queueCompletes(&b, completes)
			readers = append(readers, func(br pgx.BatchResults) error { return readCompletes(br, completes) })
		}
	}
	br := conn.SendBatch(ctx, &b)
	for _, read := range readers {
		if err = read(br); err != nil {
			break
		}
	}
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

// queueAlone queues the statement op (a Release, Escalate or Extend) runs
// alone.
func (s *Store) queueAlone(b *pgx.Batch, op *groupcommit.Op) {
	k := op.Key
	switch op.Kind {
	case groupcommit.Release:
		b.Queue(s.q.release, s.notifyArgs(k, []any{k.Scope, k.Operation, k.Key, op.Token})...)
	case groupcommit.Escalate:
		b.Queue(s.q.escalate, s.notifyArgs(k, []any{k.Scope, k.Operation, k.Key, op.Token, op.Reason})...)
	case groupcommit.Extend:
		b.Queue(s.q.extend, k.Scope, k.Operation, k.Key, op.Token, op.Lease)
	}
}

// readAlone reads the result of queueAlone's statement into op's outcome.
func readAlone(br pgx.BatchResults, op *groupcommit.Op) error {
	if op.Kind == groupcommit.Extend {
		tag, err := br.Exec()
		if err == nil && tag.RowsAffected() == 0 {
			op.Err = idemstore.ErrLeaseLost
		}
		return err
	}
	err := br.QueryRow().Scan(nil)
	if errors.Is(err, pgx.ErrNoRows) {
		op.Err = idemstore.ErrLeaseLost
		return nil
	}
	return err
}

// queueReserves queues reserveMany for ops, Reserves on distinct keys.
func (s *Store) queueReserves(b *pgx.Batch, ops []*groupcommit.Op) {
	var (
		scopes, operations, keys, fingerprints, tokens = columns(len(ops)), columns(len(ops)), columns(len(ops)), columns(len(ops)), columns(len(ops))
		leases                                         = make([]time.Duration, len(ops))
		requests                                       = make([][]byte, len(ops))
	)
	for i, op := range ops {
		scopes[i], operations[i], keys[i] = op.Key.Scope, op.Key.Operation, op.Key.Key
		fingerprints[i], tokens[i], leases[i] = op.Fingerprint, op.Token, op.Lease
		requests[i] = idemstore.EncodeRequest(op.Request)
	}
	b.Queue(s.q.reserveMany, scopes, operations, keys, fingerprints, tokens, leases, requests)
}

// readReserves reads reserveMany's rows into the outcomes of ops.
func readReserves(br pgx.BatchResults, ops []*groupcommit.Op) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	dest := make([]any, 16)
	for rows.Next() {
		var (
			ord     int64
			created bool
			scope   *string
		)
		clear(dest)
		dest[0], dest[1], dest[2] = &ord, &created, &scope
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		if ord < 1 || int(ord) > len(ops) {
			return fmt.Errorf("idempg: reserve in a batch returned row %d of %d", ord, len(ops))
		}
		op := ops[ord-1]
		op.Created = created
		if !created && scope != nil {
			if op.Record, err = scanRecord(skipColumns{rows, 2}); err != nil {
				return err
			}
		}
	}
	return rows.Err()
}

// queueCompletes queues completeMany for ops, Completes on distinct keys.
func (s *Store) queueCompletes(b *pgx.Batch, ops []*groupcommit.Op) {
	var (
		scopes, operations, keys, tokens, payloads = columns(len(ops)), columns(len(ops)), columns(len(ops)), columns(len(ops)), columns(len(ops))
		responses                                  = make([][]byte, len(ops))
		retentions                                 = make([]time.Duration, len(ops))
	)
	for i, op := range ops {
		scopes[i], operations[i], keys[i], tokens[i] = op.Key.Scope, op.Key.Operation, op.Key.Key, op.Token
		responses[i], retentions[i] = idemstore.EncodeResponse(op.Response), op.Retention
		if !s.cfg.DisableNotify {
			payloads[i] = notifyPayload(op.Key)
		}
	}
	args := []any{scopes, operations, keys, tokens, responses, retentions, payloads}
	if !s.cfg.DisableNotify {
		args = append(args, s.cfg.Channel)
	}
	b.Queue(s.q.completeMany, args...)
}

// readCompletes reads completeMany's rows, the keys it completed, into the
// outcomes of ops: the others lost their lease.
func readCompletes(br pgx.BatchResults, ops []*groupcommit.Op) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	done := make(map[idemstore.Key]bool, len(ops))
	var (
		k    idemstore.Key
		dest []any // the key, then idem_wake's result when it notifies, skipped
	)
	for rows.Next() {
		if dest == nil {
			dest = make([]any, len(rows.FieldDescriptions()))
			dest[0], dest[1], dest[2] = &k.Scope, &k.Operation, &k.Key
		}
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		done[k] = true
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, op := range ops {
		if !done[op.Key] {
			op.Err = idemstore.ErrLeaseLost
		}
	}
	return nil
}

// columns returns a slice for one text column of a multi-row statement.
func columns(n int) []string { return make([]string, n) }

// skipColumns scans a row without its first n columns.
type skipColumns struct {
	pgx.Rows
	n int
}

func (r skipColumns) Scan(dest ...any) error {
	return r.Rows.Scan(append(make([]any, r.n), dest...)...)
}
