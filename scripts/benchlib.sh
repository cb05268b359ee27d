# shellcheck shell=bash
# Helpers sourced by the store benchmark scripts (scripts/bench-sqlite.sh,
# idempg/bench/run.sh, idemmysql/bench/run.sh).

# answers NAME PORT LOG waits (10 s at most) until the server NAME answers
# HTTP on PORT; if it does not, it prints LOG, its stderr, and exits.
answers() {
	for _ in $(seq 200); do
		curl -s -o /dev/null "http://127.0.0.1:$2/" && return 0
		sleep 0.05
	done
	echo "$1 did not start:" >&2
	cat "$3" >&2
	exit 1
}

# metric OUTPUT NAME METRIC prints the value of METRIC (pairs/s, p50-µs, …)
# on the line of benchmark NAME (what follows "Benchmark", without the
# -GOMAXPROCS suffix) in go test's OUTPUT.
metric() {
	awk -v n="Benchmark$2-" -v m="$3" 'index($1, n) == 1 { for (i = 2; i < NF; i++) if ($(i+1) == m) print $i }' <<<"$1"
}

# latencies OUTPUT NAME prints the p50 and p99 per pair of benchmarks
# NAME/batch=on|off/c=1|32 in OUTPUT.
latencies() {
	local c b
	for c in 1 32; do
		for b in on off; do
			echo "latency c=$c batch=$b: p50 $(metric "$1" "$2/batch=$b/c=$c" p50-µs)µs p99 $(metric "$1" "$2/batch=$b/c=$c" p99-µs)µs"
		done
	done
}

# ensure_wrk NAME installs wrk (the Debian package) when it is missing,
# saying so on stderr as NAME.
ensure_wrk() {
	command -v wrk >/dev/null && return
	echo "$1: installing wrk" >&2
	if [ "$(id -u)" = 0 ]; then
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null 2>&1 ||
			{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }
	else
		sudo apt-get install -y -qq wrk >/dev/null
	fi
}

# run_rss_tool TOOL [ARGS...] builds idem serve (or takes IDEM_BIN, an
# older build, for a before/after comparison) and internal/tools/TOOL, and
# runs TOOL ROUNDS times (default 3, a fresh process each) with -idem,
# -conns CONNS and -size SIZE, each of its runs printing its figures; ARGS
# go to idem serve. The memory scripts (scripts/body-rss.sh,
# scripts/replay-rss.sh) set CONNS and SIZE defaults and call it.
run_rss_tool() {
	local tool=$1 bin
	shift
	rss_tmp=$(mktemp -d)
	trap 'rm -rf "$rss_tmp"' EXIT
	bin=${IDEM_BIN:-}
	if [ -z "$bin" ]; then
		bin=$rss_tmp/idem
		go build -o "$bin" ./cmd/idem
	fi
	go build -o "$rss_tmp/$tool" "./internal/tools/$tool"
	for _ in $(seq "${ROUNDS:-3}"); do
		"$rss_tmp/$tool" -idem "$bin" -conns "$CONNS" -size "$SIZE" "${RSS_TOOL_FLAGS[@]}" -- "$@"
	done
}

# pgcpu_start starts counting the CPU time of the local PostgreSQL server,
# and pgcpu_stop prints how many ticks it used since. Two counts, both
# lower bounds, and the larger is printed:
#   - the postmaster's own ticks, its ended children's (cutime, cstime)
#     and each live child's: exact, except that on this machine it has
#     now and then lost whole backends' time (a run's count fell by
#     seconds while nothing restarted);
#   - a sample, every tenth of a second, of the postmaster's and each
#     child's ticks: for a process alive at the start its last sample
#     less its first, for one started since its last sample; a backend
#     that ends loses at most its last tenth of a second.
pgcpu_start() {
	pgcpu_pm=$(pgrep -o -x postgres) || pgcpu_pm=
	pgcpu_file=$(mktemp)
	[ -n "$pgcpu_pm" ] || return 0
	pgcpu_total0=$(pgcpu_total)
	pgcpu_sample >"$pgcpu_file"
	(while :; do pgcpu_sample; sleep 0.1; done) >>"$pgcpu_file" &
	pgcpu_loop=$!
}
# pgcpu_total prints the postmaster's ticks, its ended children's and its
# live children's.
pgcpu_total() {
	local p f s
	read -r -a f 2>/dev/null <"/proc/$pgcpu_pm/stat" || { echo 0; return; }
	s=$((f[13] + f[14] + f[15] + f[16]))
	for p in $(pgrep -P "$pgcpu_pm"); do
		read -r -a f 2>/dev/null <"/proc/$p/stat" && s=$((s + f[13] + f[14]))
	done
	echo "$s"
}
# pgcpu_sample prints a block of "pid ticks" lines, then a blank line. It
# reads /proc with bash's read, so that a process that ends meanwhile only
# drops its own line.
pgcpu_sample() {
	local p f
	for p in $pgcpu_pm $(pgrep -P "$pgcpu_pm"); do
		read -r -a f 2>/dev/null <"/proc/$p/stat" || continue
		echo "$p $((f[13] + f[14]))"
	done
	echo
}
pgcpu_stop() {
	[ -n "$pgcpu_pm" ] || { rm -f "$pgcpu_file"; echo 0; return; }
	kill "$pgcpu_loop" 2>/dev/null || true
	local total=$(($(pgcpu_total) - pgcpu_total0))
	pgcpu_sample >>"$pgcpu_file"
	awk -v total="$total" 'BEGIN { block = 0 } NF == 0 { block++; next }
		{ if (block == 0) base[$1] = $2; last[$1] = $2 }
		END { for (p in last) s += last[p] - base[p]; print (s > total ? s : total) }' "$pgcpu_file"
	rm -f "$pgcpu_file"
}

