#!/usr/bin/env bash
# Benchmarks the ibv provider against perftest on soft-RoCE, in one VM boot so the
# figures compare: ib_write_bw, ib_send_lat and ib_write_lat (server and client on
# rxe0 in the guest), then the provider's benchmarks of the same shape.
#
#	test/vm/bench.sh [benchtime]      (from the repository root; default 3s)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
benchtime=${1:-3s}
bin=$(mktemp -d "$root/test/vm/cache/bench.XXXXXX")
trap 'rm -rf "$bin"' EXIT
go test -c -tags ibv -o "$bin/ibv.test" ./smcr/verbs/ibv
cat >"$bin/guest.sh" <<GUEST
set -u
# perftest: the server listens on TCP for the out-of-band exchange; -x 1 is the
# RoCE v2 GID of 10.99.0.1 on rxe0.
perf() {
	"\$@" -d rxe0 -x 1 >/tmp/server.log 2>&1 &
	sleep 1
	"\$@" -d rxe0 -x 1 127.0.0.1 2>&1 | sed -n '/#bytes/,/^---/p'
	wait
}
echo "== perftest"
perf ib_write_bw -s 65536 -n 2000
perf ib_send_lat -F -s 8 -n 2000
perf ib_write_lat -F -s 4 -n 2000
echo "== ibv provider"
SMCR_IBV_INTERFACE=dummy0 SMCR_IBV_REQUIRE=1 $bin/ibv.test -test.run '^\$' -test.bench . -test.benchtime $benchtime -test.count 3
GUEST
exec "$root/test/vm/run.sh" -t 560 -- bash "$bin/guest.sh"
