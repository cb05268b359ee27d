#!/usr/bin/env bash
# Memory of idem serve under clients that hold replays in it: an answer of
# SIZE bytes is stored under one key, then CONNS connections ask for it
# again and never read (internal/tools/replayrss). Prints the process's
# resident memory before the clients, while they hold their replays, and
# its peak (VmHWM), and how many got 503 busy. Linux only.
#
#   scripts/replay-rss.sh                                  # this checkout, the defaults
#   scripts/replay-rss.sh --max-replay-memory 16777216     # flags after the script go to idem serve
#
# Environment:
#   CONNS=400 SIZE=1048576  the clients and the stored answer's size
#   ROUNDS=3                runs (a fresh process each); the figures of every run are printed
#   IDEM_BIN=path           measure this binary instead of building ./cmd/idem (an older build,
#                           for a before/after comparison)
set -euo pipefail
cd "$(dirname "$0")/.."
CONNS=${CONNS:-400}
SIZE=${SIZE:-1048576}
ROUNDS=${ROUNDS:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=${IDEM_BIN:-}
if [ -z "$bin" ]; then
	bin=$tmp/idem
	go build -o "$bin" ./cmd/idem
fi
go build -o "$tmp/replayrss" ./internal/tools/replayrss
for _ in $(seq "$ROUNDS"); do
	"$tmp/replayrss" -idem "$bin" -conns "$CONNS" -size "$SIZE" -- "$@"
done
