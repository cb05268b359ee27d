#!/usr/bin/env bash
# fuzz.sh PKG FUNC FUZZTIME fuzzes one target, as make fuzz does for each.
#
# Go 1.26's fuzz coordinator can fail a run with a bare "context deadline
# exceeded" when -fuzztime ends while a worker is mid-call (go.dev/issue/75804,
# fixed in Go 1.27): nothing was found and no input was written. Such a run
# is tried once more; any other failure, or a run that wrote a failing input
# (testdata/fuzz/FUNC/...), fails at once.
set -uo pipefail
pkg=$1 fn=$2 fuzztime=$3
for try in 1 2; do
	out=$("${GO:-go}" test -run '^$' -fuzz "^$fn\$" -fuzztime "$fuzztime" "$pkg" 2>&1)
	status=$?
	printf '%s\n' "$out"
	[ "$status" = 0 ] && exit 0
	if [ "$try" = 1 ] && grep -q 'context deadline exceeded' <<<"$out" &&
		! grep -qE 'Failing input written|panic:' <<<"$out"; then
		echo "fuzz: $fn stopped on the fuzz engine's deadline race (go.dev/issue/75804) with nothing found; once more" >&2
		continue
	fi
	exit "$status"
done
