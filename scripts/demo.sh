#!/usr/bin/env bash
# The main job (make demo): two network namespaces joined by a veth pair, an smcrd
# in each on its embedded default configuration (but for its own cgroup and
# control socket, providers shm,soft without the rdma this build lacks, its own
# pin directory and a shm directory both share), and an unmodified
# iperf3 between them: through SMC-R (RFC 7609, shared memory provider) in the
# direct mode (smcrctl run: the library in iperf3) and through smcrd's relay,
# then as plain TCP over the same veth, measured in the same run. Cleans up after
# itself. Run as root from the repository root, after make build.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${SMCR_DEMO_BIN:-$PWD/bin} # the tests' own builds
[ -x "$bin/smcrd" ] && [ -x "$bin/smcrctl" ] && [ -f "$bin/libsmcr-preload.so" ] || { echo "demo: run make build first" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "demo: run as root (namespaces, cgroups, BPF)" >&2; exit 1; }

id=$$
work=$(mktemp -d /tmp/smcr-demo.XXXXXX)
cgroot=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
[ -n "$cgroot" ] || { echo "demo: no cgroup2 mount in /proc/mounts" >&2; exit 1; }
port=5201       # in the default port_range_list (1024-65535): the direct mode
relayed=5202    # also listed: iperf3 without the library, through smcrd's relay
plain=80        # outside it: the plain TCP baseline over the same veth
pids=()

cleanup() {
	set +e
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	sleep 0.2
	for h in a b; do
		ip netns del "smcr-demo-$id-$h" 2>/dev/null
		rm -rf "/sys/fs/bpf/smcr-demo-$id-$h"
		rmdir "$cgroot/smcr-demo-$id/$h" 2>/dev/null
	done
	rmdir "$cgroot/smcr-demo-$id" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT INT TERM

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "two hosts: namespaces smcr-demo-$id-a (198.18.0.1) and -b (198.18.0.2), one veth"
for h in a b; do
	ip netns add "smcr-demo-$id-$h"
	mkdir -p "$work/$h" # its control socket, and the direct socket beside it
	ip -n "smcr-demo-$id-$h" link set lo up
	mkdir -p "$cgroot/smcr-demo-$id/$h"
done
ip link add "smd$id"a netns "smcr-demo-$id-a" type veth peer name "smd$id"b netns "smcr-demo-$id-b"
ip -n "smcr-demo-$id-a" addr add 198.18.0.1/24 dev "smd$id"a
ip -n "smcr-demo-$id-b" addr add 198.18.0.2/24 dev "smd$id"b
ip -n "smcr-demo-$id-a" link set "smd$id"a up
ip -n "smcr-demo-$id-b" link set "smd$id"b up
sleep 1 # addresses leave tentative state

# on HOST CMD...: run CMD in the host's namespace and cgroup. nsenter joins only
# the network namespace, so the cgroup and bpf mounts stay visible to smcrd.
# It execs: call it in a subshell, ( on ... ), so that in the background $! is
# CMD itself and cleanup can stop it.
on() {
	local h=$1; shift
	exec sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cgroot/smcr-demo-$id/$h" \
		nsenter --net="/run/netns/smcr-demo-$id-$h" "$@"
}
bg() { ("$@") & pids+=($!); }
ctl() { local h=$1; shift; "$bin/smcrctl" --socket "$work/$h/smcrd.sock" "$@"; }

say "smcrd in each host: the embedded default configuration, plus where to put things"
for h in a b; do
	{
		"$bin/smcrd" -print-default-config | grep -v -e '^cgroup =' -e '^control_socket =' -e '^providers ='
		echo "cgroup = smcr-demo-$id/$h"
		echo "control_socket = $work/$h/smcrd.sock"
		echo "providers = shm,soft"
	} > "$work/$h.conf"
	bg on "$h" "$bin/smcrd" -config "$work/$h.conf" -pin-dir "/sys/fs/bpf/smcr-demo-$id-$h" \
		-shm-dir "$work/shm" > "$work/smcrd-$h.log" 2>&1
done
for h in a b; do
	for _ in $(seq 100); do ctl "$h" status > /dev/null 2>&1 && break; sleep 0.1; done
	ctl "$h" status
done

say "unmodified iperf3 servers in host b: port $port with smcrctl run (direct mode), $relayed without (relay), $plain (plain TCP)"
bg on b "$bin/smcrctl" --socket "$work/b/smcrd.sock" run -- iperf3 -s -p "$port" > /dev/null 2>&1
bg on b iperf3 -s -p "$relayed" > /dev/null 2>&1
bg on b iperf3 -s -p "$plain" > /dev/null 2>&1
sleep 0.5

rate() { python3 -c 'import json,sys; print("%.0f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e6))'; }
counter() { ctl a stats --json | python3 -c "import json,sys; s=json.load(sys.stdin); print($1)"; }

say "smcrctl run -- iperf3 -c 198.18.0.2 -p $port from host a: the direct mode"
(on a "$bin/smcrctl" --socket "$work/a/smcrd.sock" run -- iperf3 -c 198.18.0.2 -p "$port" -t 5 -J > "$work/direct.json") &
ipf=$!
sleep 2
say "smcrctl conns --json (host a) while it runs: mode and path of each connection"
ctl a conns --json | python3 -c 'import json,sys; [print("  %-22s %-22s %-5s %s" % (c["local"], c["remote"], c["mode"], c["path"])) for c in json.load(sys.stdin)]'
say "smcrctl links (host a)"
ctl a links
wait "$ipf"
direct=$(rate < "$work/direct.json")
# iperf3 gets through as plain TCP too when smcrd did not take its sockets:
# the demo shows the direct mode only if its connections went SMC-R.
if [ "$(counter 's["direct"]["smcr"]')" -eq 0 ]; then
	echo "demo: iperf3 with the library (direct mode) did not go through SMC-R; host a's counters and the smcrds' logs:" >&2
	ctl a stats >&2
	tail -n 20 "$work"/smcrd-*.log >&2
	exit 1
fi

say "iperf3 -c 198.18.0.2 -p $relayed from host a, unmodified and without the library: smcrd's relay"
before=$(counter 's["connections"]["smcr"]')
(on a iperf3 -c 198.18.0.2 -p "$relayed" -t 5 -J > "$work/smcr.json")
smcr=$(rate < "$work/smcr.json")
if [ "$(counter 's["connections"]["smcr"]')" -le "$before" ]; then
	echo "demo: iperf3 did not go through SMC-R in the relay; host a's counters and the smcrds' logs:" >&2
	ctl a stats >&2
	tail -n 20 "$work"/smcrd-*.log >&2
	exit 1
fi

say "iperf3 -c 198.18.0.2 -p $plain from host a: plain TCP over the same veth"
(on a iperf3 -c 198.18.0.2 -p "$plain" -t 5 -J > "$work/tcp.json")
tcp=$(rate < "$work/tcp.json")

say "smcrctl stats (host a)"
ctl a stats

say "result"
ratio() { python3 -c "print('%.2f' % ($1 / $2))"; }
printf '  direct mode (smcrctl run, shm provider): %6s Mbit/s  x%s of TCP\n' "$direct" "$(ratio "$direct" "$tcp")"
printf '  relay (smcrd, shm provider):             %6s Mbit/s  x%s of TCP\n' "$smcr" "$(ratio "$smcr" "$tcp")"
printf '  plain TCP over the veth:                 %6s Mbit/s\n' "$tcp"
