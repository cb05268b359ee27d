#!/usr/bin/env bash
# Unary gRPC calls per second through idem serve, against the same upstream
# called directly and through a stock h2c proxy (httputil.ReverseProxy with
# an HTTP/2 transport, internal/tools/h2cproxy), under ghz (installed from
# the Go module proxy into .tmp/bin on first use). The upstream is the bare
# Payments server of idemgrpc/internal/benchserver over h2c; every call is
# a Charge with a fresh idempotency-key (metadata), so through idem each
# one reserves and completes a key.
#
# Targets: direct, stock, mem (idem serve, memory store) and, when
# IDEM_TEST_POSTGRES_URL is set (scripts/services.sh), pg. Each proxy runs
# fresh in every round; rounds alternate the order. It prints, per run,
# calls/s (answered OK over ghz's time) and the proxy's CPU per call (user
# + system, from /proc/<pid>/stat), then the median of each target's
# per-round ratio to stock (they ran close together, so the machine's
# drift cancels out).
#
#   scripts/bench-grpc-proxy.sh                     # 10s per run, 3 rounds, 32 concurrent calls
#   DUR=20s ROUNDS=5 CONC=64 scripts/bench-grpc-proxy.sh
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
DUR=${DUR:-10s}
CONC=${CONC:-32}
ROUNDS=${ROUNDS:-3}
UP=127.0.0.1:50151
mkdir -p .tmp/bin
if [ ! -x .tmp/bin/ghz ]; then
	GOBIN=$PWD/.tmp/bin GOFLAGS=-mod=mod GOWORK=off go install github.com/bojand/ghz/cmd/ghz@v0.93.0
fi
(cd idemgrpc && go build -o ../.tmp/bin/grpc-benchserver ./internal/benchserver)
go build -o .tmp/bin/h2cproxy ./internal/tools/h2cproxy
go build -o .tmp/bin/idem-bench ./cmd/idem
targets="direct stock mem"
[ -n "${IDEM_TEST_POSTGRES_URL:-}" ] && targets="$targets pg"
ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }
waitport() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/${1%:*}/${1#*:}") 2>/dev/null && return 0; sleep 0.1; done; echo "bench-grpc-proxy: nothing listens on $1" >&2; return 1; }

.tmp/bin/grpc-benchserver -addr "$UP" -store none >/dev/null 2>&1 &
upid=$!
trap 'kill $upid 2>/dev/null || true' EXIT
waitport "$UP"

# run TARGET: prints "calls/s cpu-us/call ok calls"
run() {
	local addr pid="" res
	res=$(mktemp)
	case $1 in
	direct) addr=$UP ;;
	stock)
		addr=127.0.0.1:50161
		.tmp/bin/h2cproxy -listen "$addr" -upstream "$UP" 2>/dev/null &
		pid=$!
		;;
	mem | pg)
		addr=127.0.0.1:50171
		local store=memory://
		[ "$1" = pg ] && store=$IDEM_TEST_POSTGRES_URL
		.tmp/bin/idem-bench serve --upstream "h2c://$UP" --listen "$addr" --store "$store" --anonymous shared --log-level error 2>/dev/null &
		pid=$!
		;;
	esac
	waitport "$addr"
	local t0=0 t1=0
	[ -n "$pid" ] && t0=$(ticks "$pid")
	.tmp/bin/ghz --insecure --proto internal/rpctest/testpb/payments.proto --import-paths /usr/include,internal/rpctest/testpb \
		--call idem.test.v1.Payments.Charge -O json -d '{"account":"acc","amount":5}' -m '{"idempotency-key":"{{newUUID}}"}' \
		-c "$CONC" --connections 4 -z "$DUR" "$addr" >"$res" 2>/dev/null || true
	[ -n "$pid" ] && { t1=$(ticks "$pid"); kill "$pid"; wait "$pid" 2>/dev/null || true; }
	python3 -c 'import json,sys
r=json.load(open(sys.argv[1])); ok=r["statusCodeDistribution"].get("OK",0); n=r["count"]
if n == 0 or n - ok > n / 100:
    sys.exit("bench-grpc-proxy: %d of %d calls failed: %s" % (n - ok, n, r["statusCodeDistribution"]))
print("%.0f %.1f %d %d" % (ok / (r["total"] / 1e9), (int(sys.argv[2]) * 1e6 / int(sys.argv[3])) / n, ok, n))' \
		"$res" $((t1 - t0)) "$(getconf CLK_TCK)"
	rm -f "$res"
}

echo "# $(date -u +%FT%TZ) ghz -c $CONC -z $DUR --connections 4, $ROUNDS rounds; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A ratio
for r in $(seq "$ROUNDS"); do
	order=$targets
	[ $((r % 2)) = 0 ] && order=$(tr ' ' '\n' <<<"$targets" | tac | tr '\n' ' ')
	declare -A got=()
	for t in $order; do
		read -r c u ok n <<<"$(run "$t")"
		got[$t]=$c
		printf 'round %d %-6s %6s calls/s  %6s proxy-cpu-us/call  %s of %s OK\n' "$r" "$t" "$c" "$u" "$ok" "$n"
	done
	for t in $targets; do
		ratio[$t]+="$(awk -v a="${got[$t]}" -v b="${got[stock]}" 'BEGIN { printf "%.3f", a / b }') "
	done
done
for t in $targets; do
	printf 'median %-6s / stock: %s\n' "$t" "$(tr ' ' '\n' <<<"${ratio[$t]}" | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')"
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
