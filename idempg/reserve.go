package idempg

import (
	"context"
	"errors"
	"math"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// Reserve inserts a pending record with INSERT … ON CONFLICT DO NOTHING, in
// a transaction of its own on a pooled connection, committed before it
// returns, so the reservation is committed before any business work
// starts. The server's clock at that statement makes the record's
// CreatedAt and UpdatedAt, and its lease deadline is that plus p.Lease.
// When the key exists it reads the existing record and returns it (with
// ReadAt) and created == false. It repeats the insert if that record
// vanished before the read (up to idemstore.MaxReserveAttempts) and when
// the server aborted it for contention (up to Config.ReserveRetries).
//
// The transaction is what makes a Reserve whose ctx ends safe to release:
// the insert may wait for a lock (another transaction writing the same
// key), and pgx answers a context that ends then by dropping the
// connection. An insert on its own would still commit whenever the lock
// came free, after the engine's release of its token had found nothing;
// an insert in a transaction that never received COMMIT is rolled back.
// The COMMIT runs in groupcommit.CommitContext, so that it is answered
// before Reserve returns (see internal/groupcommit/commit.go).
func (s *Store) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	return idemstore.ReserveLoop("idempg", s.cfg.ReserveRetries, func() (*idemstore.Record, bool, error) {
		if s.batch == nil {
			return s.reserveOnce(ctx, p)
		}
		op := groupcommit.ReserveOp(p)
		if err := s.batch.Do(ctx, op); err != nil {
			return nil, false, interpretError(ctx, err)
		}
		return op.Record, op.Created, op.Err
	})
}

// reserveOnce makes one insert, in a transaction that BEGIN opens in the
// same round trip, and commits it; on conflict it ends the transaction and
// reads the existing record, again in one round trip. It returns a nil
// record and nil error when the conflicting row was gone by the read.
func (s *Store) reserveOnce(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, false, interpretError(ctx, err)
	}
	defer conn.Release() // destroys a connection left in a transaction
	k := p.Key
	var b pgx.Batch
	// READ COMMITTED whatever the database's default, as a batch.
	b.Queue(beginReadCommitted)
	b.Queue(s.q.reserve, k.Scope, k.Operation, k.Key, p.Fingerprint, p.Token, p.Lease, idemstore.EncodeRequest(p.Request),
		p.ScopeLabel, idemstore.ScopeLabelIndex(p.ScopeLabel))
	br := conn.SendBatch(ctx, &b)
	_, err = br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil { // never committed: rolled back, or dropped uncommitted
		s.rollback(ctx, conn)
		return nil, false, interpretError(ctx, err)
	}
	if tag.RowsAffected() == 1 {
		if err := ctx.Err(); err != nil { // the caller left: commit nothing
			s.rollback(ctx, conn)
			return nil, false, interpretError(ctx, err)
		}
		cctx, stop := groupcommit.CommitContext(ctx)
		defer stop()
		if _, err := conn.Exec(cctx, "COMMIT"); err != nil {
			return nil, false, interpretError(ctx, err)
		}
		return nil, true, nil
	}
	// Nothing written: end the transaction, and read the record in a
	// statement of its own, whose snapshot is taken after the insert's.
	b = pgx.Batch{}
	b.Queue("ROLLBACK")
	b.Queue(s.q.getInline, k.Scope, k.Operation, k.Key, min(p.InlineResponse, math.MaxInt32))
	br = conn.SendBatch(ctx, &b)
	_, err = br.Exec()
	var (
		rec  *idemstore.Record
		size *int64
	)
	if err == nil {
		rec, err = scanRecord(extraColumn{br.QueryRow(), &size})
	}
	if err == nil {
		leftOut(rec, size, p.InlineResponse)
	}
	gone := errors.Is(err, pgx.ErrNoRows)
	if cerr := br.Close(); err == nil || gone {
		err = cerr
	}
	if err != nil {
		return nil, false, interpretError(ctx, err)
	}
	return rec, false, nil // nil when the record was gone by the read
}

// rollback ends the transaction left open on conn (a statement the server
// refused, a caller that left before COMMIT), so that the pool can keep
// the connection. A connection that ctx's end closed needs nothing: the
// server rolls back on its own.
func (s *Store) rollback(ctx context.Context, conn *pgxpool.Conn) {
	if conn.Conn().IsClosed() || conn.Conn().PgConn().TxStatus() == 'I' {
		return
	}
	cctx, stop := groupcommit.CommitContext(ctx)
	defer stop()
	_, _ = conn.Exec(cctx, "ROLLBACK")
}

// Get returns the record for key, read at the server's clock (ReadAt), or
// idemstore.ErrNotFound.
func (s *Store) Get(ctx context.Context, key idemstore.Key) (*idemstore.Record, error) {
	return s.get(ctx, key)
}

func (s *Store) get(ctx context.Context, k idemstore.Key) (*idemstore.Record, error) {
	rec, err := scanRecord(s.pool.QueryRow(ctx, s.q.get, k.Scope, k.Operation, k.Key))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, idemstore.ErrNotFound
	}
	if err != nil {
		return nil, interpretError(ctx, err)
	}
	return rec, nil
}
