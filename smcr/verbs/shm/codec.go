// Pure codecs of the shm provider: the Endpoint (host identity and rendezvous path
// that travel in smcr's CLC extension), the control messages on the rendezvous
// socket, and the slot header of the shared request ring. The layouts are drawn in
// the package doc. The RDMA transport these replace is RFC 7609 §2.1 (RC QPs).

package shm

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// Endpoint layout.
const (
	epMagic     = "SHM1"
	epVersion   = 1
	epOffVer    = 4
	epOffLen    = 5
	epOffBoot   = 6
	epOffIno    = 22
	epOffDev    = 30
	epOffPath   = 38
	epMinLen    = epOffPath + 1
	maxPathLen  = 107 // sun_path holds 108 bytes with the NUL
	epMaxLen    = epOffPath + maxPathLen
	ctlHelloLen = 28
	ctlMapRepLn = 28
	ctlRkeyLen  = 8
	ctlBellLen  = 4
	maxCtlLen   = 32 // largest control message, for receive buffers
)

// endpoint is a decoded Device.Endpoint.
type endpoint struct {
	boot [16]byte // /proc/sys/kernel/random/boot_id
	ino  uint64   // inode of the rendezvous socket, as the owner sees it
	dev  uint64   // device of the rendezvous socket's file system
	path string   // file-system Unix socket (never abstract: those are per netns)
}

func (e *endpoint) append(b []byte) []byte {
	b = append(b, epMagic...)
	b = append(b, epVersion, byte(len(e.path)))
	b = append(b, e.boot[:]...)
	b = binary.BigEndian.AppendUint64(b, e.ino)
	b = binary.BigEndian.AppendUint64(b, e.dev)
	return append(b, e.path...)
}

// parseEndpoint decodes an Endpoint; it never reads past b and allocates only the path.
func parseEndpoint(b []byte) (endpoint, error) {
	var e endpoint
	if len(b) < epMinLen || string(b[:4]) != epMagic {
		return e, fmt.Errorf("%w: not an shm endpoint", errEndpoint)
	}
	if b[epOffVer] != epVersion {
		return e, fmt.Errorf("%w: version %d", errEndpoint, b[epOffVer])
	}
	n := int(b[epOffLen])
	if n == 0 || n > maxPathLen || len(b) != epOffPath+n {
		return e, fmt.Errorf("%w: path length %d in %d bytes", errEndpoint, n, len(b))
	}
	copy(e.boot[:], b[epOffBoot:epOffIno])
	e.ino = binary.BigEndian.Uint64(b[epOffIno:])
	e.dev = binary.BigEndian.Uint64(b[epOffDev:])
	path := b[epOffPath:]
	if path[0] != '/' {
		return e, fmt.Errorf("%w: rendezvous path is not absolute", errEndpoint)
	}
	for _, c := range path {
		if c == 0 {
			return e, fmt.Errorf("%w: NUL in rendezvous path", errEndpoint)
		}
	}
	e.path = string(path)
	return e, nil
}

// Control message types on the rendezvous socket (SOCK_SEQPACKET: one per packet).
const (
	ctlHello    = 1 // dialer → acceptor: connect a QP; fd: the dialer's queue segment
	ctlHelloAck = 2 // acceptor → dialer: accepted; fd: the acceptor's queue segment
	ctlDoorbell = 3 // "look at the shared queues": sent only to a peer that sleeps
	ctlMapReq   = 4 // requester asks for the region of an rkey
	ctlMapRep   = 5 // answer; fd: the region (read-only unless remote write)
	ctlRevoke   = 6 // the region of an rkey was deregistered
)

// Map reply statuses.
const (
	mapOK       = 0
	mapNoAccess = 1 // unknown rkey, another PD, or no remote access
)

// ctl is a decoded control message; which fields are meaningful depends on typ.
type ctl struct {
	typ     uint8
	dstQPN  uint32 // hello
	srcQPN  uint32 // hello
	ino     uint64 // hello: the sender's rendezvous socket inode
	segSize uint32 // hello: size of the sender's queue segment
	rnr     uint8  // hello: the sender's RNR retry count (7 = forever)
	rkey    uint32 // map request/reply, revoke
	status  uint8  // map reply
	access  verbs.Access
	addr    uint64 // map reply: the region's Addr()
	size    uint64 // map reply: the region's registered length
}

func (c *ctl) append(b []byte) []byte {
	b = append(b, c.typ, 0, 0, 0)
	switch c.typ {
	case ctlHello, ctlHelloAck:
		b = binary.BigEndian.AppendUint32(b, c.dstQPN)
		b = binary.BigEndian.AppendUint32(b, c.srcQPN)
		b = binary.BigEndian.AppendUint64(b, c.ino)
		b = binary.BigEndian.AppendUint32(b, c.segSize)
		b = append(b, c.rnr, 0, 0, 0)
	case ctlMapReq, ctlRevoke:
		b = binary.BigEndian.AppendUint32(b, c.rkey)
	case ctlMapRep:
		b = binary.BigEndian.AppendUint32(b, c.rkey)
		b = append(b, c.status, byte(c.access), 0, 0)
		b = binary.BigEndian.AppendUint64(b, c.addr)
		b = binary.BigEndian.AppendUint64(b, c.size)
	}
	return b
}

