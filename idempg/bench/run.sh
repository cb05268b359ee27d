#!/usr/bin/env bash
# run.sh compares idempg's BenchmarkReserveComplete (16 goroutines) with the
# native limit: pgbench running the same INSERT … ON CONFLICT + UPDATE at 16
# clients against the same table layout, in the same session.
#
#   eval "$(scripts/services.sh --bench)"; idempg/bench/run.sh
#
# Environment: IDEM_TEST_POSTGRES_URL (required), SECONDS_PER_RUN (20),
# PGBENCH_FLAGS (extra pgbench flags, e.g. "-M prepared").
set -euo pipefail
cd "$(dirname "$0")/../.."
url=${IDEM_TEST_POSTGRES_URL:?run: eval "\$(scripts/services.sh --bench)"}
secs=${SECONDS_PER_RUN:-20}

psql -X -q "$url" -v ON_ERROR_STOP=1 -c 'DROP SCHEMA IF EXISTS idem_bench CASCADE' -c 'CREATE SCHEMA idem_bench'
sed 's/{schema}/idem_bench/g' idempg/migrations/*.sql | psql -X -q "$url" -v ON_ERROR_STOP=1 >/dev/null
trap 'psql -X -q "$url" -c "DROP SCHEMA IF EXISTS idem_bench CASCADE" >/dev/null' EXIT

echo "# PostgreSQL $(psql -X -At "$url" -c 'SHOW server_version'), synchronous_commit=$(psql -X -At "$url" -c 'SHOW synchronous_commit')"
echo "# pgbench -n -c 16 -j 2 -T $secs ${PGBENCH_FLAGS:-} -f idempg/bench/pgbench.sql"
# shellcheck disable=SC2086
pgb=$(pgbench -n -c 16 -j 2 -T "$secs" ${PGBENCH_FLAGS:-} -f idempg/bench/pgbench.sql "$url" 2>&1)
echo "$pgb" | grep -E '^(number of transactions actually processed|latency average|tps)'
native=$(echo "$pgb" | sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p')

echo "# go test -run '^\$' -bench 'BenchmarkReserveComplete/notify=on' -benchmem -benchtime ${secs}s ./idempg/"
gob=$(go test -run '^$' -bench 'BenchmarkReserveComplete/notify=on' -benchmem -benchtime "${secs}s" ./idempg/)
echo "$gob" | grep '^Benchmark'
store=$(echo "$gob" | sed -n 's/.* \([0-9.]*\) pairs\/s.*/\1/p')

awk -v s="$store" -v n="$native" 'BEGIN { printf "store %.0f pairs/s, pgbench %.0f tx/s, ratio %.2f (target >= 0.85)\n", s, n, s / n }'
