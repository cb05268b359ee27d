#!/usr/bin/env bash
# ceiling.sh holds the PostgreSQL store alone against what PostgreSQL itself
# does with idem's rows on the same machine, in one run, ROUNDS times
# interleaved:
#
#   1. PostgreSQL's ceiling, by pgbench, 32-row batches on 8 connections
#      (the same two writes, INSERT … ON CONFLICT then the settle UPDATE,
#      each batch in a transaction) of the rows the store's benchmark
#      writes (internal/tools/storebench: scope "bench", a random 26-byte
#      key, fingerprint "fp", token "tok-" and the key, the same encoded
#      answer), for three schemas:
#        idem     the tables idempg/migrations create today
#        minimal  the primary key and one index on created_at, fillfactor 70:
#                 the settle touches no index and can be a HOT update
#        hot      idem's tables without the three indexes that name state,
#                 expires_at or lease_until (so that a settle can be a HOT
#                 update), fillfactor 70, plus a side table of pending keys
#                 written by the reserve and deleted by the settle: what
#                 recovery would need to find expired leases without those
#                 indexes
#      with the share of settle UPDATEs that were HOT (n_tup_hot_upd),
#      and idem's schema again in batches of the store's size (idem-16),
#      and in the store's own transactions (mixed-16): each transaction
#      of a connection inserts a batch's rows and settles the rows its
#      previous transaction inserted, then commits once, as a batch of
#      the store carries the reserves of some calls and the completions
#      of others;
#   2. the store, BenchmarkReserveComplete/batch=on/c=50 (idempg/bench_test.go),
#      right after, and its ratio to each line: pairs/s, and PostgreSQL's
#      CPU per pair (the store's over the line's). The benchmark makes and
#      drops its schema twice (Go runs a benchmark once with b.N = 1
#      before the measured run): what that costs PostgreSQL, measured
#      before the rounds (the median of three runs of one pair), is taken
#      out of the store's CPU.
#
# Every line writes the same number of pairs (PAIRS) into empty tables (the
# store's benchmark makes a schema of its own, the pgbench lines' tables
# are truncated first), with keys spread over the whole key space as
# clients' keys are: a batch's 32 keys each land on a page of their own in
# every index that holds the key, not on one shared leaf (keys of one
# prefix, as "k-<n>-<row>", cost PostgreSQL a quarter less, and measure a
# workload no client sends).
#
# For every line it also prints PostgreSQL's CPU time per pair (every
# postgres process, counted by scripts/benchlib.sh's pgcpu_start) and the
# share of the machine that idled: what the database spends on a pair in pgbench's hands is the
# floor for what it can spend behind the store.
#
# With STATEMENTS=1 it also prints, after each line, what PostgreSQL spent
# on each statement (pg_stat_statements, reset before the line): calls,
# rows a call, execution time a call and a pair, and per pair the shared
# blocks hit and dirtied, the WAL records and bytes and full-page images.
# The times are the executor's (waits for locks and for the WAL flush of a
# COMMIT included), not CPU; they say where, the CPU line says how much.
# They are wall times, not to be compared across lines: pgbench's
# connections share the machine's cores and count, inside the executor,
# the time they wait for one, where the store runs its batches one at a
# time in one backend. BenchmarkStatementCPU (idempg) compares what the
# statements themselves cost PostgreSQL, in one backend and no
# concurrency.
#
#   eval "$(scripts/services.sh)"; idempg/bench/ceiling.sh
#   STATEMENTS=1 ROUNDS=2 idempg/bench/ceiling.sh
#
# Environment: IDEM_TEST_POSTGRES_URL (required), CLIENTS (8), BATCH (32),
# PAIRS (40000: the pairs each line writes; a count, so that the store's
# CPU per pair counts one run of the benchmark, not its ramp-up too),
# WARMUP (2: seconds of pgbench on each schema before the rounds; 0 for
# none), STORE_ROWS (16: the rows a statement of the idem-N and mixed-N
# lines), ROUNDS (1), PROTOCOL (simple: pgbench's -M; prepared sends
# the statements as the store does, parsed and planned once),
# STORE_TEST (a compiled idempg test binary, from `go test -c ./idempg/`,
# built when unset), STATEMENTS (0).
#
# STATEMENTS=1 needs pg_stat_statements loaded at server start: add
# shared_preload_libraries = 'pg_stat_statements' to the server's
# configuration (on Debian, a file in /etc/postgresql/15/main/conf.d/) and
# restart it (pg_ctlcluster 15 main restart); the script creates the
# extension itself.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/benchlib.sh
url=${IDEM_TEST_POSTGRES_URL:?run: eval "\$(scripts/services.sh)"}
clients=${CLIENTS:-8}; batch=${BATCH:-32}; pairs_per_line=${PAIRS:-40000}; rounds=${ROUNDS:-1}
warmup=${WARMUP:-2}; statements=${STATEMENTS:-0}; protocol=${PROTOCOL:-simple}
if [ "$statements" = 1 ]; then
	case ",$(psql -X -At "$url" -c 'SHOW shared_preload_libraries' | tr -d ' ')," in
	*,pg_stat_statements,*) psql -X -q "$url" -v ON_ERROR_STOP=1 -c 'CREATE EXTENSION IF NOT EXISTS pg_stat_statements' >/dev/null ;;
	*)
		echo "ceiling.sh: STATEMENTS=1 needs shared_preload_libraries = 'pg_stat_statements' in the server's configuration, and a restart" >&2
		exit 1
		;;
	esac
