#!/usr/bin/env bash
# Unary gRPC calls per second to the test Payments service, bare and behind
# idemgrpc's interceptor on the memory store and on PostgreSQL, under ghz
# (installed from the Go module proxy into .tmp/bin on first use). Every call
# carries a fresh request_id, so each one reserves and completes a key.
#
# The servers run interleaved, ROUNDS times, each fresh in each round, in
# order in odd rounds and in reverse in even ones. For every run it prints
# calls/s (the calls answered OK, over ghz's time), the server's CPU time
# per call (user + system, from /proc/<pid>/stat: what the server spends,
# which other processes' load on the machine changes far less than
# calls/s), ghz's own CPU time per call (it shares the machine's cores with
# the server, and spends about twice the bare server's CPU: the calls/s
# ratio is diluted by it, the CPU ratio is not), the server's minor page
# faults per call, and what the server counted at exit: handler runs,
# records, for the memory store its evictions, for PostgreSQL how many calls
# each group-commit transaction carried, and the collections in the
# measured window and the live heap (runtime/metrics). Then the medians,
# their ratios to the bare server's, and the median, quartiles and range of
# per-round ratios (each store's calls/s over the bare server's in the same
# round, so that the machine's drift between rounds cancels out), with a
# bootstrap interval of that median.
#
# The script stops, failing, when a run is not what it claims to be: the
# server does not start (another process holds ADDR), more than 1% of the
# calls fail, or the server's handler runs fall outside [calls answered
# OK, calls sent] (every call carries a new key, so the handler runs at
# most once per call).
#
# WARMUP (default 0) has each server serve that long of the same load
# first, uncounted: the memory store then starts the measured window full
# (100 000 records, its default MaxRecords, evicting one a call).
#
# REPLAY (default 0), after the measured window, sends one call with a key
# of its own and then that same call again for that long, at the same
# concurrency: every retry is a replay of the first answer. It prints the
# replays' calls/s, and fails unless the first call was answered OK, at
# most 1% of the replays failed (those ghz cut off when it stops), and the
# handler ran once for that key (the bare server, which has no interceptor,
# runs it for every call).
#
#   scripts/bench-grpc.sh                      # 10s per run, 3 rounds, 32 concurrent calls
#   DUR=30s ROUNDS=5 CONC=64 scripts/bench-grpc.sh
#   WARMUP=10s scripts/bench-grpc.sh           # measured after 10s of the same load
#   REPLAY=3s scripts/bench-grpc.sh            # then 3s of one key sent again and again
#   PROFILE=.tmp/prof scripts/bench-grpc.sh    # also CPU profiles, one per run
#   BASE=31112a9 scripts/bench-grpc.sh         # also "base", the memory store at that commit
#
# With BASE, a server built from that commit (git archive into .tmp) runs
# the memory store in every round too, next to this tree's: an A/B of the
# two under the same load, run after run.
#
# PostgreSQL is skipped when IDEM_TEST_POSTGRES_URL is unset (scripts/services.sh
# prints it). Everything runs on loopback.
set -euo pipefail
shopt -s inherit_errexit # a failing run stops the script
cd "$(dirname "$0")/.."
DUR=${DUR:-10s}
CONC=${CONC:-32}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-0}
REPLAY=${REPLAY:-0}
ADDR=${ADDR:-127.0.0.1:50151}
PROFILE=${PROFILE:-}
mkdir -p .tmp/bin
if [ ! -x .tmp/bin/ghz ]; then
	GOBIN=$PWD/.tmp/bin GOFLAGS=-mod=mod GOWORK=off go install github.com/bojand/ghz/cmd/ghz@v0.93.0
fi
(cd idemgrpc && go build -o ../.tmp/bin/grpc-benchserver ./internal/benchserver)
[ -n "$PROFILE" ] && mkdir -p "$PROFILE"
stores="none mem"
BASE=${BASE:-}
if [ -n "$BASE" ]; then
	src=.tmp/base-src
	rm -rf "$src" && mkdir -p "$src"
	git archive "$BASE" | tar -x -C "$src"
	(cd "$src/idemgrpc" && go build -o ../../bin/grpc-benchserver-base ./internal/benchserver)
	stores="none base mem"
fi
[ -n "${IDEM_TEST_POSTGRES_URL:-}" ] && { export IDEM_TEST_POSTGRES_URL; stores="$stores pg"; }
# procstat PID: the fields of /proc/PID/stat after the command's name (which
# may hold spaces), so that $12 + $13 is utime + stime and $8 minflt
procstat() { sed 's/.*) //' "/proc/$1/stat"; }
ticks() { procstat "$1" | awk '{ print $12 + $13 }'; }
faults() { procstat "$1" | awk '{ print $8 }'; } # minor page faults
case "$WARMUP" in 0 | 0s | "") WARMUP=0 ;; esac
case "$REPLAY" in 0 | 0s | "") REPLAY=0 ;; esac

