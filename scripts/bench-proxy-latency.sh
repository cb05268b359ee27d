#!/usr/bin/env bash
# Latency that `idem serve` adds at a fixed rate, for BENCHMARKS.md and
# docs/capacity.md: keyed POSTs (a fresh Idempotency-Key each, so each one
# reserves and completes a key) at a constant RATE, from vegeta (its
# latencies kept in an HDR histogram), through the stock proxy
# (internal/tools/plainproxy, a bare httputil.ReverseProxy) and through
# `idem serve` on each store, in front of the same bare upstream. The stock
# proxy runs right before each store in every round, so that drift on a
# shared machine hits both alike; it prints p50, p99 and p99.9 of every
# run, what idem serve added over the stock proxy in that round, and the
# medians of those differences over the rounds.
#
#   eval "$(scripts/services.sh)"; scripts/bench-proxy-latency.sh
#   RATE=2000 ROUNDS=5 STORES="memory sqlite" scripts/bench-proxy-latency.sh
#
# Environment:
#   RATE        requests per second; by default half the stock proxy's
#               maximum on this machine, measured first with wrk (CONNS
#               connections, MAXDUR)
#   DUR=10s     each vegeta run; ROUNDS=3 rounds
#   STORES="memory sqlite postgres redis"
#   IDEM_TEST_POSTGRES_URL, IDEM_TEST_REDIS_URL  the servers; a store whose
#               variable is unset is skipped with a message
#
# vegeta (github.com/tsenart/vegeta/v12) is installed with go install into
# .tmp/bin, and wrk (Debian package) with apt-get, when missing; neither
# enters idem's go.mod. PostgreSQL gets a schema of its own, dropped at the
# end; Redis keys carry a prefix of their own and are deleted.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-10s}
MAXDUR=${MAXDUR:-5s}
CONNS=${CONNS:-32}
ROUNDS=${ROUNDS:-3}
STORES=${STORES:-memory sqlite postgres redis}
RATE=${RATE:-}

. scripts/benchlib.sh
ensure_wrk bench-proxy-latency
mkdir -p .tmp/bin
[ -x .tmp/bin/vegeta ] || GOBIN=$PWD/.tmp/bin GOWORK=off GOFLAGS=-mod=mod go install github.com/tsenart/vegeta/v12@v12.13.0
proxy_rig bl bench_latency 18500

if [ -z "$RATE" ]; then
	max=$(wrk -t2 -c"$CONNS" -d"$MAXDUR" -s scripts/wrk-idempotency.lua "http://127.0.0.1:$plainport/payments" -- "$run-max" |
		sed -nE 's/^RESULT .*rps=([0-9]+).*/\1/p')
	RATE=$((max / 2))
	echo "# stock proxy maximum: $max requests/s (wrk -t2 -c$CONNS -d$MAXDUR); RATE=$RATE"
fi
echo "# $(date -u +%FT%TZ) $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); RATE=$RATE/s DUR=$DUR ROUNDS=$ROUNDS"

body=$(printf '%s' '{"amount":1000,"currency":"usd"}' | base64 -w0)
# attack PORT NAME runs vegeta at RATE for DUR against PORT, every request
# with a fresh key, and prints "p50 p99 p99.9" in microseconds (from
# vegeta's HDR histogram), and the share of answers that were not 2xx.
attack() {
	local prefix="$run-$2-$RANDOM$RANDOM"
	awk -v u="http://127.0.0.1:$1/payments" -v p="$prefix" -v b="$body" 'BEGIN {
		for (i = 1; ; i++)
			printf "{\"method\":\"POST\",\"url\":\"%s\",\"body\":\"%s\",\"header\":{\"Content-Type\":[\"application/json\"],\"Authorization\":[\"Bearer bench\"],\"Idempotency-Key\":[\"%s-%d\"]}}\n", u, b, p, i
	}' 2>/dev/null | .tmp/bin/vegeta attack -lazy -format=json -rate="$RATE" -duration="$DUR" -keepalive=true >"$tmp/$2.bin" || true
	local ok
	ok=$(.tmp/bin/vegeta report -type=json <"$tmp/$2.bin" | sed -nE 's/.*"success":([0-9.e+-]+).*/\1/p')
	.tmp/bin/vegeta report -type=hdrplot <"$tmp/$2.bin" | awk -v ok="$ok" '
		NR > 1 && $2 >= 0.5 && !a { a = $1 * 1000 }
		NR > 1 && $2 >= 0.99 && !b { b = $1 * 1000 }
		NR > 1 && $2 >= 0.999 && !c { c = $1 * 1000 }
		END { printf "%.0f %.0f %.0f %s\n", a, b, c, ok }'
}

median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
for s in $STORES; do
	serve "$s" on
	[ -n "$sport" ] || continue
	d50=() d99=() d999=()
	for round in $(seq "$ROUNDS"); do
		read -r a50 a99 a999 aok < <(attack "$plainport" plain)
		read -r b50 b99 b999 bok < <(attack "$sport" "$s")
		echo "round $round plain: p50 ${a50}µs p99 ${a99}µs p99.9 ${a999}µs success $aok"
		echo "round $round $s: p50 ${b50}µs p99 ${b99}µs p99.9 ${b999}µs success $bok (load $(cut -d' ' -f1 /proc/loadavg))"
		d50+=($((b50 - a50))) d99+=($((b99 - a99))) d999+=($((b999 - a999)))
		echo "round $round $s adds: p50 ${d50[-1]}µs p99 ${d99[-1]}µs p99.9 ${d999[-1]}µs"
	done
	echo "$s adds (median of $ROUNDS rounds) at $RATE/s: p50 $(median "${d50[@]}")µs p99 $(median "${d99[@]}")µs p99.9 $(median "${d999[@]}")µs"
done
