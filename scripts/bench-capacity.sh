#!/usr/bin/env bash
# Measurements for docs/capacity.md, in four parts (PARTS):
#
#   capacity  bytes per completed record (1 KiB and 16 KiB answers, and a
#             1 KiB answer with the request body stored) and purge cost per
#             million expired records, on every store: TestCapacity in
#             internal/capacity (its doc says how each store is measured);
#   scale     1, 2 and 3 `idem serve` processes on one store (PostgreSQL,
#             Redis), at the same total load: CONNS connections split over
#             one wrk per process; total requests/s, and CPU µs per request
#             of the proxies (summed over processes), wrk, the upstream and
#             the store's server, and the machine's idle share; the stock
#             httputil.ReverseProxy (internal/tools/plainproxy) at the same
#             load first;
#   cluster   Redis Clusters of 1, 2 and 3 masters (no replicas) started here
#             on spare ports: the store alone (BenchmarkStorePairs, as
#             BenchmarkReserveComplete in idemredis), pairs/s and the
#             masters' CPU µs per pair, summed;
#   latency   p50 and p99 at 1 and CONNS connections of the stock proxy and
#             of idem serve on memory, PostgreSQL and Redis, in one run, the
#             stock proxy right before each store; "added" is the store's
#             figure minus that stock run's.
#
#   eval "$(scripts/services.sh)"; scripts/bench-capacity.sh
#   PARTS=latency DUR=5s scripts/bench-capacity.sh
#
# Environment:
#   PARTS="capacity scale cluster latency"
#   DUR=10s CONNS=128 THREADS=2   wrk's duration (whole seconds, at least 3s: CPU
#                                 is sampled from 1 s in to 1 s before the end),
#                                 total connections, and threads of a lone wrk
#                                 (with several, one thread each)
#   RECORDS=10000 PURGE=100000    capacity: records per shape, and records purged
#   CAP_STORES="memory sqlite postgres mysql redis"
#   SCALE_STORES="postgres redis" PROCS="1 2 3"
#   MASTERS="1 2 3" BENCHTIME=5s  cluster: Cluster sizes, and go test -benchtime
#   LAT_STORES="memory postgres redis" ROUNDS=1
#                                 latency: stores, and rounds (medians printed)
#   REDIS_PORT=7390               the redis-server of this script's own (bytes,
#                                 purge, scale, latency): the shared 6379 serves
#                                 other tests, whose keys and CPU would count
#   CLUSTER_PORT=7400             the Cluster's first master (then +1, +2)
#   BASE_PORT=18600               the first port of the upstream and proxies
#   IDEM_TEST_POSTGRES_URL, IDEM_TEST_MYSQL_DSN
#                                 the servers (scripts/services.sh prints them); a
#                                 store whose variable is unset is skipped
#
# PostgreSQL's server CPU is every postgres process on this machine, MySQL's
# every mariadbd or mysqld, Redis's the redis-server(s) this script started.
# The script installs wrk (Debian package) with apt-get when it is missing.
# It stops every process it started, drops its PostgreSQL schemas and MySQL
# database (the capacity test drops its own), and removes the Redis data.
set -euo pipefail
cd "$(dirname "$0")/.."
PARTS=${PARTS:-capacity scale cluster latency}
DUR=${DUR:-10s}
CONNS=${CONNS:-128}
THREADS=${THREADS:-2}
RECORDS=${RECORDS:-10000}
PURGE=${PURGE:-100000}
CAP_STORES=${CAP_STORES:-memory sqlite postgres mysql redis}
SCALE_STORES=${SCALE_STORES:-postgres redis}
PROCS=${PROCS:-1 2 3}
MASTERS=${MASTERS:-1 2 3}
BENCHTIME=${BENCHTIME:-5s}
LAT_STORES=${LAT_STORES:-memory postgres redis}
ROUNDS=${ROUNDS:-1}
REDIS_PORT=${REDIS_PORT:-7390}
CLUSTER_PORT=${CLUSTER_PORT:-7400}
BASE_PORT=${BASE_PORT:-18600}