// parseCtl decodes one control message; every type has one exact length.
func parseCtl(b []byte) (ctl, error) {
	var c ctl
	if len(b) < ctlBellLen {
		return c, fmt.Errorf("%w: control message of %d bytes", errPeer, len(b))
	}
	c.typ = b[0]
	want := 0
	switch c.typ {
	case ctlHello, ctlHelloAck:
		want = ctlHelloLen
	case ctlDoorbell:
		want = ctlBellLen
	case ctlMapReq, ctlRevoke:
		want = ctlRkeyLen
	case ctlMapRep:
		want = ctlMapRepLn
	default:
		return c, fmt.Errorf("%w: control message type %d", errPeer, c.typ)
	}
	if len(b) != want {
		return c, fmt.Errorf("%w: control message type %d of %d bytes, want %d", errPeer, c.typ, len(b), want)
	}
	if b[1]|b[2]|b[3] != 0 || ((c.typ == ctlHello || c.typ == ctlHelloAck) && b[25]|b[26]|b[27] != 0) || (c.typ == ctlMapRep && b[10]|b[11] != 0) {
		return c, fmt.Errorf("%w: reserved bytes set in control message type %d", errPeer, c.typ)
	}
	switch c.typ {
	case ctlHello, ctlHelloAck:
		c.dstQPN = binary.BigEndian.Uint32(b[4:])
		c.srcQPN = binary.BigEndian.Uint32(b[8:])
		c.ino = binary.BigEndian.Uint64(b[12:])
		c.segSize = binary.BigEndian.Uint32(b[20:])
		c.rnr = b[24]
		if c.dstQPN > maxQPN || c.srcQPN > maxQPN || c.rnr > 7 {
			return c, fmt.Errorf("%w: hello with qpn %d/%d rnr %d", errPeer, c.dstQPN, c.srcQPN, c.rnr)
		}
	case ctlMapReq, ctlRevoke:
		c.rkey = binary.BigEndian.Uint32(b[4:])
	case ctlMapRep:
		c.rkey = binary.BigEndian.Uint32(b[4:])
		c.status = b[8]
		c.access = verbs.Access(b[9])
		c.addr = binary.BigEndian.Uint64(b[12:])
		c.size = binary.BigEndian.Uint64(b[20:])
		if c.status > mapNoAccess {
			return c, fmt.Errorf("%w: map reply status %d", errPeer, c.status)
		}
	}
	return c, nil
}

// Request ring slot header (the payload of a SEND follows it).
const (
	slotOffOp   = 0
	slotOffLen  = 4
	slotOffImm  = 8
	slotHdrLen  = 16
	slotOpSend  = 1
	slotOpImm   = 2 // WRITE WITH IMMEDIATE: the data is already in place, length is its size
	maxQPN      = 1<<24 - 1
	maxRegion   = math.MaxInt32 // the largest AllocMR makes: a peer announcing more is lying, and maps address space
	maxSlots    = 1 << 16
	maxSlotSize = 1 << 20
)

// slotHdr is a slot header copied out of shared memory.
type slotHdr struct {
	op  uint8
	len uint32
	imm uint32
}

// parseSlot decodes and validates a slot header against the ring's slot size; the
// peer may have written anything there.
func parseSlot(b []byte, slotSize int) (slotHdr, error) {
	var h slotHdr
	if len(b) < slotHdrLen {
		return h, fmt.Errorf("%w: short slot", errPeer)
	}
	h.op = b[slotOffOp]
	h.len = binary.LittleEndian.Uint32(b[slotOffLen:])
	h.imm = binary.LittleEndian.Uint32(b[slotOffImm:])
	switch h.op {
	case slotOpSend:
		if int64(h.len) > int64(slotSize-slotHdrLen) {
			return h, fmt.Errorf("%w: send of %d bytes in a %d-byte slot", errPeer, h.len, slotSize)
		}
	case slotOpImm:
		if h.len > 1<<31 {
			return h, fmt.Errorf("%w: write length %d", errPeer, h.len)
		}
	default:
		return h, fmt.Errorf("%w: slot opcode %d", errPeer, h.op)
	}
	return h, nil
}

func putSlot(b []byte, h slotHdr) {
	b[slotOffOp] = h.op
	b[1], b[2], b[3] = 0, 0, 0
	binary.LittleEndian.PutUint32(b[slotOffLen:], h.len)
	binary.LittleEndian.PutUint32(b[slotOffImm:], h.imm)
}
