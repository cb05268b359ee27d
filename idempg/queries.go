package idempg

import (
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/idemstore"
)

// recordColumns is the column list every record-returning query selects
// from the record r and its heartbeat l (joined by heartbeatJoin), in the
// order scanRecord reads them. A pending record's lease deadline and
// UpdatedAt come from its heartbeat when the heartbeat carries its token.
// The last column is the server's clock at the read (Record.ReadAt).
const recordColumns = `r.scope, r.operation, r.key, r.fingerprint, r.state, r.token,
COALESCE(l.lease_until, r.lease_until) AS lease_until, r.response, r.reason, r.created_at,
GREATEST(COALESCE(r.updated_at, r.created_at), l.updated_at), r.expires_at, r.request, r.scope_label, statement_timestamp()`

// recordColumnCount is the number of columns of recordColumns.
const recordColumnCount = 15

// inlineColumns is recordColumns with an answer longer than {inline}
// bytes (when it is positive) left out (NULL), and the answer's length
// last, for idemstore.ReserveParams.InlineResponse. octet_length reads a
// stored value's length without detoasting it.
const inlineColumns = `r.scope, r.operation, r.key, r.fingerprint, r.state, r.token,
COALESCE(l.lease_until, r.lease_until) AS lease_until,
CASE WHEN {inline} > 0 AND octet_length(r.response) > {inline} THEN NULL ELSE r.response END, r.reason, r.created_at,
GREATEST(COALESCE(r.updated_at, r.created_at), l.updated_at), r.expires_at, r.request, r.scope_label, statement_timestamp(),
octet_length(r.response)`

// heartbeatJoin matches a record r with the heartbeat l of its current
// lease, if it is pending and has one.
const heartbeatJoin = `l.scope = r.scope AND l.operation = r.operation AND l.key = r.key
AND l.token = r.token AND r.state = 'pending'`

// queries holds the SQL of a Store, with the table names filled in once.
//
// Every deadline and every expiry check uses statement_timestamp(), the
// server's clock at the start of the statement: it is the same everywhere
// in one statement, and unlike now() it is not frozen at the start of the
// caller's transaction in CompleteTx. Durations travel as intervals (pgx
// encodes a time.Duration as one, in whole microseconds).
//
// Only the statements that settle or hand over a lease write a record's
// row. Extend writes the heartbeat table (idem_leases) and Subscribe the
// waiters table (idem_waiters), each after locking the record's row in a
// share mode, so that neither can make a concurrent CompleteTx at
// REPEATABLE READ or SERIALIZABLE fail with a serialization error.
//
// Statements that end a wait (complete, release, escalate, resolve,
// takeover) are written as a data-modifying CTE followed by a SELECT that
// calls the schema's idem_wake function for the changed row: it calls
// pg_notify if a waiter subscribed to the key, and deletes the key's
// heartbeat and waiter rows when the record is deleted. The notification is
// sent when the surrounding transaction commits: for CompleteTx, at the
// caller's commit. Notifying only awaited records matters: PostgreSQL
// serialises the commits of all transactions that NOTIFY, which would cost
// most of the commit throughput if every completion notified. A statement
// that changed nothing returns no row, which is how the callers detect a
// lost lease.
type queries struct {
	reserve, reserveMany, get, getInline, pending    string
	state, readResponse                              string
	complete, completeTx, completeMany               string
	completeManyAwaited                              string
	release, escalate, extend                        string
	lock, releaseExpired, escalateExpired, takeover  string
	resolveComplete, resolveRelease, deleteCompleted string
	markWaiting, list, expired, purge                string
	countOpen, countCompleted                        string
}

