#!/usr/bin/env bash
# floor.sh: what MariaDB/MySQL itself spends on idem's rows, as a floor to
# hold the MySQL store's server CPU against on the same machine.
#
# mysqlslap runs, on CLIENTS connections, transactions that insert BATCH
# fresh records (one INSERT IGNORE … SELECT from the sequence engine) and,
# in a second transaction, complete them (one UPDATE joined on the same
# sequence): the same two writes as idemmysql's batches, with nothing else,
# of the rows the store's benchmark writes (internal/tools/storebench: scope
# "bench", a random 26-byte key, fingerprint "fp", token "tok-" and the
# key, the same encoded answer). Keys are spread over the key space as
# clients' keys are: a batch's keys each land on a page of their own, not
# on one shared leaf.
# It prints pairs/s and the server's CPU time per pair (the mariadbd or
# mysqld process, from /proc) for two schemas:
#   idem     the tables idemmysql/migrations create today
#   minimal  the primary key and the index on created_at only
# and, with IDEM_TEST_MYSQL_DSN set, the store on idem's schema right after
# mysqlslap's idem line in each round: BenchmarkReserveComplete/batch=on/c=50
# (idemmysql/bench_test.go, with interpolateParams=true), and its ratio of
# server CPU per pair to each line's.
#
#   eval "$(scripts/services.sh)"; idemmysql/bench/floor.sh
#
# Environment: CLIENTS (8), BATCH (32: rows a statement), SETS (180 per client, about 40 000 pairs: mysqlslap's query budget,
# not an exact count; pairs are counted in the table), ROUNDS (2),
# MYSQL_ARGS (client flags, default "-uroot -h127.0.0.1"),
# IDEM_TEST_MYSQL_DSN (the store's line; left out when unset), PAIRS
# (40000: the store's pairs), STORE_TEST (a compiled idemmysql test binary,
# from `go test -c ./idemmysql/`, built when unset). Needs MariaDB's
# sequence engine (seq_1_to_N tables, MariaDB 10.0+). Run on an otherwise
# quiet machine: the CPU is the server process's, whatever it serves.
set -euo pipefail
cd "$(dirname "$0")/../.."
read -r -a my <<<"${MYSQL_ARGS:--uroot -h127.0.0.1}"
clients=${CLIENTS:-8}; sets=${SETS:-180}; rounds=${ROUNDS:-2}; batch=${BATCH:-32}; store_pairs=${PAIRS:-40000}
dsn=${IDEM_TEST_MYSQL_DSN:-}
pid=$(pgrep -xo mariadbd || pgrep -xo mysqld) || { echo "floor.sh: no mariadbd or mysqld process on this machine" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; mysql "${my[@]}" -e "DROP DATABASE IF EXISTS idem_floor" >/dev/null 2>&1 || true' EXIT
now="(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000)"
cat >"$tmp/pair.sql" <<SQL
SET @p := UUID();
START TRANSACTION;
INSERT IGNORE INTO idem_records (scope, operation, \`key\`, fingerprint, state, token, lease_until, reason, request, created_at, updated_at) SELECT 'bench', 'POST /orders', k, 'fp', 'pending', CONCAT('tok-', k), $now + 30000, '', NULL, $now, $now FROM (SELECT LEFT(MD5(CONCAT(@p, '-', seq)), 26) AS k FROM seq_1_to_$batch) s;
COMMIT;
START TRANSACTION;
UPDATE idem_records r JOIN seq_1_to_$batch s ON r.scope = 'bench' AND r.operation = 'POST /orders' AND r.\`key\` = LEFT(MD5(CONCAT(@p, '-', s.seq)), 26) SET r.state = 'completed', r.response = X'01c9010000207b226964223a226f72645f313233222c22737461747573223a2270616964227d', r.expires_at = $now + 86400000, r.updated_at = $now WHERE r.state = 'pending' AND r.token = CONCAT('tok-', r.\`key\`);
COMMIT;
SQL
# schema NAME creates idem_floor with idem's tables, or the minimal ones.
schema() {
	mysql "${my[@]}" -e "DROP DATABASE IF EXISTS idem_floor; CREATE DATABASE idem_floor"
	cat idemmysql/migrations/*.sql | mysql "${my[@]}" idem_floor
	if [ "$1" = minimal ]; then
		mysql "${my[@]}" idem_floor -e "ALTER TABLE idem_records DROP INDEX idem_records_state_lease, DROP INDEX idem_records_state_expiry,
			DROP INDEX idem_records_state, DROP INDEX idem_records_operation, DROP INDEX idem_records_key_value, DROP INDEX idem_records_label"
	fi
}
store_test=${STORE_TEST:-}
if [ -n "$dsn" ] && [ -z "$store_test" ]; then
	store_test=$tmp/idemmysql.test
	go test -c -o "$store_test" ./idemmysql/ >/dev/null
fi
case "$dsn" in *\?*) sep='&' ;; *) sep='?' ;; esac
declare -A cpu=()
completed() { mysql "${my[@]}" -N idem_floor -e "SELECT COUNT(*) FROM idem_records WHERE state = 'completed'"; }
echo "# $(mysql "${my[@]}" -N -e 'SELECT VERSION()'); $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); $clients clients x $batch-row batches"
for round in $(seq "$rounds"); do
	for s in idem minimal; do
		schema "$s" # empty tables on every line, as the store's own database
		before=$(completed)
		t0=$(awk '{ print $14 + $15 }' "/proc/$pid/stat") s0=$(date +%s.%N)
		mysqlslap "${my[@]}" --create-schema=idem_floor --no-drop --concurrency="$clients" --iterations=1 \
			--number-of-queries=$((clients * 6 * sets)) --delimiter=";" --query="$tmp/pair.sql" >/dev/null
		t1=$(awk '{ print $14 + $15 }' "/proc/$pid/stat") s1=$(date +%s.%N)
		n=$(($(completed) - before))
		awk -v s="$s" -v r="$round" -v n="$n" -v t=$((t1 - t0)) -v a="$s0" -v b="$s1" -v hz="$(getconf CLK_TCK)" \
			'BEGIN { printf "%-8s round %d: %.0f pairs/s, server %.0f cpu-µs/pair (%d pairs)\n", s, r, n / (b - a), t * 1e6 / hz / n, n }'
		cpu[$s,$round]=$(awk -v n="$n" -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", t * 1e6 / hz / n }')
		[ "$s" = idem ] && [ -n "$dsn" ] || continue
		# The store, right after mysqlslap on idem's schema (its tables are
		# the test's own database's).
		t0=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
		out=$(IDEM_TEST_MYSQL_DSN="${dsn}${sep}interpolateParams=true" "$store_test" -test.run '^$' \
			-test.bench 'BenchmarkReserveComplete/batch=on/c=50$' -test.benchtime "${store_pairs}x")
		t1=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
		line=$(grep 'ReserveComplete/batch=on/c=50' <<<"$out")
		awk -v r="$round" -v l="$line" -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" 'BEGIN {
			n = split(l, f, " "); ps = "?"; cb = "?"
			for (i = 3; i < n; i++) { if (f[i+1] == "pairs/s") ps = f[i]; if (f[i+1] == "calls/batch") cb = f[i] }
			printf "store    round %d: %s pairs/s (%s calls per batch), server %.0f cpu-µs/pair (%d pairs, the test set-up included)\n", r, ps, cb, t * 1e6 / hz / f[2], f[2] }'
		cpu[store,$round]=$(awk -v l="$line" -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" 'BEGIN { split(l, f, " "); printf "%.1f", t * 1e6 / hz / f[2] }')
	done
done
if [ -n "$dsn" ]; then
	for round in $(seq "$rounds"); do
		for s in idem minimal; do
			awk -v r="$round" -v s="$s" -v a="${cpu[store,$round]}" -v b="${cpu[$s,$round]:-0}" 'BEGIN { if (b > 0) printf "round %d store / %s: server CPU per pair %.2f\n", r, s, a / b }'
		done
	done
fi
