package idempg

import (
	"context"
	"errors"
	"math"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/idemstore"
)

var _ idemstore.ResponseReader = (*Store)(nil)
var _ idemstore.HeadReader = (*Store)(nil)

// GetHead is Get with an answer longer than inline bytes (when positive)
// left out (see idemstore.HeadReader).
func (s *Store) GetHead(ctx context.Context, k idemstore.Key, inline int) (*idemstore.Record, error) {
	var size *int64
	rec, err := scanRecord(extraColumn{s.pool.QueryRow(ctx, s.q.getInline, k.Scope, k.Operation, k.Key, min(inline, math.MaxInt32)), &size})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, idemstore.ErrNotFound
	}
	if err != nil {
		return nil, interpretError(ctx, err)
	}
	leftOut(rec, size, inline)
	return rec, nil
}

// extraColumn scans one more column than scanRecord asks for, into dest.
type extraColumn struct {
	r    pgx.Row
	dest any
}

func (x extraColumn) Scan(dest ...any) error { return x.r.Scan(append(dest, x.dest)...) }

// leftOut marks rec, read with inlineColumns, as having its answer left
// out when its length (size) is over inline.
func leftOut(rec *idemstore.Record, size *int64, inline int) {
	if rec != nil && rec.Response == nil && size != nil && inline > 0 && *size > int64(inline) {
		rec.ResponseSize = *size
	}
}

// ReadResponse returns the answer of the record for key while it is
// completed under token, or idemstore.ErrNotFound (see
// idemstore.ResponseReader).
func (s *Store) ReadResponse(ctx context.Context, key idemstore.Key, token string) (*idemstore.Response, error) {
	var b []byte
	err := s.pool.QueryRow(ctx, s.q.readResponse, key.Scope, key.Operation, key.Key, token).Scan(&b)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, idemstore.ErrNotFound
	}
	if err != nil {
		return nil, interpretError(ctx, err)
	}
	return idemstore.DecodeReadResponse(b)
}
