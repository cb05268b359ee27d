package idempg

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
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
			return s.complete(ctx, readCommitted{s}, s.q.complete, p)
		},
		Release:  s.release,
		Escalate: s.escalate,
		Extend:   s.extend,
	}
}

// runBatch sends ops as one pipeline (one round trip) that opens a
// transaction with BEGIN, and commits it with a COMMIT of its own once
// every statement has answered (a second round trip). The ops go in rounds
// of distinct keys (groupcommit.Rounds), one round after another, so that
// each key's calls keep their order. In a round, the Reserves are one
// multi-row statement (reserveMany), sent first, and the Completes another
// (completeMany), sent last, which costs the server one statement's
// overhead for the whole round instead of one per call; the rarer calls
// (Release, Escalate, Extend) send their own statements in between, as
// without batching. A statement that fails makes the server skip the rest
// and roll everything back.
//
// The COMMIT waits for the answers because the batch's context ends when
// all its members have left, and pgx answers that by dropping the
// connection: a pipeline committed at its end (an implicit transaction)
// would still commit on the server once a lock it waits for came free,
// after the members' releases of their tokens had found nothing. Without
// COMMIT the server rolls back. The COMMIT itself runs in
// groupcommit.CommitContext (see internal/groupcommit/commit.go).
func (s *Store) runBatch(ctx context.Context, ops []*groupcommit.Op) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil { // nothing sent
		return groupcommit.Failed(interpretError(ctx, err))
	}
	defer conn.Release()
	var (
		b     pgx.Batch
		steps [][]*groupcommit.Op // what each queued statement is for, in order
	)
	// READ COMMITTED whatever the database's default: the waiter checks
	// (idem_awaited, idem_wake) need a fresh snapshot after the rows are
	// locked, which REPEATABLE READ and SERIALIZABLE would not give them,
	// and at SERIALIZABLE a waiter that subscribed meanwhile would fail
	// the whole batch (TestBatchManyWaiterSubscribedWhileCompleting).
	b.Queue(beginReadCommitted)
	for _, round := range groupcommit.Rounds(ops) {
		var reserves, others, completes []*groupcommit.Op
		for _, op := range round {
			switch op.Kind {
			case groupcommit.Reserve:
				reserves = append(reserves, op)
			case groupcommit.Complete:
				completes = append(completes, op)
			default:
				others = append(others, op)
			}
		}
		// The Reserves first, in key order: inserts are what waits for
		// other processes' batches (for their insert, update or delete of
		// the same key), and taking them before the round's changes of
		// existing records keeps the batches' locks in one order, as key
		// order did when each call had its own statement. A Release before
		// them can deadlock with another batch (TestBatchManyLockOrder).
		for _, part := range s.parts(reserves) {
			b.Queue(s.q.reserveMany, reserveArrays(part)...)
			steps = append(steps, part)
		}
		for _, op := range others {
			k := op.Key
			switch op.Kind {
			case groupcommit.Release:
				b.Queue(s.q.release, s.notifyArgs(k, []any{k.Scope, k.Operation, k.Key, op.Token})...)
			case groupcommit.Escalate:
				b.Queue(s.q.escalate, s.notifyArgs(k, []any{k.Scope, k.Operation, k.Key, op.Token, op.Reason})...)
			case groupcommit.Extend:
				b.Queue(s.q.extend, k.Scope, k.Operation, k.Key, op.Token, op.Lease)
			}
			steps = append(steps, []*groupcommit.Op{op})
		}
		for _, part := range s.parts(completes) {
			b.Queue(s.completeManySQL(ctx, conn), s.completeArrays(part)...)
			steps = append(steps, part)
		}
	}
	br := conn.SendBatch(ctx, &b)
	_, err = br.Exec() // BEGIN
	if err == nil {
		err = readBatch(br, steps)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = ctx.Err() // every member has left: commit nothing
	}
	if err != nil {
		// Never committed: the server refused a statement and skipped the
		// rest, or the connection was dropped before COMMIT was sent.
		s.rollback(ctx, conn)
		return groupcommit.Failed(interpretError(ctx, err))
	}
	cctx, stop := groupcommit.CommitContext(ctx)
	defer stop()
	if _, err := conn.Exec(cctx, "COMMIT"); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) { // the server refused: it rolled back
			return groupcommit.Failed(interpretError(ctx, err))
		}
		return groupcommit.CommitUnknown("idempg", len(ops), interpretError(ctx, err))
	}
	return nil
}

