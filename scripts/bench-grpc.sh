#!/usr/bin/env bash
# Unary gRPC calls per second to the test Payments service, bare and behind
# idemgrpc's interceptor on the memory store and on PostgreSQL, under ghz
# (installed from the Go module proxy into .tmp/bin on first use). Every call
# carries a fresh request_id, so each one reserves and completes a key.
# Prints each figure and its ratio to the bare server.
#
#   scripts/bench-grpc.sh                 # 10s per run, 32 concurrent calls
#   DUR=30s CONC=64 scripts/bench-grpc.sh
#
# PostgreSQL is skipped when IDEM_TEST_POSTGRES_URL is unset (scripts/services.sh
# prints it). Everything runs on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-10s}
CONC=${CONC:-32}
ADDR=${ADDR:-127.0.0.1:50151}
mkdir -p .tmp/bin
if [ ! -x .tmp/bin/ghz ]; then
	GOBIN=$PWD/.tmp/bin GOFLAGS=-mod=mod GOWORK=off go install github.com/bojand/ghz/cmd/ghz@v0.93.0
fi
(cd idemgrpc && go build -o ../.tmp/bin/grpc-benchserver ./internal/benchserver)

run() { # run STORE: prints calls/s
	.tmp/bin/grpc-benchserver -addr "$ADDR" -store "$1" >/dev/null &
	local pid=$!
	trap 'kill $pid 2>/dev/null || true' RETURN
	for _ in $(seq 50); do (exec 3<>/dev/tcp/${ADDR%:*}/${ADDR#*:}) 2>/dev/null && break; sleep 0.1; done
	.tmp/bin/ghz --insecure --proto internal/rpctest/testpb/payments.proto --import-paths /usr/include,internal/rpctest/testpb \
		--call idem.test.v1.Payments.Charge -d '{"account":"acc","amount":5,"request_id":"{{newUUID}}"}' \
		-c "$CONC" -z "$DUR" --connections 4 -O json "$ADDR" 2>/dev/null |
		python3 -c 'import json,sys; r=json.load(sys.stdin); ok=r["statusCodeDistribution"].get("OK",0); print("%.0f %d %d" % (r["rps"], ok, r["count"]))'
	kill $pid 2>/dev/null || true
	wait $pid 2>/dev/null || true
}

echo "duration $DUR, $CONC concurrent calls, 4 connections; each figure: calls/s, OK answers, calls"
read -r bare bok bn <<<"$(run none)"
echo "bare server:               $bare calls/s ($bok of $bn OK)"
read -r mem mok mn <<<"$(run mem)"
echo "idemgrpc, memory store:    $mem calls/s ($mok of $mn OK), ratio $(python3 -c "print('%.2f' % ($mem/$bare))")"
if [ -n "${IDEM_TEST_POSTGRES_URL:-}" ]; then
	export IDEM_TEST_POSTGRES_URL
	read -r pg pok pn <<<"$(run pg)"
	echo "idemgrpc, PostgreSQL:      $pg calls/s ($pok of $pn OK), ratio $(python3 -c "print('%.2f' % ($pg/$bare))")"
else
	echo "PostgreSQL: skipped (IDEM_TEST_POSTGRES_URL is unset)"
fi
