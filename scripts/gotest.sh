#!/usr/bin/env bash
# gotest.sh: go test, with the lines that say what failed repeated at the end.
#
# A suite that times out prints every goroutine's stack after the one line
# naming the test that hung, and a CI log keeps only its tail: this repeats
# the failures, the panic and the tests still running once go test is done.
# Usage: scripts/gotest.sh GO [go test flags and packages], GO the go command.
# (An argument, not the environment: the tests would inherit it, and a make
# they run would take it for the Makefile's GO.)
set -uo pipefail
go=$1
shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$go" test "$@" 2>&1 | tee "$log"
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
