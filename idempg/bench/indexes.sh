#!/usr/bin/env bash
# indexes.sh prices each secondary index of idem's schema: pgbench writes
# the store's rows (ceiling.sh's 32-row batches: an INSERT … ON CONFLICT
# transaction, then the settle UPDATE's) into idem's schema (migrations
# 001–005), and into copies that each lack one index, and prints
# PostgreSQL's CPU per pair and WAL bytes per pair for each, and what
# dropping the index saves. Lines are interleaved, ROUNDS times, each into
# an empty table.
#
#   eval "$(scripts/services.sh)"; idempg/bench/indexes.sh
#
# Environment: IDEM_TEST_POSTGRES_URL (required), CLIENTS (8), BATCH (32),
# PAIRS (40000 a line), ROUNDS (2). The CPU is every postgres process's
# (scripts/benchlib.sh's pgcpu_start): run it on a server that nothing
# else uses.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/benchlib.sh
url=${IDEM_TEST_POSTGRES_URL:?run: eval "\$(scripts/services.sh)"}
clients=${CLIENTS:-8}; batch=${BATCH:-32}; pairs=${PAIRS:-40000}; rounds=${ROUNDS:-2}
per_client=$(((pairs + clients * batch - 1) / (clients * batch)))
tmp=$(mktemp -d)
indexes=(none idem_records_pending_lease idem_records_completed_expiry idem_records_open_key
	idem_records_operation_key idem_records_key_value idem_records_created idem_records_label)
schema() { echo "ix_$1" | sed 's/idem_records_//'; }
drop() { for ix in "${indexes[@]}"; do psql -X -q "$url" -c "DROP SCHEMA IF EXISTS $(schema "$ix") CASCADE" >/dev/null 2>&1 || true; done; }
trap 'kill "${pgcpu_loop:-}" 2>/dev/null || true; drop; rm -rf "$tmp"' EXIT
drop
for ix in "${indexes[@]}"; do
	s=$(schema "$ix")
	psql -X -q "$url" -v ON_ERROR_STOP=1 -c "CREATE SCHEMA $s" >/dev/null
	# In one transaction, as Migrate applies them (migration 005 locks the table).
	sed "s/{schema}/$s/g" idempg/migrations/*.sql | psql -X -q -1 "$url" -v ON_ERROR_STOP=1 >/dev/null
	[ "$ix" = none ] || psql -X -q "$url" -v ON_ERROR_STOP=1 -c "DROP INDEX $s.$ix" >/dev/null
	cat >"$tmp/$s.sql" <<SQL
\\set n random(1, 1000000000000)
BEGIN;
INSERT INTO $s.idem_records (scope, operation, key, fingerprint, state, token, lease_until, created_at, updated_at, request)
SELECT 'bench', 'POST /orders', k, 'fp', 'pending', 'tok-' || k, statement_timestamp() + interval '30 seconds',
    statement_timestamp(), statement_timestamp(), NULL
FROM generate_series(1, $batch) g, left(md5(:n || '-' || g), 26) k
ON CONFLICT (scope, operation, key) DO NOTHING;
COMMIT;
BEGIN;
UPDATE $s.idem_records r
   SET state = 'completed', expires_at = statement_timestamp() + interval '24 hours', updated_at = statement_timestamp(),
       response = '\\x01c9010000207b226964223a226f72645f313233222c22737461747573223a2270616964227d'::bytea
  FROM generate_series(1, $batch) g, left(md5(:n || '-' || g), 26) k
 WHERE r.scope = 'bench' AND r.operation = 'POST /orders' AND r.key = k
   AND r.state = 'pending' AND r.token = 'tok-' || k;
COMMIT;
SQL
done
echo "# PostgreSQL $(psql -X -At "$url" -c 'SHOW server_version'); $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); pgbench $clients clients x $batch-row batches, $((per_client * clients * batch)) pairs a line"
declare -A sum=()
for round in $(seq "$rounds"); do
	for ix in "${indexes[@]}"; do
		s=$(schema "$ix")
		psql -X -q "$url" -c "TRUNCATE $s.idem_records; CHECKPOINT" >/dev/null
		w0=$(psql -X -At "$url" -c "SELECT pg_current_wal_lsn()")
		pgcpu_start
		out=$(pgbench -n -c "$clients" -j 2 -t "$per_client" -f "$tmp/$s.sql" "$url" 2>&1)
		t=$(pgcpu_stop)
		wal=$(psql -X -At "$url" -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '$w0')")
		n=$(($(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out") * batch))
		cpu=$(awk -v n="$n" -v t="$t" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", t * 1e6 / hz / n }')
		sum[$ix]=$(awk -v a="${sum[$ix]:-0}" -v b="$cpu" 'BEGIN { print a + b }')
		awk -v r="$round" -v ix="$ix" -v c="$cpu" -v w="$wal" -v n="$n" 'BEGIN { printf "round %d without %-30s PostgreSQL %6.1f cpu-µs/pair, WAL %5.0f B/pair\n", r, ix, c, w / n }'
	done
done
for ix in "${indexes[@]}"; do
	[ "$ix" = none ] && continue
	awk -v ix="$ix" -v a="${sum[none]}" -v b="${sum[$ix]}" -v r="$rounds" 'BEGIN { printf "dropping %-30s saves %5.1f cpu-µs/pair (mean of %d rounds)\n", ix, (a - b) / r, r }'
done
