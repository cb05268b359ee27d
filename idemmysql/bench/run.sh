#!/usr/bin/env bash
# run.sh compares idemmysql's BenchmarkReserveComplete at 16 goroutines with
# (a) a raw database/sql loop of the same INSERT + UPDATE at 16 goroutines,
# in the same go test run, and (b) mysqlslap running the same two
# statements as text at 16 clients (mysqlslap.sql: each pair's key is a
# fresh UUID() kept in the session variable @k; the response bytes are those
# the Go benchmark stores). Keys are random on both sides, as clients send.
#
#   eval "$(scripts/services.sh --bench)"; idemmysql/bench/run.sh
#
# The Go side runs with interpolateParams=true added to the DSN, so each
# statement is one round trip as in mysqlslap, not prepare/execute/close.
# Environment: IDEM_TEST_MYSQL_DSN (required), SECONDS_PER_RUN (10),
# MYSQL_ARGS (client flags for mysqlslap, default "-uroot -h127.0.0.1").
set -euo pipefail
cd "$(dirname "$0")/../.."
dsn=${IDEM_TEST_MYSQL_DSN:?run: eval "\$(scripts/services.sh --bench)"}
secs=${SECONDS_PER_RUN:-10}
read -r -a my <<<"${MYSQL_ARGS:--uroot -h127.0.0.1}"

echo "# $(mysql "${my[@]}" -N -e 'SELECT CONCAT(VERSION(), ", innodb_flush_log_at_trx_commit=", @@innodb_flush_log_at_trx_commit, ", sync_binlog=", @@sync_binlog, ", log_bin=", @@log_bin)')"

case "$dsn" in *\?*) sep='&' ;; *) sep='?' ;; esac
echo "# go test -run '^\$' -bench BenchmarkReserveComplete -benchmem -benchtime ${secs}s ./idemmysql/  (DSN + interpolateParams=true)"
gob=$(IDEM_TEST_MYSQL_DSN="${dsn}${sep}interpolateParams=true" go test -run '^$' -bench BenchmarkReserveComplete -benchmem -benchtime "${secs}s" ./idemmysql/)
echo "$gob" | grep '^Benchmark'
store=$(echo "$gob" | sed -n 's/^BenchmarkReserveComplete\/store.* \([0-9.]*\) pairs\/s.*/\1/p')
raw=$(echo "$gob" | sed -n 's/^BenchmarkReserveComplete\/raw.* \([0-9.]*\) pairs\/s.*/\1/p')

mysql "${my[@]}" -e 'DROP DATABASE IF EXISTS idem_bench; CREATE DATABASE idem_bench'
trap 'mysql "${my[@]}" -e "DROP DATABASE IF EXISTS idem_bench"' EXIT
cat idemmysql/migrations/*.sql | grep -v '^\s*--' | mysql "${my[@]}" idem_bench
# About as many pairs as the store did in SECONDS_PER_RUN.
queries=$(awk -v s="$store" -v t="$secs" 'BEGIN { q = int(s * t * 2 / 32) * 32; print (q < 3200 ? 3200 : q) }')
echo "# mysqlslap --concurrency=16 --iterations=1 --number-of-queries=$queries --delimiter=';' --query=idemmysql/bench/mysqlslap.sql"
slap=$(mysqlslap "${my[@]}" --create-schema=idem_bench --no-drop --concurrency=16 --iterations=1 \
	--number-of-queries="$queries" --delimiter=";" --query=idemmysql/bench/mysqlslap.sql)
echo "$slap" | grep -E 'Average number of seconds'
native=$(echo "$slap" | awk -v q="$queries" '/Average number of seconds/ { printf "%.1f", q / 2 / $(NF-1) }')

awk -v s="$store" -v r="$raw" -v n="$native" 'BEGIN {
	printf "store %.0f pairs/s, raw database/sql %.0f pairs/s, mysqlslap %.0f pairs/s\n", s, r, n
	printf "ratio store/raw %.2f, store/mysqlslap %.2f (target >= 0.85)\n", s / r, s / n
}'
