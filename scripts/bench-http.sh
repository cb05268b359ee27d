#!/usr/bin/env bash
# HTTP load run for BENCHMARKS.md: bare net/http against net/http behind
# idem's middleware (memory and SQLite stores), keep-alive, unique keys,
# 16 connections, on loopback. The modes run interleaved, RUNS rounds, so
# that drift on a shared machine hits them alike; it prints every run, each
# round's ratios, and the medians.
#
#   scripts/bench-http.sh          # DUR=10s CONNS=16 RUNS=3
#   LOADGEN=wrk THREADS=2 scripts/bench-http.sh
#
# LOADGEN picks the load generator: loadgen (internal/tools/loadgen, the
# default) or wrk (the Debian package, installed when missing, with
# scripts/wrk-idempotency.lua: a fresh Idempotency-Key per POST).
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-10s}
CONNS=${CONNS:-16}
RUNS=${RUNS:-3}
LOADGEN=${LOADGEN:-loadgen}
THREADS=${THREADS:-2}
mkdir -p .tmp
go build -o .tmp/benchserver ./internal/tools/benchserver
case $LOADGEN in
loadgen) go build -o .tmp/loadgen ./internal/tools/loadgen ;;
wrk)
  . scripts/benchlib.sh
  ensure_wrk bench-http
  ;;
*) echo "bench-http: LOADGEN must be loadgen or wrk, not $LOADGEN" >&2; exit 2 ;;
esac
# load PORT prints one line with rps=N: loadgen's own, or wrk's RESULT line.
load() {
  if [ "$LOADGEN" = wrk ]; then
    wrk -t"$THREADS" -c"$CONNS" -d"$DUR" -s scripts/wrk-idempotency.lua "http://127.0.0.1:$1/payments" -- "bh$$-$RANDOM$RANDOM" | grep '^RESULT'
  else
    .tmp/loadgen -url "http://127.0.0.1:$1/payments" -c "$CONNS" -d "$DUR" -unique-keys
  fi
}
port=18080
mem_ratios=() sql_ratios=()
for round in $(seq "$RUNS"); do
  declare -A rps=()
  for mode in bare memory sqlite; do
    port=$((port + 1))
    .tmp/benchserver -addr 127.0.0.1:$port -mode $mode 2>/dev/null &
    pid=$!
    for _ in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:$port/ && break; sleep 0.1; done
    out=$(load $port)
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
