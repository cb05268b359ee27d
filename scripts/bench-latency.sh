#!/usr/bin/env bash
# p50 and p99 of one reserve+complete pair on the SQL stores alone, at 1
# and 32 concurrent callers, with group commit on and off, for
# BENCHMARKS.md: a lone request must not get slower with batching on. The
# four cases run interleaved, ROUNDS times, so that drift on a shared machine
# hits them alike; it prints every run and the medians.
#
#   eval "$(scripts/services.sh)"; scripts/bench-latency.sh            # all three stores
#   STORES=sqlite ROUNDS=5 BENCHTIME=3s scripts/bench-latency.sh
#
# PostgreSQL and MySQL need IDEM_TEST_POSTGRES_URL and IDEM_TEST_MYSQL_DSN
# (their benchmarks skip otherwise); MySQL's DSN gets interpolateParams=true.
set -euo pipefail
cd "$(dirname "$0")/.."
STORES=${STORES:-sqlite pg mysql}
ROUNDS=${ROUNDS:-3}
BENCHTIME=${BENCHTIME:-2s}
if [ -n "${IDEM_TEST_MYSQL_DSN:-}" ]; then
	case "$IDEM_TEST_MYSQL_DSN" in *\?*) sep='&' ;; *) sep='?' ;; esac
	export IDEM_TEST_MYSQL_DSN="${IDEM_TEST_MYSQL_DSN}${sep}interpolateParams=true"
fi
echo "# $(date -u +%FT%TZ) $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); benchtime $BENCHTIME, $ROUNDS rounds"
declare -A p50=() p99=()
for s in $STORES; do
	go test -c -o ".tmp/idem$s.test" "./idem$s/" >/dev/null
	for round in $(seq "$ROUNDS"); do
		for c in 1 32; do
			for b in on off; do
				line=$(".tmp/idem$s.test" -test.run '^$' -test.bench "BenchmarkReserveComplete/batch=$b/c=$c\$" -test.benchtime "$BENCHTIME" | grep '^Benchmark' || true)
				[ -n "$line" ] || { echo "$s: no result (server variable unset?)"; continue 3; }
				a=$(awk '{ for (i = 2; i < NF; i++) if ($(i+1) == "p50-µs") print $i }' <<<"$line")
				z=$(awk '{ for (i = 2; i < NF; i++) if ($(i+1) == "p99-µs") print $i }' <<<"$line")
				echo "round $round $s batch=$b c=$c: p50 ${a}µs p99 ${z}µs"
				p50[$s-$b-$c]="${p50[$s-$b-$c]:-} $a"
				p99[$s-$b-$c]="${p99[$s-$b-$c]:-} $z"
			done
		done
	done
done
median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
echo "# medians of $ROUNDS rounds (µs): store, callers, p50 on / off, p99 on / off"
for s in $STORES; do
	for c in 1 32; do
		[ -n "${p50[$s-on-$c]:-}" ] || continue
		# shellcheck disable=SC2086
		printf '%-7s c=%-3s p50 %8s / %-8s p99 %8s / %s\n' "$s" "$c" "$(median ${p50[$s-on-$c]})" "$(median ${p50[$s-off-$c]})" \
			"$(median ${p99[$s-on-$c]})" "$(median ${p99[$s-off-$c]})"
	done
done