dur_secs=0
if [[ $DUR =~ ^([0-9]+)s$ ]]; then
	dur_secs=${BASH_REMATCH[1]}
elif [[ $DUR =~ ^([0-9]+)m$ ]]; then
	dur_secs=$((BASH_REMATCH[1] * 60))
fi
if [ "$dur_secs" -lt 3 ]; then
	echo "bench-capacity: DUR must be whole seconds or minutes, at least 3s (got $DUR)" >&2
	exit 2
fi
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

. scripts/benchlib.sh
ensure_wrk bench-capacity

mkdir -p .tmp
go build -o .tmp/idem ./cmd/idem
go build -o .tmp/benchserver ./internal/tools/benchserver
go build -o .tmp/plainproxy ./internal/tools/plainproxy
go test -c -o .tmp/capacity.test ./internal/capacity
tmp=$(mktemp -d)
run=bc$$-$(date +%s)
pgschema=idem_bench_capacity_$$
pids=()
cluster_pids=()
cleanup() {
	for p in "${pids[@]}" "${cluster_pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [ -n "${IDEM_TEST_POSTGRES_URL:-}" ]; then
		psql -X -q "$IDEM_TEST_POSTGRES_URL" -c "DROP SCHEMA IF EXISTS $pgschema CASCADE" >/dev/null 2>&1 || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

ping_redis() { [ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = PONG ]; }

# redis_start PORT DIR [ARGS...] starts a redis-server of this script's
# own on PORT, refusing a port that something already answers on, and
# appends its pid to the array named by REDIS_PIDS (pids by default).
redis_start() {
	local port=$1 dir=$2
	shift 2
	if ping_redis "$port"; then
		echo "bench-capacity: port $port is taken by another Redis; set REDIS_PORT or CLUSTER_PORT" >&2
		exit 1
	fi
	mkdir -p "$dir"
	redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" "$@" >"$dir/log" 2>&1 &
	if [ "${REDIS_PIDS:-pids}" = cluster_pids ]; then cluster_pids+=($!); else pids+=($!); fi
	for _ in $(seq 100); do
		ping_redis "$port" && return 0
		sleep 0.05
	done
	echo "redis-server on $port did not start:" >&2
	cat "$dir/log" >&2
	exit 1
}

redis_start "$REDIS_PORT" "$tmp/redis"
redis_url=redis://127.0.0.1:$REDIS_PORT/0
redis_pid=${pids[-1]}

echo "# $(date -u +%FT%TZ) $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); $(git log -1 --format='%h %s' 2>/dev/null | cut -c1-100)"
echo "# parts: $PARTS; wrk $DUR, $CONNS connections in all"

if has capacity; then
	echo "## capacity: bytes per record and purge cost"
	IDEM_BENCH_CAPACITY=1 IDEM_CAPACITY_RECORDS=$RECORDS IDEM_CAPACITY_PURGE=$PURGE \
		IDEM_CAPACITY_STORES=$CAP_STORES IDEM_CAPACITY_REDIS_URL=$redis_url \
		.tmp/capacity.test -test.run '^TestCapacity$' -test.timeout 60m | grep --line-buffered -v '^PASS$'
	redis-cli -p "$REDIS_PORT" flushall >/dev/null
fi

port=$BASE_PORT
declare -A portpid=()
# start NAME CMD... starts a server on the next free $port and waits
# until it answers.
start() {
	local name=$1
	shift
	port=$((port + 1))
	while curl -s -o /dev/null "http://127.0.0.1:$port/"; do port=$((port + 1)); done
	"${@//@PORT@/$port}" 2>"$tmp/$name.log" &
	pids+=($!)
	portpid[$port]=$!
	answers "$name" "$port" "$tmp/$name.log"
}

if has scale || has latency; then
	start upstream .tmp/benchserver -addr 127.0.0.1:@PORT@ -mode bare
	up=127.0.0.1:$port
	start plain .tmp/plainproxy -listen 127.0.0.1:@PORT@ -upstream "http://$up"
	plainport=$port
fi

# store_url NAME prints the --store URL of a store, or nothing when its
# server is not configured.
store_url() {
	case $1 in
	memory) echo "memory://" ;;
	postgres) [ -z "${IDEM_TEST_POSTGRES_URL:-}" ] || echo "${IDEM_TEST_POSTGRES_URL}$(sep "$IDEM_TEST_POSTGRES_URL")schema=$pgschema" ;;
	redis) echo "$redis_url?prefix=$run" ;;
	esac
}
sep() { case $1 in *\?*) echo '&' ;; *) echo '?' ;; esac; }

