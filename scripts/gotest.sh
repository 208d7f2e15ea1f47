#!/usr/bin/env bash
# gotest.sh: go test, with the lines that say what failed repeated at the end,
# and the tests that skipped listed with their reasons.
#
# A suite that times out prints every goroutine's stack after the one line
# naming the test that hung, and a CI log keeps only its tail: this repeats
# the failures, the panic and the tests still running once go test is done.
# go test says why a test skipped only with -v: it runs with -json, and
# scripts/testsum prints what go test would without -v, and the skipped tests
# at the end, or appends them to $SMCR_TEST_SKIPS (make test lists them once,
# after every phase).
# Usage: scripts/gotest.sh GO [go test flags and packages], GO the go command.
# (An argument, not the environment: the tests would inherit it, and a make
# they run would take it for the Makefile's GO.)
set -uo pipefail
go=$1
shift
log=$(mktemp)
sum=$(mktemp -d)
trap 'rm -rf "$log" "$sum"' EXIT
# Built before the tests run: their packages' build errors must not mix with its.
"$go" build -o "$sum/testsum" "$(cd "$(dirname "$0")" && pwd)/testsum" || exit 1
"$go" test -json "$@" 2>&1 | "$sum/testsum" -skips "${SMCR_TEST_SKIPS:-}" | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
	echo
	echo "gotest.sh: go test $* failed (exit $rc); what failed:"
	grep -E -e '^(--- FAIL|FAIL|panic: )' -e '^[[:space:]]*running tests:' -e 'race detected' -e '^[[:space:]]+Test[^ ]* \([0-9.hms]+\)$' "$log" | head -n 60
	# A race report (the test's own, or a race-built smcrd's in the log the
	# e2e harness prints) sits far above the tail: the first one, again.
	if grep -q 'WARNING: DATA RACE' "$log"; then
		echo
		echo "gotest.sh: the first data race reported:"
		awk '/WARNING: DATA RACE/ { on = 1 } on { print } on && /^[[:space:]]*==================$/ { exit }' "$log" | head -n 80
	fi
fi
exit "$rc"
