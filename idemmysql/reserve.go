package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

const (
	// insertSQL takes one now for created_at, updated_at and the lease
	// deadline.
	insertSQL = "INSERT INTO idem_records (scope, operation, `key`, fingerprint, state, token, lease_until, reason, request, created_at, updated_at, scope_label, label_index) " +
		"VALUES (?, ?, ?, ?, 'pending', ?, " + nowPlus + ", '', ?, " + nowMillis + ", " + nowMillis + ", ?, ?)"
	getSQL = "SELECT " + recordColumns + " FROM idem_records WHERE " + byKey
)

// Reserve inserts a pending record with a plain INSERT in a transaction of
// its own, committed before it returns, so the reservation is committed
// before any business work starts. The server's clock at the insert is its
// CreatedAt and UpdatedAt, and that plus p.Lease its lease deadline. A
// duplicate key (1062) means the key exists: Reserve reads that record and
// returns it (with ReadAt) and created == false. It repeats the insert if
// the record vanished before the read (up to idemstore.MaxReserveAttempts)
// and when the server aborted it for contention (up to
// Config.ReserveRetries).
//
// The transaction is what makes a Reserve whose ctx ends safe to release:
// the INSERT may wait for a lock (another transaction writing the same
// key, or holding the gap it goes in), and go-sql-driver/mysql answers a
// context that ends then by closing the connection. An INSERT on its own
// would still commit whenever the lock came free, after the engine's
// release of its token had found nothing; an INSERT in a transaction that
// never received COMMIT is rolled back. database/sql sends the COMMIT
// without watching the context, so Reserve returns only once the server
// has answered whether it committed.
//
// Keys longer than the columns allow (MaxScopeLen, MaxOperationLen,
// MaxKeyLen) are rejected before reaching the server.
func (s *Store) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	if err := checkKey(p.Key); err != nil {
		return nil, false, err
	}
	if len(p.Fingerprint) > MaxFingerprintLen || len(p.Token) > MaxTokenLen {
		return nil, false, fmt.Errorf("idemmysql: fingerprint (%d bytes) or token (%d bytes) too long, at most %d and %d fit",
			len(p.Fingerprint), len(p.Token), MaxFingerprintLen, MaxTokenLen)
	}
	return idemstore.ReserveLoop("idemmysql", s.cfg.ReserveRetries, func() (*idemstore.Record, bool, error) {
		if s.batch == nil || p.Request != nil && len(p.Request.Body) > maxBatchedValue {
			return s.reserveOnce(ctx, p)
		}
		op := groupcommit.ReserveOp(p)
		if err := s.batch.Do(ctx, op); err != nil {
			return nil, false, interpretError(ctx, err)
		}
		return op.Record, op.Created, op.Err
	})
}

// reserveOnce makes one insert in a transaction of its own and commits it;
// on a duplicate key it rolls back and reads the existing record. It
// returns a nil record and nil error when the existing row was gone by the
// read.
func (s *Store) reserveOnce(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, false, interpretError(ctx, err)
	}
	_, err = tx.ExecContext(ctx, insertSQL, keyArgs(p.Key, p.Fingerprint, p.Token, millis(p.Lease), requestArg(p.Request),
		labelArg(p.ScopeLabel), labelArg(idemstore.ScopeLabelIndex(p.ScopeLabel)))...)
	if err != nil {
		_ = tx.Rollback() // a connection that ctx's end closed is discarded, and the server rolls back
		if err = interpretError(ctx, err); !errors.Is(err, errDuplicate) {
			return nil, false, err
		}
		rec, err := s.getInline(ctx, p.Key, p.InlineResponse)
		if errors.Is(err, idemstore.ErrNotFound) {
			return nil, false, nil
		}
		return rec, false, err
	}
	if err := tx.Commit(); err != nil {
		return nil, false, interpretError(ctx, err)
	}
	return nil, true, nil
}

// Get returns the record for key, read at the server's clock (ReadAt), or
// idemstore.ErrNotFound.
func (s *Store) Get(ctx context.Context, k idemstore.Key) (*idemstore.Record, error) {
	rec, err := scanRecord(s.db.QueryRowContext(ctx, getSQL, keyArgs(k)...))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, idemstore.ErrNotFound
	}
	if err != nil {
		return nil, interpretError(ctx, err)
	}
	return rec, nil
}
