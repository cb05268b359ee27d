#!/usr/bin/env bash
# Memory of idem serve under clients that hold replays in it: an answer of
# SIZE bytes is stored under one key, then CONNS connections ask for it
# again and never read (internal/tools/replayrss). Prints the process's
# resident memory before the clients, while they hold their replays, and
# its peak (VmHWM), and how many got 503 busy. Linux only.
#
#   scripts/replay-rss.sh                                  # this checkout, the defaults
#   scripts/replay-rss.sh --max-replay-memory 16777216     # flags after the script go to idem serve
#   STORE=memory:// scripts/replay-rss.sh                  # the memory store
#
# Environment:
#   CONNS=400 SIZE=1048576  the clients and the stored answer's size
#   STORE=url               the store (default: SQLite, idem serve's default, in a temporary directory)
#   ROUNDS=3                runs (a fresh process each); the figures of every run are printed
#   IDEM_BIN=path           measure this binary instead of building ./cmd/idem (an older build,
#                           for a before/after comparison)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/benchlib.sh
CONNS=${CONNS:-400}
SIZE=${SIZE:-1048576}
RSS_TOOL_FLAGS=()
if [ -n "${STORE:-}" ]; then
	RSS_TOOL_FLAGS=(-store "$STORE")
fi
run_rss_tool replayrss "$@"
