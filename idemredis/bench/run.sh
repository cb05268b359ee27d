#!/usr/bin/env bash
# Compares idemredis's reserve+complete rate with the native SET NX rate of
# the same servers, in one run, on the standalone Redis and on the Cluster:
#
#   eval "$(scripts/redis.sh)"; idemredis/bench/run.sh
#
# Native: redis-benchmark -c 50 -n 200000 -r 1000000 SET key v NX (no
# pipelining, -P 1), and go-redis's own SET NX (BenchmarkSetNX) from the
# same 50 goroutines. idemredis: BenchmarkReserveComplete, 50 goroutines,
# each pair a reserve script and a complete script (two round trips, so 0.5
# of the native rate is the ceiling; the target is 0.45). BENCHTIME sets
# go test -benchtime (default 5s). The SET NX keys (idembench:*) are deleted
# afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."

: "${IDEM_TEST_REDIS_URL:?run: eval \"\$(scripts/redis.sh)\"}"
: "${IDEM_TEST_REDIS_CLUSTER:?run: eval \"\$(scripts/redis.sh)\"}"

hostport=${IDEM_TEST_REDIS_URL#redis://}
hostport=${hostport%%/*}
hostport=${hostport##*@}
host=${hostport%:*}
port=${hostport##*:}
seed=${IDEM_TEST_REDIS_CLUSTER%%,*}
chost=${seed%:*}
cport=${seed##*:}

# rate prints the requests per second of a redis-benchmark run; its
# arguments are the connection options, then the command.
rate() {
	redis-benchmark -c 50 -n 200000 -r 1000000 -q "$@" 2>/dev/null |
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

echo "# $(date -u +%FT%TZ) $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# redis $(redis-server --version | grep -o 'v=[0-9.]*')"

native_std=$(rate -h "$host" -p "$port" SET 'idembench:key:__rand_int__' v NX)
cleanup "$host" "$port"
native_cl=$(rate -h "$chost" -p "$cport" --cluster SET 'idembench:{tag}:key:__rand_int__' v NX)
for m in $(masters); do cleanup "${m%:*}" "${m##*:}"; done
echo "redis-benchmark SET NX standalone: $native_std requests/s"
echo "redis-benchmark SET NX cluster:    $native_cl requests/s"

# The server-side ceiling: the reserve script alone (a copy of reserveScript
# in ../scripts.go), driven by redis-benchmark's C client on the standalone
# server. A pair runs two scripts, so pairs/s cannot exceed about half this.
reserve='if redis.call("EXISTS", KEYS[1]) == 1 then return redis.call("HMGET", KEYS[1], "s", "o", "k", "fp", "st", "tok", "lu", "resp", "rsn", "ca", "ea") end
redis.call("HSET", KEYS[1], "s", ARGV[1], "o", ARGV[2], "k", ARGV[3], "fp", ARGV[4], "st", "pending", "tok", ARGV[5], "lu", ARGV[6], "ca", ARGV[7])
return 1'
sha=$(redis-cli -h "$host" -p "$port" script load "$reserve")
native_script=$(rate -h "$host" -p "$port" EVALSHA "$sha" 1 'idembench:{__rand_int__}:r' \
	tenant 'POST /charges' key fp tok 1796000000000000 1796000000000000)
cleanup "$host" "$port"
echo "redis-benchmark EVALSHA reserve script standalone: $native_script requests/s"

out=$(go test -run '^$' -bench '^Benchmark(ReserveComplete|SetNX)$' -benchmem -count 1 \
	-benchtime "${BENCHTIME:-5s}" ./idemredis/)
echo "$out" | grep '^Benchmark'

# metric NAME UNIT prints the UNIT figure of the benchmark whose name matches NAME.
metric() { echo "$out" | awk -v name="$1" -v unit="$2" '$1 ~ name { for (i = 1; i < NF; i++) if ($(i+1) == unit) print $i }'; }
std=$(metric 'ReserveComplete/standalone' pairs/s)
cl=$(metric 'ReserveComplete/cluster' pairs/s)
go_std=$(metric 'SetNX/standalone' ops/s)
go_cl=$(metric 'SetNX/cluster' ops/s)
awk -v p="$std" -v n="$native_std" 'BEGIN { printf "standalone: %.0f pairs/s / %.0f SET NX/s = %.3f (target >= 0.45)\n", p, n, p / n }'
awk -v s="$native_script" -v n="$native_std" 'BEGIN { printf "server ceiling: %.0f scripts/s / 2 / %.0f SET NX/s = %.3f\n", s, n, s / 2 / n }'
awk -v p="$cl" -v n="$native_cl" 'BEGIN { printf "cluster:    %.0f pairs/s / %.0f SET NX/s = %.3f (target >= 0.45)\n", p, n, p / n }'
# The client-side ceiling: go-redis's own SET NX rate from the same 50
# goroutines (BenchmarkSetNX). Two round trips per pair make 0.5 the most a
# go-redis store can reach against it.
awk -v p="$std" -v n="$go_std" 'BEGIN { printf "standalone vs go-redis SET NX: %.0f / %.0f = %.3f (ceiling 0.5)\n", p, n, p / n }'
awk -v p="$cl" -v n="$go_cl" 'BEGIN { printf "cluster vs go-redis SET NX:    %.0f / %.0f = %.3f (ceiling 0.5)\n", p, n, p / n }'

