#!/usr/bin/env bash
# HTTP/2 rapid reset (CVE-2023-44487) against idem serve: ATTACKERS
# connections open and reset streams in a loop while C legitimate clients
# send protected POSTs over h2c; a phase without the attack, then one with
# it, D each. Prints legitimate requests/s, attack streams/s, idem serve's
# CPU per second and its RSS. internal/tools/rapidreset.
#
#   scripts/bench-rapid-reset.sh                        # this checkout
#   IDEM_BIN=/tmp/idem-old scripts/bench-rapid-reset.sh # another build
#
# Environment: D=10s ATTACKERS=2 C=4; flags after the script go to idem serve.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=${IDEM_BIN:-}
if [ -z "$bin" ]; then
	bin=$tmp/idem
	go build -o "$bin" ./cmd/idem
fi
go build -o "$tmp/rapidreset" ./internal/tools/rapidreset
echo "load before: $(cat /proc/loadavg)"
"$tmp/rapidreset" -idem "$bin" -d "${D:-10s}" -attackers "${ATTACKERS:-2}" -c "${C:-4}" -- "$@"
echo "load after: $(cat /proc/loadavg)"
