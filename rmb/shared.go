// The direct mode's shared connection area and policy page: the versioned ABI
// between smcrd and libsmcr-preload.so (preload/smcr_abi.h is the C side; the
// tests compile it and compare every offset). docs/direct.md tells the protocol.

package rmb

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"sync/atomic"
	"unsafe"
)

// ABIVersion is the version of the shared area, the policy page and the
// direct socket's messages.
const ABIVersion = 5

// The shared area of one connection (struct smcr_shared): a control page, then
// the send ring (the program writes, smcrd takes) and the receive ring (smcrd
// writes, the program takes). Its layout, its publishing order and its wake-ups
// are the ABI drawn in the package doc ("The direct mode's shared area").
const (
	SharedMagic    = 0x53434d53 // "SMCS"
	SharedPageSize = 4096       // the control page; the rings start after it

	offMagic    = 0
	offVersion  = 4
	offTxSize   = 8
	offRxSize   = 12
	offTxOff    = 16
	offRxOff    = 20
	offMapSize  = 24
	offRingFile = 28
	offTxProd   = 64
	offRxCons   = 72
	offLibFlags = 80
	offLibSeq   = 84
	offLibWait  = 88
	offLibPoll  = 92
	offTxUrg    = 96
	offRxOOB    = 104
	offLibOwner = 112
	offLibSend  = 116
	offLibPidNS = 120
	offTxCons   = 128
	offRxProd   = 136
	offDFlags   = 144
	offDErrno   = 148
	offDSeq     = 152
	offDTxWait  = 156
	offDRxWait  = 160
	offRxUrg    = 168
	// the library's own, shared by the processes that hold a connection since
	// a fork or an exec; smcrd ignores them
	offLibRingOps   = 192
	offLibReleasing = 196
	sharedEnd       = 256 // sizeof(struct smcr_shared)
)

// Library flags (lib_flags).
const (
	LibShutWR = 1 // shutdown(SHUT_WR): after the bytes up to tx_prod, the FIN
	LibClosed = 2 // close(): the program is gone from the connection
	LibAbort  = 4 // the program's end (LibClosed, or the channel's close) is an abort (SO_LINGER {1, 0}, bytes left unread, an exec into an image without the library): the peer reads a reset
	// LibRelease: hand the connection back to the kernel socket after the
	// bytes up to tx_prod, with rx_cons final (the socket goes to another
	// process, or to an image without the library); answered by DReleased, or
	// DNoRelease (or DError) where it cannot be.
	LibRelease = 8
)

// smcrd's flags (d_flags).
const (
	DEOF       = 1  // the peer sent its last byte: rx_prod is final
	DError     = 2  // the connection failed: d_errno for reads and writes
	DTxClosed  = 4  // the peer reads no more: writes fail with EPIPE
	DReleased  = 8  // LibRelease done: the kernel socket carries the rest of the stream, smcrd let go
	DNoRelease = 16 // LibRelease not possible here: the connection goes on as it was
	// DPeerRelease (SHM): the peer library released the connection: this
	// library copies no more into the peer's ring, and once its copies under
	// way ended (LibSending 0) smcrd resends the peer's unread bytes over TCP
	// and sets DReleased.
	DPeerRelease = 32
)

// SharedRingFiles in ring_files: the rings are not in the area but in files of
// their own, which DECIDED passes after the eventfds (the send ring's, then the
// receive ring's); tx_off and rx_off are where the rings start in those files,
// and the area is the control page alone (map_size).
const SharedRingFiles = 1

// SharedSize is the size of an area with rings of tx and rx bytes, each
// rounded up to whole pages.
func SharedSize(tx, rx int) int { return SharedPageSize + pageUp(tx) + pageUp(rx) }

func pageUp(n int) int { return (n + SharedPageSize - 1) &^ (SharedPageSize - 1) }

// Shared is a view of a connection's shared area over mapped memory.
type Shared struct{ mem, tx, rx []byte }

