package idempg

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
	"github.com/idem-dev/idem/internal/testenv"
)

// BenchmarkStatementCPU sends the writes of b.N reserve+complete pairs
// from one connection, one batch after another, and reports the CPU time
// its PostgreSQL backend spent per pair (pg-cpu-µs/pair, read from
// /proc, so the server must run on this machine). One backend and no
// concurrency: what it measures is the statements, not the client, the
// scheduler or other backends. It also reports the WAL the server wrote
// meanwhile per pair (WAL-B/pair: the whole server's, so other sessions'
// writes count too). The sub-benchmarks:
//
//	store/rows=N            the store's batch: BEGIN, reserveMany for N new
//	                        keys, completeMany for the previous batch's N
//	                        keys, in one pipeline; then COMMIT
//	                        (completeMany checks for waiters once: the
//	                        schema has migration 006)
//	store/per-row/rows=N    the same with the statement of a schema at
//	                        migration 005 (idem_wake for every completed
//	                        row)
//	store/notify=off/rows=N the same with Config.DisableNotify (completeMany
//	                        calls neither idem_awaited nor idem_wake)
//	plain/rows=N            the same writes, protocol and parameters without
//	                        what the store reads back: an INSERT … ON
//	                        CONFLICT DO NOTHING and an UPDATE from the
//	                        unnested arrays, no RETURNING, no conflict read,
//	                        no idem_wake; not a statement the store can use
//	pgbench/rows=N          idem/bench/ceiling.sh's pgbench transactions,
//	                        by the simple protocol: BEGIN, an INSERT of N
//	                        rows from generate_series, COMMIT, BEGIN, the
//	                        settle UPDATE of those rows, COMMIT
//	mixed/rows=N            ceiling.sh's mixed-N line, prepared: the
//	                        store's transaction with pgbench's statements
//	                        (generate_series and md5 for the keys, the
//	                        answer a literal), sent by the extended
//	                        protocol as the store sends its own: BEGIN, an
//	                        INSERT of N new rows and the settle UPDATE of
//	                        the previous batch's, in one pipeline; then
//	                        COMMIT
//	values/rows=N           plain's writes with the rows as VALUES lists
//	                        of parameters (one statement text a batch
//	                        size) instead of parameter arrays
//
// Each runs on a fresh schema of its own.
func BenchmarkStatementCPU(b *testing.B) {
	for _, rows := range []int{16, 32} {
		for _, v := range []string{"store", "store/per-row", "store/notify=off", "plain", "pgbench", "mixed", "values"} {
			b.Run(fmt.Sprintf("%s/rows=%d", v, rows), func(b *testing.B) { benchStatementCPU(b, v, rows) })
		}
	}
}

