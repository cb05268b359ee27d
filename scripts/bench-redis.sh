#!/usr/bin/env bash
# Redis store throughput and latency for BENCHMARKS.md, against the native
# SET NX rate of the same servers, standalone and Cluster:
#
#   scripts/bench-redis.sh      # ROUNDS=3 BENCHTIME=3s REQUESTS=100000 BENCH_BIN=
#
# It reads IDEM_TEST_REDIS_URL and IDEM_TEST_REDIS_CLUSTER (from
# .tmp/services.env when they are unset; scripts/services.sh writes it).
#
# Native: redis-benchmark -c 50 -P 1 -n $REQUESTS -r 1000000 SET key v NX
# (no pipelining; --cluster on the Cluster, where {tag} spreads the keys
# over every master). Go, from ./idemredis, with -benchtime $BENCHTIME:
#   BenchmarkReserveComplete  a store Reserve then Complete of a fresh key,
#                             16 and 50 goroutines (pairs/s);
#   BenchmarkSetNX            the Go client's own SET NX, 50 goroutines;
#   BenchmarkEngine           idem's Begin + Lease.Complete, 1 and 32
#                             goroutines, with p50 and p99 of the pair.
# Each round puts a topology's Go benchmarks between two redis-benchmark
# runs on it; the ratios are against their mean, and their medians over the
# rounds come last. Then the reserve script's own rate under
# redis-benchmark (the server's cost of a script), and the engine's
# latency. Targets (the store throughput issue): pairs/s >= 0.6 of
# redis-benchmark's SET NX rate standalone and >= 0.45 on the Cluster. The
# SET NX keys (idembench:*) are deleted as it goes; the store's keys by the
# benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${IDEM_TEST_REDIS_URL:-}" ] && [ -f .tmp/services.env ]; then
	# shellcheck disable=SC1091
	. .tmp/services.env
fi
: "${IDEM_TEST_REDIS_URL:?set it, or run scripts/services.sh > .tmp/services.env}"
: "${IDEM_TEST_REDIS_CLUSTER:?set it, or run scripts/services.sh > .tmp/services.env}"

hostport=${IDEM_TEST_REDIS_URL#*://}
hostport=${hostport%%/*}
hostport=${hostport%%\?*}
hostport=${hostport##*@}
host=${hostport%:*}
port=${hostport##*:}
seed=${IDEM_TEST_REDIS_CLUSTER#*://}
seed=${seed%%,*}
chost=${seed%:*}
cport=${seed##*:}

# rate prints the requests per second of a redis-benchmark run; its
# arguments are the connection options, then the command.
rate() {
	redis-benchmark -c 50 -P 1 -n "${REQUESTS:-100000}" -r 1000000 -q "$@" 2>/dev/null |
		tr '\r' '\n' | grep -o '[0-9.]* requests per second' | tail -1 | cut -d' ' -f1
}

# cleanup deletes the SET NX keys from one node, one UNLINK per key (a
# Cluster node refuses multi-key commands across slots), pipelined.
cleanup() {
	redis-cli -h "$1" -p "$2" --scan --pattern 'idembench:*' |
		awk '{ printf "UNLINK %s\r\n", $0 }' |
		redis-cli -h "$1" -p "$2" --pipe >/dev/null
}

masters() {
	redis-cli -h "$chost" -p "$cport" cluster nodes | awk '$3 ~ /master/ {sub(/@.*/, "", $2); print $2}'
}

# Built first, so that no compilation overlaps a measurement. BENCH_BIN
# runs a test binary built earlier instead (go test -c ./idemredis/), to
# compare two versions of the store on the same servers.
bin=${BENCH_BIN:-}
if [ -z "$bin" ]; then
	mkdir -p .tmp
	bin=.tmp/idemredis.test
	go test -c -o "$bin" ./idemredis/
fi

echo "# $(date -u +%FT%TZ) $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(redis-server --version | grep -o 'v=[0-9.]*')"
echo "# $(git log -1 --format='%h %s' 2>/dev/null || true)"

# The reserve script's work (a copy of reserveScript in idemredis/scripts.go,
# without the request field), driven by redis-benchmark's C client.
reserve='local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if redis.call("EXISTS", KEYS[1]) == 1 then return redis.call("HMGET", KEYS[1], "s", "o", "k", "fp", "st", "tok", "lu", "resp", "rsn", "ca", "ea", "ua", "req") end
redis.call("HSET", KEYS[1], "s", ARGV[1], "o", ARGV[2], "k", ARGV[3], "fp", ARGV[4], "st", "pending", "tok", ARGV[5], "lu", string.format("%.0f", now + 30000000), "ca", string.format("%.0f", now), "ua", string.format("%.0f", now))
return 1'
sha=$(redis-cli -h "$host" -p "$port" script load "$reserve")

