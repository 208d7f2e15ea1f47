#!/usr/bin/env bash
# Builds test/vm/rxefix (a module for the test VM's Debian kernel that works around
# two rdma_rxe bugs of 6.1, see rxefix.c) against that kernel's headers, which it
# fetches with apt-get download into test/vm/cache/, idempotently. Prints the path
# of rxefix.ko. Needs gcc and make (scripts/deps.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${SMCR_VM_CACHE:-$here/cache}
release=$("$here/kernel.sh")
hdr=$cache/headers-$release
out=$cache/rxefix-$release

if [ ! -e "$hdr/.done" ]; then
	(
		exec 9>"$cache/.lock-headers" && flock 9
		[ ! -e "$hdr/.done" ] || exit 0
		rm -rf "$hdr" "$cache/dl-headers" && mkdir -p "$cache/dl-headers" "$hdr"
		cd "$cache/dl-headers"
		# The arch package names the common headers and the kbuild tools it needs.
		deps=$(apt-cache depends "linux-headers-$release" | awk '/Depends: linux-(headers|kbuild)-/ {print $2}')
		apt-get download "linux-headers-$release" $deps >&2
		for d in *.deb; do dpkg-deb -x "$d" "$hdr"; done
		# The arch package includes the common Makefile by its absolute path
		# under /usr: include it from this tree instead (the other links are
		# relative).
		sed -i "s|^include /usr/|include $hdr/usr/|" "$hdr/usr/src/linux-headers-$release/Makefile"
		rm -rf "$cache/dl-headers"
		touch "$hdr/.done"
	)
fi
kdir=$hdr/usr/src/linux-headers-$release
if [ ! -e "$out/rxefix.ko" ] || [ "$here/rxefix/rxefix.c" -nt "$out/rxefix.ko" ]; then
	rm -rf "$out" && mkdir -p "$out"
	cp "$here/rxefix/rxefix.c" "$here/rxefix/Kbuild" "$out/"
	make -s -C "$kdir" M="$out" modules >&2
fi
echo "$out/rxefix.ko"
