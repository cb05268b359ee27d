#!/usr/bin/env bash
# HTTP load run for BENCHMARKS.md: bare net/http against net/http behind
# idem's middleware (memory and SQLite stores), keep-alive, unique keys,
# 16 connections, on loopback. The modes run interleaved, RUNS rounds, so
# that drift on a shared machine hits them alike; it prints every run, each
# round's ratios, and the medians.
#
#   scripts/bench-http.sh          # DUR=10s CONNS=16 RUNS=3
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-10s}
CONNS=${CONNS:-16}
RUNS=${RUNS:-3}
mkdir -p .tmp
go build -o .tmp/benchserver ./internal/tools/benchserver
go build -o .tmp/loadgen ./internal/tools/loadgen
port=18080
mem_ratios=() sql_ratios=()
for round in $(seq "$RUNS"); do
  declare -A rps=()
  for mode in bare memory sqlite; do
    port=$((port + 1))
    .tmp/benchserver -addr 127.0.0.1:$port -mode $mode 2>/dev/null &
    pid=$!
    for _ in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:$port/ && break; sleep 0.1; done
    out=$(.tmp/loadgen -url http://127.0.0.1:$port/payments -c "$CONNS" -d "$DUR" -unique-keys)
    kill $pid; wait $pid 2>/dev/null || true
    echo "round $round $mode: $out"
    rps[$mode]=$(sed -E 's/.*rps=([0-9]+).*/\1/' <<<"$out")
  done
  mem_ratios+=("$(awk -v b="${rps[bare]}" -v m="${rps[memory]}" 'BEGIN { printf "%.2f", m/b }')")
  sql_ratios+=("$(awk -v b="${rps[bare]}" -v s="${rps[sqlite]}" 'BEGIN { printf "%.2f", s/b }')")
  echo "round $round: memory/bare = ${mem_ratios[-1]}, sqlite/bare = ${sql_ratios[-1]}"
done
median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
echo "median of $RUNS rounds: memory/bare = $(median "${mem_ratios[@]}"), sqlite/bare = $(median "${sql_ratios[@]}")"
