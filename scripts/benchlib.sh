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
