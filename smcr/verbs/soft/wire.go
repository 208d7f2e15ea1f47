// The soft transport's frame header: a pure codec, no I/O. It carries what the
// InfiniBand base transport header, RETH, ImmDt and AETH carry for the RC
// operations SMC-R uses (RFC 7609 §2.1: RDMA WRITE, WRITE WITH IMM, SEND).

package soft

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Frame types.
const (
	frameWrite    = 1  // RDMA WRITE: payload lands at addr under rkey
	frameWriteImm = 2  // RDMA WRITE WITH IMMEDIATE: as WRITE, then consumes a RECV
	frameSend     = 3  // SEND: payload scattered into the next RECV
	frameAck      = 16 // responder executed the request with this PSN
	frameNak      = 17 // responder refused the request with this PSN; syndrome says why
	frameHello    = 32 // first frame of a request stream: names the target QP
	frameHelloOK  = 33 // the responder attached the stream to the QP
)

// NAK syndromes (the AETH NAK codes of the InfiniBand spec, renumbered).
const (
	nakRNR       = 1 // receiver not ready: no RECV posted; retry later
	nakRemAccess = 2 // bad rkey, bounds or permission: nothing written
	nakInvReq    = 3 // invalid request (the RECV was too small)
	nakRemOp     = 4 // the responder could not complete the operation
)

// Header layout, big-endian (see the package doc for the drawing).
const (
	offType     = 0
	offSyndrome = 1
	offReserved = 2 // 2 bytes, zero
	offPSN      = 4
	offAddr     = 8
	offRKey     = 16
	offImm      = 20
	offLength   = 24
	headerLen   = 28
)

const (
	helloMagic   = 0x534f4654 // "SOFT", in the rkey field of a hello
	helloVersion = 1          // in the imm field of a hello
	psnMask      = 0xFFFFFF
	// maxMessage bounds one request's payload, as IB bounds a message at 2^31 bytes.
	maxMessage = 1 << 31
)

// errFrame is wrapped by every header the codec refuses.
var errFrame = errors.New("soft: malformed frame")

// header is one decoded frame header.
type header struct {
	typ      uint8
	syndrome uint8
	psn      uint32
	addr     uint64 // WRITE*: remote address; HELLO: src QPN << 32 | dst QPN
	rkey     uint32
	imm      uint32
	length   uint32 // payload bytes that follow the header
}

// put encodes h into b[:headerLen].
func (h *header) put(b []byte) {
	_ = b[headerLen-1]
	b[offType] = h.typ
	b[offSyndrome] = h.syndrome
	binary.BigEndian.PutUint16(b[offReserved:], 0)
	binary.BigEndian.PutUint32(b[offPSN:], h.psn)
	binary.BigEndian.PutUint64(b[offAddr:], h.addr)
	binary.BigEndian.PutUint32(b[offRKey:], h.rkey)
	binary.BigEndian.PutUint32(b[offImm:], h.imm)
	binary.BigEndian.PutUint32(b[offLength:], h.length)
}

// parseHeader decodes and validates b[:headerLen]. Fields a type does not use must
// be zero, so a header that parses re-encodes to the same bytes.
func parseHeader(b []byte, h *header) error {
	if len(b) < headerLen {
		return fmt.Errorf("%w: %d bytes, want %d", errFrame, len(b), headerLen)
	}
	*h = header{
		typ:      b[offType],
		syndrome: b[offSyndrome],
		psn:      binary.BigEndian.Uint32(b[offPSN:]),
		addr:     binary.BigEndian.Uint64(b[offAddr:]),
		rkey:     binary.BigEndian.Uint32(b[offRKey:]),
		imm:      binary.BigEndian.Uint32(b[offImm:]),
		length:   binary.BigEndian.Uint32(b[offLength:]),
	}
	if binary.BigEndian.Uint16(b[offReserved:]) != 0 {
		return fmt.Errorf("%w: reserved bytes set", errFrame)
	}
	if h.psn > psnMask {
		return fmt.Errorf("%w: psn %#x wider than 24 bits", errFrame, h.psn)
	}
	if h.length > maxMessage {
		return fmt.Errorf("%w: length %d over %d", errFrame, h.length, maxMessage)
	}
	if h.typ != frameNak && h.syndrome != 0 {
		return fmt.Errorf("%w: syndrome %d on type %d", errFrame, h.syndrome, h.typ)
	}
	switch h.typ {
	case frameWrite:
		if h.imm != 0 {
			return fmt.Errorf("%w: immediate on a WRITE", errFrame)
		}
	case frameWriteImm:
	case frameSend:
		if h.addr != 0 || h.rkey != 0 || h.imm != 0 {
			return fmt.Errorf("%w: address fields on a SEND", errFrame)
		}
	case frameAck, frameNak, frameHelloOK:
		if h.addr != 0 || h.rkey != 0 || h.imm != 0 || h.length != 0 {
			return fmt.Errorf("%w: fields set on a type %d frame", errFrame, h.typ)
		}
		if h.typ == frameNak && (h.syndrome < nakRNR || h.syndrome > nakRemOp) {
			return fmt.Errorf("%w: NAK syndrome %d", errFrame, h.syndrome)
		}
	case frameHello:
		if h.rkey != helloMagic || h.imm != helloVersion || h.length != 0 {
			return fmt.Errorf("%w: bad hello (magic %#x version %d)", errFrame, h.rkey, h.imm)
		}
		if src, dst := h.addr>>32, h.addr&0xFFFFFFFF; src == 0 || src > psnMask || dst == 0 || dst > psnMask {
			return fmt.Errorf("%w: hello QPNs %#x -> %#x", errFrame, src, dst)
		}
	default:
		return fmt.Errorf("%w: unknown type %d", errFrame, h.typ)
	}
	return nil
}

// isRequest reports whether t is a request a responder executes.
func isRequest(t uint8) bool { return t == frameWrite || t == frameWriteImm || t == frameSend }