# ghz's load: every call a Charge with a new request_id; ghz1 sends one
# call, and replay is the REPLAY phase's one key
ghzcall=(.tmp/bin/ghz --insecure --proto internal/rpctest/testpb/payments.proto --import-paths /usr/include,internal/rpctest/testpb
	--call idem.test.v1.Payments.Charge -O json)
ghz=("${ghzcall[@]}" -d '{"account":"acc","amount":5,"request_id":"{{newUUID}}"}' -c "$CONC" --connections 4 "$ADDR")
replay='{"account":"acc","amount":5,"request_id":"0190a0e0-0000-7000-8000-00000000beef"}'
ghz1=("${ghzcall[@]}" -d "$replay" -n 1 -c 1 "$ADDR")
ghzreplay=("${ghzcall[@]}" -d "$replay" -c "$CONC" --connections 4 "$ADDR")

# run STORE ROUND: prints "calls/s cpu-us/call ok calls ghz-cpu-us/call
# faults/call replay-calls/s | what the server counted", or fails
run() {
	local prof=() log out0 gt warm res first again
	[ -n "$PROFILE" ] && prof=(-cpuprofile "$PROFILE/$1-$2.cpu")
	log=$(mktemp) out0=$(mktemp) gt=$(mktemp) warm=$(mktemp) res=$(mktemp) first=$(mktemp) again=$(mktemp)
	local bin=.tmp/bin/grpc-benchserver store=$1
	[ "$1" = base ] && bin=.tmp/bin/grpc-benchserver-base store=mem
	"$bin" -addr "$ADDR" -store "$store" "${prof[@]}" >"$out0" 2>"$log" &
	local pid=$!
	# its own word that it listens: a probe of ADDR would reach another
	# process that holds it, whose figures are not this server's
	for _ in $(seq 100); do grep -q '^listening' "$out0" && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
	if ! grep -q '^listening' "$out0"; then
		echo "bench-grpc: the $1 server did not start: $(cat "$log")" >&2
		kill $pid 2>/dev/null || true
		return 1
	fi
	echo '{"count":0,"statusCodeDistribution":{}}' >"$warm"
	[ "$WARMUP" != 0 ] && "${ghz[@]}" -z "$WARMUP" >"$warm" 2>/dev/null
	local t0 t1 f0 f1
	# the server's counters start here (a BASE server from before the mark
	# existed would die of the signal)
	[ "$1" = base ] || kill -USR1 $pid
	t0=$(ticks $pid)
	f0=$(faults $pid)
	local timed=()
	[ -x /usr/bin/time ] && timed=(/usr/bin/time -o "$gt" -f "%U %S") # Debian's time package
	"${timed[@]}" "${ghz[@]}" -z "$DUR" >"$res" 2>/dev/null
	t1=$(ticks $pid)
	f1=$(faults $pid)
	echo '{"count":0,"statusCodeDistribution":{}}' | tee "$first" >"$again"
	if [ "$REPLAY" != 0 ]; then
		"${ghz1[@]}" >"$first" 2>/dev/null
		"${ghzreplay[@]}" -z "$REPLAY" >"$again" 2>/dev/null
	fi
	kill -TERM $pid
	wait $pid || true
	# calls/s counts the calls answered OK. The server's handler runs must
	# lie between the calls answered OK and the calls sent, warm-up
	# included: every call carries a new key, so each ran at most once. The
	# replay phase's key ran once behind the interceptor, however often it
	# was sent; the bare server runs every call.
	python3 -c 'import json,re,sys
r=json.load(open(sys.argv[5])); w=json.load(open(sys.argv[6])); log=open(sys.argv[7]).read()
first=json.load(open(sys.argv[8])); again=json.load(open(sys.argv[9])); bare=sys.argv[10] == "none"
ok_=lambda x: x["statusCodeDistribution"].get("OK",0)
ok=ok_(r); n=r["count"]
if n == 0 or n - ok > n / 100:
    sys.exit("bench-grpc: %d of %d calls failed: %s" % (n - ok, n, r["statusCodeDistribution"]))
if first["count"] and (ok_(first) != 1 or again["count"] == 0 or again["count"] - ok_(again) > again["count"] / 100):
    sys.exit("bench-grpc: replay: the first call %s, then %d of %d answered OK: %s" % (
        first["statusCodeDistribution"], ok_(again), again["count"], again["statusCodeDistribution"]))
m=re.search(r"runs (\d+)", log)
if not m:
    sys.exit("bench-grpc: the server did not report its runs: " + log)
runs=int(m.group(1)); wok=ok_(w)
lo=ok + wok + ok_(first); hi=n + w["count"] + first["count"]
if bare:
    lo, hi = lo + ok_(again), hi + again["count"]
if not (lo <= runs <= hi):
    sys.exit("bench-grpc: %d handler runs for %d+%d+%d%s calls answered OK of %d+%d+%d%s sent" % (runs, wok, ok, ok_(first),
        "+%d" % ok_(again) if bare else "", w["count"], n, first["count"], "+%d" % again["count"] if bare else ""))
g=open(sys.argv[3]).read().split()
g="%.1f" % (sum(map(float,g))*1e6/n) if g else "-"
rr="%.0f" % (ok_(again) / (again["total"] / 1e9)) if again["count"] else "-"
print("%.0f %.1f %d %d %s %.3f %s" % (ok / (r["total"] / 1e9), (int(sys.argv[1])*1e6/int(sys.argv[2]))/n, ok, n, g, int(sys.argv[4])/n, rr), end="")' \
		$((t1 - t0)) "$(getconf CLK_TCK)" "$gt" $((f1 - f0)) "$res" "$warm" "$log" "$first" "$again" "$1"
	echo " | $(tr -d '\n' <"$log")"
	rm -f "$log" "$out0" "$gt" "$warm" "$res" "$first" "$again"
}

