#!/usr/bin/env bash
# test.sh: make test's phases one after the other, stopping at the first that
# fails as make would, then what each took and every test that skipped, with
# its reason (go test shows those only with -v: scripts/gotest.sh collects
# them in $SMCR_TEST_SKIPS).
# Usage: scripts/test.sh MAKE FUZZTIME
set -uo pipefail
make=$1
fuzztime=$2
times=$(mktemp)
skips=$(mktemp)
trap 'rm -f "$times" "$skips"' EXIT
export SMCR_TEST_SKIPS=$skips
rc=0
for phase in lint check-generate test-unit test-race test-lockrank fuzz; do
	start=$(date +%s)
	if [ "$phase" = fuzz ]; then
		$make --no-print-directory fuzz FUZZTIME="$fuzztime"
	else
		$make --no-print-directory "$phase"
	fi
	rc=$?
	status=""
	[ "$rc" -eq 0 ] || status="  FAILED (exit $rc)"
	printf '  %-15s %5ds%s\n' "$phase" $(($(date +%s) - start)) "$status" >>"$times"
	[ "$rc" -eq 0 ] || break
done
echo
echo "make test: the phases"
cat "$times"
if [ -s "$skips" ]; then
	echo
	echo "make test: $(wc -l <"$skips") tests skipped"
	cat "$skips"
fi
exit "$rc"
