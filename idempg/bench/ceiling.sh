#!/usr/bin/env bash
# ceiling.sh holds the PostgreSQL store alone against what PostgreSQL itself
# does with idem's rows on the same machine, in one run, ROUNDS times
# interleaved:
#
#   1. PostgreSQL's ceiling, by pgbench, 32-row batches on 8 connections
#      (the same two writes, INSERT … ON CONFLICT then the settle UPDATE,
#      each batch in a transaction), for three schemas:
#        idem     the tables idempg/migrations create today
#        minimal  the primary key and one index on created_at, fillfactor 70:
#                 the settle touches no index and can be a HOT update
#        hot      idem's tables without the three indexes that name state,
#                 expires_at or lease_until (so that a settle can be a HOT
#                 update), fillfactor 70, plus a side table of pending keys
#                 written by the reserve and deleted by the settle: what
#                 recovery would need to find expired leases without those
#                 indexes
#      with the share of settle UPDATEs that were HOT (n_tup_hot_upd);
#   2. the store, BenchmarkReserveComplete/batch=on/c=50 (idempg/bench_test.go),
#      right after, and its ratio to each line.
#
# For every line it also prints PostgreSQL's CPU time per pair (every
# postgres process, the backends that ended during the run included,
# through the postmaster's children's times) and the share of the machine
# that idled: what the database spends on a pair in pgbench's hands is the
# floor for what it can spend behind the store.
#
#   eval "$(scripts/services.sh)"; idempg/bench/ceiling.sh
#
# Environment: IDEM_TEST_POSTGRES_URL (required), CLIENTS (8), BATCH (32),
# SECS (10, per pgbench run), BENCHTIME (40000x: a count, so that the store's
# CPU per pair counts one run of the benchmark, not its ramp-up too), ROUNDS (1).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/benchlib.sh
url=${IDEM_TEST_POSTGRES_URL:?run: eval "\$(scripts/services.sh)"}
clients=${CLIENTS:-8}; batch=${BATCH:-32}; secs=${SECS:-10}; benchtime=${BENCHTIME:-40000x}; rounds=${ROUNDS:-1}
tmp=$(mktemp -d)
# pgticks prints the CPU ticks every postgres process has used: the
# postmaster's own and its ended children's (cutime, cstime), and each live
# one's. Run on an otherwise quiet machine.
pgticks() {
	local pm
	pm=$(pgrep -o -x postgres) || { echo 0; return; }
	{
		awk '{ print $14 + $15 + $16 + $17 }' "/proc/$pm/stat"
		for p in $(pgrep -P "$pm"); do awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null || true; done
	} | awk '{ s += $1 } END { print s }'
}
# cpustat prints the machine's busy and idle ticks (/proc/stat).
cpustat() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6 }' /proc/stat; }
# usage PAIRS T0 T1 "BUSY0 IDLE0" "BUSY1 IDLE1" prints PostgreSQL's CPU µs per pair and the idle share.
usage() {
	awk -v n="$1" -v t0="$2" -v t1="$3" -v a="$4" -v b="$5" -v hz="$(getconf CLK_TCK)" 'BEGIN {
		split(a, x, " "); split(b, y, " "); busy = y[1] - x[1]; idle = y[2] - x[2]
		per = (n > 0) ? (t1 - t0) * 1e6 / hz / n : 0; share = (busy + idle > 0) ? 100 * idle / (busy + idle) : 0
		printf "PostgreSQL %.0f cpu-µs/pair, idle %.0f%%", per, share }'
}
schemas=(ceil_idem ceil_min ceil_hot)
drop() { for s in "${schemas[@]}"; do psql -X -q "$url" -c "DROP SCHEMA IF EXISTS $s CASCADE" >/dev/null 2>&1 || true; done; }
trap 'drop; rm -rf "$tmp"' EXIT
drop
for s in "${schemas[@]}"; do psql -X -q "$url" -v ON_ERROR_STOP=1 -c "CREATE SCHEMA $s" >/dev/null; done
for s in ceil_idem ceil_hot; do sed "s/{schema}/$s/g" idempg/migrations/*.sql | psql -X -q "$url" -v ON_ERROR_STOP=1 >/dev/null; done
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
for s in "${schemas[@]}"; do
	ins="" del=""
	if [ "$s" = ceil_hot ]; then
		ins="INSERT INTO $s.idem_pending SELECT 'user-' || :client_id, 'POST /orders', 'k-' || :n || '-' || g, statement_timestamp() + interval '30 seconds' FROM generate_series(1, $batch) g ON CONFLICT DO NOTHING;"
		del="DELETE FROM $s.idem_pending p USING generate_series(1, $batch) g WHERE p.scope = 'user-' || :client_id AND p.operation = 'POST /orders' AND p.key = 'k-' || :n || '-' || g;"
	fi
	# The two transactions of ../shared/bench/pg-batch-limit.sh, with the side table's writes for hot.
	cat >"$tmp/$s.sql" <<SQL
\\set n random(1, 1000000000000)
BEGIN;
INSERT INTO $s.idem_records (scope, operation, key, fingerprint, state, token, lease_until, created_at, updated_at, request)
SELECT 'user-' || :client_id, 'POST /orders', 'k-' || :n || '-' || g, 'v1:5d9adae3c06e62407254b9a98c783924f07907d28e152ee81afa2d0500119829',
    'pending', 'tok-' || :n, statement_timestamp() + interval '30 seconds', statement_timestamp(), statement_timestamp(), NULL
FROM generate_series(1, $batch) g
ON CONFLICT (scope, operation, key) DO NOTHING;
$ins
COMMIT;
BEGIN;
UPDATE $s.idem_records r
   SET state = 'completed', expires_at = statement_timestamp() + interval '24 hours', updated_at = statement_timestamp(),
       response = '\\x01c9010000207b226964223a226f72645f313233222c22737461747573223a2270616964222c22616d6f756e74223a353030307d'::bytea
  FROM generate_series(1, $batch) g
 WHERE r.scope = 'user-' || :client_id AND r.operation = 'POST /orders' AND r.key = 'k-' || :n || '-' || g
   AND r.state = 'pending' AND r.token = 'tok-' || :n;
$del
COMMIT;
SQL
	pgbench -n -c "$clients" -j 2 -T 2 -f "$tmp/$s.sql" "$url" >/dev/null 2>&1
	psql -X -q "$url" -c "ANALYZE $s.idem_records" >/dev/null
done
go test -c -o "$tmp/idempg.test" ./idempg/ >/dev/null
echo "# PostgreSQL $(psql -X -At "$url" -c 'SHOW server_version'); $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); pgbench $clients clients x $batch-row batches, ${secs}s; store ${benchtime}"
for round in $(seq "$rounds"); do
	declare -A pairs=()
	for s in "${schemas[@]}"; do
		before=$(psql -X -At "$url" -c "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = '$s' AND relname = 'idem_records'")
		t0=$(pgticks) c0=$(cpustat)
		out=$(pgbench -n -c "$clients" -j 2 -T "$secs" -f "$tmp/$s.sql" "$url" 2>&1)
		t1=$(pgticks) c1=$(cpustat)
		tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out")
		done_pairs=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")
		sleep 1 # the statistics collector's report
		after=$(psql -X -At "$url" -c "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = '$s' AND relname = 'idem_records'")
		pairs[$s]=$(awk -v t="$tps" -v b="$batch" 'BEGIN { printf "%.0f", t * b }')
		hot=$(awk -F'|' -v b="$before" -v a="$after" 'BEGIN { split(b, x, "|"); split(a, y, "|"); u = y[1] - x[1]; h = y[2] - x[2]; printf "%.0f%%", (u > 0 ? 100 * h / u : 0) }')
		echo "round $round ${s#ceil_}: ${pairs[$s]} pairs/s, HOT settles $hot, $(usage $((done_pairs * batch)) "$t0" "$t1" "$c0" "$c1")"
	done
	t0=$(pgticks) c0=$(cpustat)
	out=$("$tmp/idempg.test" -test.run '^$' -test.bench 'BenchmarkReserveComplete/batch=on/c=50$' -test.benchtime "$benchtime")
	t1=$(pgticks) c1=$(cpustat)
	store=$(metric "$out" "ReserveComplete/batch=on/c=50" pairs/s)
	calls=$(metric "$out" "ReserveComplete/batch=on/c=50" calls/batch)
	n=$(awk -v o="$out" 'BEGIN { split(o, l, "\n"); for (i in l) if (l[i] ~ /ReserveComplete\/batch=on\/c=50/) { split(l[i], f, " "); print f[2] } }')
	echo "round $round store batch=on c=50: ${store:-?} pairs/s (${calls:-?} calls per batch), $(usage "${n:-0}" "$t0" "$t1" "$c0" "$c1") (the test's set-up included)"
	for s in "${schemas[@]}"; do
		awk -v a="$store" -v b="${pairs[$s]}" -v s="${s#ceil_}" 'BEGIN { if (a != "" && b > 0) printf "round %d store / %s = %.2f\n", '"$round"', s, a / b }'
	done
done
