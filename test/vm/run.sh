#!/usr/bin/env bash
# Runs one command inside a throw-away qemu VM with a real verbs stack: the Debian
# kernel with soft-RoCE (rdma_rxe) on dummy0 (rxe0, 10.99.0.1) and lo (rxe1),
# chrooted into this host's / shared read-only over 9p, so host-built binaries run as
# is. The host kernel has no RDMA; this is how the ibv provider is tested for real.
#
#	test/vm/run.sh [-t timeout_s] [-m mem_mb] [-e VAR=value]... -- command [arg...]
#
# The command runs in the caller's working directory with a fresh /tmp, as root.
# Its output is printed; the exit status is the command's, 124 when the VM ran out
# of time (a hang fails instead of stalling CI), 125 when the VM did not run it.
set -euo pipefail
# Until qemu runs, a failure is the harness's (no kernel, no initramfs), not
# the command's: 125, whatever status the failed step had.
trap 'exit 125' ERR
here=$(cd "$(dirname "$0")" && pwd)
timeout_s=300
mem=2048
envs=()
while [ $# -gt 0 ]; do
	case $1 in
	-t) timeout_s=$2; shift 2 ;;
	-m) mem=$2; shift 2 ;;
	-e) envs+=("$2"); shift 2 ;;
	--) shift; break ;;
	*) break ;;
	esac
done
[ $# -gt 0 ] || { echo "usage: $0 [-t timeout_s] [-m mem_mb] [-e VAR=value]... -- command [arg...]" >&2; exit 2; }

# The accelerator: TCG by default, the only one that works on these machines
# (most have no /dev/kvm; where one is, its nested KVM boots no guest). SMCR_VM_ACCEL=kvm runs the guest under KVM where the host has it,
# at the CPU's own speed: under TCG a cgo call costs ~25 times what it does on
# the host, which sets the ibv benchmarks' gap to perftest (docs/benchmarks.md).
accel=${SMCR_VM_ACCEL:-tcg}
case $accel in
tcg) ;;
kvm)
	if [ ! -r /dev/kvm ] || [ ! -w /dev/kvm ]; then
		echo "vm: SMCR_VM_ACCEL=kvm, but /dev/kvm is not there or not ours to use" >&2
		exit 125
	fi ;;
*) echo "vm: SMCR_VM_ACCEL=$accel: want tcg or kvm" >&2; exit 125 ;;
esac

for tool in qemu-system-x86_64 busybox cpio depmod modprobe apt-get dpkg-deb; do
	command -v $tool >/dev/null || { echo "vm: $tool not found: run scripts/deps.sh (needs qemu-system-x86 busybox-static kmod cpio)" >&2; exit 125; }
done
# The initramfs has no libraries: a dynamic busybox (Debian's busybox package
# rather than busybox-static) would fail there with a bare "not found".
busybox=${SMCR_VM_BUSYBOX:-/bin/busybox} # a test's stand-in
if ldd "$busybox" >/dev/null 2>&1; then
	echo "vm: $busybox is dynamically linked: install busybox-static (scripts/deps.sh)" >&2
	exit 125
fi

cache=${SMCR_VM_CACHE:-$here/cache}
release=$("$here/kernel.sh")
kroot=$cache/kernel-$release
mkdir -p "$cache/jobs"
job=$(mktemp -d "$cache/jobs/job.XXXXXX")
trap 'rm -rf "$job"' EXIT

# initramfs: static busybox, init.sh and the modules that reach the 9p root.
stage=$job/initramfs
mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp} "$stage/lib/modules/$release"
cp "$busybox" "$stage/bin/busybox"
cp "$here/init.sh" "$stage/init"
chmod +x "$stage/init"
for m in virtio_pci 9pnet_virtio 9p; do
	modprobe -d "$kroot" -S "$release" --show-depends $m | awk '$1 == "insmod" {print $2}'
done | sort -u | while read -r ko; do
	rel=${ko#"$kroot/lib/modules/$release/"}
	rel=${rel#./}
	mkdir -p "$stage/lib/modules/$release/$(dirname "$rel")"
	cp "$ko" "$stage/lib/modules/$release/$rel"
done
cp "$kroot/lib/modules/$release"/modules.{order,builtin,builtin.modinfo} "$stage/lib/modules/$release/"
depmod -b "$stage" "$release"
(cd "$stage" && find . | cpio -o -H newc --quiet | gzip -1) >"$job/initramfs.gz"
rm -rf "$stage"

{
	echo "cd $(printf %q "$PWD") || exit 125"
	for e in "${envs[@]}"; do echo "export $(printf %q "$e")"; done
	printf '%q ' "$@"
	echo
} >"$job/cmd.sh"

# The guest gets a fresh /tmp; what the job needs from the host's /tmp (this
# repository and the working directory, when they lie there, as in a CI clone)
# is bound back into it, read-only like the rest of the host.
keep=()
for d in "$(cd "$here/../.." && pwd)" "$PWD"; do
	case $d in /tmp/*) keep+=("$d") ;; esac
done
keep_arg=
if [ ${#keep[@]} -gt 0 ]; then
	keep_arg=$(IFS=,; echo "${keep[*]}")
	case $keep_arg in *[[:space:]]*) echo "vm: cannot share $keep_arg: a path with spaces under /tmp" >&2; exit 125 ;; esac
	keep_arg="smcr_keep=$keep_arg"
fi

# -cpu max gives the guest PCLMUL for crc32_pclmul (under KVM: the host's
# CPU). TCG's TSC is the host's, one clock for all vCPUs, but the guest calls
# it unsynchronized and falls back to hpet, whose reads trap into qemu (2-4 us
# per clock_gettime): tsc=reliable keeps the vDSO's cheap reads, which the
# latency benchmarks rely on.
trap - ERR
set +e
timeout --kill-after=10 "$timeout_s" qemu-system-x86_64 -accel "$accel" -cpu max -smp 2 -m "$mem" \
	-nodefaults -display none -serial stdio -no-reboot \
	-kernel "$kroot/boot/vmlinuz-$release" -initrd "$job/initramfs.gz" \
	-append "console=ttyS0 quiet loglevel=3 panic=-1 tsc=reliable clocksource=tsc smcr_job=$job smcr_modules=$kroot/lib/modules $keep_arg" \
	-virtfs "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap" \
	-virtfs "local,path=$job,mount_tag=job,security_model=none,multidevs=remap" </dev/null
qrc=$?
set -e
if [ $qrc -eq 124 ] || [ $qrc -eq 137 ]; then
	echo "vm: timed out after ${timeout_s}s" >&2
	exit 124
fi
if [ ! -s "$job/rc" ]; then
	echo "vm: the guest did not run the command (qemu exit $qrc)" >&2
	exit 125
fi
exit "$(cat "$job/rc")"