# serve NAME N sets sports to the ports of N idem serve processes on the
# store (started once, and kept for later runs), or to nothing when the
# store is skipped.
declare -A served=()
serve() {
	local url i
	sports=
	url=$(store_url "$1")
	if [ -z "$url" ]; then
		echo "bench-capacity: skipping $1: its server variable is not set (eval \"\$(scripts/services.sh)\")" >&2
		return 0
	fi
	for i in $(seq "$2"); do
		if [ -z "${served[$1-$i]:-}" ]; then
			start "$1-$i" .tmp/idem serve --upstream "http://$up" --listen "127.0.0.1:@PORT@" --store "$url" --log-level error
			served[$1-$i]=$port
		fi
		sports="$sports ${served[$1-$i]}"
	done
}

# ticks PID... prints the CPU ticks (user + system) the processes have
# used, read in one pass; a process that is gone counts nothing.
ticks() {
	local p f=()
	for p in "$@"; do [ -r "/proc/$p/stat" ] && f+=("/proc/$p/stat"); done
	[ "${#f[@]}" -gt 0 ] || { echo 0; return; }
	# utime and stime are fields 14 and 15; the command name (field 2, in
	# parentheses) may hold spaces, so they are counted from its end.
	awk '{ sub(/.*\) /, ""); s += $12 + $13 } END { print s + 0 }' "${f[@]}" 2>/dev/null || echo 0
}

# dbpids STORE prints the pids of the store's server processes, by process
# name (never by command line, which for idem serve holds the store URL).
dbpids() {
	case $1 in
	postgres) pgrep -x postgres || true ;;
	mysql) pgrep -x 'mariadbd|mysqld' || true ;;
	redis) echo "$redis_pid" ;;
	esac
}