// buildQueries fills in the statements for the tables of schema. With
// notify, settling statements call pg_notify for awaited keys, with the
// channel and payload as their last two parameters (the callers append
// them); without, they pass NULL for the channel where they still need
// idem_wake to forget a deleted record's side rows.
func buildQueries(schema string, notify bool) queries {
	id := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	r := strings.NewReplacer(
		"{t}", id("idem_records"), "{l}", id("idem_leases"), "{w}", id("idem_waiters"),
		"{cols}", recordColumns, "{inlineCols}", inlineColumns, "{hb}", heartbeatJoin, "{now}", "statement_timestamp()",
		"{fence}", `r.scope = $1 AND r.operation = $2 AND r.key = $3 AND r.state = 'pending' AND r.token = $4`,
		"{key}", `r.scope = $1 AND r.operation = $2 AND r.key = $3`,
		// The effective deadline of the pending record r, under the lock
		// that takeover and the expired variants take first.
		"{expired}", `COALESCE((SELECT l.lease_until FROM `+id("idem_leases")+` l
    WHERE l.scope = r.scope AND l.operation = r.operation AND l.key = r.key AND l.token = r.token),
    r.lease_until) <= statement_timestamp()`,
	)
	wake := id("idem_wake")
	// tail returns the SELECT after a CTE named u that returns the key of
	// the changed record. next is the number of the channel parameter;
	// always is the SQL condition under which to notify whether or not a
	// waiter is seen, and forget says the record was deleted.
	tail := func(next int, always string, forget bool) string {
		if !notify && !forget {
			return ` SELECT NULL FROM u`
		}
		ch, payload := "NULL", "NULL"
		if notify {
			ch, payload = "$"+strconv.Itoa(next), "$"+strconv.Itoa(next+1)
		}
		return ` SELECT ` + wake + `(` + ch + `::text, ` + payload + `::text, u.scope, u.operation, u.key, ` +
			always + `, ` + strconv.FormatBool(forget) + `) FROM u`
	}
	// manyTail ends completeMany: with notify, each completed record's
	// idem_wake, with its payload taken from the array by position. Not
	// inlined as an EXISTS on the waiters: that would read them with the
	// statement's snapshot, which misses a waiter that subscribed after it
	// and before the update got the row's lock; idem_wake, VOLATILE, reads
	// them afresh (TestBatchManyWaiterSubscribedWhileCompleting).
	manyWake := wake + `($7::text, ($8::text[])[u.n], u.scope, u.operation, u.key, false, false)`
	manyTail := ` SELECT u.n FROM u`
	// awaitedTail ends completeManyAwaited: idem_awaited (migration 006)
	// checks once, with a fresh snapshot, whether any key is awaited, and
	// idem_wake runs per record only if so. Its argument, the count of u,
	// makes it run after the update has locked every row; the CTE a,
	// VOLATILE, is evaluated once.
	awaitedTail := manyTail
	if notify {
		manyTail = ` SELECT u.n, ` + manyWake + ` FROM u`
		awaitedTail = `,
a AS (SELECT ` + id("idem_awaited") + `(count(*)) AS w FROM u)
SELECT u.n, CASE WHEN a.w THEN ` + manyWake + ` END FROM u, a`
	}
	const returning = ` RETURNING r.scope, r.operation, r.key)`
	complete := `WITH u AS (UPDATE {t} r SET state = 'completed', response = $5,
    expires_at = {now} + $6::interval, updated_at = {now}
WHERE {fence}` + returning
	release := `WITH u AS (DELETE FROM {t} r WHERE {fence}%s` + returning
	escalate := `WITH u AS (UPDATE {t} r SET state = 'needs_review', reason = $5, updated_at = {now}
WHERE {fence}%s` + returning
	completeMany := `WITH i AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::interval[])
    WITH ORDINALITY AS i(scope, operation, key, token, response, retention, n)),
u AS (UPDATE {t} r SET state = 'completed', response = i.response, expires_at = {now} + i.retention, updated_at = {now}
    FROM i WHERE r.scope = i.scope AND r.operation = i.operation AND r.key = i.key AND r.state = 'pending' AND r.token = i.token
    RETURNING i.n, r.scope, r.operation, r.key)`
	cond := func(sql, extra string) string { return strings.Replace(sql, "%s", extra, 1) }
	return queries{
		reserve: r.Replace(`INSERT INTO {t} (scope, operation, key, fingerprint, state, token, lease_until, created_at, updated_at, request, scope_label, label_index)
VALUES ($1, $2, $3, $4, 'pending', $5, {now} + $6::interval, {now}, {now}, $7, NULLIF($8, ''), NULLIF($9, ''))
ON CONFLICT (scope, operation, key) DO NOTHING`),
		// reserveMany is reserve for a round of a batch (calls on distinct
		// keys), in one statement: parallel arrays of the calls' values,
		// unnested in order, inserted together. It returns one row per
		// call, in the arrays' order: whether its insert went in and, when
		// it did not, the existing record (NULLs if it vanished meanwhile,
		// or was committed after the statement's snapshot: the caller then
		// tries again). A second round trip to read a conflicting record
		// would cost the whole batch a wait.
		reserveMany: strings.Replace(r.Replace(`WITH i AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::interval[], $7::bytea[], $8::text[], $9::text[], $10::int[])
    WITH ORDINALITY AS i(scope, operation, key, fingerprint, token, lease, request, scope_label, label_index, inline, n)),
ins AS (INSERT INTO {t} (scope, operation, key, fingerprint, state, token, lease_until, created_at, updated_at, request, scope_label, label_index)
    SELECT scope, operation, key, fingerprint, 'pending', token, {now} + lease, {now}, {now}, request, NULLIF(scope_label, ''), NULLIF(label_index, '') FROM i ORDER BY n
    ON CONFLICT (scope, operation, key) DO NOTHING RETURNING scope, operation, key)
SELECT ins.key IS NOT NULL, rec.* FROM i
LEFT JOIN ins ON ins.scope = i.scope AND ins.operation = i.operation AND ins.key = i.key
LEFT JOIN LATERAL (SELECT {inlineCols} FROM {t} r LEFT JOIN {l} l ON {hb}
    WHERE r.scope = i.scope AND r.operation = i.operation AND r.key = i.key AND ins.key IS NULL
    OFFSET 0) rec ON true
ORDER BY i.n`), "{inline}", "i.inline", -1),
		get: r.Replace(`SELECT {cols} FROM {t} r LEFT JOIN {l} l ON {hb} WHERE {key}`),
		// getInline is get for Reserve, $4 its InlineResponse.
		getInline: strings.Replace(r.Replace(`SELECT {inlineCols} FROM {t} r LEFT JOIN {l} l ON {hb} WHERE {key}`), "{inline}", "$4::int", -1),
		// readResponse is idemstore.ResponseReader's read: the answer
		// completed under the token $4.
		readResponse: r.Replace(`SELECT r.response FROM {t} r WHERE {key} AND r.state = 'completed' AND r.token = $4`),
		pending:      r.Replace(`SELECT FROM {t} r WHERE {fence}`),
		state:        r.Replace(`SELECT r.state, r.token FROM {t} r WHERE {key}`),

		complete: r.Replace(complete) + tail(7, "false", false),
		// completeMany is complete for a round of a batch, in one
		// statement: it returns the position (from 1) in the arrays of each
		// call whose record it completed; the others lost their lease.
		// With notify, $7 is the channel and $8 the payloads, in the
		// arrays' order.
		completeMany: r.Replace(completeMany) + manyTail,
		// completeManyAwaited is completeMany for a schema that has
		// migration 006: it checks for waiters once, not once per record.
		completeManyAwaited: r.Replace(completeMany) + awaitedTail,
		// In the caller's transaction at REPEATABLE READ or SERIALIZABLE,
		// the snapshot may predate a waiter's subscription: notify anyway.
		completeTx: r.Replace(complete) + tail(7, "current_setting('transaction_isolation') <> 'read committed'", false),
		release:    r.Replace(cond(release, "")) + tail(5, "false", true),
		escalate:   r.Replace(cond(escalate, "")) + tail(6, "false", false),
		// Extend locks the record's row FOR KEY SHARE: that does not
		// conflict with the completion's update, and a committed lock does
		// not make a later update at REPEATABLE READ fail; it conflicts
		// with the FOR UPDATE that takeover and the expired variants take
		// before they read the heartbeat.
		extend: r.Replace(`WITH r AS (SELECT r.scope, r.operation, r.key, r.token, r.lease_until FROM {t} r
    WHERE {fence} FOR KEY SHARE)
INSERT INTO {l} AS l (scope, operation, key, token, lease_until, updated_at, shrunk)
SELECT scope, operation, key, token, {now} + $5::interval, {now}, {now} + $5::interval < lease_until FROM r
ON CONFLICT (scope, operation, key) DO UPDATE
SET token = EXCLUDED.token, lease_until = EXCLUDED.lease_until, updated_at = EXCLUDED.updated_at, shrunk = EXCLUDED.shrunk`),

		// The statements that act on an expired lease run in a READ
		// COMMITTED transaction of their own after lock: it waits for a
		// heartbeat in progress, and the statement after it, with a fresh
		// snapshot, sees that heartbeat.
		lock:            r.Replace(`SELECT FROM {t} r WHERE {fence} FOR UPDATE`),
		releaseExpired:  r.Replace(cond(release, " AND {expired}")) + tail(5, "false", true),
		escalateExpired: r.Replace(cond(escalate, " AND {expired}")) + tail(6, "false", false),
		takeover: r.Replace(`WITH u AS (UPDATE {t} r SET token = $5, lease_until = {now} + $6::interval, updated_at = {now}
WHERE {fence} AND {expired}`+returning) + tail(7, "false", false),

		resolveComplete: r.Replace(`WITH u AS (UPDATE {t} r SET state = 'completed', response = $4,
    expires_at = {now} + $5::interval, updated_at = {now}, reason = COALESCE(NULLIF($6, ''), reason)
WHERE {key} AND r.state = 'needs_review' AND ($7 = '' OR r.token = $7)`+returning) + tail(8, "false", false),
		resolveRelease: r.Replace(`WITH u AS (DELETE FROM {t} r WHERE {key} AND r.state = 'needs_review' AND ($4 = '' OR r.token = $4)`+returning) + tail(5, "false", true),
		// A completed record gains no side rows (Extend and Subscribe need
		// it pending), so the statement's own snapshot sees them all.
		deleteCompleted: r.Replace(`WITH d AS (DELETE FROM {t} r WHERE {key} AND r.state = 'completed' AND ($4 = '' OR r.token = $4)` + ` RETURNING r.scope, r.operation, r.key),
l AS (DELETE FROM {l} l USING d WHERE l.scope = d.scope AND l.operation = d.operation AND l.key = d.key),
w AS (DELETE FROM {w} w USING d WHERE w.scope = d.scope AND w.operation = d.operation AND w.key = d.key)
SELECT count(*) FROM d`),

		// Subscribe locks the record's row FOR SHARE, which waits for a
		// completion in progress (and then finds the record changed).
		markWaiting: r.Replace(`WITH r AS (SELECT r.scope, r.operation, r.key FROM {t} r
    WHERE {key} AND r.state = 'pending' FOR SHARE),
i AS (INSERT INTO {w} (scope, operation, key) SELECT scope, operation, key FROM r ON CONFLICT DO NOTHING)
SELECT count(*) FROM r`),
		list: r.Replace(`SELECT {cols} FROM {t} r LEFT JOIN {l} l ON {hb} WHERE `),
		countOpen: r.Replace(`SELECT state, operation, count(*), min(created_at) FROM {t}
WHERE state <> 'completed' GROUP BY state, operation ORDER BY operation`),
		// The completed records, counted up to $1, and the table's row
		// estimate, which pg_class.reltuples keeps (-1 before the first
		// ANALYZE).
		countCompleted: r.Replace(`SELECT statement_timestamp(),
    (SELECT count(*) FROM (SELECT FROM {t} WHERE state = 'completed' LIMIT $1) c),
    COALESCE((SELECT reltuples FROM pg_class WHERE oid = to_regclass($2)), -1)::float8`),
		// Expired leases: records past their own deadline whose heartbeat,
		// if any, is past too; and records whose heartbeat shortened the
		// lease to a deadline that has passed.
		expired: r.Replace(`SELECT {cols} FROM {t} r LEFT JOIN {l} l ON {hb}
WHERE r.state = 'pending' AND r.lease_until <= {now} AND (l.lease_until IS NULL OR l.lease_until <= {now})
UNION ALL
SELECT {cols} FROM {l} l JOIN {t} r ON {hb}
WHERE l.shrunk AND l.lease_until <= {now} AND r.lease_until > {now}
ORDER BY lease_until, scope, operation, key LIMIT $1`),
		purge: r.Replace(`WITH d AS (DELETE FROM {t}
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {t}
    WHERE state = 'completed' AND expires_at <= {now}
    ORDER BY expires_at LIMIT $1
    FOR UPDATE SKIP LOCKED))
AND state = 'completed' AND expires_at <= {now}
RETURNING scope, operation, key),
l AS (DELETE FROM {l} l USING d WHERE l.scope = d.scope AND l.operation = d.operation AND l.key = d.key),
w AS (DELETE FROM {w} w USING d WHERE w.scope = d.scope AND w.operation = d.operation AND w.key = d.key)
SELECT count(*) FROM d`),
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
		label     *string
	)
	err := row.Scan(&rec.Key.Scope, &rec.Key.Operation, &rec.Key.Key, &rec.Fingerprint, &state,
		&rec.Token, &rec.LeaseUntil, &response, &rec.Reason, &rec.CreatedAt, &rec.UpdatedAt, &expiresAt,
		&request, &label, &rec.ReadAt)
	if err != nil {
		return nil, err
	}
	if label != nil {
		rec.ScopeLabel = *label
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
