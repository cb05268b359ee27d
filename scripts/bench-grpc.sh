#!/usr/bin/env bash
# Unary gRPC calls per second to the test Payments service, bare and behind
# idemgrpc's interceptor on the memory store and on PostgreSQL, under ghz
# (installed from the Go module proxy into .tmp/bin on first use). Every call
# carries a fresh request_id, so each one reserves and completes a key.
#
# The servers run interleaved, ROUNDS times, each fresh in each round. For
# every run it prints calls/s, the server's CPU time per call (user + system,
# from /proc/<pid>/stat: what the server spends, which other processes' load
# on the machine changes far less than calls/s), ghz's own CPU time per call
# (it shares the machine's cores with the server), the server's minor page
# faults per call, and what the server counted at exit: handler runs,
# records (equal to the calls answered OK: no key was used twice; with a
# warm-up, the runs include its calls, and the memory store holds at most
# its MaxRecords), for PostgreSQL how many calls each group-commit
# transaction carried, and the garbage collector's cycles, share of the
# server's CPU and live heap (from runtime/metrics). Then the medians, and their ratios to the bare
# server's.
#
# Each server first serves WARMUP (10s) of the same load, not counted, so
# that what is measured is a server that has run for a while: the memory
# store full (its default MaxRecords, 100 000 records, is reached in about
# 8s) and the Go heap at its steady size. WARMUP=0 measures from a fresh
# process instead, while the store and the heap grow; on a virtual machine
# where a page fault is dear, the faults of that growth (faults/call) cost
# the memory store more than the interceptor's own work does.
#
# Besides the medians it prints the median of per-round ratios: each
# store's calls/s over the bare server's in the same round, which ran just
# before it, so that the machine's drift between rounds cancels out.
#
#   scripts/bench-grpc.sh                      # 10s per run after 10s of warm-up, 3 rounds, 32 concurrent calls
#   DUR=30s ROUNDS=5 CONC=64 scripts/bench-grpc.sh
#   WARMUP=0 scripts/bench-grpc.sh             # measured from each server's start
#   PROFILE=.tmp/prof scripts/bench-grpc.sh    # also CPU profiles, one per run
#   BASE=31112a9 scripts/bench-grpc.sh         # also "base", the memory store at that commit
#
# With BASE, a server built from that commit (git archive into .tmp) runs
# the memory store in every round too, between the bare server and this
# tree's: an A/B of the two under the same load, run after run.
#
# PostgreSQL is skipped when IDEM_TEST_POSTGRES_URL is unset (scripts/services.sh
# prints it). Everything runs on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-10s}
CONC=${CONC:-32}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-10s}
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
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
faults() { awk '{ print $10 }' "/proc/$1/stat"; } # minor page faults

# ghz's load: every call a Charge with a new request_id
ghz=(.tmp/bin/ghz --insecure --proto internal/rpctest/testpb/payments.proto --import-paths /usr/include,internal/rpctest/testpb
	--call idem.test.v1.Payments.Charge -d '{"account":"acc","amount":5,"request_id":"{{newUUID}}"}'
	-c "$CONC" --connections 4 -O json "$ADDR")

# run STORE ROUND: prints "calls/s cpu-us/call ok calls ghz-cpu-us/call | what the server counted"
run() {
	local prof=() log gt
	[ -n "$PROFILE" ] && prof=(-cpuprofile "$PROFILE/$1-$2.cpu")
	log=$(mktemp)
	gt=$(mktemp)
	local bin=.tmp/bin/grpc-benchserver store=$1
	[ "$1" = base ] && bin=.tmp/bin/grpc-benchserver-base store=mem
	"$bin" -addr "$ADDR" -store "$store" "${prof[@]}" >/dev/null 2>"$log" &
	local pid=$!
	for _ in $(seq 100); do (exec 3<>"/dev/tcp/${ADDR%:*}/${ADDR#*:}") 2>/dev/null && break; sleep 0.1; done
	if ! kill -0 $pid 2>/dev/null; then # another process holds ADDR: its figures would not be this server's
		echo "bench-grpc: the $1 server did not start: $(cat "$log")" >&2
		exit 1
	fi
	local t0 t1 f0 f1 out
	[ "$WARMUP" != 0 ] && "${ghz[@]}" -z "$WARMUP" >/dev/null 2>&1
	t0=$(ticks $pid)
	f0=$(faults $pid)
	local timed=()
	[ -x /usr/bin/time ] && timed=(/usr/bin/time -o "$gt" -f "%U %S") # Debian's time package
	out=$("${timed[@]}" "${ghz[@]}" -z "$DUR" 2>/dev/null)
	t1=$(ticks $pid)
	f1=$(faults $pid)
	kill -TERM $pid 2>/dev/null || true
	wait $pid 2>/dev/null || true
	python3 -c 'import json,sys
r=json.load(sys.stdin); ok=r["statusCodeDistribution"].get("OK",0); n=max(r["count"],1)
g=open(sys.argv[3]).read().split()
g="%.1f" % (sum(map(float,g))*1e6/n) if g else "-"
print("%.0f %.1f %d %d %s %.3f" % (r["rps"], (int(sys.argv[1])*1e6/int(sys.argv[2]))/n, ok, r["count"], g, int(sys.argv[4])/n), end="")' \
		$((t1 - t0)) "$(getconf CLK_TCK)" "$gt" $((f1 - f0)) <<<"$out"
	echo " | $(tr -d '\n' <"$log")"
	rm -f "$log" "$gt"
}

echo "# $(date -u +%FT%TZ) ghz -c $CONC -z $DUR --connections 4 after $WARMUP of warm-up, $ROUNDS rounds; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A rps cpu pair
for r in $(seq "$ROUNDS"); do
	for s in $stores; do
		line=$(run "$s" "$r")
		read -r c u ok n g f _ <<<"$line"
		rps[$s]+="$c "
		cpu[$s]+="$u "
		# this store's calls/s over the bare server's in the same round:
		# the two ran back to back, so the machine's drift between rounds
		# cancels out of the ratio
		[ "$s" = none ] && bare=$c
		pair[$s]+="$(awk -v a="$c" -v b="$bare" 'BEGIN { printf "%.3f", a / b }') "
		printf 'round %d %-4s %6s calls/s  %6s cpu-us/call  ghz %6s cpu-us/call  %s faults/call  %s of %s OK  (%s)\n' "$r" "$s" "$c" "$u" "$g" "$f" "$ok" "$n" "${line#*| }"
	done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
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
echo "per-round ratios to the bare server's calls/s in the same round (median, and the range):"
for s in $stores; do
	[ "$s" = none ] && continue
	sorted=$(tr ' ' '\n' <<<"${pair[$s]}" | grep . | sort -g)
	printf '  %-4s %.2f  (%s .. %s)\n' "$s" "$(median <<<"${pair[$s]}")" "$(head -1 <<<"$sorted")" "$(tail -1 <<<"$sorted")"
done
