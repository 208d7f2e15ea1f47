#!/usr/bin/env bash
# Benchmarks the ibv provider against perftest on soft-RoCE, in one VM boot so the
# figures compare: ib_write_bw, ib_send_lat and ib_write_lat (server and client on
# rxe0 in the guest), then the provider's benchmarks of the same shapes
# (smcr/verbs/ibv/bench_test.go) with the same iteration count, in interleaved
# rounds so a change in the host's load hits both alike.
#
#	test/vm/bench.sh [iterations [rounds]]    (from anywhere; default 2000 3)
#
# Compare medians: perftest's t_typical with the provider's us-median, and
# BW average with MiB/s (perftest's MB is 2^20 bytes).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
iters=${1:-2000}
rounds=${2:-3}
mkdir -p "$root/test/vm/cache"
bin=$(mktemp -d "$root/test/vm/cache/bench.XXXXXX")
trap 'rm -rf "$bin"' EXIT
go test -c -tags ibv -o "$bin/ibv.test" ./smcr/verbs/ibv
cat >"$bin/guest.sh" <<GUEST
set -u
# perftest: the server listens on TCP for the out-of-band exchange; -x 1 is the
# RoCE v2 GID of 10.99.0.1 on rxe0. Under TCG the server may take seconds to
# listen, so the client retries its connection.
perf() {
	"\$@" -d rxe0 -x 1 -F >/tmp/server.log 2>&1 &
	for try in 1 2 3 4 5 6 7 8 9 10; do
		sleep 1
		"\$@" -d rxe0 -x 1 -F 127.0.0.1 >/tmp/client.log 2>&1 && break
		grep -q "Couldn't connect" /tmp/client.log || break
	done
	sed -n '/#bytes/,/^---/p' /tmp/client.log | grep -v '^---' || cat /tmp/client.log /tmp/server.log
	wait
}
for r in \$(seq $rounds); do
	echo "== round \$r: perftest"
	perf ib_write_bw -s 65536 -n $iters
	perf ib_send_lat -s 8 -n $iters
	perf ib_write_lat -s 4 -n $iters
	echo "== round \$r: ibv provider"
	SMCR_IBV_INTERFACE=dummy0 SMCR_IBV_REQUIRE=1 $bin/ibv.test -test.run '^\$' \
		-test.bench '^Benchmark(Write|SendPingPong|WritePingPong)\$' -test.benchtime ${iters}x
done
GUEST
exec "$root/test/vm/run.sh" -t 570 -- bash "$bin/guest.sh"