fi
tmp=$(mktemp -d)
# cpustat prints the machine's busy and idle ticks (/proc/stat).
cpustat() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6 }' /proc/stat; }
# per PAIRS T0 T1 prints PostgreSQL's CPU µs per pair.
per() { awk -v n="$1" -v t0="$2" -v t1="$3" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", (n > 0) ? (t1 - t0) * 1e6 / hz / n : 0 }'; }
# usage PAIRS T0 T1 "BUSY0 IDLE0" "BUSY1 IDLE1" prints PostgreSQL's CPU µs per pair and the idle share.
usage() {
	awk -v n="$1" -v t0="$2" -v t1="$3" -v a="$4" -v b="$5" -v hz="$(getconf CLK_TCK)" 'BEGIN {
		split(a, x, " "); split(b, y, " "); busy = y[1] - x[1]; idle = y[2] - x[2]
		per = (n > 0) ? (t1 - t0) * 1e6 / hz / n : 0; share = (busy + idle > 0) ? 100 * idle / (busy + idle) : 0
		printf "PostgreSQL %.0f cpu-µs/pair, idle %.0f%%", per, share }'
}
# stats_settled waits (at most 5 s) until no pgbench backend is left:
# each reports its table statistics as it exits.
stats_settled() {
	local i
	for i in $(seq 50); do
		[ "$(psql -X -At "$url" -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgbench'")" = 0 ] && return
		sleep 0.1
	done
}
# statements PAIRS prints, with STATEMENTS=1, what each statement cost
# since the last reset, per pair, the costliest first, and resets.
statements() {
	[ "$statements" = 1 ] && [ "$1" -gt 0 ] || return 0
	psql -X -q "$url" -v ON_ERROR_STOP=1 -v pairs="$1" -P footer=off <<'PSS' | sed 's/^/    /'
SELECT calls, round(rows::numeric / calls, 1) AS "rows/call",
    round((total_exec_time * 1000 / calls)::numeric) AS "µs/call",
    round((total_exec_time * 1000 / :pairs)::numeric, 1) AS "µs/pair",
    round(shared_blks_hit::numeric / :pairs, 1) AS "hit/pair",
    round(shared_blks_dirtied::numeric / :pairs, 2) AS "dirtied/pair",
    round(wal_records::numeric / :pairs, 2) AS "WAL rec/pair",
    round(wal_bytes::numeric / :pairs) AS "WAL B/pair",
    round(wal_fpi::numeric / :pairs, 3) AS "FPI/pair",
    CASE WHEN toplevel THEN '' ELSE 'nested ' END || left(regexp_replace(query, '\s+', ' ', 'g'), 70) AS statement
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query !~* 'pg_stat|pg_catalog|pg_advisory|idem_schema_migrations|^(CREATE|DROP|ALTER|LOCK|ANALYZE|SHOW)'
  AND calls > 2
ORDER BY total_exec_time DESC LIMIT 12;
SELECT pg_stat_statements_reset() IS NULL AS reset \gset
PSS
}
reset_statements() { [ "$statements" = 1 ] && psql -X -q -At "$url" -c 'SELECT pg_stat_statements_reset()' >/dev/null || true; }
schemas=(ceil_idem ceil_min ceil_hot)
drop() { for s in "${schemas[@]}"; do psql -X -q "$url" -c "DROP SCHEMA IF EXISTS $s CASCADE" >/dev/null 2>&1 || true; done; }
trap 'kill "${pgcpu_loop:-}" 2>/dev/null || true; drop; rm -rf "$tmp"' EXIT
drop
for s in "${schemas[@]}"; do psql -X -q "$url" -v ON_ERROR_STOP=1 -c "CREATE SCHEMA $s" >/dev/null; done
# In one transaction, as Migrate applies them: migration 005 locks the
# table, which PostgreSQL allows only inside a transaction block.
for s in ceil_idem ceil_hot; do sed "s/{schema}/$s/g" idempg/migrations/*.sql | psql -X -q -1 "$url" -v ON_ERROR_STOP=1 >/dev/null; done
psql -X -q "$url" -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
CREATE TABLE ceil_min.idem_records (
    scope text COLLATE "C" NOT NULL, operation text COLLATE "C" NOT NULL, key text COLLATE "C" NOT NULL,
    fingerprint text NOT NULL, state text NOT NULL, token text NOT NULL, lease_until timestamptz NOT NULL,
    response bytea, reason text NOT NULL DEFAULT '', created_at timestamptz NOT NULL, expires_at timestamptz,
    waiters boolean NOT NULL DEFAULT false, updated_at timestamptz, request bytea,
    PRIMARY KEY (scope, operation, key)) WITH (fillfactor = 70);
CREATE INDEX ON ceil_min.idem_records (created_at);
DROP INDEX ceil_hot.idem_records_pending_lease, ceil_hot.idem_records_completed_expiry, ceil_hot.idem_records_open_key;
ALTER TABLE ceil_hot.idem_records SET (fillfactor = 70);
CREATE TABLE ceil_hot.idem_pending (scope text COLLATE "C" NOT NULL, operation text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL, lease_until timestamptz NOT NULL, PRIMARY KEY (scope, operation, key));
SQL
# The lines: a name, its schema, its batch size. idem-N is idem's schema
# in batches of the store's size: at 50 callers a batch of the store
# carries 32-34 calls, so each of its two statements about 16 rows
# (STORE_ROWS), and what a statement costs is shared by that many pairs,
# not 32. mixed-N writes them in the store's transactions: one commit a
# batch of N pairs, as the store's one commit a batch (idem and idem-N
# commit twice a batch).
store_rows=${STORE_ROWS:-16}
mixed=mixed-$store_rows
lines=(idem min hot "idem-$store_rows" "$mixed")
declare -A line_schema=([idem]=ceil_idem [min]=ceil_min [hot]=ceil_hot ["idem-$store_rows"]=ceil_idem [$mixed]=ceil_idem)
declare -A line_batch=([idem]=$batch [min]=$batch [hot]=$batch ["idem-$store_rows"]=$store_rows [$mixed]=$store_rows)
# insert_sql S B prints the reserve of batch n's B rows into schema S, and
# settle_sql S B V the settle of batch V's rows. Row g of batch n has the
# key left(md5(n-g), 26): random, as the store's benchmark's keys (26 bytes
# of crypto/rand's rand.Text), yet the same in both statements. The answer
# is the store's encoding of storebench.Response (TestCeilingScript checks
# it).
insert_sql() {
	cat <<SQL
INSERT INTO $1.idem_records (scope, operation, key, fingerprint, state, token, lease_until, created_at, updated_at, request)
SELECT 'bench', 'POST /orders', k, 'fp', 'pending', 'tok-' || k, statement_timestamp() + interval '30 seconds',
    statement_timestamp(), statement_timestamp(), NULL
FROM generate_series(1, $2) g, left(md5(:n || '-' || g), 26) k
ON CONFLICT (scope, operation, key) DO NOTHING;
SQL
}
settle_sql() {
	cat <<SQL
UPDATE $1.idem_records r
   SET state = 'completed', expires_at = statement_timestamp() + interval '24 hours', updated_at = statement_timestamp(),
       response = '\\x01c9010000207b226964223a226f72645f313233222c22737461747573223a2270616964227d'::bytea
  FROM generate_series(1, $2) g, left(md5(:$3 || '-' || g), 26) k
 WHERE r.scope = 'bench' AND r.operation = 'POST /orders' AND r.key = k
   AND r.state = 'pending' AND r.token = 'tok-' || k;
SQL
}
for line in "${lines[@]}"; do
	s=${line_schema[$line]} b=${line_batch[$line]} extra=()
	if [ "$line" = "$mixed" ]; then
		# One transaction: this batch's reserves and the settles of the
		# batch the client's previous transaction inserted. pgbench keeps a
		# client's variables from one run of the script to the next: prev
		# is that batch (0, no rows, before the first; -D sets it).
		extra=(-D prev=0)
		{
			echo '\set n random(1, 1000000000000)'
			echo 'BEGIN;'
			insert_sql "$s" "$b"
			settle_sql "$s" "$b" prev
			echo 'COMMIT;'
			echo '\set prev :n'
		} >"$tmp/$line.sql"
	else
		# The two transactions of a batch, with the side table's writes for
		# hot.
		ins="" del=""
		if [ "$s" = ceil_hot ]; then
			ins="INSERT INTO $s.idem_pending SELECT 'bench', 'POST /orders', left(md5(:n || '-' || g), 26), statement_timestamp() + interval '30 seconds' FROM generate_series(1, $b) g ON CONFLICT DO NOTHING;"
			del="DELETE FROM $s.idem_pending p USING generate_series(1, $b) g WHERE p.scope = 'bench' AND p.operation = 'POST /orders' AND p.key = left(md5(:n || '-' || g), 26);"
		fi
		{
			echo '\set n random(1, 1000000000000)'
			echo 'BEGIN;'
			insert_sql "$s" "$b"
			echo "$ins"
			echo 'COMMIT;'
			echo 'BEGIN;'
			settle_sql "$s" "$b" n
			echo "$del"
			echo 'COMMIT;'
		} >"$tmp/$line.sql"
	fi
	if [ "$warmup" != 0 ]; then
		pgbench -n -M "$protocol" "${extra[@]}" -c "$clients" -j 2 -T "$warmup" -f "$tmp/$line.sql" "$url" >/dev/null 2>&1
	fi
	psql -X -q "$url" -c "ANALYZE $s.idem_records" >/dev/null
done
store_test=${STORE_TEST:-}
if [ -z "$store_test" ]; then
	store_test=$tmp/idempg.test
	go test -c -o "$store_test" ./idempg/ >/dev/null
fi
# setup_ticks is what one run of the store's benchmark on one pair costs
# PostgreSQL (making and dropping its schema): the mean of five, each
# counted to the tick.
setup_ticks=$(for i in 1 2 3 4 5; do
	pgcpu_start
	"$store_test" -test.run '^$' -test.bench 'BenchmarkReserveComplete/batch=on/c=50$' -test.benchtime 1x >/dev/null
	pgcpu_stop
done | awk '{ s += $1 } END { printf "%.1f", s / NR }')
echo "# PostgreSQL $(psql -X -At "$url" -c 'SHOW server_version'); $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); pgbench $clients clients x $batch-row batches (idem-$store_rows, $mixed: $store_rows-row), pgbench -M $protocol; $pairs_per_line pairs a line (pgbench: rounded up to whole batches)"
for round in $(seq "$rounds"); do
	declare -A pairs=() cpu=()
	for line in "${lines[@]}"; do
		s=${line_schema[$line]} b=${line_batch[$line]}
		psql -X -q "$url" -c "TRUNCATE $s.idem_records$([ "$s" = ceil_hot ] && echo ", $s.idem_pending")" >/dev/null
		stats_settled
		before=$(psql -X -At "$url" -c "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = '$s' AND relname = 'idem_records'")
		reset_statements
		t0=0 c0=$(cpustat)
		pgcpu_start
		# A line's transactions: one batch of pairs each (two a batch but
		# idem's and idem-N's scripts count them as one); mixed-N's first
		# transaction of each client settles nothing, and its last leaves
		# its batch pending, so it runs one more a client and counts one
		# fewer.
		txs=$(((pairs_per_line + clients * b - 1) / (clients * b))) extra=() spare=0
		[ "$line" = "$mixed" ] && txs=$((txs + 1)) extra=(-D prev=0) spare=$clients
		out=$(pgbench -n -M "$protocol" "${extra[@]}" -c "$clients" -j 2 -t "$txs" -f "$tmp/$line.sql" "$url" 2>&1)
		t1=$(pgcpu_stop) c1=$(cpustat)
		tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out")
		done_tx=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")
		done_pairs=$((done_tx - spare))
		stats_settled
		# Every pair counted must have been settled: a script whose settle
		# matched no row would measure half the work.
		settled=$(psql -X -At "$url" -c "SELECT count(*) FROM $s.idem_records WHERE state = 'completed'")
		if [ "$settled" -lt $((done_pairs * b)) ]; then
			echo "ceiling.sh: round $round $line settled $settled rows of the $((done_pairs * b)) it counts" >&2
			exit 1
		fi
		after=$(psql -X -At "$url" -c "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = '$s' AND relname = 'idem_records'")
		pairs[$line]=$(awk -v t="$tps" -v b="$b" -v d="$done_tx" -v p="$done_pairs" 'BEGIN { printf "%.0f", (d > 0 ? t * b * p / d : 0) }')
		cpu[$line]=$(per $((done_pairs * b)) "$t0" "$t1")
		hot=$(awk -F'|' -v b="$before" -v a="$after" 'BEGIN { split(b, x, "|"); split(a, y, "|"); u = y[1] - x[1]; h = y[2] - x[2]; printf "%.0f%%", (u > 0 ? 100 * h / u : 0) }')
		echo "round $round $line: ${pairs[$line]} pairs/s, HOT settles $hot, $(usage $((done_pairs * b)) "$t0" "$t1" "$c0" "$c1")"
		statements $((done_pairs * b))
	done
	reset_statements
	t0=0 c0=$(cpustat)
	pgcpu_start
	out=$("$store_test" -test.run '^$' -test.bench 'BenchmarkReserveComplete/batch=on/c=50$' -test.benchtime "${pairs_per_line}x")
	t1=$(awk -v t="$(pgcpu_stop)" -v s="$setup_ticks" 'BEGIN { print t - 2 * s }') c1=$(cpustat)
	store=$(metric "$out" "ReserveComplete/batch=on/c=50" pairs/s)
	calls=$(metric "$out" "ReserveComplete/batch=on/c=50" calls/batch)
	n=$(awk -v o="$out" 'BEGIN { split(o, l, "\n"); for (i in l) if (l[i] ~ /ReserveComplete\/batch=on\/c=50/) { split(l[i], f, " "); print f[2] } }')
	echo "round $round store batch=on c=50: ${store:-?} pairs/s (${calls:-?} calls per batch), $(usage "${n:-0}" "$t0" "$t1" "$c0" "$c1") (its set-up, $(awk -v s="$setup_ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.0f", s * 1000 / hz }') ms of PostgreSQL CPU twice, taken out)"
	statements "${n:-0}"
	for line in "${lines[@]}"; do
		awk -v a="$store" -v b="${pairs[$line]}" -v c="$(per "${n:-0}" "$t0" "$t1")" -v d="${cpu[$line]}" -v s="$line" -v r="$round" 'BEGIN {
			if (a != "" && b > 0 && d > 0) printf "round %d store / %s: pairs/s %.2f, PostgreSQL CPU per pair %.2f\n", r, s, a / b, c / d }'
	done
done
