#!/usr/bin/env bash
# Benchmarks the ibv provider against perftest on soft-RoCE, in one VM boot so the
# figures compare: ib_write_bw, ib_send_lat (polling and -e, sleeping on CQ
# events) and ib_write_lat, server and client on rxe0 in the guest, then the
# provider's benchmarks of the same shapes (smcr/verbs/ibv/bench_test.go) with the
# same iteration count, in interleaved rounds so a change in the host's load hits
# both alike; each round ends with two smcr engines' 64 B round trip over rxe0
# beside TCP's. benchsum.sh prints the medians side by side at the end.
#
# Go's scheduler matters here: rxe does the whole protocol inside the post_send
# syscall, so a spinning Go process spends long in syscalls, and sysmon hands its
# P to a freshly woken thread that competes with the kernel for the 2 vCPUs. The
# provider benchmarks therefore also run with GOMAXPROCS=1, the responder of the
# ping-pongs in its own process, which is perftest's shape.
#
#	test/vm/bench.sh [iterations [rounds]]    (from anywhere; default 2000 3)
#
# The guest runs under TCG unless SMCR_VM_ACCEL=kvm (run.sh), which the output
# names before the figures: figures under TCG and KVM do not compare.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
iters=${1:-2000}
rounds=${2:-3}
for n in "$iters" "$rounds"; do
	[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "bench.sh: iterations and rounds are positive integers, not \"$n\" (usage: $0 [iterations [rounds]])" >&2; exit 2; }
done
mkdir -p "$here/cache"
bin=$(mktemp -d "$here/cache/bench.XXXXXX")
trap 'rm -rf "$bin"' EXIT
go test -c -tags ibv -o "$bin/ibv.test" ./smcr/verbs/ibv
go test -c -tags ibv -o "$bin/engine.test" ./test/vm/engine
cat >"$bin/guest.sh" <<GUEST
set -u
# perftest: the server listens on TCP for the out-of-band exchange; -x 1 is the
# RoCE v2 GID of 10.99.0.1 on rxe0. Under TCG the server may take seconds to
# listen, so the client retries its connection.
perf() {
	echo "-- \$*"
	"\$@" -d rxe0 -x 1 -F >/tmp/server.log 2>&1 &
	for try in 1 2 3 4 5 6 7 8 9 10; do
		sleep 1
		"\$@" -d rxe0 -x 1 -F 127.0.0.1 >/tmp/client.log 2>&1 && break
		grep -q "Couldn't connect" /tmp/client.log || break
	done
	sed -n '/#bytes/,/^---/p' /tmp/client.log | grep -v '^---' || cat /tmp/client.log /tmp/server.log
	wait
}
gobench() {
	env "\$1" SMCR_IBV_INTERFACE=dummy0 SMCR_IBV_REQUIRE=1 $bin/ibv.test -test.run '^\$' \
		-test.bench "\$2" -test.benchtime ${iters}x | grep -Ev '^(goos|goarch|pkg|cpu|PASS)'
}
for r in \$(seq $rounds); do
	echo "== round \$r: perftest"
	# 128 outstanding, every 100th signaled: ib_write_bw's defaults, and
	# BenchmarkWrite's shape.
	perf ib_write_bw -s 65536 -t 128 -Q 100 -n $iters
	perf ib_send_lat -s 8 -n $iters
	perf ib_send_lat -e -s 8 -n $iters
	perf ib_write_lat -s 4 -n $iters
	# Inline sends: perftest leaves -I at 0 on rxe ("Max inline data: 0").
	perf ib_send_lat -I 64 -s 8 -n $iters
	perf ib_write_lat -I 64 -s 4 -n $iters
	echo "== round \$r: ibv provider"
	# One process with both ends on 2 Ps, then perftest's shape: one thread
	# posting (BenchmarkWrite) and two single-threaded processes (proc-).
	gobench GOMAXPROCS=2 '^Benchmark(Write|SendPingPong|WritePingPong)\$/^(spin|wait)'
	gobench GOMAXPROCS=1 '^BenchmarkWrite\$'
	gobench GOMAXPROCS=1 '^Benchmark(SendPingPong|WritePingPong)\$/^proc-'
	# What one library call costs beyond perftest's: a poll of an empty CQ.
	SMCR_IBV_INTERFACE=dummy0 SMCR_IBV_REQUIRE=1 $bin/ibv.test -test.run '^\$' \
		-test.bench '^BenchmarkPollEmpty\$' -test.benchtime 200000x | grep '^Benchmark'
	echo "== round \$r: engine"
	# 64 B request/response between two smcr engines over rxe0, beside TCP
	# between the same addresses (test/vm/engine/bench_test.go).
	SMCR_IBV_INTERFACE=dummy0 SMCR_IBV_REQUIRE=1 $bin/engine.test -test.run '^\$' \
		-test.bench '^BenchmarkRoundTrip\$' -test.benchtime ${iters}x | grep '^Benchmark'
done
GUEST
echo "bench.sh: the guest runs under ${SMCR_VM_ACCEL:-tcg}"
set +e
"$here/run.sh" -t 590 -- bash "$bin/guest.sh" | tee "$bin/out"
rc=${PIPESTATUS[0]}
set -e
echo
"$here/benchsum.sh" "$bin/out"
exit "$rc"
