#!/usr/bin/env bash
# Announced-length attack on idem serve: CONNS connections, each with its
# own credential, announce a SIZE-byte body on a protected POST, send one
# byte and stall; then PROBES legitimate protected requests go through and
# their answers are counted (201 ran, 503 busy). internal/tools/announce.
#
#   scripts/bench-announce.sh                        # this checkout, the defaults
#   IDEM_BIN=/tmp/idem-old scripts/bench-announce.sh # another build, for a before/after comparison
#
# Environment: CONNS=80 SIZE=1048575 PROBES=50; flags after the script go to idem serve.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=${IDEM_BIN:-}
if [ -z "$bin" ]; then
	bin=$tmp/idem
	go build -o "$bin" ./cmd/idem
fi
go build -o "$tmp/announce" ./internal/tools/announce
"$tmp/announce" -idem "$bin" -conns "${CONNS:-80}" -size "${SIZE:-1048575}" -probes "${PROBES:-50}" -- "$@"
