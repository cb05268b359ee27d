#!/usr/bin/env bash
# Proxy load run for BENCHMARKS.md, under wrk: keyed POSTs with a fresh
# Idempotency-Key each (scripts/wrk-idempotency.lua), keep-alive, loopback,
# through a stock httputil.ReverseProxy (internal/tools/plainproxy, no idem
# code) and through `idem serve` on memory, SQLite, PostgreSQL, MySQL and
# Redis, all in front of the same bare upstream, in one run. The plain proxy
# runs right before each store, and each store's ratio is taken against that
# run, so that drift on a shared machine hits both sides alike.
#
#   eval "$(scripts/services.sh)"; scripts/bench-proxy.sh
#
# Environment:
#   DUR=10s THREADS=2 CONNS=32   wrk's duration, threads and connections
#   ROUNDS=1                     rounds of the whole set; ratios are printed per round and as medians
#   STORES="memory sqlite postgres mysql redis"
#   BATCH=on                     group commit of the SQL stores (batch=off in their URLs turns it off)
#   LATENCY=0                    1: instead, p50/p99 of the SQL stores at 1 and CONNS connections,
#                                batching on and off (and the plain proxy at both)
#   CPU=0                        1: also print, for every run, the CPU time per request of wrk,
#                                the upstream, the proxy and the store's server (from /proc, over
#                                the middle of the run; the server is every postgres or mariadbd
#                                process on this machine, and the redis-server that
#                                IDEM_TEST_REDIS_URL names) and the machine's idle share,
#                                and per server store a ceiling: the ratio idem would reach if its
#                                store client cost no more CPU than the memory store and no core
#                                idled (needs memory in STORES, first)
#   IDEM_TEST_POSTGRES_URL, IDEM_TEST_MYSQL_DSN, IDEM_TEST_REDIS_URL
#                                the servers (scripts/services.sh prints them); a store whose
#                                variable is unset is skipped with a message
#
# The script installs wrk (Debian package) with apt-get when it is missing.
# PostgreSQL gets a schema of its own and MySQL a database of its own, both
# dropped at the end; Redis keys carry a prefix of their own and are deleted.
# MySQL's URL adds interpolateParams=true (one round trip per statement, as
# idemmysql's documentation recommends for throughput).
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-10s}
THREADS=${THREADS:-2}
CONNS=${CONNS:-32}
ROUNDS=${ROUNDS:-1}
STORES=${STORES:-memory sqlite postgres mysql redis}
BATCH=${BATCH:-on}
LATENCY=${LATENCY:-0}
CPU=${CPU:-0}
if [ "$CPU" = 1 ]; then
	# CPU=1 samples from 1 s in to 1 s before the end of each run.
	dur_secs=0
	if [[ $DUR =~ ^([0-9]+)s$ ]]; then
		dur_secs=${BASH_REMATCH[1]}
	elif [[ $DUR =~ ^([0-9]+)m$ ]]; then
		dur_secs=$((BASH_REMATCH[1] * 60))
	fi
	if [ "$dur_secs" -lt 3 ]; then
		echo "bench-proxy: CPU=1 needs DUR in whole seconds or minutes, at least 3s (got $DUR)" >&2
		exit 2
	fi
fi

. scripts/benchlib.sh
ensure_wrk bench-proxy

mkdir -p .tmp
proxy_rig bp bench_proxy 18300

# load PORT CONNS NAME [STORE] runs wrk and prints its RESULT line, prefixed
# with NAME; with CPU=1 also the CPU per request of each process (STORE
# names the server whose processes count as db), and sets cpu_* for the
# ceilings.
load() {
	local threads=$THREADS
	[ "$2" -lt "$threads" ] && threads=$2
	local out
	wrk -t"$threads" -c"$2" -d"$DUR" -s scripts/wrk-idempotency.lua "http://127.0.0.1:$1/payments" -- "$run-$RANDOM$RANDOM" >"$tmp/wrk.out" &
	local w=$!
	if [ "$CPU" = 1 ]; then
		measure "$w" "${portpid[$1]}" "${portpid[${up#*:}]}" "${4:-}"
	fi
	wait "$w"
	out=$(grep '^RESULT' "$tmp/wrk.out")
	echo "$3 c=$2: ${out#RESULT }"
	last=$out
	if [ "$CPU" = 1 ]; then
		local n
		n=$(awk -v r="$(field rps "$out")" -v s="$cpu_secs" 'BEGIN { print r * s }')
		read -r cpu_wrk cpu_up cpu_proxy cpu_db < <(awk -v n="$n" -v t="$(getconf CLK_TCK)" -v a="$cpu_ticks" 'BEGIN {
			split(a, x, " "); for (i = 1; i <= 4; i++) printf "%.0f ", (n > 0 ? x[i] * 1e6 / t / n : 0); print "" }')
		echo "$3 c=$2: cpu us/request: wrk=$cpu_wrk upstream=$cpu_up proxy=$cpu_proxy db=$cpu_db; idle $cpu_idle%"
	fi
}

# ticks PID... prints the CPU ticks (user + system) the processes have used.
ticks() {
	local p sum=0
	for p in "$@"; do
		[ -r "/proc/$p/stat" ] || continue
		sum=$((sum + $(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null || echo 0)))
	done
	echo "$sum"
}

