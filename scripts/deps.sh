#!/usr/bin/env bash
# Installs everything smcr needs on a fresh Debian (bookworm) machine, as root:
# the Debian packages below, Go itself where it is missing, and the Go modules
# of go.mod. Idempotent and quick
# when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
	# eBPF: bpf2go compiles the C programs with clang; headers from libbpf-dev
	clang llvm libbpf-dev linux-libc-dev bpftool
	# the direct mode's library (preload/) and the tests' C peers
	gcc libc6-dev make
	# network namespaces, real unmodified programs for the end-to-end tests and demo
	iproute2 iperf3 tcpdump socat ethtool
	# firewall rules on a socket's owner, for the relay's end-to-end test
	nftables
	# servers users accelerate, with their clients (the end-to-end tests run
	# their own instances; the packages' services are stopped below)
	nginx curl redis-server redis-tools memcached haproxy openssh-server openssh-client
	# the application benchmarks' load generator (nginx small files)
	wrk
	# interop: Wireshark's SMC dissector checks the wire formats
	tshark
	# real RDMA: libibverbs for the ibv provider, soft-RoCE in a qemu VM for its tests
	libibverbs-dev ibverbs-providers ibverbs-utils perftest rdmacm-utils
	qemu-system-x86 busybox-static kmod cpio
	# the Go toolchain, when this machine lacks it (below)
	ca-certificates unzip
	# the demo reads iperf3's and smcrctl's JSON with it
	python3
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
	# The tests start these servers themselves, inside their namespaces: a
	# server this script installed should not stay listening on the host.
	if [ -d /run/systemd/system ]; then
		for svc in nginx redis-server memcached haproxy ssh; do
			if [[ " ${missing[*]} " == *" $svc "* ]]; then
				systemctl disable --now "$svc" >/dev/null 2>&1 || true
			fi
		done
	fi
fi

# Go, at least the version go.mod names. These machines have it in /usr/local/go
# (the Makefile looks there when PATH has no go); where it is missing or older,
# this installs there the toolchain that Go's own toolchain switching fetches:
# the module golang.org/toolchain, from the Go module proxy.
goroot=${SMCR_GOROOT:-/usr/local/go}
want=$(awk '$1 == "go" {print $2; exit}' go.mod)
# The archives' SHA-256, by version and architecture: add the new one when
# go.mod's go line changes (sha256sum of the .zip the URL below names).
declare -A go_sha256=(
	[1.26.8.linux-amd64]=30c2b1bf7dcc88d3eb0a1364e47ddd9128edb3110a30e8a0ef61cd5856b31de7
)

# go_ok GO: GO runs here and is at least go.mod's version.
go_ok() {
	local v
	v=$("$1" env GOVERSION 2>/dev/null) || return 1
	v=${v#go}
	[ "$(printf '%s\n%s\n' "$want" "$v" | sort -V | head -n 1)" = "$want" ]
}

install_go() {
	local arch
	case $(uname -m) in
	x86_64) arch=amd64 ;;
	aarch64) arch=arm64 ;;
	*) echo "deps: no Go toolchain for $(uname -m)" >&2; exit 1 ;;
	esac
	local v=v0.0.1-go$want.linux-$arch
	local sum=${SMCR_GO_SHA256:-${go_sha256[$want.linux-$arch]:-}}
	if [ -z "$sum" ]; then
		echo "deps: scripts/deps.sh has no SHA-256 for Go $want (linux-$arch): add it to go_sha256" >&2
		exit 1
	fi
	if [ -e "$goroot" ] && [ ! -e "$goroot/VERSION" ]; then
		echo "deps: $goroot exists and is not a Go installation; not replacing it" >&2
		exit 1
	fi
	# The proxy is GOPROXY's first entry, as go would ask it.
	local proxy=${GOPROXY:-https://proxy.golang.org}
	proxy=${proxy%%[,|]*}
	case $proxy in direct | off | "") proxy=https://proxy.golang.org ;; esac
	echo "deps: installing Go $want into $goroot"
	mkdir -p "$(dirname "$goroot")"
	# Beside $goroot, so that the tree moves into place with a rename; global,
	# so that the trap still sees it.
	tmp=$(mktemp -d "$(dirname "$goroot")/.go-install.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	curl -fsSL -o "$tmp/go.zip" "$proxy/golang.org/toolchain/@v/$v.zip"
	echo "$sum  $tmp/go.zip" | sha256sum -c --quiet - || { echo "deps: Go $want archive: checksum mismatch" >&2; exit 1; }
	unzip -q "$tmp/go.zip" -d "$tmp/x"
	local src=$tmp/x/golang.org/toolchain@$v
	chmod +x "$src"/bin/* "$src"/pkg/tool/*/*
	rm -rf "$goroot"
	mv "$src" "$goroot"
	rm -rf "$tmp"
	trap - EXIT
}

gobin=$(command -v go || echo "$goroot/bin/go")
if ! go_ok "$gobin"; then
	if [ "$gobin" != "$goroot/bin/go" ] && go_ok "$goroot/bin/go"; then
		echo "deps: $gobin, first on PATH, is older than Go $want; $goroot/bin/go is not: put it first" >&2
		exit 1
	fi
	install_go
	if [ "$gobin" != "$goroot/bin/go" ]; then
		echo "deps: $gobin, first on PATH, is older than Go $want; put $goroot/bin first" >&2
		exit 1
	fi
fi
"$gobin" mod download