func benchStatementCPU(b *testing.B, variant string, rows int) {
	ctx := context.Background()
	url := testenv.Getenv(b, "IDEM_TEST_POSTGRES_URL")
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	cfg := Config{Schema: "idem_cpu_" + strings.ToLower(rand.Text()[:10]), DisableNotify: variant == "store/notify=off"}
	if err := Migrate(ctx, pool, cfg); err != nil {
		b.Fatal(err)
	}
	defer func() { _, _ = pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{cfg.Schema}.Sanitize()+" CASCADE") }()
	s, err := New(pool, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		b.Fatal(err)
	}
	if _, err := backendTicks(pid); err != nil {
		b.Skipf("the server's backend is not on this machine: %v", err)
	}
	table := pgx.Identifier{cfg.Schema, "idem_records"}.Sanitize()
	reserveSQL, completeSQL := s.q.reserveMany, s.completeManySQL(ctx, conn)
	if variant == "store/per-row" {
		completeSQL = s.q.completeMany
	}
	if variant == "plain" {
		reserveSQL = `INSERT INTO ` + table + ` (scope, operation, key, fingerprint, state, token, lease_until, created_at, updated_at, request, scope_label, label_index)
SELECT scope, operation, key, fingerprint, 'pending', token, statement_timestamp() + lease, statement_timestamp(), statement_timestamp(), request, NULLIF(scope_label, ''), NULLIF(label_index, '')
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::interval[], $7::bytea[], $8::text[], $9::text[], $10::int[])
    AS i(scope, operation, key, fingerprint, token, lease, request, scope_label, label_index, inline)
ON CONFLICT (scope, operation, key) DO NOTHING`
		// $7 and $8, the channel and the payloads, are sent but not used.
		completeSQL = `UPDATE ` + table + ` r SET state = 'completed', response = i.response, expires_at = statement_timestamp() + i.retention, updated_at = statement_timestamp()
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::interval[]) AS i(scope, operation, key, token, response, retention)
WHERE r.scope = i.scope AND r.operation = i.operation AND r.key = i.key AND r.state = 'pending' AND r.token = i.token
    AND $7::text IS NOT NULL AND $8::text[] IS NOT NULL`
	}
	newOps := func() (reserves, completes []*groupcommit.Op) {
		for range rows {
			k := idemstore.Key{Scope: "bench", Operation: "POST /orders", Key: rand.Text()}
			tok := "tok-" + k.Key
			reserves = append(reserves, &groupcommit.Op{Kind: groupcommit.Reserve, Key: k, Token: tok, Fingerprint: "fp", Lease: 30 * time.Second})
			completes = append(completes, &groupcommit.Op{Kind: groupcommit.Complete, Key: k, Token: tok, Response: statementResponse, Retention: 24 * time.Hour})
		}
		return reserves, completes
	}
	var (
		previous []*groupcommit.Op
		batch    int64
	)
	// one writes a batch of rows pairs; the store's variants complete the
	// previous batch's keys, as a batch of the store carries one round's
	// reserves and an earlier round's completes.
	one := func() {
		batch++
		if variant == "pgbench" {
			n := strconv.FormatInt(time.Now().UnixNano()%1e12+batch, 10)
			from := ` FROM generate_series(1, ` + strconv.Itoa(rows) + `) g, left(md5(` + n + ` || '-' || g), 26) k`
			insert := `INSERT INTO ` + table + ` (scope, operation, key, fingerprint, state, token, lease_until, created_at, updated_at, request)
SELECT 'bench', 'POST /orders', k, 'fp', 'pending', 'tok-' || k, statement_timestamp() + interval '30 seconds',
    statement_timestamp(), statement_timestamp(), NULL` + from + `
ON CONFLICT (scope, operation, key) DO NOTHING`
			update := `UPDATE ` + table + ` r
   SET state = 'completed', expires_at = statement_timestamp() + interval '24 hours', updated_at = statement_timestamp(),
       response = '\x01c9010000207b226964223a226f72645f313233222c22737461747573223a2270616964227d'::bytea` + from + `
 WHERE r.scope = 'bench' AND r.operation = 'POST /orders' AND r.key = k
   AND r.state = 'pending' AND r.token = 'tok-' || k`
			for _, q := range []string{"BEGIN", insert, "COMMIT", "BEGIN", update, "COMMIT"} {
				if _, err := conn.Exec(ctx, q, pgx.QueryExecModeSimpleProtocol); err != nil {
					b.Fatal(err)
				}
			}
			return
		}
		if variant == "mixed" {
			from := ` FROM generate_series(1, ` + strconv.Itoa(rows) + `) g, left(md5($1::bigint || '-' || g), 26) k`
			var pb pgx.Batch
			pb.Queue("BEGIN")
			pb.Queue(`INSERT INTO `+table+` (scope, operation, key, fingerprint, state, token, lease_until, created_at, updated_at, request)
SELECT 'bench', 'POST /orders', k, 'fp', 'pending', 'tok-' || k, statement_timestamp() + interval '30 seconds',
    statement_timestamp(), statement_timestamp(), NULL`+from+`
ON CONFLICT (scope, operation, key) DO NOTHING`, batch)
			pb.Queue(`UPDATE `+table+` r
   SET state = 'completed', expires_at = statement_timestamp() + interval '24 hours', updated_at = statement_timestamp(),
       response = '\x01c9010000207b226964223a226f72645f313233222c22737461747573223a2270616964227d'::bytea`+from+`
 WHERE r.scope = 'bench' AND r.operation = 'POST /orders' AND r.key = k
   AND r.state = 'pending' AND r.token = 'tok-' || k`, batch-1)
			if err := conn.SendBatch(ctx, &pb).Close(); err != nil {
				b.Fatal(err)
			}
			if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
				b.Fatal(err)
			}
			return
		}
		reserves, completes := newOps()
		var pb pgx.Batch
		pb.Queue("BEGIN")
		if variant == "values" {
			queueValues(&pb, table, reserves, previous)
		} else {
			pb.Queue(reserveSQL, reserveArrays(reserves)...)
			if previous != nil {
				pb.Queue(completeSQL, s.completeArrays(previous)...)
			}
		}
		if err := conn.SendBatch(ctx, &pb).Close(); err != nil {
			b.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
			b.Fatal(err)
		}
		previous = completes
	}
	for range 20 {
		one()
	}
	batches := max(1, b.N/rows)
	var lsn0, lsn1 string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn0); err != nil {
		b.Fatal(err)
	}
	t0, err := backendTicks(pid)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range batches {
		one()
	}
	b.StopTimer()
	t1, err := backendTicks(pid)
	if err != nil {
		b.Fatal(err)
	}
	// Every variant settles at least the pairs measured (the warm-up's
	// batches make up for the last batch, which the store's variants and
	// mixed leave pending): a settle that matched no row would measure
	// half the work.
	var settled int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE state = 'completed'").Scan(&settled); err != nil {
		b.Fatal(err)
	}
	if settled < batches*rows {
		b.Fatalf("%d records completed, want at least %d", settled, batches*rows)
	}
	var wal float64
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn1); err != nil {
		b.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)::float8", lsn1, lsn0).Scan(&wal); err != nil {
		b.Fatal(err)
	}
	pairs := float64(batches * rows)
	b.ReportMetric(float64(t1-t0)*1e6/float64(clockTicks)/pairs, "pg-cpu-µs/pair")
	b.ReportMetric(wal/pairs, "WAL-B/pair")
}