# cpustat prints the machine's idle and total CPU ticks so far.
cpustat() { awk '/^cpu / { print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat; }

field() { sed -E "s/.* $1=([0-9.]+).*/\1/" <<<"$2"; }

# load NAME STORE PORT... runs one wrk per port at once, CONNS connections
# split over them, and prints the total requests/s, the largest p50 and
# p99 of the wrk runs, and the CPU µs per request of the proxies (summed),
# wrk, the upstream and the store's server over the middle of the run, and
# the machine's idle share. It sets rps, p50 and p99.
load() {
	local name=$1 store=$2
	shift 2
	local nports=$# i=0 p c threads wpids=() ppids=() dbs=() w started=$EPOCHREALTIME
	for p in "$@"; do
		c=$((CONNS / nports))
		[ "$i" -lt $((CONNS % nports)) ] && c=$((c + 1))
		threads=1
		[ "$nports" = 1 ] && threads=$THREADS
		[ "$c" -lt "$threads" ] && threads=$c
		wrk -t"$threads" -c"$c" -d"$DUR" -s scripts/wrk-idempotency.lua "http://127.0.0.1:$p/payments" -- "$run-${name//[^A-Za-z0-9]/_}-$i-$RANDOM" >"$tmp/wrk.$i" &
		wpids+=($!)
		case " ${ppids[*]} " in *" ${portpid[$p]} "*) ;; *) ppids+=("${portpid[$p]}") ;; esac
		i=$((i + 1))
	done
	# Sampled from 1 s in to 1 s before the end, by the clock: on a
	# loaded machine the sampling itself takes a while.
	local secs i1 i2 db0=0 db1=0
	sleep 1
	mapfile -t dbs < <(dbpids "$store")
	local w0 u0 p0
	w0=$(ticks "${wpids[@]}") u0=$(ticks "${portpid[${up#*:}]}") p0=$(ticks "${ppids[@]}")
	[ "${#dbs[@]}" = 0 ] || db0=$(ticks "${dbs[@]}")
	i1=$(cpustat)
	local t0=$EPOCHREALTIME
	sleep "$(awk -v s="$started" -v n="$t0" -v d="$dur_secs" 'BEGIN { r = s + d - 1 - n; print (r > 0.5 ? r : 0.5) }')"
	local w1 u1 p1 gone=0
	for w in "${wpids[@]}"; do [ -r "/proc/$w/stat" ] || gone=1; done
	w1=$(ticks "${wpids[@]}") u1=$(ticks "${portpid[${up#*:}]}") p1=$(ticks "${ppids[@]}")
	[ "${#dbs[@]}" = 0 ] || db1=$(ticks "${dbs[@]}")
	i2=$(cpustat)
	secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }')
	for w in "${wpids[@]}"; do wait "$w"; done
	rps=0 p50=0 p99=0
	local bad=0 out
	for i in $(seq 0 $((nports - 1))); do
		out=$(grep '^RESULT' "$tmp/wrk.$i")
		rps=$((rps + $(field rps "$out")))
		[ "$(field p50us "$out")" -le "$p50" ] || p50=$(field p50us "$out")
		[ "$(field p99us "$out")" -le "$p99" ] || p99=$(field p99us "$out")
		bad=$((bad + $(field non2xx "$out") + $(field errors "$out")))
	done
	[ "$bad" = 0 ] || echo "$name: WARNING: $bad failed requests; see $tmp/*.log" >&2
	[ "$gone" = 0 ] || echo "$name: WARNING: a wrk ended inside the CPU window (machine too loaded for DUR=$DUR): its CPU figures are wrong" >&2
	awk -v n="$name" -v r="$rps" -v s="$secs" -v t="$(getconf CLK_TCK)" -v w=$((w1 - w0)) -v u=$((u1 - u0)) \
		-v p=$((p1 - p0)) -v d=$((db1 - db0)) -v hasdb="${#dbs[@]}" -v a="$i1" -v b="$i2" -v p50="$p50" -v p99="$p99" 'BEGIN {
		k = r * s; us = 1e6 / t / (k > 0 ? k : 1)
		split(a, x, " "); split(b, y, " ")
		printf "%-22s %8d req/s  p50 %6d us  p99 %7d us  cpu us/req: proxy %5.0f  wrk %4.0f  upstream %4.0f  server %s;  idle %2.0f%%\n",
			n, r, p50, p99, p * us, w * us, u * us, (hasdb > 0 ? sprintf("%4.0f", d * us) : "   -"),
			(y[2] > x[2] ? 100 * (y[1] - x[1]) / (y[2] - x[2]) : 0) }'
}

if has scale; then
	echo "## scale: idem serve processes on one store, $CONNS connections in all"
	for s in $SCALE_STORES; do
		for n in $PROCS; do
			# The stock proxy takes the same split of the load, over n wrk.
			ports=()
			for _ in $(seq "$n"); do ports+=("$plainport"); done
			load "plain ($n wrk)" none "${ports[@]}"
			serve "$s" "$n"
			[ -n "$sports" ] || continue 2
			# shellcheck disable=SC2086
			load "$s x$n" "$s" $sports
		done
	done
fi