# proxy_rig RUN NAME PORT sets up what the proxy load scripts
# (bench-proxy.sh, bench-proxy-latency.sh) share: it builds idem, the bare
# upstream and the stock proxy, starts the upstream on PORT and the stock
# proxy on PORT+1 (up, plainport), and defines store_url NAME BATCH,
# prepare, start NAME CMD... and serve NAME BATCH (which starts idem serve
# on a store once and sets sport). RUN prefixes the Redis keys, NAME the
# PostgreSQL schema and the MySQL database; all are removed at exit.
proxy_rig() {
	go build -o .tmp/idem ./cmd/idem
	go build -o .tmp/benchserver ./internal/tools/benchserver
	go build -o .tmp/plainproxy ./internal/tools/plainproxy
	tmp=$(mktemp -d)
	run=$1$$-$(date +%s)
	pids=()
	pgschema=idem_$2_$$
	mydb=idem_$2_$$
	cleanup() {
		for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
		wait 2>/dev/null || true
		if [ -n "${IDEM_TEST_POSTGRES_URL:-}" ]; then
			psql -X -q "$IDEM_TEST_POSTGRES_URL" -c "DROP SCHEMA IF EXISTS ${pgschema}_on, ${pgschema}_off CASCADE" >/dev/null 2>&1 || true
		fi
		if [ -n "${IDEM_TEST_MYSQL_DSN:-}" ]; then
			mysql -uroot -h127.0.0.1 -e "DROP DATABASE IF EXISTS ${mydb}_on; DROP DATABASE IF EXISTS ${mydb}_off" >/dev/null 2>&1 || true
		fi
		if [ -n "${IDEM_TEST_REDIS_URL:-}" ]; then
			redis-cli -u "$IDEM_TEST_REDIS_URL" --scan --pattern "$run*" 2>/dev/null |
				xargs -r -n 500 redis-cli -u "$IDEM_TEST_REDIS_URL" unlink >/dev/null 2>&1 || true
		fi
		rm -rf "$tmp"
	}
	trap cleanup EXIT

	# store_url NAME BATCH prints the --store URL of a store, or nothing when
	# its server is not configured.
	store_url() {
		local sep q=""
		[ "$2" = off ] && q="batch=off"
		case $1 in
		memory) echo "memory://" ;;
		sqlite) echo "sqlite://$tmp/idem-$2.db${q:+?$q}" ;;
		postgres)
			[ -n "${IDEM_TEST_POSTGRES_URL:-}" ] || return 0
			case $IDEM_TEST_POSTGRES_URL in *\?*) sep='&' ;; *) sep='?' ;; esac
			echo "${IDEM_TEST_POSTGRES_URL}${sep}schema=${pgschema}_$2${q:+&$q}"
			;;
		mysql)
			[ -n "${IDEM_TEST_MYSQL_DSN:-}" ] || return 0
			# The DSN's database is replaced with this run's own.
			local dsn
			dsn=$(sed -E "s#\)/[^?]*#)/${mydb}_$2#" <<<"$IDEM_TEST_MYSQL_DSN")
			case $dsn in *\?*) sep='&' ;; *) sep='?' ;; esac
			echo "mysql://${dsn}${sep}interpolateParams=true${q:+&$q}"
			;;
		redis)
			[ -n "${IDEM_TEST_REDIS_URL:-}" ] || return 0
			case $IDEM_TEST_REDIS_URL in *\?*) sep='&' ;; *) sep='?' ;; esac
			echo "${IDEM_TEST_REDIS_URL}${sep}prefix=${run}"
			;;
		esac
	}

	# prepare NAME BATCH creates what the store needs before idem serve
	# migrates it.
	prepare() {
		case $1 in
		mysql) mysql -uroot -h127.0.0.1 -e "CREATE DATABASE IF NOT EXISTS ${mydb}_$2" ;;
		postgres) psql -X -q "$IDEM_TEST_POSTGRES_URL" -c "DROP SCHEMA IF EXISTS ${pgschema}_$2 CASCADE" >/dev/null ;;
		esac
	}

	port=$3
	declare -gA portpid=()
	# start NAME CMD... starts a server on $port and waits until it answers.
	start() {
		local name=$1
		shift
		"$@" 2>"$tmp/$name.log" &
		pids+=($!)
		portpid[$port]=$!
		answers "$name" "$port" "$tmp/$name.log"
	}

	up=127.0.0.1:$port
	start upstream .tmp/benchserver -addr $up -mode bare

	port=$((port + 1))
	plainport=$port
	start plain .tmp/plainproxy -listen 127.0.0.1:$plainport -upstream http://$up

	# serve NAME BATCH starts idem serve on the store, once, and sets sport to
	# its port, or to nothing when the store is skipped.
	declare -gA served=()
	serve() {
		local url
		sport=
		url=$(store_url "$1" "$2")
		if [ -z "$url" ]; then
			echo "$(basename "$0" .sh): skipping $1: its server variable is not set (eval \"\$(scripts/services.sh)\")" >&2
			return 0
		fi
		if [ -z "${served[$1-$2]:-}" ]; then
			prepare "$1" "$2"
			port=$((port + 1))
			start "$1-$2" .tmp/idem serve --upstream "http://$up" --listen "127.0.0.1:$port" --store "$url" --log-level error
			served[$1-$2]=$port
		fi
		sport=${served[$1-$2]}
	}
}