warmup="from each server's start"
[ "$WARMUP" != 0 ] && warmup="after $WARMUP of warm-up"
[ "$REPLAY" != 0 ] && warmup="$warmup, then $REPLAY of one key again and again"
echo "# $(date -u +%FT%TZ) ghz -c $CONC -z $DUR --connections 4 $warmup, $ROUNDS rounds; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A rps cpu pair rrps
for r in $(seq "$ROUNDS"); do
	# odd rounds run the servers in order, even rounds in reverse, so that
	# none always runs first
	order=$stores
	[ $((r % 2)) = 0 ] && order=$(tr ' ' '\n' <<<"$stores" | tac | tr '\n' ' ')
	declare -A got=()
	for s in $order; do
		line=$(run "$s" "$r")
		read -r c u ok n g f rr _ <<<"$line"
		got[$s]=$c
		rps[$s]+="$c "
		cpu[$s]+="$u "
		rrps[$s]+="$rr "
		replayed=
		[ "$REPLAY" != 0 ] && replayed="  replays $rr calls/s"
		printf 'round %d %-4s %6s calls/s  %6s cpu-us/call  ghz %6s cpu-us/call  %s faults/call  %s of %s OK%s  (%s)\n' "$r" "$s" "$c" "$u" "$g" "$f" "$ok" "$n" "$replayed" "${line#*| }"
	done
	# each store's calls/s over the bare server's in the same round: they
	# ran close together, so the machine's drift between rounds cancels out
	for s in $stores; do
		pair[$s]+="$(awk -v a="${got[$s]}" -v b="${got[none]}" 'BEGIN { printf "%.3f", a / b }') "
	done
done
# quantile P: the P-quantile of the numbers on stdin (interpolated)
quantile() {
	tr ' ' '\n' | grep . | sort -g | awk -v p="$1" '{ v[NR] = $1 }
		END { i = 1 + p * (NR - 1); print v[int(i)] + (i - int(i)) * (v[int(i) + 1] - v[int(i)]) }'
}
median() { quantile 0.5; }
bare_rps=$(median <<<"${rps[none]}")
bare_cpu=$(median <<<"${cpu[none]}")
echo "medians (ratio to bare: calls/s, and bare's CPU per call over this one's):"
for s in $stores; do
	m=$(median <<<"${rps[$s]}")
	u=$(median <<<"${cpu[$s]}")
	printf '  %-4s %6s calls/s (%s)  %6s cpu-us/call (%s)\n' "$s" "$m" \
		"$(awk -v a="$m" -v b="$bare_rps" 'BEGIN { printf "%.2f", a / b }')" "$u" \
		"$(awk -v a="$bare_cpu" -v b="$u" 'BEGIN { printf "%.2f", a / b }')"
done
if [ "$REPLAY" != 0 ]; then
	echo "replays of one key, medians (ratio to the bare server, which runs every call):"
	bare_rr=$(median <<<"${rrps[none]}")
	for s in $stores; do
		m=$(median <<<"${rrps[$s]}")
		printf '  %-4s %6s calls/s (%s)\n' "$s" "$m" "$(awk -v a="$m" -v b="$bare_rr" 'BEGIN { printf "%.2f", a / b }')"
	done
fi
# interval: a 90% bootstrap interval of the median of the numbers on stdin
# (10 000 resamples, a fixed seed so that the same rounds give the same
# interval): how far the median could move with other rounds like these
interval() {
	python3 -c 'import random,statistics,sys
x=[float(v) for v in sys.stdin.read().split()]
r=random.Random(1)
m=sorted(statistics.median(r.choices(x,k=len(x))) for _ in range(10000))
print("%.2f .. %.2f" % (m[500], m[9499]))'
}
echo "per-round ratios to the bare server's calls/s in the same round (median, quartiles, range; 90% interval of the median):"
q() { quantile "$1" <<<"${pair[$s]}"; } # of the store $s
for s in $stores; do
	[ "$s" = none ] && continue
	printf '  %-4s %.2f  (%.2f, %.2f; %.2f .. %.2f, %d rounds; %s)\n' "$s" "$(q 0.5)" "$(q 0.25)" "$(q 0.75)" "$(q 0)" "$(q 1)" "$ROUNDS" "$(interval <<<"${pair[$s]}")"
done