// InitShared lays a new area out in mem (zeroed, SharedSize(tx, rx) bytes,
// 8-byte aligned, as a mapping is) and returns its view.
func InitShared(mem []byte, tx, rx int) (*Shared, error) {
	if tx <= 0 || rx <= 0 || len(mem) < SharedSize(tx, rx) || uintptr(unsafe.Pointer(&mem[0]))%8 != 0 {
		return nil, errors.New("rmb: shared area: bad size or alignment")
	}
	s := &Shared{mem: mem[:SharedSize(tx, rx)]}
	s.u32(offMagic).Store(SharedMagic)
	s.u32(offVersion).Store(ABIVersion)
	s.u32(offTxSize).Store(uint32(tx))
	s.u32(offRxSize).Store(uint32(rx))
	s.u32(offTxOff).Store(SharedPageSize)
	s.u32(offRxOff).Store(uint32(SharedPageSize + pageUp(tx)))
	s.u32(offMapSize).Store(uint32(len(s.mem)))
	s.tx, s.rx = s.mem[SharedPageSize:SharedPageSize+tx], s.mem[SharedPageSize+pageUp(tx):][:rx]
	return s, nil
}

// InitSharedRingFiles lays out in mem (zeroed, SharedPageSize bytes, 8-byte
// aligned) an area whose rings tx and rx are in files of their own
// ([SharedRingFiles]), at txOff and rxOff in those files.
func InitSharedRingFiles(mem, tx, rx []byte, txOff, rxOff int64) (*Shared, error) {
	switch {
	case len(tx) == 0 || len(rx) == 0 || len(tx) > math.MaxUint32 || len(rx) > math.MaxUint32:
		return nil, errors.New("rmb: shared area: bad ring sizes")
	case txOff < 0 || rxOff < 0 || txOff > math.MaxUint32 || rxOff > math.MaxUint32:
		return nil, errors.New("rmb: shared area: ring offsets out of range")
	case len(mem) < SharedPageSize || uintptr(unsafe.Pointer(&mem[0]))%8 != 0:
		return nil, errors.New("rmb: shared area: bad size or alignment")
	}
	s := &Shared{mem: mem[:SharedPageSize], tx: tx, rx: rx}
	s.u32(offMagic).Store(SharedMagic)
	s.u32(offVersion).Store(ABIVersion)
	s.u32(offTxSize).Store(uint32(len(tx)))
	s.u32(offRxSize).Store(uint32(len(rx)))
	s.u32(offTxOff).Store(uint32(txOff))
	s.u32(offRxOff).Store(uint32(rxOff))
	s.u32(offMapSize).Store(SharedPageSize)
	s.u32(offRingFile).Store(SharedRingFiles)
	return s, nil
}

// ViewShared checks the header of an area smcrd laid out and returns its view.
// An area with [SharedRingFiles] has no rings until [Shared.AttachRings].
func ViewShared(mem []byte) (*Shared, error) {
	if len(mem) < SharedPageSize || uintptr(unsafe.Pointer(&mem[0]))%8 != 0 {
		return nil, errors.New("rmb: shared area: too short or misaligned")
	}
	s := &Shared{mem: mem}
	tx, rx := int(s.u32(offTxSize).Load()), int(s.u32(offRxSize).Load())
	switch {
	case s.u32(offMagic).Load() != SharedMagic:
		return nil, errors.New("rmb: shared area: bad magic")
	case s.u32(offVersion).Load() != ABIVersion:
		return nil, errors.New("rmb: shared area: unknown version")
	case tx <= 0 || rx <= 0:
		return nil, errors.New("rmb: shared area: empty rings")
	case s.u32(offRingFile).Load() == SharedRingFiles:
		if s.u32(offMapSize).Load() != SharedPageSize {
			return nil, errors.New("rmb: shared area: control page of the wrong size")
		}
		s.mem = mem[:SharedPageSize]
		return s, nil
	case s.u32(offRingFile).Load() != 0:
		return nil, errors.New("rmb: shared area: unknown ring placement")
	case SharedSize(tx, rx) > len(mem) || int(s.u32(offMapSize).Load()) != SharedSize(tx, rx):
		return nil, errors.New("rmb: shared area: rings do not fit")
	case s.u32(offTxOff).Load() != SharedPageSize || int(s.u32(offRxOff).Load()) != SharedPageSize+pageUp(tx):
		return nil, errors.New("rmb: shared area: bad ring offsets")
	}
	s.mem = mem[:SharedSize(tx, rx)]
	s.tx, s.rx = s.mem[SharedPageSize:SharedPageSize+tx], s.mem[SharedPageSize+pageUp(tx):][:rx]
	return s, nil
}

