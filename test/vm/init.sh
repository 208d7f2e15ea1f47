#!/bin/busybox sh
# Guest /init of the soft-RoCE test VM (see run.sh): loads the 9p and RDMA modules
# of the Debian kernel, creates rxe0 on dummy0 (and rxe1 on lo), chroots into the
# host's / shared read-only and runs the job's cmd.sh there. The job's exit code
# goes back in $smcr_job/rc; its output in $smcr_job/output and on the console.
/bin/busybox --install -s
export PATH=/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for a in $(cat /proc/cmdline); do
	case $a in smcr_*=*) export "$a" ;; esac
done

fail() {
	echo "vm-init: $*"
	poweroff -f
	exit 1
}

for m in virtio_pci 9pnet_virtio 9p; do modprobe $m || fail "modprobe $m"; done
mkdir -p /host
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=524288,cache=loose host /host || fail "mount host /"
# The whole module tree of the unpacked kernel, and busybox modprobe for the
# kernel's own on-demand loads (rdma link add asks for rdma-link-rxe, crypto).
mkdir -p /lib/modules
mount --bind "/host$smcr_modules" /lib/modules || fail "bind modules"
echo /sbin/modprobe >/proc/sys/kernel/modprobe
# Without the crc32 modules rxe cannot compute its ICRC and "rdma link add" fails
# with ENOENT. tun: devtmpfs has no /dev/net/tun before the module is loaded (the
# eBPF tests list a tun device).
for m in crc32_generic crc32_pclmul rdma_rxe ib_uverbs rdma_ucm dummy tun; do
	modprobe $m || fail "modprobe $m"
done

h=/host
mount -t proc proc $h/proc
mount -t sysfs sys $h/sys
mount -t devtmpfs dev $h/dev
mkdir -p $h/dev/pts $h/dev/shm 2>/dev/null
mount -t devpts devpts $h/dev/pts
mount -t tmpfs shm $h/dev/shm
# A fresh /tmp, with the host's /tmp paths the job needs bound back (run.sh).
mkdir -p /hosttmp
mount --bind $h/tmp /hosttmp || fail "bind host /tmp"
mount -t tmpfs tmp $h/tmp
for d in $(echo "${smcr_keep:-}" | tr , ' '); do
	mkdir -p "$h$d"
	mount --bind "/hosttmp${d#/tmp}" "$h$d" || fail "bind $d"
done
mount -t tmpfs run $h/run
# cgroup v2 and bpffs, for smcrd's BPF programs (the end-to-end tests in the guest).
mount -t cgroup2 cgroup2 $h/sys/fs/cgroup || echo "vm-init: no cgroup2"
mount -t bpf bpf $h/sys/fs/bpf || echo "vm-init: no bpffs"
mkdir -p "$h$smcr_job" 2>/dev/null
mount -t 9p -o trans=virtio,version=9p2000.L,rw,msize=524288 job "$h$smcr_job" || fail "mount job"

in_host() { chroot $h /usr/bin/env -i PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp "$@"; }
in_host ip link set lo up
in_host ip link add dummy0 type dummy 2>/dev/null
in_host ip addr add 10.99.0.1/24 dev dummy0
in_host ip link set dummy0 up
in_host rdma link add rxe0 type rxe netdev dummy0 || fail "rdma link add rxe0"
in_host rdma link add rxe1 type rxe netdev lo || echo "vm-init: no rxe on lo"
# A second interface with its own device, for a link group's second link.
in_host ip link add dummy1 type dummy 2>/dev/null
in_host ip addr add 10.99.1.1/24 dev dummy1
in_host ip link set dummy1 up
in_host rdma link add rxe2 type rxe netdev dummy1 || fail "rdma link add rxe2"

# cmd.sh is written by run.sh; it sets the environment and cds to the caller's
# directory. started tells run.sh the guest booted.
: >"$h$smcr_job/started"
(in_host /bin/bash "$smcr_job/cmd.sh"; echo $? >"$h$smcr_job/rc") 2>&1 | tee "$h$smcr_job/output"
sync
umount "$h$smcr_job"
poweroff -f
