package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"github.com/idem-dev/idem/idemstore"
)

var _ idemstore.ResponseReader = (*Store)(nil)
var _ idemstore.HeadReader = (*Store)(nil)

// GetHead is Get with an answer longer than inline bytes (when positive)
// left out (see idemstore.HeadReader).
func (s *Store) GetHead(ctx context.Context, key idemstore.Key, inline int) (*idemstore.Record, error) {
	return s.getInline(ctx, key, inline)
}

// inlineBefore and inlineAfter surround a limit to make recordColumns with
// an answer longer than the limit left out (NULL), and the answer's length
// last, for idemstore.ReserveParams.InlineResponse (see inlineLimit).
var inlineBefore, inlineAfter = func() (string, string) {
	before, after, ok := strings.Cut(recordColumns, "response,")
	if !ok {
		panic("idemmysql: recordColumns has no response")
	}
	return before + "CASE WHEN LENGTH(response) > ", " THEN NULL ELSE response END," + after + ", LENGTH(response)"
}()

// inlineLimit is the limit of inlineBefore for a Reserve's
// InlineResponse: the answers no longer than it are returned whole.
func inlineLimit(inline int) int64 {
	if inline <= 0 {
		return 1 << 62 // every answer
	}
	return int64(inline)
}

// getInline is Get, but an answer longer than inline (when positive) is
// left out of the record, which says its size instead.
func (s *Store) getInline(ctx context.Context, k idemstore.Key, inline int) (*idemstore.Record, error) {
	var size sql.NullInt64
	q := "SELECT " + inlineBefore + literal(inlineLimit(inline)) + inlineAfter + " FROM idem_records WHERE " + byKey
	rec, err := scanRecord(extraColumn{s.db.QueryRowContext(ctx, q, keyArgs(k)...), &size})
	if errors.Is(err, sql.ErrNoRows) {
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
	r    scanner
	dest any
}

func (x extraColumn) Scan(dest ...any) error { return x.r.Scan(append(dest, x.dest)...) }

// leftOut marks rec as having its answer left out when its length (size)
// is over inline.
func leftOut(rec *idemstore.Record, size sql.NullInt64, inline int) {
	if rec.Response == nil && size.Valid && inline > 0 && size.Int64 > int64(inline) {
		rec.ResponseSize = size.Int64
	}
}

// ReadResponse returns the answer of the record for key while it is
// completed under token, or idemstore.ErrNotFound (see
// idemstore.ResponseReader).
func (s *Store) ReadResponse(ctx context.Context, key idemstore.Key, token string) (*idemstore.Response, error) {
	var b []byte
	err := s.db.QueryRowContext(ctx, "SELECT response FROM idem_records WHERE "+byKey+" AND state = 'completed' AND token = ?",
		keyArgs(key, token)...).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, idemstore.ErrNotFound
	}
	if err != nil {
		return nil, interpretError(ctx, err)
	}
	return idemstore.DecodeReadResponse(b)
}
