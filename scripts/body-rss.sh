#!/usr/bin/env bash
# Peak memory of idem serve under clients that hold request bodies in it:
# CONNS connections each announce a SIZE-byte body on a protected POST,
# send all of it but its last byte, and stall (internal/tools/bodyrss).
# Prints the process's resident memory before the clients, while they
# stall, and its peak (VmHWM). Linux only.
#
#   scripts/body-rss.sh                               # this checkout, the defaults
#   scripts/body-rss.sh --max-body-memory 16777216    # flags after the script go to idem serve
#
# Environment:
#   CONNS=40 SIZE=1048576   the clients and the body each announces
#   ROUNDS=3                runs (a fresh process each); the figures of every run are printed
#   IDEM_BIN=path           measure this binary instead of building ./cmd/idem (an older build,
#                           for a before/after comparison)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/benchlib.sh
CONNS=${CONNS:-40}
SIZE=${SIZE:-1048576}
RSS_TOOL_FLAGS=()
run_rss_tool bodyrss "$@"
