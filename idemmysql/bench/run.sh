#!/usr/bin/env bash
# run.sh compares idemmysql's BenchmarkReserveComplete (group commit on and
# off) with (a) a raw database/sql loop of the same INSERT + UPDATE, one
# pair of autocommit statements at a time, in the same go test run, and (b)
# mysqlslap running the same two statements as text (mysqlslap.sql: each
# pair's key is a fresh UUID() kept in the session variable @k), at 16, 32
# and 50 clients. Keys are random on every side, as clients send. It also
# prints the store's p50 and p99 per pair at 1 and 32 goroutines, batching
# on and off.
#
#   eval "$(scripts/services.sh --bench)"; idemmysql/bench/run.sh
#
# The Go side runs with interpolateParams=true added to the DSN, so each
# statement is one round trip as in mysqlslap, not prepare/execute/close.
# Environment: IDEM_TEST_MYSQL_DSN (required), SECONDS_PER_RUN (10),
# CLIENTS ("16 32 50"), MYSQL_ARGS (client flags for mysqlslap, default
# "-uroot -h127.0.0.1").
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/benchlib.sh
dsn=${IDEM_TEST_MYSQL_DSN:?run: eval "\$(scripts/services.sh --bench)"}
secs=${SECONDS_PER_RUN:-10}
clients=${CLIENTS:-16 32 50}
read -r -a my <<<"${MYSQL_ARGS:--uroot -h127.0.0.1}"

echo "# $(mysql "${my[@]}" -N -e 'SELECT CONCAT(VERSION(), ", innodb_flush_log_at_trx_commit=", @@innodb_flush_log_at_trx_commit, ", sync_binlog=", @@sync_binlog, ", log_bin=", @@log_bin)'); $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"

case "$dsn" in *\?*) sep='&' ;; *) sep='?' ;; esac
echo "# go test -run '^\$' -bench BenchmarkReserveComplete -benchmem -benchtime ${secs}s ./idemmysql/  (DSN + interpolateParams=true)"
gob=$(IDEM_TEST_MYSQL_DSN="${dsn}${sep}interpolateParams=true" go test -run '^$' -bench BenchmarkReserveComplete -benchmem -benchtime "${secs}s" ./idemmysql/)
echo "$gob" | grep '^Benchmark'

mysql "${my[@]}" -e 'DROP DATABASE IF EXISTS idem_bench; CREATE DATABASE idem_bench'
trap 'mysql "${my[@]}" -e "DROP DATABASE IF EXISTS idem_bench"' EXIT
cat idemmysql/migrations/*.sql | grep -v '^\s*--' | mysql "${my[@]}" idem_bench
declare -A native=()
for c in $clients; do
	# About as many pairs as the raw loop does in SECONDS_PER_RUN.
	queries=$(awk -v s="$(metric "$gob" "ReserveComplete/raw/c=$c" pairs/s)" -v t="$secs" -v c="$c" 'BEGIN { q = int(s * t * 2 / (2 * c)) * 2 * c; print (q < 200 * c ? 200 * c : q) }')
	echo "# mysqlslap --concurrency=$c --iterations=1 --number-of-queries=$queries --delimiter=';' --query=idemmysql/bench/mysqlslap.sql"
	slap=$(mysqlslap "${my[@]}" --create-schema=idem_bench --no-drop --concurrency="$c" --iterations=1 \
		--number-of-queries="$queries" --delimiter=";" --query=idemmysql/bench/mysqlslap.sql)
	echo "$slap" | grep -E 'Average number of seconds'
	native[$c]=$(echo "$slap" | awk -v q="$queries" '/Average number of seconds/ { printf "%.1f", q / 2 / $(NF-1) }')
done

for c in $clients; do
	awk -v on="$(metric "$gob" "ReserveComplete/batch=on/c=$c" pairs/s)" -v off="$(metric "$gob" "ReserveComplete/batch=off/c=$c" pairs/s)" -v r="$(metric "$gob" "ReserveComplete/raw/c=$c" pairs/s)" -v n="${native[$c]}" -v c="$c" 'BEGIN {
		printf "c=%d: store %.0f pairs/s (batching off: %.0f), raw database/sql %.0f, mysqlslap %.0f: store/mysqlslap %.2f (target >= 2), store/raw %.2f; batching off: %.2f, %.2f\n",
			c, on, off, r, n, on / n, on / r, off / n, off / r }'
done
latencies "$gob" ReserveComplete