// RingFiles reports whether the rings are in files of their own
// ([SharedRingFiles]), and where they start in them.
func (s *Shared) RingFiles() (txOff, rxOff int64, ok bool) {
	if s.u32(offRingFile).Load() != SharedRingFiles {
		return 0, 0, false
	}
	return int64(s.u32(offTxOff).Load()), int64(s.u32(offRxOff).Load()), true
}

// AttachRings gives an area with [SharedRingFiles] its rings, as mapped from
// their files.
func (s *Shared) AttachRings(tx, rx []byte) error {
	if _, _, ok := s.RingFiles(); !ok {
		return errors.New("rmb: shared area: rings are in the area")
	}
	if len(tx) != int(s.u32(offTxSize).Load()) || len(rx) != int(s.u32(offRxSize).Load()) {
		return errors.New("rmb: shared area: rings of the wrong size")
	}
	s.tx, s.rx = tx, rx
	return nil
}

func (s *Shared) u32(off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&s.mem[off]))
}

func (s *Shared) u64(off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&s.mem[off]))
}

// TxRing and RxRing are the rings' bytes.
func (s *Shared) TxRing() []byte { return s.tx }
func (s *Shared) RxRing() []byte { return s.rx }

// The library's words.
func (s *Shared) TxProd() *atomic.Uint64     { return s.u64(offTxProd) }
func (s *Shared) RxCons() *atomic.Uint64     { return s.u64(offRxCons) }
func (s *Shared) LibFlags() *atomic.Uint32   { return s.u32(offLibFlags) }
func (s *Shared) LibSeq() *atomic.Uint32     { return s.u32(offLibSeq) }
func (s *Shared) LibWaiters() *atomic.Uint32 { return s.u32(offLibWait) }
func (s *Shared) LibPollers() *atomic.Uint32 { return s.u32(offLibPoll) }

// LibSending (SHM) counts the library's copies into the peer's receive ring
// under way.
func (s *Shared) LibSending() *atomic.Uint32 { return s.u32(offLibSend) }

// TxUrg is the stream position just past the program's latest urgent byte
// (send with MSG_OOB), 0 none; the library stores it before the tx_prod that
// covers the byte.
func (s *Shared) TxUrg() *atomic.Uint64 { return s.u64(offTxUrg) }

// smcrd's words.
func (s *Shared) TxCons() *atomic.Uint64   { return s.u64(offTxCons) }
func (s *Shared) RxProd() *atomic.Uint64   { return s.u64(offRxProd) }
func (s *Shared) DFlags() *atomic.Uint32   { return s.u32(offDFlags) }
func (s *Shared) DErrno() *atomic.Int32    { return (*atomic.Int32)(unsafe.Pointer(&s.mem[offDErrno])) }
func (s *Shared) DSeq() *atomic.Uint32     { return s.u32(offDSeq) }
func (s *Shared) DTxWait() *atomic.Uint32  { return s.u32(offDTxWait) }
func (s *Shared) DRxWait() *atomic.Uint32  { return s.u32(offDRxWait) }
func (s *Shared) DSeqAddr() unsafe.Pointer { return unsafe.Pointer(&s.mem[offDSeq]) }

// RxUrg is the stream position just past the peer's latest urgent byte, 0
// none; smcrd stores it before the rx_prod that covers the byte.
func (s *Shared) RxUrg() *atomic.Uint64 { return s.u64(offRxUrg) }

