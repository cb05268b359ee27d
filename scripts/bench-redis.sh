#!/usr/bin/env bash
# Redis store throughput and latency for BENCHMARKS.md, against the native
# SET NX rate of the same servers, in one run, standalone and Cluster:
#
#   scripts/bench-redis.sh            # BENCHTIME=5s, BENCH_BIN (see below)
#
# It reads IDEM_TEST_REDIS_URL and IDEM_TEST_REDIS_CLUSTER (from
# .tmp/services.env when they are unset; scripts/services.sh writes it).
#
# Native: redis-benchmark -c 50 -P 1 -n 200000 -r 1000000 SET key v NX (no
# pipelining; --cluster on the Cluster, where {tag} spreads the keys over
# every master), and the reserve script alone through EVALSHA, the server's
# cost of a script. Go, from ./idemredis:
#   BenchmarkReserveComplete  a store Reserve then Complete of a fresh key,
#                             16 and 50 goroutines (pairs/s);
#   BenchmarkSetNX            the Go client's own SET NX, 50 goroutines;
#   BenchmarkEngine           idem's Begin + Lease.Complete, 1 and 32
#                             goroutines, with p50 and p99 of the pair.
# Targets (issue "store throughput"): pairs/s >= 0.6 of redis-benchmark's SET
# NX rate standalone and >= 0.45 on the Cluster. The SET NX keys
# (idembench:*) are deleted afterwards; the store's keys by the benchmarks.
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
	redis-benchmark -c 50 -P 1 -n 200000 -r 1000000 -q "$@" 2>/dev/null |
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

# native measures the three redis-benchmark rates into the variables named
# by its arguments.
native() {
	local -n std=$1 cl=$2 script=$3
	std=$(rate -h "$host" -p "$port" SET 'idembench:key:__rand_int__' v NX)
	cleanup "$host" "$port"
	cl=$(rate -h "$chost" -p "$cport" --cluster SET 'idembench:{tag}:key:__rand_int__' v NX)
	for m in $(masters); do cleanup "${m%:*}" "${m##*:}"; done
	script=$(rate -h "$host" -p "$port" EVALSHA "$sha" 1 'idembench:{__rand_int__}:r' tenant 'POST /charges' key fp tok)
	cleanup "$host" "$port"
}

# The reserve script's work (a copy of reserveScript in idemredis/scripts.go,
# without the request field), driven by redis-benchmark's C client.
reserve='local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if redis.call("EXISTS", KEYS[1]) == 1 then return redis.call("HMGET", KEYS[1], "s", "o", "k", "fp", "st", "tok", "lu", "resp", "rsn", "ca", "ea", "ua", "req") end
redis.call("HSET", KEYS[1], "s", ARGV[1], "o", ARGV[2], "k", ARGV[3], "fp", ARGV[4], "st", "pending", "tok", ARGV[5], "lu", string.format("%.0f", now + 30000000), "ca", string.format("%.0f", now), "ua", string.format("%.0f", now))
return 1'
sha=$(redis-cli -h "$host" -p "$port" script load "$reserve")

# The native rates are measured before and after the Go benchmarks, and
# their mean is the baseline, so that drift on a shared machine during the
# run weighs on both sides alike.
native std1 cl1 script1
echo "redis-benchmark before: SET NX standalone $std1, cluster $cl1, EVALSHA reserve script standalone $script1 requests/s"

out=$("$bin" -test.run '^$' -test.bench '^Benchmark(ReserveComplete|SetNX|Engine)$' -test.benchmem \
	-test.count 1 -test.benchtime "${BENCHTIME:-5s}")
echo "$out" | grep '^Benchmark'
echo "# load after the Go benchmarks: $(cut -d' ' -f1-3 /proc/loadavg)"
native std2 cl2 script2
echo "redis-benchmark after:  SET NX standalone $std2, cluster $cl2, EVALSHA reserve script standalone $script2 requests/s"
mean() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", (a + b) / 2 }'; }
native_std=$(mean "$std1" "$std2")
native_cl=$(mean "$cl1" "$cl2")
native_script=$(mean "$script1" "$script2")

# metric NAME UNIT prints the UNIT figure of the benchmark whose name starts with NAME.
metric() {
	echo "$out" | awk -v name="$1" -v unit="$2" 'index($1, name) == 1 { for (i = 1; i < NF; i++) if ($(i+1) == unit) print $i }'
}
ratio() { awk -v p="$2" -v n="$3" -v what="$1" -v goal="$4" 'BEGIN { printf "%-34s %8.0f / %8.0f = %.3f%s\n", what, p, n, p / n, goal }'; }

for w in 16 50; do
	ratio "standalone pairs/s, $w workers:" "$(metric "BenchmarkReserveComplete/standalone/workers=$w-" pairs/s)" "$native_std" " (target >= 0.6 of SET NX)"
done
for w in 16 50; do
	ratio "cluster pairs/s, $w workers:" "$(metric "BenchmarkReserveComplete/cluster/workers=$w-" pairs/s)" "$native_cl" " (target >= 0.45 of SET NX)"
done
ratio "Go client SET NX, standalone:" "$(metric 'BenchmarkSetNX/standalone/workers=50-' ops/s)" "$native_std" ""
ratio "Go client SET NX, cluster:" "$(metric 'BenchmarkSetNX/cluster/workers=50-' ops/s)" "$native_cl" ""
ratio "reserve script / SET NX, standalone:" "$native_script" "$native_std" ""
for topo in standalone cluster; do
	for w in 1 32; do
		name="BenchmarkEngine/$topo/workers=$w-"
		printf 'engine Begin+Complete, %-10s %2d workers: p50 %s µs, p99 %s µs, %s pairs/s\n' "$topo," "$w" \
			"$(metric "$name" p50-µs)" "$(metric "$name" p99-µs)" "$(metric "$name" pairs/s)"
	done
done
