package idempg

import (
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/idemstore"
)

// recordColumns is the column list every record-returning query selects, in
// the order scanRecord reads them. The last one is the server's clock at the
// read (Record.ReadAt).
const recordColumns = `scope, operation, key, fingerprint, state, token, lease_until, response, reason,
created_at, COALESCE(updated_at, created_at), expires_at, request, statement_timestamp()`

// queries holds the SQL of a Store, with the table name filled in once.
//
// Every deadline and every expiry check uses statement_timestamp(), the
// server's clock at the start of the statement: it is the same everywhere
// in one statement, and unlike now() it is not frozen at the start of the
// caller's transaction in CompleteTx. Durations travel as intervals (pgx
// encodes a time.Duration as one, in whole microseconds).
//
// Statements that end a wait (complete, release, escalate, resolve,
// takeover) are written as a data-modifying CTE followed by a SELECT that
// calls pg_notify for the changed row if a waiter flagged it (Subscribe sets
// the waiters column). The notification is sent when the surrounding
// transaction commits: for CompleteTx, at the caller's commit. Notifying
// only flagged records matters: PostgreSQL serialises the commits of all
// transactions that NOTIFY, which would cost most of the commit throughput
// if every completion notified. A statement that changed nothing returns no
// row, which is how the callers detect a lost lease.
type queries struct {
	notify bool

	reserve, get                    string
	complete, release, escalate     string
	releaseExpired, escalateExpired string
	extend, takeover                string
	resolveComplete, resolveRelease string
	deleteCompleted                 string
	state, markWaiting              string
	list, expired, purge            string
}

func buildQueries(table string, notify bool) queries {
	r := strings.NewReplacer("{t}", table, "{cols}", recordColumns, "{now}", "statement_timestamp()")
	// tail returns the SELECT after a CTE named u. With notify it calls
	// pg_notify($ch, $payload), whose parameter numbers the caller appends.
	tail := func(next int) string {
		if !notify {
			return ` SELECT NULL FROM u`
		}
		return ` SELECT CASE WHEN u.waiters THEN pg_notify($` + strconv.Itoa(next) + `, $` + strconv.Itoa(next+1) + `) END FROM u`
	}
	const (
		fence   = `scope = $1 AND operation = $2 AND key = $3 AND state = 'pending' AND token = $4`
		expired = ` AND lease_until <= statement_timestamp()`
	)
	release := `WITH u AS (DELETE FROM {t} WHERE ` + fence + `%s RETURNING waiters)`
	escalate := `WITH u AS (UPDATE {t} SET state = 'needs_review', reason = $5, updated_at = {now}
WHERE ` + fence + `%s RETURNING waiters)`
	return queries{
		notify: notify,
		reserve: r.Replace(`INSERT INTO {t} (scope, operation, key, fingerprint, state, token, lease_until, created_at, updated_at, request)
VALUES ($1, $2, $3, $4, 'pending', $5, {now} + $6::interval, {now}, {now}, $7)
ON CONFLICT (scope, operation, key) DO NOTHING`),
		get: r.Replace(`SELECT {cols} FROM {t} WHERE scope = $1 AND operation = $2 AND key = $3`),
		complete: r.Replace(`WITH u AS (UPDATE {t} SET state = 'completed', response = $5,
    expires_at = {now} + $6::interval, updated_at = {now}
WHERE `+fence+` RETURNING waiters)`) + tail(7),
		release:         r.Replace(strings.Replace(release, "%s", "", 1)) + tail(5),
		releaseExpired:  r.Replace(strings.Replace(release, "%s", expired, 1)) + tail(5),
		escalate:        r.Replace(strings.Replace(escalate, "%s", "", 1)) + tail(6),
		escalateExpired: r.Replace(strings.Replace(escalate, "%s", expired, 1)) + tail(6),
		extend:          r.Replace(`UPDATE {t} SET lease_until = {now} + $5::interval, updated_at = {now} WHERE ` + fence),
		takeover: r.Replace(`WITH u AS (UPDATE {t} SET token = $5, lease_until = {now} + $6::interval, updated_at = {now}
WHERE `+fence+expired+` RETURNING waiters)`) + tail(7),
		resolveComplete: r.Replace(`WITH u AS (UPDATE {t} SET state = 'completed', response = $4,
    expires_at = {now} + $5::interval, updated_at = {now}, reason = COALESCE(NULLIF($6, ''), reason)
WHERE scope = $1 AND operation = $2 AND key = $3 AND state = 'needs_review' RETURNING waiters)`) + tail(7),
		resolveRelease: r.Replace(`WITH u AS (DELETE FROM {t}
WHERE scope = $1 AND operation = $2 AND key = $3 AND state = 'needs_review' RETURNING waiters)`) + tail(4),
		deleteCompleted: r.Replace(`DELETE FROM {t} WHERE scope = $1 AND operation = $2 AND key = $3 AND state = 'completed'`),
		state:           r.Replace(`SELECT state FROM {t} WHERE scope = $1 AND operation = $2 AND key = $3`),
		markWaiting: r.Replace(`UPDATE {t} SET waiters = true
WHERE scope = $1 AND operation = $2 AND key = $3 AND state = 'pending'`),
		list: r.Replace(`SELECT {cols} FROM {t} WHERE `),
		expired: r.Replace(`SELECT {cols} FROM {t}
WHERE state = 'pending' AND lease_until <= {now}
ORDER BY lease_until, scope, operation, key LIMIT $1`),
		purge: r.Replace(`DELETE FROM {t}
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {t}
    WHERE state = 'completed' AND expires_at <= {now}
    ORDER BY expires_at LIMIT $1
    FOR UPDATE SKIP LOCKED))
AND state = 'completed' AND expires_at <= {now}`),
	}
}

// scanRecord reads one row of recordColumns.
func scanRecord(row pgx.Row) (*idemstore.Record, error) {
	var (
		rec       idemstore.Record
		state     string
		response  []byte
		request   []byte
		expiresAt *time.Time
	)
	err := row.Scan(&rec.Key.Scope, &rec.Key.Operation, &rec.Key.Key, &rec.Fingerprint, &state,
		&rec.Token, &rec.LeaseUntil, &response, &rec.Reason, &rec.CreatedAt, &rec.UpdatedAt, &expiresAt,
		&request, &rec.ReadAt)
	if err != nil {
		return nil, err
	}
	rec.State = idemstore.State(state)
	rec.LeaseUntil = rec.LeaseUntil.UTC()
	rec.CreatedAt = rec.CreatedAt.UTC()
	rec.UpdatedAt = rec.UpdatedAt.UTC()
	rec.ReadAt = rec.ReadAt.UTC()
	if expiresAt != nil {
		rec.ExpiresAt = expiresAt.UTC()
	}
	if rec.Response, err = idemstore.DecodeResponse(response); err != nil {
		return nil, err
	}
	if rec.Request, err = idemstore.DecodeRequest(request); err != nil {
		return nil, err
	}
	return &rec, nil
}