# native TOPOLOGY prints redis-benchmark's SET NX rate on the standalone
# server or the Cluster, and deletes the keys it set.
native() {
	if [ "$1" = standalone ]; then
		rate -h "$host" -p "$port" SET 'idembench:key:__rand_int__' v NX
		cleanup "$host" "$port"
	else
		rate -h "$chost" -p "$cport" --cluster SET 'idembench:{tag}:key:__rand_int__' v NX
		for m in $(masters); do cleanup "${m%:*}" "${m##*:}"; done
	fi
}

# gobench PATTERN runs the Go benchmarks that match PATTERN.
gobench() {
	"$bin" -test.run '^$' -test.bench "$1" -test.benchmem -test.count 1 -test.benchtime "${BENCHTIME:-3s}" | grep '^Benchmark'
}

# metric OUTPUT NAME UNIT prints the UNIT figure of the benchmark in OUTPUT
# whose name starts with NAME.
metric() {
	echo "$1" | awk -v name="$2" -v unit="$3" 'index($1, name) == 1 { for (i = 1; i < NF; i++) if ($(i+1) == unit) print $i }'
}
ratio() { awk -v p="$2" -v n="$3" -v what="$1" 'BEGIN { printf "  %-30s %8.0f / %8.0f = %.3f\n", what, p, n, p / n }'; }
median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# Each round measures, per topology, redis-benchmark's SET NX rate right
# before and right after the Go benchmarks and compares with their mean, so
# that drift on a shared machine weighs on both sides alike. ROUNDS rounds
# (default 3); the medians of the rounds' ratios come last.
declare -A ratios
for round in $(seq "${ROUNDS:-3}"); do
	for topo in standalone cluster; do
		before=$(native $topo)
		out=$(gobench "^Benchmark(ReserveComplete|SetNX)\$/^$topo\$")
		after=$(native $topo)
		base=$(awk -v a="$before" -v b="$after" 'BEGIN { printf "%.0f", (a + b) / 2 }')
		echo "round $round, $topo: redis-benchmark SET NX $before before, $after after (load $(cut -d' ' -f1 /proc/loadavg))"
		echo "$out" | sed 's/^/  /'
		for w in 16 50; do
			p=$(metric "$out" "BenchmarkReserveComplete/$topo/workers=$w-" pairs/s)
			ratio "pairs/s, $w workers:" "$p" "$base"
			ratios[$topo/$w]+="$(awk -v p="$p" -v n="$base" 'BEGIN { printf "%.3f", p / n }') "
		done
		ratio "Go client SET NX, 50 workers:" "$(metric "$out" "BenchmarkSetNX/$topo/workers=50-" ops/s)" "$base"
	done
done
echo "medians of ${ROUNDS:-3} rounds, store pairs/s / redis-benchmark SET NX:"
for topo in standalone cluster; do
	target=0.6
	[ $topo = cluster ] && target=0.45
	for w in 16 50; do
		# shellcheck disable=SC2086
		echo "  $topo, $w workers: $(median ${ratios[$topo/$w]}) (rounds: ${ratios[$topo/$w]% }; target >= $target)"
	done
done

# The server's cost of a script against a plain command, with
# redis-benchmark's own client on both sides.
setnx=$(native standalone)
script=$(rate -h "$host" -p "$port" EVALSHA "$sha" 1 'idembench:{__rand_int__}:r' tenant 'POST /charges' key fp tok)
cleanup "$host" "$port"
echo "redis-benchmark EVALSHA reserve script / SET NX, standalone: $script / $setnx = $(awk -v a="$script" -v b="$setnx" 'BEGIN { printf "%.3f", a / b }')"

# The engine's latency: Begin + Lease.Complete of a fresh key, from one
# goroutine and from 32.
out=$(gobench '^BenchmarkEngine$')
echo "$out"
for topo in standalone cluster; do
	for w in 1 32; do
		name="BenchmarkEngine/$topo/workers=$w-"
		printf 'engine Begin+Complete, %-10s %2d workers: p50 %s µs, p99 %s µs, %s pairs/s\n' "$topo," "$w" \
			"$(metric "$out" "$name" p50-µs)" "$(metric "$out" "$name" p99-µs)" "$(metric "$out" "$name" pairs/s)"
	done
done
echo "# load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
