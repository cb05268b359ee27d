#!/usr/bin/env bash
# run.sh compares idempg's BenchmarkReserveComplete with the native limit:
# pgbench running the same INSERT … ON CONFLICT + UPDATE, one pair per
# transaction as two autocommit statements (pgbench.sql), against the same
# table layout, in the same session, at 16, 32 and 50 clients (the store at
# the same numbers of goroutines, with group commit on and off). It also
# prints the store's p50 and p99 per pair at 1 and 32 goroutines, batching
# on and off.
#
#   eval "$(scripts/services.sh --bench)"; idempg/bench/run.sh
#
# Environment: IDEM_TEST_POSTGRES_URL (required), SECONDS_PER_RUN (10),
# CLIENTS ("16 32 50"), PGBENCH_FLAGS (extra pgbench flags, e.g. "-M prepared").
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/benchlib.sh
url=${IDEM_TEST_POSTGRES_URL:?run: eval "\$(scripts/services.sh --bench)"}
secs=${SECONDS_PER_RUN:-10}
clients=${CLIENTS:-16 32 50}

psql -X -q "$url" -v ON_ERROR_STOP=1 -c 'DROP SCHEMA IF EXISTS idem_bench CASCADE' -c 'CREATE SCHEMA idem_bench'
sed 's/{schema}/idem_bench/g' idempg/migrations/*.sql | psql -X -q "$url" -v ON_ERROR_STOP=1 >/dev/null
trap 'psql -X -q "$url" -c "DROP SCHEMA IF EXISTS idem_bench CASCADE" >/dev/null' EXIT

echo "# PostgreSQL $(psql -X -At "$url" -c 'SHOW server_version'), synchronous_commit=$(psql -X -At "$url" -c 'SHOW synchronous_commit'); $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A native=()
for c in $clients; do
	echo "# pgbench -n -c $c -j 2 -T $secs ${PGBENCH_FLAGS:-} -f idempg/bench/pgbench.sql"
	# shellcheck disable=SC2086
	pgb=$(pgbench -n -c "$c" -j 2 -T "$secs" ${PGBENCH_FLAGS:-} -f idempg/bench/pgbench.sql "$url" 2>&1)
	echo "$pgb" | grep -E '^(number of transactions actually processed|latency average|tps)'
	native[$c]=$(echo "$pgb" | sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p')
done

echo "# go test -run '^\$' -bench 'BenchmarkReserveComplete/batch' -benchmem -benchtime ${secs}s ./idempg/"
gob=$(go test -run '^$' -bench 'BenchmarkReserveComplete/batch' -benchmem -benchtime "${secs}s" ./idempg/)
echo "$gob" | grep '^Benchmark'
for c in $clients; do
	awk -v on="$(metric "$gob" "ReserveComplete/batch=on/c=$c" pairs/s)" -v off="$(metric "$gob" "ReserveComplete/batch=off/c=$c" pairs/s)" -v n="${native[$c]}" -v c="$c" 'BEGIN {
		printf "c=%d: store %.0f pairs/s (batching off: %.0f), pgbench %.0f tx/s: ratio %.2f (target >= 2), batching off %.2f\n", c, on, off, n, on / n, off / n }'
done
latencies "$gob" ReserveComplete