if has cluster; then
	echo "## cluster: the Redis store alone (BenchmarkStorePairs) on Clusters of 1, 2 and 3 masters"
	for m in $MASTERS; do
		ports=()
		for i in $(seq 0 $((m - 1))); do
			ports+=($((CLUSTER_PORT + i)))
			REDIS_PIDS=cluster_pids redis_start "${ports[-1]}" "$tmp/cluster-$m-$i" --cluster-enabled yes \
				--cluster-config-file "$tmp/cluster-$m-$i/nodes.conf" --cluster-node-timeout 5000
		done
		# Slots split evenly; every node meets the first.
		for i in $(seq 0 $((m - 1))); do
			redis-cli -p "${ports[$i]}" cluster addslotsrange $((16384 * i / m)) $((16384 * (i + 1) / m - 1)) >/dev/null
			[ "$i" = 0 ] || redis-cli -p "${ports[$i]}" cluster meet 127.0.0.1 "${ports[0]}" >/dev/null
		done
		ok=0
		for _ in $(seq 200); do
			ok=1
			for p in "${ports[@]}"; do
				redis-cli -p "$p" cluster info | tr -d '\r' | grep -qx 'cluster_state:ok' || ok=0
				[ "$(redis-cli -p "$p" cluster info | tr -d '\r' | sed -n 's/^cluster_known_nodes://p')" = "$m" ] || ok=0
			done
			[ "$ok" = 1 ] && break
			sleep 0.1
		done
		[ "$ok" = 1 ] || { echo "bench-capacity: the Cluster of $m masters did not reach cluster_state:ok" >&2; exit 1; }
		seeds=$(printf '127.0.0.1:%s,' "${ports[@]}")
		IDEM_CAPACITY_STORE_URL="redis+cluster://${seeds%,}?prefix=$run" .tmp/capacity.test -test.run '^$' \
			-test.bench '^BenchmarkStorePairs$' -test.benchtime "$BENCHTIME" | grep '^Benchmark' |
			awk -v m="$m" '{ for (i = 2; i < NF; i++) v[$(i+1)] = $i
				sub(/-[0-9]+$/, "", $1); sub(/^BenchmarkStorePairs\//, "", $1)
				printf "masters=%d %-5s %8.0f pairs/s  p50 %6.0f us  p99 %6.0f us  redis cpu %5.1f us/pair (summed over masters)\n",
					m, $1, v["pairs/s"], v["p50-µs"], v["p99-µs"], v["server-µs/pair"] }'
		for p in "${cluster_pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
		cluster_pids=()
	done
fi

median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

if has latency; then
	echo "## latency: p50 and p99 (us) that idem serve adds to the stock proxy, $ROUNDS round(s)"
	declare -A lat=()
	for round in $(seq "$ROUNDS"); do
		for c in 1 "$CONNS"; do
			for s in $LAT_STORES; do
				serve "$s" 1
				[ -n "$sports" ] || continue
				CONNS=$c load "plain c=$c" none "$plainport"
				b50=$p50 b99=$p99
				# shellcheck disable=SC2086
				CONNS=$c load "$s c=$c" "$s" $sports
				echo "round $round $s c=$c: idem adds p50 $((p50 - b50)) us, p99 $((p99 - b99)) us"
				lat[$s-$c-p50]="${lat[$s-$c-p50]:-} $p50" lat[$s-$c-p99]="${lat[$s-$c-p99]:-} $p99"
				lat[$s-$c-b50]="${lat[$s-$c-b50]:-} $b50" lat[$s-$c-b99]="${lat[$s-$c-b99]:-} $b99"
				lat[$s-$c-a50]="${lat[$s-$c-a50]:-} $((p50 - b50))" lat[$s-$c-a99]="${lat[$s-$c-a99]:-} $((p99 - b99))"
			done
		done
	done
	echo "# medians of $ROUNDS round(s), us: store, connections, p50 stock / idem / added, p99 stock / idem / added"
	for c in 1 "$CONNS"; do
		for s in $LAT_STORES; do
			[ -n "${lat[$s-$c-p50]:-}" ] || continue
			m=()
			# shellcheck disable=SC2086
			for k in b50 p50 a50 b99 p99 a99; do m+=("$(median ${lat[$s-$c-$k]})"); done
			printf '%-9s c=%-4s p50 %7s / %7s / %7s   p99 %8s / %8s / %8s\n' "$s" "$c" "${m[@]}"
		done
	done
fi
