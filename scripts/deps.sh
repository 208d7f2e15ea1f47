#!/usr/bin/env bash
# Installs everything smcr needs on a fresh Debian (bookworm) machine, as root:
# the Debian packages below and the Go modules of go.mod. Idempotent and quick
# when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
	# eBPF: bpf2go compiles the C programs with clang; headers from libbpf-dev
	clang llvm libbpf-dev linux-libc-dev bpftool
	# network namespaces, real unmodified programs for the end-to-end tests and demo
	iproute2 iperf3 tcpdump socat ethtool
	# servers users accelerate, with their clients (the end-to-end tests run
	# their own instances; the packages' services are stopped below)
	nginx curl redis-server redis-tools
	# interop: Wireshark's SMC dissector checks the wire formats
	tshark
	# real RDMA: libibverbs for the ibv provider, soft-RoCE in a qemu VM for its tests
	libibverbs-dev ibverbs-providers ibverbs-utils perftest rdmacm-utils
	qemu-system-x86 busybox-static kmod cpio
)

missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "deps: need root to install: ${missing[*]}" >&2
		exit 1
	fi
	echo "deps: installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
	# The tests start nginx and redis themselves, inside their namespaces: a
	# server this script installed should not stay listening on the host.
	if [ -d /run/systemd/system ]; then
		for svc in nginx redis-server; do
			if [[ " ${missing[*]} " == *" $svc "* ]]; then
				systemctl disable --now "$svc" >/dev/null 2>&1 || true
			fi
		done
	fi
fi

if ! command -v go >/dev/null; then
	export PATH=$PATH:/usr/local/go/bin
fi
go mod download
