package idemmysql

import (
	"database/sql"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// nowMillis is the server's clock in Unix milliseconds. UTC_TIMESTAMP, like
// NOW, is fixed for the duration of a statement, so every deadline a
// statement writes and every expiry it judges use one instant. It is taken
// in UTC rather than through UNIX_TIMESTAMP(NOW(3)), which converts from
// the session time zone and is ambiguous for the repeated hour when
// daylight saving time ends. DIV truncates to the millisecond.
const nowMillis = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000)"

// recordColumns is the column list every record-returning query selects, in
// the order scanRecord reads them; the last one is the server's clock at
// the read (Record.ReadAt). Rows written before updated_at existed read
// created_at for it.
const recordColumns = "scope, operation, `key`, fingerprint, state, token, lease_until, response, reason, request, " +
	"created_at, COALESCE(updated_at, created_at), expires_at, scope_label, " + nowMillis

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
		response, reason, request []byte
		leaseUntil, createdAt     int64
		updatedAt, readAt         int64
		expiresAt                 sql.NullInt64
		label                     []byte
	)
	err := row.Scan(&scope, &operation, &key, &fingerprint, &state, &token,
		&leaseUntil, &response, &reason, &request, &createdAt, &updatedAt, &expiresAt, &label, &readAt)
	if err != nil {
		return nil, err
	}
	rec.ScopeLabel = string(label)
	rec.Key = idemstore.Key{Scope: string(scope), Operation: string(operation), Key: string(key)}
	rec.Fingerprint = string(fingerprint)
	rec.State = idemstore.State(state)
	rec.Token = string(token)
	rec.LeaseUntil = fromMillis(leaseUntil)
	rec.Reason = string(reason)
	rec.CreatedAt = fromMillis(createdAt)
	rec.UpdatedAt = fromMillis(updatedAt)
	rec.ReadAt = fromMillis(readAt)
	if expiresAt.Valid {
		rec.ExpiresAt = fromMillis(expiresAt.Int64)
	}
	if rec.Response, err = idemstore.DecodeResponse(response); err != nil {
		return nil, err
	}
	if rec.Request, err = idemstore.DecodeRequest(request); err != nil {
		return nil, err
	}
	return &rec, nil
}

// millis turns a duration into the whole milliseconds added to nowMillis,
// truncated toward zero like the stored times. Zero and negative durations
// stay as they are: they make deadlines that have already passed.
func millis(d time.Duration) int64 { return d.Milliseconds() }

// requestArg is the request column's value: NULL for no request.
func requestArg(r *idemstore.Request) any {
	if r == nil {
		return nil
	}
	return idemstore.EncodeRequest(r)
}

// labelArg is a label column's value: NULL for none.
func labelArg(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func fromMillis(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// nowPlus is nowMillis plus a parameter of milliseconds (see millis): a
// deadline on the server's clock.
const nowPlus = "(" + nowMillis + " + ?)"