// beginReadCommitted opens a batch's transaction, and a lone reserve's.
const beginReadCommitted = "BEGIN ISOLATION LEVEL READ COMMITTED"

// The states of Store.awaited.
const (
	awaitedUnknown = iota
	awaitedYes
	awaitedNo
)

// completeManySQL returns the statement that completes a round's records:
// completeManyAwaited, which checks for waiters once, if the schema has
// migration 006 (which adds idem_awaited), completeMany, which checks per
// record, if not. The store reads the schema's migrations once, on conn,
// the first time a batch completes records (unless New migrated), and
// keeps the answer: a store started before migration 006 was applied
// keeps the per-record check until it is made again. A rolling upgrade
// thus runs new stores against the old schema, and old stores against
// the new one, unchanged. If the read fails, this batch uses completeMany
// and the next one reads again.
func (s *Store) completeManySQL(ctx context.Context, conn interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) string {
	if s.cfg.DisableNotify {
		return s.q.completeMany // the same statement: no waiter to check
	}
	switch s.awaited.Load() {
	case awaitedYes:
		return s.q.completeManyAwaited
	case awaitedNo:
		return s.q.completeMany
	}
	var has bool
	err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+pgx.Identifier{s.cfg.Schema, "idem_schema_migrations"}.Sanitize()+
		` WHERE version = $1)`, awaitedMigration).Scan(&has)
	switch {
	case err != nil:
		return s.q.completeMany
	case has:
		s.awaited.Store(awaitedYes)
		return s.q.completeManyAwaited
	default:
		s.awaited.Store(awaitedNo)
		return s.q.completeMany
	}
}

// awaitedMigration is the version of the migration that adds idem_awaited.
const awaitedMigration = 6

// maxStatementBytes is, unless a test sets Store.statementBytes, how many
// bytes of values (keys, tokens, bodies) one multi-row statement carries at
// most. pgx refuses to send a message over 1 GiB, and fails the whole batch
// (as a commit it cannot vouch for) where each call alone would have fit:
// a round of a large batch of large bodies is cut into several statements.
const maxStatementBytes = 64 << 20

// parts cuts ops, in order, into runs whose values fit in one statement;
// each run holds at least one op.
func (s *Store) parts(ops []*groupcommit.Op) [][]*groupcommit.Op {
	return groupcommit.Chunks(ops, 0, cmp.Or(s.statementBytes, maxStatementBytes), opBytes)
}

// opBytes is about how many bytes op's values take in a statement.
func opBytes(op *groupcommit.Op) int {
	n := len(op.Key.Scope) + len(op.Key.Operation) + len(op.Key.Key) + len(op.Fingerprint) + len(op.Token) + 64
	if r := op.Request; r != nil {
		n += len(r.Method) + len(r.Path) + len(r.Query) + len(r.Body)
	}
	if r := op.Response; r != nil {
		n += len(r.NotReplayable) + len(r.Body)
		for name, values := range r.Header {
			n += len(name)
			for _, v := range values {
				n += len(v) + 8
			}
		}
	}
	return n
}

// reserveArrays returns reserveMany's arguments for ops: one array per
// column, in ops' order.
func reserveArrays(ops []*groupcommit.Op) []any {
	var (
		scopes, operations, keys = make([]string, len(ops)), make([]string, len(ops)), make([]string, len(ops))
		fingerprints, tokens     = make([]string, len(ops)), make([]string, len(ops))
		leases                   = make([]time.Duration, len(ops))
		requests                 = make([][]byte, len(ops))
		labels, labelIndexes     = make([]string, len(ops)), make([]string, len(ops))
		inlines                  = make([]int32, len(ops))
	)
	for i, op := range ops {
		scopes[i], operations[i], keys[i] = op.Key.Scope, op.Key.Operation, op.Key.Key
		fingerprints[i], tokens[i], leases[i] = op.Fingerprint, op.Token, op.Lease
		requests[i] = idemstore.EncodeRequest(op.Request)
		labels[i], labelIndexes[i] = op.ScopeLabel, idemstore.ScopeLabelIndex(op.ScopeLabel)
		inlines[i] = int32(min(op.InlineResponse, math.MaxInt32))
	}
	return []any{scopes, operations, keys, fingerprints, tokens, leases, requests, labels, labelIndexes, inlines}
}

