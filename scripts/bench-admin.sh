#!/usr/bin/env bash
# bench-admin.sh: how long the admin searches take with a million records,
# ten thousand of them in review: a key found by its value, the oldest 50
# in review (with and without an age and reason filter), a key prefix, a
# scope label, the newest 100 and the overview's counts, on SQLite,
# PostgreSQL and MySQL (MariaDB: its sequence engine loads the rows).
# Each store's TestSearchAtScale loads the records in a file, schema or
# database of its own (dropped after), times each search RUNS times after
# a warm-up, prints the median and the slowest in milliseconds, and prints
# the query plans (EXPLAIN) of the searches.
#
#   scripts/bench-admin.sh            # every store (servers from scripts/services.sh)
#   scripts/bench-admin.sh sqlite     # one store: sqlite, postgres or mysql
#   RUNS=51 scripts/bench-admin.sh
#
# Redis is not measured: idemredis does not search (Capabilities.Search is
# false, and the admin API answers 501 not_supported).
set -euo pipefail
cd "$(dirname "$0")/.."

stores=("${@:-sqlite postgres mysql}")
# shellcheck disable=SC2206
stores=(${stores[*]})

if [[ " ${stores[*]} " != " sqlite " && -z "${IDEM_TEST_POSTGRES_URL:-}${IDEM_TEST_MYSQL_DSN:-}" ]]; then
	eval "$(scripts/services.sh)"
fi

for store in "${stores[@]}"; do
	case $store in
	sqlite) pkg=./idemsqlite ;;
	postgres) pkg=./idempg ;;
	mysql) pkg=./idemmysql ;;
	*)
		echo "unknown store $store: sqlite, postgres or mysql" >&2
		exit 2
		;;
	esac
	IDEM_BENCH_SEARCH=1 IDEM_BENCH_SEARCH_RUNS="${RUNS:-21}" CI=true \
		go test -count=1 -timeout 40m -run '^TestSearchAtScale$' "$pkg" -v |
		grep -v -e '^=== RUN' -e '^--- PASS' -e '^PASS' -e '^ok '
done
