#!/usr/bin/env bash
# HTTP load run for BENCHMARKS.md: bare net/http against net/http behind
# idem's middleware (memory and SQLite stores), and, as the peer, bare Fiber
# against Fiber behind its own idempotency middleware
# (github.com/gofiber/fiber/v2/middleware/idempotency, memory storage),
# keep-alive, unique keys, 16 connections, on loopback. The modes run
# interleaved, RUNS rounds, so that drift on a shared machine hits them
# alike; it prints every run, each round's ratios, and the medians.
#
#   scripts/bench-http.sh          # DUR=10s CONNS=16 RUNS=3
#   LOADGEN=wrk THREADS=2 RUNS=5 scripts/bench-http.sh
#   MODES="bare memory fiber fiber-idempotency" scripts/bench-http.sh
#
# LOADGEN picks the load generator: loadgen (internal/tools/loadgen, the
# default) or wrk (the Debian package, installed when missing, with
# scripts/wrk-idempotency.lua: a fresh Idempotency-Key per POST).
# MODES picks the servers (default: bare memory sqlite fiber
# fiber-idempotency; also floor: benchserver's measuring stick, the least
# an idempotency middleware must do for a fresh key, see
# internal/tools/benchserver/floor.go). READ_BODY=1 makes the handler read the request
# body in every mode, as an API that decodes it does. Every run also prints
# the server's CPU time per request (user + system, from /proc/PID/stat),
# which the load of other processes on a shared machine changes far less
# than requests per second, and each round the ratio of those. The Fiber peer (internal/tools/fiberpeer) is a module
# of its own, built here with GOWORK=off, so that Fiber never enters the
# go.mod of idem's users.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-10s}
CONNS=${CONNS:-16}
RUNS=${RUNS:-3}
LOADGEN=${LOADGEN:-loadgen}
READ_BODY=${READ_BODY:-}
[ "$READ_BODY" = 0 ] && READ_BODY=
THREADS=${THREADS:-2}
mkdir -p .tmp
MODES=${MODES:-bare memory sqlite fiber fiber-idempotency}
go build -o .tmp/benchserver ./internal/tools/benchserver
case " $MODES " in
*" fiber"*) (cd internal/tools/fiberpeer && GOWORK=off go build -o ../../../.tmp/fiberpeer .) ;;
esac
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
mem_ratios=() sql_ratios=() fiber_ratios=() floor_ratios=() mem_cpu=() fiber_cpu=() floor_cpu=()
# ticks PID prints the CPU ticks (user + system) PID has used.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# ratio NUM DEN prints NUM/DEN with two decimals, or - when either is missing.
ratio() { awk -v n="${1:-}" -v d="${2:-}" 'BEGIN { if (n == "" || d == "" || d == 0) print "-"; else printf "%.2f", n/d }'; }
for round in $(seq "$RUNS"); do
  declare -A rps=() cpu=()
  for mode in $MODES; do
    port=$((port + 1))
    case $mode in
    fiber) .tmp/fiberpeer -addr 127.0.0.1:$port -mode bare 2>/dev/null & ;;
    fiber-idempotency) .tmp/fiberpeer -addr 127.0.0.1:$port -mode idempotency 2>/dev/null & ;;
    *) .tmp/benchserver -addr 127.0.0.1:$port -mode "$mode" ${READ_BODY:+-read-body} 2>/dev/null & ;;
    esac
    pid=$!
    for _ in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:$port/ && break; sleep 0.1; done
    t0=$(ticks $pid)
    out=$(load $port)
    t1=$(ticks $pid)
    kill $pid; wait $pid 2>/dev/null || true
    rps[$mode]=$(sed -E 's/.*rps=([0-9]+).*/\1/' <<<"$out")
    n=$(sed -nE 's/.*requests=([0-9]+).*/\1/p' <<<"$out")
    [ -n "$n" ] || n=$(awk -v r="${rps[$mode]}" -v d="${DUR%s}" 'BEGIN { print r * d }')
    cpu[$mode]=$(awk -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" -v n="$n" 'BEGIN { printf "%.1f", (n > 0 ? t * 1e6 / hz / n : 0) }')
    echo "round $round $mode: $out server_cpu_us_per_request=${cpu[$mode]}"
  done
  mem_ratios+=("$(ratio "${rps[memory]:-}" "${rps[bare]:-}")")
  sql_ratios+=("$(ratio "${rps[sqlite]:-}" "${rps[bare]:-}")")
  fiber_ratios+=("$(ratio "${rps[fiber-idempotency]:-}" "${rps[fiber]:-}")")
  floor_ratios+=("$(ratio "${rps[floor]:-}" "${rps[bare]:-}")")
  mem_cpu+=("$(ratio "${cpu[bare]:-}" "${cpu[memory]:-}")")
  fiber_cpu+=("$(ratio "${cpu[fiber]:-}" "${cpu[fiber-idempotency]:-}")")
  floor_cpu+=("$(ratio "${cpu[bare]:-}" "${cpu[floor]:-}")")
  echo "round $round: memory/bare = ${mem_ratios[-1]}, sqlite/bare = ${sql_ratios[-1]}, fiber-idempotency/fiber = ${fiber_ratios[-1]}, floor/bare = ${floor_ratios[-1]}; server CPU per request bare/memory = ${mem_cpu[-1]}, fiber/fiber-idempotency = ${fiber_cpu[-1]}, bare/floor = ${floor_cpu[-1]} (load $(cut -d' ' -f1-3 /proc/loadavg))"
done
median() { printf '%s\n' "$@" | grep -v '^-$' | sort -n | awk '{ a[NR] = $1 } END { if (NR == 0) print "-"; else print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
echo "median of $RUNS rounds: memory/bare = $(median "${mem_ratios[@]}"), sqlite/bare = $(median "${sql_ratios[@]}"), fiber-idempotency/fiber = $(median "${fiber_ratios[@]}"), floor/bare = $(median "${floor_ratios[@]}")"
echo "median of $RUNS rounds, server CPU per request: bare/memory = $(median "${mem_cpu[@]}"), fiber/fiber-idempotency = $(median "${fiber_cpu[@]}"), bare/floor = $(median "${floor_cpu[@]}")"
