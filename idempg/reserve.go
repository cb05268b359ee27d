package idempg

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// Reserve inserts a pending record with INSERT … ON CONFLICT DO NOTHING, in
// its own autocommit statement on a pooled connection, so the reservation is
// committed before any business work starts. The server's clock at that
// statement makes the record's CreatedAt and UpdatedAt, and its lease
// deadline is that plus p.Lease. When the key exists it reads the existing
// record and returns it (with ReadAt) and created == false. It repeats the
// insert if that record vanished before the read (up to
// idemstore.MaxReserveAttempts) and when the server aborted it for
// contention (up to Config.ReserveRetries).
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

// reserveOnce makes one insert and, on conflict, one read. It returns a nil
// record and nil error when the conflicting row was gone by the read.
func (s *Store) reserveOnce(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	k := p.Key
	tag, err := s.pool.Exec(ctx, s.q.reserve, k.Scope, k.Operation, k.Key, p.Fingerprint, p.Token, p.Lease, idemstore.EncodeRequest(p.Request))
	if err != nil {
		return nil, false, interpretError(ctx, err)
	}
	if tag.RowsAffected() == 1 {
		return nil, true, nil
	}
	rec, err := s.get(ctx, k)
	if errors.Is(err, idemstore.ErrNotFound) {
		return nil, false, nil
	}
	return rec, false, err
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