// statementResponse is the answer every pair of BenchmarkStatementCPU
// stores: storebench.Response's.
var statementResponse = &idemstore.Response{Status: 201, Body: []byte(`{"id":"ord_123","status":"paid"}`)}

// clockTicks is Linux's USER_HZ, the unit of /proc/PID/stat's times.
const clockTicks = 100

// backendTicks returns the user and system CPU time of process pid, in
// clock ticks.
func backendTicks(pid int) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(data)
	end := strings.LastIndexByte(s, ')')
	if end < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	user, err1 := strconv.Atoi(f[11])
	sys, err2 := strconv.Atoi(f[12])
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return user + sys, nil
}

// queueValues queues values/rows=N's two statements: the reserves' INSERT
// and the previous batch's settle, each row a VALUES list of parameters.
func queueValues(pb *pgx.Batch, table string, reserves, previous []*groupcommit.Op) {
	var (
		sb   strings.Builder
		args []any
	)
	sb.WriteString(`INSERT INTO ` + table + ` (scope, operation, key, fingerprint, state, token, lease_until, created_at, updated_at, request, scope_label, label_index) VALUES `)
	for i, op := range reserves {
		if i > 0 {
			sb.WriteString(", ")
		}
		n := len(args)
		fmt.Fprintf(&sb, "($%d, $%d, $%d, $%d, 'pending', $%d, statement_timestamp() + $%d::interval, statement_timestamp(), statement_timestamp(), $%d::bytea, NULLIF($%d, ''), NULLIF($%d, ''))",
			n+1, n+2, n+3, n+4, n+5, n+6, n+7, n+8, n+9)
		args = append(args, op.Key.Scope, op.Key.Operation, op.Key.Key, op.Fingerprint, op.Token, op.Lease, idemstore.EncodeRequest(op.Request), "", "")
	}
	sb.WriteString(" ON CONFLICT (scope, operation, key) DO NOTHING")
	pb.Queue(sb.String(), args...)
	if previous == nil {
		return
	}
	sb.Reset()
	args = nil // the INSERT's arguments are queued: a new slice
	sb.WriteString(`UPDATE ` + table + ` r SET state = 'completed', response = i.response, expires_at = statement_timestamp() + i.retention, updated_at = statement_timestamp() FROM (VALUES `)
	for i, op := range previous {
		if i > 0 {
			sb.WriteString(", ")
		}
		n := len(args)
		fmt.Fprintf(&sb, "($%d::text, $%d::text, $%d::text, $%d::text, $%d::bytea, $%d::interval)", n+1, n+2, n+3, n+4, n+5, n+6)
		args = append(args, op.Key.Scope, op.Key.Operation, op.Key.Key, op.Token, idemstore.EncodeResponse(op.Response), op.Retention)
	}
	sb.WriteString(`) AS i(scope, operation, key, token, response, retention)
WHERE r.scope = i.scope AND r.operation = i.operation AND r.key = i.key AND r.state = 'pending' AND r.token = i.token`)
	pb.Queue(sb.String(), args...)
}
