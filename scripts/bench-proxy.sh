#!/usr/bin/env bash
# Proxy load run for BENCHMARKS.md: keyed POSTs (a fresh Idempotency-Key per
# request, 16 keep-alive connections, loopback) through a plain
# httputil.ReverseProxy and through idem serve with the memory and SQLite
# stores, all in front of the same bare upstream, in one run. Prints each run
# and the ratios idem/plain, and the p50/p99 that idem adds.
#
#   scripts/bench-proxy.sh            # DUR=10s CONNS=16 by default
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-10s}
CONNS=${CONNS:-16}
mkdir -p .tmp
go build -o .tmp/idem ./cmd/idem
go build -o .tmp/benchserver ./internal/tools/benchserver
go build -o .tmp/plainproxy ./internal/tools/plainproxy
go build -o .tmp/loadgen ./internal/tools/loadgen
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

up=127.0.0.1:18190
.tmp/benchserver -addr $up -mode bare 2>/dev/null & pids+=($!)

start() { # name port command...
  local name=$1 port=$2; shift 2
  "$@" 2>"$tmp/$name.log" & pids+=($!)
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && return; sleep 0.1; done
  echo "$name did not start:"; cat "$tmp/$name.log"; exit 1
}
start upstream 18190 true
start plain 18191 .tmp/plainproxy -listen 127.0.0.1:18191 -upstream http://$up
start memory 18192 .tmp/idem serve --upstream http://$up --listen 127.0.0.1:18192 --store memory:// --log-level warn
start sqlite 18193 .tmp/idem serve --upstream http://$up --listen 127.0.0.1:18193 --store "sqlite://$tmp/idem.db" --log-level warn

declare -A rps p50 p99
to_us() { # Go duration -> microseconds
  awk -v d="$1" 'BEGIN { if (d ~ /ms$/) { sub(/ms$/, "", d); print d*1000 } else if (d ~ /µs$/) { sub(/µs$/, "", d); print d } else if (d ~ /ns$/) { sub(/ns$/, "", d); print d/1000 } else { sub(/s$/, "", d); print d*1000000 } }'
}
port=18190
for mode in plain memory sqlite; do
  port=$((port + 1))
  out=$(.tmp/loadgen -url "http://127.0.0.1:$port/payments" -c "$CONNS" -d "$DUR" -unique-keys)
  echo "$mode: $out"
  rps[$mode]=$(sed -E 's/.*rps=([0-9]+).*/\1/' <<<"$out")
  p50[$mode]=$(to_us "$(sed -E 's/.*p50=([^ ]+).*/\1/' <<<"$out")")
  p99[$mode]=$(to_us "$(sed -E 's/.*p99=([^ ]+).*/\1/' <<<"$out")")
done
for mode in memory sqlite; do
  awk -v m="$mode" -v r="${rps[$mode]}" -v b="${rps[plain]}" -v a50="${p50[$mode]}" -v b50="${p50[plain]}" -v a99="${p99[$mode]}" -v b99="${p99[plain]}" \
    'BEGIN { printf "%s/plain rps ratio = %.2f; p50 added = %.0fµs; p99 added = %.0fµs\n", m, r/b, a50-b50, a99-b99 }'
done
