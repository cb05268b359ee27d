package idemsqlite

import (
	"context"
	"errors"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// Reserve inserts a pending record for p.Key with INSERT … ON CONFLICT DO
// NOTHING, so that the primary key decides which of any number of
// concurrent callers, in any process, wins. A caller that loses reads the
// existing record and returns it with created == false; if that record was
// released between the two statements, it inserts again, up to
// idemstore.MaxReserveAttempts times.
func (s *Store) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	return idemstore.ReserveLoop("idemsqlite", 0, func() (*idemstore.Record, bool, error) {
		if s.batch == nil {
			return s.reserveOnce(ctx, s.q, p)
		}
		op := groupcommit.ReserveOp(p)
		if err := s.batch.Do(ctx, op); err != nil {
			return nil, false, err
		}
		return op.Record, op.Created, op.Err
	})
}

// reserveOnce makes one insert and, on conflict, one read, through q (the
// store's database or a batch's transaction). It returns a nil record and
// nil error when the conflicting row was gone by the read.
func (s *Store) reserveOnce(ctx context.Context, q querier, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	now := s.now()
	res, err := q.ExecContext(ctx, `INSERT INTO idem_records
		(scope, operation, "key", fingerprint, state, token, lease_until, created_at, updated_at, request, scope_label, label_index)
		VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (scope, operation, "key") DO NOTHING`,
		p.Key.Scope, p.Key.Operation, p.Key.Key, p.Fingerprint, p.Token, millis(now.Add(p.Lease)), millis(now), millis(now),
		idemstore.EncodeRequest(p.Request), nullString(p.ScopeLabel), nullString(idemstore.ScopeLabelIndex(p.ScopeLabel)))
	if err != nil {
		return nil, false, interpretError(ctx, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, false, interpretError(ctx, err)
	}
	if n == 1 {
		return nil, true, nil
	}
	rec, err := s.getInline(ctx, q, p.Key, p.InlineResponse)
	if errors.Is(err, idemstore.ErrNotFound) {
		return nil, false, nil // released between the insert and the read
	}
	return rec, false, err
}
