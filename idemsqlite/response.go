package idemsqlite

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
	return s.getInline(ctx, s.q, key, inline)
}

// inlineColumns is recordColumns with an answer longer than its parameter
// left out (NULL), and the answer's length last: SQLite reads a blob's
// length from the row's header, without the blob's pages.
var inlineColumns = strings.Replace(recordColumns, "response", "CASE WHEN length(response) > ? THEN NULL ELSE response END", 1) +
	", length(response)"

// getInline is get, but an answer longer than inline bytes (when
// positive) is left out of the record, which says its size instead
// (idemstore.ReserveParams.InlineResponse).
func (s *Store) getInline(ctx context.Context, q querier, key idemstore.Key, inline int) (*idemstore.Record, error) {
	if inline <= 0 {
		return s.get(ctx, q, key)
	}
	now := s.now()
	row := q.QueryRowContext(ctx, `SELECT `+inlineColumns+` FROM idem_records
		WHERE scope = ? AND operation = ? AND "key" = ?`, inline, key.Scope, key.Operation, key.Key)
	var size sql.NullInt64
	rec, err := scanRecord(extraColumn{row, &size}, now)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, idemstore.ErrNotFound
	}
	if err != nil {
		return nil, interpretError(ctx, err)
	}
	if rec.Response == nil && size.Valid && size.Int64 > int64(inline) {
		rec.ResponseSize = size.Int64
	}
	return rec, nil
}

// extraColumn scans one more column than scanRecord asks for, into dest.
type extraColumn struct {
	r    rowScanner
	dest any
}

func (x extraColumn) Scan(dest ...any) error { return x.r.Scan(append(dest, x.dest)...) }

// ReadResponse returns the answer of the record for key while it is
// completed under token, or idemstore.ErrNotFound (see
// idemstore.ResponseReader). The stored bytes are decoded where the driver
// put them (sql.RawBytes), so that an answer is held twice while it is
// read, not three times.
func (s *Store) ReadResponse(ctx context.Context, key idemstore.Key, token string) (_ *idemstore.Response, err error) {
	rows, err := s.q.QueryContext(ctx, `SELECT response FROM idem_records
		WHERE scope = ? AND operation = ? AND "key" = ? AND state = 'completed' AND token = ?`,
		key.Scope, key.Operation, key.Key, token)
	if err != nil {
		return nil, interpretError(ctx, err)
	}
	defer func() {
		if cerr := rows.Close(); err == nil && cerr != nil {
			err = interpretError(ctx, cerr)
		}
	}()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return nil, interpretError(ctx, err)
		}
		return nil, idemstore.ErrNotFound
	}
	var raw sql.RawBytes
	if err := rows.Scan(&raw); err != nil {
		return nil, interpretError(ctx, err)
	}
	return idemstore.DecodeReadResponse(raw)
}
