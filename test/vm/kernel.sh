#!/usr/bin/env bash
# Fetches the Debian distribution kernel (the package linux-image-amd64 depends on)
# into test/vm/cache/ and prepares its modules, idempotently: the qemu soft-RoCE
# harness boots it because the host kernel has no RDMA (see run.sh).
# Prints the kernel release on stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${SMCR_VM_CACHE:-$here/cache}
mkdir -p "$cache"

pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
if [ -z "$pkg" ]; then
	# apt lists may be missing on a fresh machine: refresh once, then ask again.
	apt-get update -qq >&2 || true
	pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
fi
[ -n "$pkg" ] || { echo "kernel.sh: cannot resolve linux-image-amd64's kernel package" >&2; exit 1; }
release=${pkg#linux-image-}
root=$cache/kernel-$release

# The stamp is written last, so an interrupted run starts over instead of
# leaving a half-unpacked tree behind.
if [ ! -e "$root/.done" ]; then
	(
		exec 9>"$cache/.lock"
		flock 9
		if [ -e "$root/.done" ]; then exit 0; fi
		rm -rf "$root" "$cache/dl"
		mkdir -p "$cache/dl"
		(cd "$cache/dl" && apt-get download "$pkg" >&2)
		deb=$(ls "$cache"/dl/*.deb)
		dpkg-deb -x "$deb" "$root"
		depmod -b "$root" "$release"
		rm -rf "$cache/dl"
		touch "$root/.done"
	)
fi
echo "$release"
