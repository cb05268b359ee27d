package idemmysql

import (
	"database/sql"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// recordColumns is the column list every record-returning query selects, in
// the order scanRecord reads them.
const recordColumns = "scope, operation, `key`, fingerprint, state, token, lease_until, response, reason, created_at, expires_at"

// byKey is the primary-key condition; its arguments are keyArgs.
const byKey = "scope = ? AND operation = ? AND `key` = ?"

func keyArgs(k idemstore.Key, more ...any) []any {
	return append([]any{k.Scope, k.Operation, k.Key}, more...)
}

type scanner interface{ Scan(dest ...any) error }

// scanRecord reads one row of recordColumns.
func scanRecord(row scanner) (*idemstore.Record, error) {
	var (
		rec                       idemstore.Record
		scope, operation, key     []byte
		fingerprint, state, token []byte
		response, reason          []byte
		leaseUntil, createdAt     int64
		expiresAt                 sql.NullInt64
	)
	err := row.Scan(&scope, &operation, &key, &fingerprint, &state, &token,
		&leaseUntil, &response, &reason, &createdAt, &expiresAt)
	if err != nil {
		return nil, err
	}
	rec.Key = idemstore.Key{Scope: string(scope), Operation: string(operation), Key: string(key)}
	rec.Fingerprint = string(fingerprint)
	rec.State = idemstore.State(state)
	rec.Token = string(token)
	rec.LeaseUntil = fromMillis(leaseUntil)
	rec.Reason = string(reason)
	rec.CreatedAt = fromMillis(createdAt)
	if expiresAt.Valid {
		rec.ExpiresAt = fromMillis(expiresAt.Int64)
	}
	if rec.Response, err = idemstore.DecodeResponse(response); err != nil {
		return nil, err
	}
	return &rec, nil
}

// millis stores t as Unix milliseconds.
func millis(t time.Time) int64 { return t.UnixMilli() }

// nullMillis stores the zero time as NULL.
func nullMillis(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixMilli(), Valid: true}
}

func fromMillis(ms int64) time.Time { return time.UnixMilli(ms).UTC() }
