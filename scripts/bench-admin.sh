#!/usr/bin/env bash
# bench-admin.sh: how long the admin searches take with a million records,
# ten thousand of them in review: a key found by its value, the oldest 50
# in review (with and without an age and reason filter), a key prefix, a
# scope label, the newest 100 and the overview's counts, on SQLite,
# PostgreSQL, MySQL (MariaDB: its sequence engine loads the rows) and
# Redis (a single node; REDIS_CLUSTER=1 adds the Cluster).
# Each store's TestSearchAtScale loads the records in a file, schema,
# database or Redis key prefix of its own (dropped after), times each
# search RUNS times after a warm-up, prints the median and the slowest in
# milliseconds, and prints the query plans (EXPLAIN) of the SQL searches.
#
#   scripts/bench-admin.sh            # every store (servers from scripts/services.sh)
#   scripts/bench-admin.sh sqlite     # one store: sqlite, postgres, mysql or redis
#   RUNS=51 scripts/bench-admin.sh
#   REDIS_CLUSTER=1 scripts/bench-admin.sh redis
set -euo pipefail
cd "$(dirname "$0")/.."

stores=("${@:-sqlite postgres mysql redis}")
# shellcheck disable=SC2206
stores=(${stores[*]})

if [[ " ${stores[*]} " != " sqlite " && -z "${IDEM_TEST_POSTGRES_URL:-}${IDEM_TEST_MYSQL_DSN:-}${IDEM_TEST_REDIS_URL:-}" ]]; then
	eval "$(scripts/services.sh)"
fi

for store in "${stores[@]}"; do
	case $store in
	sqlite) pkg=./idemsqlite ;;
	postgres) pkg=./idempg ;;
	mysql) pkg=./idemmysql ;;
	redis) pkg=./idemredis ;;
	*)
		echo "unknown store $store: sqlite, postgres, mysql or redis" >&2
		exit 2
		;;
	esac
	IDEM_BENCH_SEARCH=1 IDEM_BENCH_SEARCH_RUNS="${RUNS:-21}" IDEM_BENCH_SEARCH_CLUSTER="${REDIS_CLUSTER:-}" CI=true \
		go test -count=1 -timeout 40m -run '^TestSearchAtScale$' "$pkg" -v |
		grep -v -e '^=== RUN' -e '^--- PASS' -e '^PASS' -e '^ok '
done
