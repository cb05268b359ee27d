#!/usr/bin/env bash
# floor.sh: what MariaDB/MySQL itself spends on idem's rows, as a floor to
# hold the MySQL store's server CPU against on the same machine.
#
# mysqlslap runs, on CLIENTS connections, transactions that insert BATCH
# fresh records (one INSERT IGNORE … SELECT from the sequence engine) and,
# in a second transaction, complete them (one UPDATE joined on the same
# sequence): the same two writes as idemmysql's batches, with nothing else.
# It prints pairs/s and the server's CPU time per pair (the mariadbd or
# mysqld process, from /proc) for two schemas:
#   idem     the tables idemmysql/migrations create today
#   minimal  the primary key and the index on created_at only
#
#   idemmysql/bench/floor.sh
#
# Environment: CLIENTS (8), SETS (400 per client: mysqlslap's query budget,
# not an exact count; pairs are counted in the table), ROUNDS (2),
# MYSQL_ARGS (client flags, default "-uroot -h127.0.0.1"). Needs MariaDB's
# sequence engine (seq_1_to_N tables, MariaDB 10.0+). Run on an otherwise
# quiet machine: the CPU is the server process's, whatever it serves.
set -euo pipefail
cd "$(dirname "$0")/../.."
read -r -a my <<<"${MYSQL_ARGS:--uroot -h127.0.0.1}"
clients=${CLIENTS:-8}; sets=${SETS:-400}; rounds=${ROUNDS:-2}; batch=32
pid=$(pgrep -xo mariadbd || pgrep -xo mysqld) || { echo "floor.sh: no mariadbd or mysqld process on this machine" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; mysql "${my[@]}" -e "DROP DATABASE IF EXISTS idem_floor" >/dev/null 2>&1 || true' EXIT
now="(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000)"
cat >"$tmp/pair.sql" <<SQL
SET @p := UUID();
START TRANSACTION;
INSERT IGNORE INTO idem_records (scope, operation, \`key\`, fingerprint, state, token, lease_until, reason, request, created_at, updated_at) SELECT 'bench', 'POST /orders', CONCAT(@p, '-', seq), 'v1:5d9adae3c06e62407254b9a98c783924f07907d28e152ee81afa2d0500119829', 'pending', CONCAT('tok-', @p), $now + 30000, '', NULL, $now, $now FROM seq_1_to_$batch;
COMMIT;
START TRANSACTION;
UPDATE idem_records r JOIN seq_1_to_$batch s ON r.scope = 'bench' AND r.operation = 'POST /orders' AND r.\`key\` = CONCAT(@p, '-', s.seq) SET r.state = 'completed', r.response = X'01c9010000207b226964223a226f72645f313233222c22737461747573223a2270616964227d', r.expires_at = $now + 86400000, r.updated_at = $now WHERE r.state = 'pending' AND r.token = CONCAT('tok-', @p);
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
completed() { mysql "${my[@]}" -N idem_floor -e "SELECT COUNT(*) FROM idem_records WHERE state = 'completed'"; }
echo "# $(mysql "${my[@]}" -N -e 'SELECT VERSION()'); $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); $clients clients x $batch-row batches"
for s in idem minimal; do
	schema "$s"
	for round in $(seq "$rounds"); do
		before=$(completed)
		t0=$(awk '{ print $14 + $15 }' "/proc/$pid/stat") s0=$(date +%s.%N)
		mysqlslap "${my[@]}" --create-schema=idem_floor --no-drop --concurrency="$clients" --iterations=1 \
			--number-of-queries=$((clients * 6 * sets)) --delimiter=";" --query="$tmp/pair.sql" >/dev/null
		t1=$(awk '{ print $14 + $15 }' "/proc/$pid/stat") s1=$(date +%s.%N)
		n=$(($(completed) - before))
		awk -v s="$s" -v r="$round" -v n="$n" -v t=$((t1 - t0)) -v a="$s0" -v b="$s1" -v hz="$(getconf CLK_TCK)" \
			'BEGIN { printf "%-8s round %d: %.0f pairs/s, server %.0f cpu-µs/pair (%d pairs)\n", s, r, n / (b - a), t * 1e6 / hz / n, n }'
	done
done
