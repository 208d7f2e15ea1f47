// System helpers: sealed memfd regions, checked mappings of a peer's descriptors,
// the host identity, and descriptor passing (SCM_RIGHTS) on the rendezvous socket.
// No part of RFC 7609: this is the "shared memory" that stands in for RDMA (§2.1).

package shm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// seals every region and queue segment carries before it is shared: a peer that
// holds the descriptor can neither shrink it (our mapping would SIGBUS) nor grow it.
const seals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// region is one mapping of a memfd.
type region struct {
	fd  int    // the memfd (owner) or the peer's descriptor (mapped copy); -1 when closed
	mem []byte // the mapping, a multiple of the page size
}

// newRegion creates a sealed memfd of at least size bytes and maps it read-write.
func newRegion(name string, size int) (*region, error) {
	if size <= 0 {
		return nil, fmt.Errorf("%w: region size %d", errInvalidSize, size)
	}
	mapped := roundPage(size)
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(mapped)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("size memfd: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("seal memfd: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, mapped, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("map memfd: %w", err)
	}
	return &region{fd: fd, mem: mem}, nil
}

// mapPeer maps a descriptor a peer handed us. It takes ownership of fd. The
// descriptor must be a sealed memfd (else the peer could truncate it under our
// mapping) of at least size bytes; writable asks for PROT_WRITE, which the kernel
// refuses on a read-only descriptor.
func mapPeer(fd, size int, writable bool) (*region, error) {
	fail := func(err error) (*region, error) {
		unix.Close(fd)
		return nil, err
	}
	if size <= 0 || size > maxRegion {
		return fail(fmt.Errorf("%w: peer region size %d", errPeer, size))
	}
	got, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fail(fmt.Errorf("%w: peer descriptor is not a memfd: %v", errPeer, err))
	}
	if got&(unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL) != unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL {
		return fail(fmt.Errorf("%w: peer memfd not sealed against shrinking", errPeer))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(fmt.Errorf("stat peer memfd: %w", err))
	}
	mapped := roundPage(size)
	if st.Size < int64(mapped) {
		return fail(fmt.Errorf("%w: peer memfd holds %d bytes, %d claimed", errPeer, st.Size, size))
	}
	prot := unix.PROT_READ
	if writable {
		prot |= unix.PROT_WRITE
	}
	mem, err := unix.Mmap(fd, 0, mapped, prot, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("map peer memfd: %w", err))
	}
	return &region{fd: fd, mem: mem}, nil
}

// readOnlyFD opens a new, read-only file description of the region, so that a peer
// given it can map the memory for reading only (mmap PROT_WRITE fails with EACCES).
func (r *region) readOnlyFD() (int, error) {
	return unix.Open(fmt.Sprintf("/proc/self/fd/%d", r.fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
}

func (r *region) close() {
	if r.mem != nil {
		unix.Munmap(r.mem)
		r.mem = nil
	}
	if r.fd >= 0 {
		unix.Close(r.fd)
		r.fd = -1
	}
}

func roundPage(n int) int {
	p := os.Getpagesize()
	return (n + p - 1) &^ (p - 1)
}

// u64 and u32 view 8- and 4-byte aligned words of a shared mapping as atomics: the
// peer reads and writes them from another process, so every access is atomic.
func u64(mem []byte, off int) *atomic.Uint64 {
	_ = mem[off+7]
	return (*atomic.Uint64)(unsafe.Pointer(&mem[off]))
}

func u32(mem []byte, off int) *atomic.Uint32 {
	_ = mem[off+3]
	return (*atomic.Uint32)(unsafe.Pointer(&mem[off]))
}

// bootID identifies the running kernel: equal boot IDs mean the same host (network
// namespaces and containers share it; another machine or a VM does not).
func bootID() ([16]byte, error) {
	var id [16]byte
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return id, fmt.Errorf("read boot id: %w", err)
	}
	hex := bytes.ReplaceAll(bytes.TrimSpace(b), []byte("-"), nil)
	if len(hex) != 32 {
		return id, errors.New("malformed boot id")
	}
	for i := range id {
		hi, ok1 := unhex(hex[2*i])
		lo, ok2 := unhex(hex[2*i+1])
		if !ok1 || !ok2 {
			return id, errors.New("malformed boot id")
		}
		id[i] = hi<<4 | lo
	}
	return id, nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// closeFDs closes descriptors received in a message we do not use, so a peer cannot
// exhaust our descriptor table.
func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