// The wake page (struct smcr_wake): one per library process, beside its
// eventfd. A publish to a connection whose lib_pollers is nonzero bumps Pub,
// then writes the eventfd only while Sleepers is nonzero; a waiter counts
// itself in Sleepers before its last look at Pub and sleeps only if Pub did
// not move.
//
//	offset  field
//	     0  magic "SMCW", version
//	     8  sleepers u32, reserved u32
//	    16  pub u64
const (
	WakeMagic = 0x57434d53 // "SMCW"
	WakeSize  = 4096       // the memfd's size, sealed

	offWakeSleepers = 8
	offWakePub      = 16
	wakeEnd         = 24
)

// Wake is a view of a wake page.
type Wake struct{ mem []byte }

// ViewWake checks mem, a mapped wake page, and views it.
func ViewWake(mem []byte) (*Wake, error) {
	if len(mem) < wakeEnd || uintptr(unsafe.Pointer(&mem[0]))%8 != 0 {
		return nil, errors.New("rmb: wake page too small or unaligned")
	}
	w := &Wake{mem: mem[:wakeEnd]}
	if m, v := w.u32(0).Load(), w.u32(4).Load(); m != WakeMagic || v != ABIVersion {
		return nil, fmt.Errorf("rmb: wake page magic %#x version %d", m, v)
	}
	return w, nil
}

// InitWake lays a wake page out in mem, as a library does.
func InitWake(mem []byte) (*Wake, error) {
	if len(mem) < wakeEnd || uintptr(unsafe.Pointer(&mem[0]))%8 != 0 {
		return nil, errors.New("rmb: wake page too small or unaligned")
	}
	w := &Wake{mem: mem[:wakeEnd]}
	w.u32(0).Store(WakeMagic)
	w.u32(4).Store(ABIVersion)
	return w, nil
}

func (w *Wake) u32(off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&w.mem[off])) }

func (w *Wake) Sleepers() *atomic.Uint32 { return w.u32(offWakeSleepers) }
func (w *Wake) Pub() *atomic.Uint64      { return (*atomic.Uint64)(unsafe.Pointer(&w.mem[offWakePub])) }

// Published counts a publish to a polled connection and reports whether the
// process's eventfd must be written: a thread sleeps on it.
func (w *Wake) Published() bool {
	w.Pub().Add(1)
	return w.Sleepers().Load() != 0
}

// The policy page (struct smcr_policy): what smcrd decides, for a library to
// read without a round trip.
//
//	offset  field
//	     0  magic "SMCP", version
//	     8  heartbeat_ns u64 (CLOCK_MONOTONIC of smcrd's last beat)
//	    16  enabled u32, reserved u32
//	    24  ports [1024]u64: bit p of word p/64 set, port p is in port_range_list
//	  8216  max_memory u64 (bytes, 0 unlimited), mem_used u64 (bytes held now)
//	  8232  naddrs u32 (0: any local address), reserved u32
//	  8240  addrs [16][16]byte: the local addresses of ip_addr_list's interfaces
//	        (IPv4 as ::ffff:a.b.c.d)
const (
	PolicyMagic    = 0x50434d53 // "SMCP"
	PolicyMaxAddrs = 16
	PolicySize     = offPolicyAddrs + PolicyMaxAddrs*16
	PolicyStaleNS  = 3_000_000_000 // a heartbeat older than this: smcrd is gone

	offPolicyMaxMem = 24 + 1024*8
	offPolicyMemUse = offPolicyMaxMem + 8
	offPolicyNAddrs = offPolicyMemUse + 8
	offPolicyAddrs  = offPolicyNAddrs + 8
)

// Policy is a view of the policy page.
type Policy struct{ mem []byte }

// InitPolicy lays a policy page out in mem (PolicySize bytes, 8-aligned).
func InitPolicy(mem []byte) (*Policy, error) {
	if len(mem) < PolicySize || uintptr(unsafe.Pointer(&mem[0]))%8 != 0 {
		return nil, errors.New("rmb: policy page: bad size or alignment")
	}
	p := &Policy{mem: mem[:PolicySize]}
	(*atomic.Uint32)(unsafe.Pointer(&mem[0])).Store(PolicyMagic)
	(*atomic.Uint32)(unsafe.Pointer(&mem[4])).Store(ABIVersion)
	return p, nil
}

