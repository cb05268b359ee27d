# shellcheck shell=bash
# Helpers sourced by the store benchmark scripts (scripts/bench-sqlite.sh,
# idempg/bench/run.sh, idemmysql/bench/run.sh).

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