# dbpids STORE prints the pids of the store's server processes, by process
# name (never by command line, which for idem serve holds the store URL).
dbpids() {
	case $1 in
	postgres) pgrep -x postgres || true ;;
	mysql) pgrep -x 'mariadbd|mysqld' || true ;;
	# The one redis-server that IDEM_TEST_REDIS_URL names (by its INFO
	# process_id), not the Cluster's idle nodes; every one if it does not tell.
	redis) redis-cli -u "$IDEM_TEST_REDIS_URL" info server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p' | grep . ||
		pgrep -x redis-server || true ;;
	esac
}

# cpustat prints the machine's idle and total CPU ticks so far.
cpustat() { awk '/^cpu / { print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat; }

# measure WRK PROXY UPSTREAM STORE samples CPU ticks over the middle of a
# wrk run (from 1 s in to 1 s before its end) into cpu_ticks, cpu_secs and
# cpu_idle. The server's processes are every process of its name on this
# machine, looked up at both ends of the window: one that started inside it
# counts whole, one that ended inside it is missed.
measure() {
	local p t db=0 i1 i2
	local -A before=()
	cpu_secs=$((dur_secs - 2))
	sleep 1
	for p in $(dbpids "$4"); do before[$p]=$(ticks "$p"); done
	local a="$(ticks "$1") $(ticks "$3") $(ticks "$2")"
	i1=$(cpustat)
	sleep "$cpu_secs"
	local b="$(ticks "$1") $(ticks "$3") $(ticks "$2")"
	i2=$(cpustat)
	for p in $(dbpids "$4"); do
		t=$(ticks "$p")
		[ "$t" -lt "${before[$p]:-0}" ] || db=$((db + t - ${before[$p]:-0}))
	done
	cpu_ticks="$(awk -v a="$a" -v b="$b" 'BEGIN { split(a, x, " "); split(b, y, " "); for (i = 1; i <= 3; i++) printf "%d ", (y[i] > x[i] ? y[i] - x[i] : 0) }')$db"
	cpu_idle=$(awk -v a="$i1" -v b="$i2" 'BEGIN { split(a, x, " "); split(b, y, " "); printf "%.0f", (y[2] > x[2] ? 100 * (y[1] - x[1]) / (y[2] - x[2]) : 0) }')
}

field() { sed -E "s/.* $1=([0-9.]+).*/\1/" <<<"$2"; }

median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

echo "# $(date -u +%FT%TZ) wrk -t$THREADS -c$CONNS -d$DUR, stores: $STORES, batch=$BATCH; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"

if [ "$LATENCY" = 1 ]; then
	for c in 1 "$CONNS"; do
		load "$plainport" "$c" plain
		for s in $STORES; do
			case $s in sqlite | postgres | mysql) ;; *) continue ;; esac
			for b in on off; do
				serve "$s" "$b"
				[ -z "$sport" ] || load "$sport" "$c" "$s-batch=$b" "$s"
			done
		done
	done
	exit 0
fi

declare -A ratios=() ceilings=()
target() {
	case $1 in sqlite) echo 0.5 ;; postgres) echo 0.4 ;; mysql) echo 0.35 ;; redis) echo 0.85 ;; *) echo "" ;; esac
}
for round in $(seq "$ROUNDS"); do
	for s in $STORES; do
		serve "$s" "$BATCH"
		[ -n "$sport" ] || continue
		load "$plainport" "$CONNS" "round $round plain"
		base=$(field rps "$last")
		if [ "$CPU" = 1 ]; then
			plain_cpu=$((cpu_wrk + cpu_up + cpu_proxy))
			plain_proxy=$cpu_proxy
		fi
		load "$sport" "$CONNS" "round $round $s" "$s"
		if [ "$(field non2xx "$last")" != 0 ] || [ "$(field errors "$last")" != 0 ]; then
			echo "round $round $s: WARNING: failed requests; see $tmp/$s-$BATCH.log" >&2
		fi
		r=$(awk -v a="$(field rps "$last")" -v b="$base" 'BEGIN { printf "%.2f", a / b }')
		ratios[$s]="${ratios[$s]:-} $r"
		echo "round $round $s/plain = $r"
		if [ "$CPU" = 1 ]; then
			[ "$s" = memory ] && mem_proxy=$cpu_proxy
			if [ -n "${mem_proxy:-}" ] && [ -n "$(dbpids "$s")" ]; then
				c=$(awk -v p="$plain_cpu" -v pp="$plain_proxy" -v m="$mem_proxy" -v d="$cpu_db" 'BEGIN { printf "%.2f", p / (p - pp + m + d) }')
				ceilings[$s]="${ceilings[$s]:-} $c"
				echo "round $round $s: ceiling $c (plain's wrk and upstream, the memory store's proxy, this store's server, no idle)"
			fi
		fi
	done
done
echo "# idem serve / plain ReverseProxy, median of $ROUNDS round(s), batch=$BATCH:"
for s in $STORES; do
	[ -n "${ratios[$s]:-}" ] || continue
	# shellcheck disable=SC2086
	m=$(median ${ratios[$s]})
	t=$(target "$s")
	printf '%-9s %s (rounds:%s)%s' "$s" "$m" "${ratios[$s]}" "${t:+, target >= $t}"
	if [ -n "${ceilings[$s]:-}" ]; then
		# shellcheck disable=SC2086
		printf '; ceiling %s (rounds:%s)' "$(median ${ceilings[$s]})" "${ceilings[$s]}"
	fi
	echo
done