// completeArrays returns completeMany's arguments for ops, with the
// notification's channel and payloads when the store notifies.
func (s *Store) completeArrays(ops []*groupcommit.Op) []any {
	var (
		scopes, operations, keys, tokens = make([]string, len(ops)), make([]string, len(ops)), make([]string, len(ops)), make([]string, len(ops))
		responses                        = make([][]byte, len(ops))
		retentions                       = make([]time.Duration, len(ops))
	)
	for i, op := range ops {
		scopes[i], operations[i], keys[i], tokens[i] = op.Key.Scope, op.Key.Operation, op.Key.Key, op.Token
		responses[i], retentions[i] = idemstore.EncodeResponse(op.Response), op.Retention
	}
	args := []any{scopes, operations, keys, tokens, responses, retentions}
	if !s.cfg.DisableNotify {
		payloads := make([]string, len(ops))
		for i, op := range ops {
			payloads[i] = notifyPayload(op.Key)
		}
		args = append(args, s.cfg.Channel, payloads)
	}
	return args
}

// readBatch reads the result of each queued statement, in order, into the
// outcomes of the ops it was for, and returns the first error that is not
// an outcome.
func readBatch(br pgx.BatchResults, steps [][]*groupcommit.Op) error {
	for _, ops := range steps {
		var err error
		switch ops[0].Kind {
		case groupcommit.Reserve:
			err = readReserved(br, ops)
		case groupcommit.Complete:
			err = readCompleted(br, ops)
		case groupcommit.Extend:
			var tag pgconn.CommandTag
			if tag, err = br.Exec(); err == nil && tag.RowsAffected() == 0 {
				ops[0].Err = idemstore.ErrLeaseLost
			}
		default:
			err = br.QueryRow().Scan(nil)
			if errors.Is(err, pgx.ErrNoRows) {
				ops[0].Err, err = idemstore.ErrLeaseLost, nil
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// readReserved reads reserveMany's rows, one per op in order: created, or
// the existing record, or neither when that record could not be read.
func readReserved(br pgx.BatchResults, ops []*groupcommit.Op) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	dest := make([]any, 1+recordColumnCount+1) // created, the record, its answer's length
	for i, op := range ops {
		if !rows.Next() {
			if err := rows.Err(); err != nil {
				return err
			}
			return fmt.Errorf("idempg: reserve in a batch returned %d rows of %d", i, len(ops))
		}
		var (
			created bool
			scope   *string
			rec     *idemstore.Record
		)
		clear(dest)
		dest[0], dest[1] = &created, &scope
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		if !created && scope != nil {
			var size *int64
			if rec, err = scanRecord(extraColumn{afterFirst{rows}, &size}); err != nil {
				return err
			}
			leftOut(rec, size, op.InlineResponse)
		}
		op.Record, op.Created = rec, created
	}
	if rows.Next() {
		return fmt.Errorf("idempg: reserve in a batch returned more than %d rows", len(ops))
	}
	rows.Close()
	return rows.Err()
}

// readCompleted reads completeMany's rows, the positions of the ops whose
// record was completed; the others lost their lease.
func readCompleted(br pgx.BatchResults, ops []*groupcommit.Op) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	done := make([]bool, len(ops))
	var n int64
	dest := make([]any, len(rows.FieldDescriptions())) // the position, and idem_wake's result
	for rows.Next() {
		dest[0] = &n
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		if n < 1 || n > int64(len(ops)) {
			return fmt.Errorf("idempg: complete in a batch returned position %d of %d", n, len(ops))
		}
		done[n-1] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for i, op := range ops {
		if !done[i] {
			op.Err = idemstore.ErrLeaseLost
		}
	}
	return nil
}

// afterFirst scans a row without its first column.
type afterFirst struct{ pgx.Rows }

func (r afterFirst) Scan(dest ...any) error {
	return r.Rows.Scan(append([]any{nil}, dest...)...)
}
