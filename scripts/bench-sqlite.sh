#!/usr/bin/env bash
# SQLite store alone against the raw loop, for BENCHMARKS.md: idemsqlite's
# BenchmarkReserveComplete (group commit on and off) and
# BenchmarkRawInsertUpdate (the same INSERT … ON CONFLICT + UPDATE through
# database/sql, one pair of autocommit statements, two transactions, at a
# time) at 1, 16, 32 and 50 goroutines on the same settings, in one run; the
# ratio store/raw at 16–50 (target >= 3), and the p50 and p99 per pair at 1
# and 32, batching on and off.
#
#   scripts/bench-sqlite.sh            # SECONDS_PER_RUN=5
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/benchlib.sh
secs=${SECONDS_PER_RUN:-5}
echo "# go test -run '^\$' -bench 'BenchmarkReserveComplete|BenchmarkRawInsertUpdate' -benchmem -benchtime ${secs}s ./idemsqlite/; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
gob=$(go test -run '^$' -bench 'BenchmarkReserveComplete|BenchmarkRawInsertUpdate' -benchmem -benchtime "${secs}s" ./idemsqlite/)
echo "$gob" | grep '^Benchmark'
for c in 16 32 50; do
	awk -v on="$(metric "$gob" "ReserveComplete/batch=on/c=$c" pairs/s)" -v off="$(metric "$gob" "ReserveComplete/batch=off/c=$c" pairs/s)" \
		-v r="$(metric "$gob" "RawInsertUpdate/c=$c" pairs/s)" -v c="$c" 'BEGIN {
		printf "c=%d: store %.0f pairs/s (batching off: %.0f), raw loop %.0f: ratio %.2f (target >= 3); batching off %.2f\n", c, on, off, r, on / r, off / r }'
done
latencies "$gob" ReserveComplete
