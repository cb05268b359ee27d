#!/usr/bin/env bash
# Broker consumers with and without idem, for BENCHMARKS.md: messages per
# second through a Watermill router on RabbitMQ (idemwatermill's
# BenchmarkRouterRabbitMQ) and through a JetStream consumer (idemnats's
# BenchmarkJetStream), bare and with idem on the memory, SQLite, PostgreSQL
# and Redis stores, in one run, and each store's ratio to the bare consumer
# (target for PostgreSQL and Redis: >= 0.7), with the CPU time per
# message of the consumer, the broker and the store's server (from /proc;
# see internal/msgbench.Meter). Each handler decodes a JSON
# order and signs a receipt (internal/msgbench.Work); in the ledger
# variants it also writes a row to PostgreSQL, and with idem completes its
# lease in that transaction (CompleteTx).
#
#   scripts/bench-messages.sh                  # MESSAGES=3000 CONSUMERS=16 ROUNDS=1
#   CONSUMERS=64 ROUNDS=3 scripts/bench-messages.sh
#
# MESSAGES is how many messages each variant handles (queued before the
# clock starts); CONSUMERS how many are handled at once (handlers on the
# queue for Watermill, workers behind Consume for JetStream); ROUNDS how
# many times the whole run repeats. The servers come from
# scripts/services.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/benchlib.sh
eval "$(scripts/services.sh)"
messages=${MESSAGES:-3000}
export IDEM_BENCH_CONSUMERS=${CONSUMERS:-16}
rounds=${ROUNDS:-1}
stores="memory sqlite postgres redis"

# cpu OUTPUT NAME prints the CPU µs per message of benchmark NAME: this
# process (consumer and store client), the broker and the stores' servers
# (every postgres and redis-server process: run on an otherwise quiet
# machine), and their sum.
cpu() {
	local c k s
	c=$(metric "$1" "$2" consumer-µs/msg)
	k=$(metric "$1" "$2" broker-µs/msg)
	s=$(metric "$1" "$2" store-µs/msg)
	awk -v c="$c" -v k="$k" -v s="$s" 'BEGIN { printf "cpu µs/msg: consumer %.0f, broker %.0f, store server %.0f, total %.0f", c, k, s, c + k + s }'
}

# table OUTPUT BENCHMARK prints msgs/s per variant, the ratio to bare and
# the CPU per message. With every part of the run on the same cores, the
# ratio cannot pass the bare consumer's total CPU per message over the
# variant's (the "CPU bound" printed): a consumer that spends more CPU per
# message than the bare one, counting the store's server, handles fewer.
table() {
	local bare v bcpu
	bare=$(metric "$1" "$2/bare" msgs/s)
	bcpu=$(cpu "$1" "$2/bare")
	printf "  %-9s %8.0f msgs/s              %s\n" bare "$bare" "$bcpu"
	for v in $stores; do
		awk -v s="$v" -v r="$(metric "$1" "$2/$v" msgs/s)" -v b="$bare" -v c="$(cpu "$1" "$2/$v")" -v bt="${bcpu##* }" 'BEGIN {
			t = c; sub(/.* /, "", t)
			printf "  %-9s %8.0f msgs/s  ratio %.2f  %s; CPU bound %.2f\n", s, r, r / b, c, bt / t }'
	done
	bare=$(metric "$1" "$2/bare+ledger" msgs/s)
	bcpu=$(cpu "$1" "$2/bare+ledger")
	printf "  with a ledger row per message in PostgreSQL:\n  %-9s %8.0f msgs/s              %s\n" bare "$bare" "$bcpu"
	awk -v r="$(metric "$1" "$2/postgres+ledger" msgs/s)" -v b="$bare" -v c="$(cpu "$1" "$2/postgres+ledger")" -v bt="${bcpu##* }" 'BEGIN {
		t = c; sub(/.* /, "", t)
		printf "  %-9s %8.0f msgs/s  ratio %.2f  %s; CPU bound %.2f (CompleteTx in the handler'"'"'s transaction)\n", "postgres", r, r / b, c, bt / t }'
}

for round in $(seq "$rounds"); do
	echo "# round $round: $messages messages, $IDEM_BENCH_CONSUMERS at once; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "# (cd idemwatermill && go test -run '^\$' -bench BenchmarkRouterRabbitMQ -benchmem -benchtime ${messages}x .)"
	wm=$(cd idemwatermill && go test -run '^$' -bench BenchmarkRouterRabbitMQ -benchmem -benchtime "${messages}x" .)
	echo "$wm" | grep '^Benchmark'
	echo "Watermill router on RabbitMQ:"
	table "$wm" RouterRabbitMQ
	echo "# (cd idemnats && go test -run '^\$' -bench BenchmarkJetStream -benchmem -benchtime ${messages}x .)"
	js=$(cd idemnats && go test -run '^$' -bench BenchmarkJetStream -benchmem -benchtime "${messages}x" .)
	echo "$js" | grep '^Benchmark'
	echo "JetStream consumer:"
	table "$js" JetStream
done
