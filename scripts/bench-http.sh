#!/usr/bin/env bash
# HTTP load run for BENCHMARKS.md: bare net/http against net/http behind
# idem's middleware (memory and SQLite stores), keep-alive, unique keys,
# 16 connections, on loopback. Prints each run and the ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-10s}
CONNS=${CONNS:-16}
mkdir -p .tmp
go build -o .tmp/benchserver ./internal/tools/benchserver
go build -o .tmp/loadgen ./internal/tools/loadgen
declare -A rps
port=18080
for mode in bare memory sqlite; do
  port=$((port + 1))
  .tmp/benchserver -addr 127.0.0.1:$port -mode $mode 2>/dev/null &
  pid=$!
  for _ in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:$port/ && break; sleep 0.1; done
  out=$(.tmp/loadgen -url http://127.0.0.1:$port/payments -c "$CONNS" -d "$DUR" -unique-keys)
  kill $pid; wait $pid 2>/dev/null || true
  echo "$mode: $out"
  rps[$mode]=$(sed -E 's/.*rps=([0-9]+).*/\1/' <<<"$out")
done
awk -v b="${rps[bare]}" -v m="${rps[memory]}" -v s="${rps[sqlite]}" \
  'BEGIN { printf "ratio memory/bare = %.2f, sqlite/bare = %.2f\n", m/b, s/b }'