// Beat records smcrd alive at monotonic time now (ns).
func (p *Policy) Beat(now uint64) { (*atomic.Uint64)(unsafe.Pointer(&p.mem[8])).Store(now) }

// Heartbeat is the last beat.
func (p *Policy) Heartbeat() uint64 { return (*atomic.Uint64)(unsafe.Pointer(&p.mem[8])).Load() }

// SetEnabled sets the enabled word.
func (p *Policy) SetEnabled(on bool) {
	v := uint32(0)
	if on {
		v = 1
	}
	(*atomic.Uint32)(unsafe.Pointer(&p.mem[16])).Store(v)
}

// Enabled reads it.
func (p *Policy) Enabled() bool { return (*atomic.Uint32)(unsafe.Pointer(&p.mem[16])).Load() != 0 }

// SetPorts sets the port bitmap to exactly the ports listed says are listed.
func (p *Policy) SetPorts(listed func(port uint16) bool) {
	for w := 0; w < 1024; w++ {
		var v uint64
		for b := 0; b < 64; b++ {
			if listed(uint16(w*64 + b)) {
				v |= 1 << b
			}
		}
		(*atomic.Uint64)(unsafe.Pointer(&p.mem[24+8*w])).Store(v)
	}
}

// Port reports whether port is listed.
func (p *Policy) Port(port uint16) bool {
	w := (*atomic.Uint64)(unsafe.Pointer(&p.mem[24+8*int(port/64)])).Load()
	return w&(1<<(port%64)) != 0
}

// SetMemory records smcrd's max_memory (0: unlimited) and the bytes it holds
// now: a library offers no connection while used reaches limit.
func (p *Policy) SetMemory(used, limit uint64) {
	(*atomic.Uint64)(unsafe.Pointer(&p.mem[offPolicyMaxMem])).Store(limit)
	(*atomic.Uint64)(unsafe.Pointer(&p.mem[offPolicyMemUse])).Store(used)
}

// Memory reads them.
func (p *Policy) Memory() (used, limit uint64) {
	return (*atomic.Uint64)(unsafe.Pointer(&p.mem[offPolicyMemUse])).Load(),
		(*atomic.Uint64)(unsafe.Pointer(&p.mem[offPolicyMaxMem])).Load()
}

// SetAddrs lists the local addresses a connection may have (those of
// ip_addr_list's interfaces); none, or more than PolicyMaxAddrs, is any. The
// count goes to 0 while the list changes, so a library reading meanwhile sees
// any address rather than a torn list.
func (p *Policy) SetAddrs(addrs []netip.Addr) {
	n := (*atomic.Uint32)(unsafe.Pointer(&p.mem[offPolicyNAddrs]))
	n.Store(0)
	if len(addrs) > PolicyMaxAddrs {
		return
	}
	for i, a := range addrs {
		b := a.As16()
		for w := 0; w < 2; w++ {
			(*atomic.Uint64)(unsafe.Pointer(&p.mem[offPolicyAddrs+16*i+8*w])).Store(le.Uint64(b[8*w:]))
		}
	}
	n.Store(uint32(len(addrs)))
}

// Addrs reads the list (nil: any).
func (p *Policy) Addrs() []netip.Addr {
	n := int((*atomic.Uint32)(unsafe.Pointer(&p.mem[offPolicyNAddrs])).Load())
	var out []netip.Addr
	for i := 0; i < n && i < PolicyMaxAddrs; i++ {
		var b [16]byte
		for w := 0; w < 2; w++ {
			le.PutUint64(b[8*w:], (*atomic.Uint64)(unsafe.Pointer(&p.mem[offPolicyAddrs+16*i+8*w])).Load())
		}
		out = append(out, netip.AddrFrom16(b).Unmap())
	}
	return out
}
