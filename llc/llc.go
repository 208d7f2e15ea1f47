// LLC message framing: the 4-byte common header, the type and flag values, field
// types, errors, and Parse. Implements RFC 7609 §3.8 / §4.7 (LLC message format).

package llc

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Sizes of the LLC wire format.
const (
	MsgLen  = 44 // every LLC message, and its length byte
	SlotLen = 48 // receive slot size on Linux (SMC_WR_BUF_SIZE); a slot may hold an LLC or a CDC message

	offType   = 0
	offLength = 1
	offReason = 2 // low nibble: ADD_LINK reject reason; high nibble reserved
	offFlags  = 3
	bodyOff   = 4 // first body byte

	maxU24 = 1<<24 - 1
)

// Type is the first byte of an LLC message.
type Type uint8

// LLC message types (Linux enum smc_llc_msg_type, version 1).
const (
	TypeConfirmLink     Type = 0x01
	TypeAddLink         Type = 0x02
	TypeAddLinkCont     Type = 0x03
	TypeDeleteLink      Type = 0x04
	TypeConfirmRkey     Type = 0x06
	TypeTestLink        Type = 0x07
	TypeConfirmRkeyCont Type = 0x08
	TypeDeleteRkey      Type = 0x09

	// TypeCDC is not an LLC message: CDC messages (package rmb) arrive in the same
	// receive slots, told apart by this first byte.
	TypeCDC Type = 0xFE
)

func (t Type) String() string {
	switch t {
	case TypeConfirmLink:
		return "CONFIRM_LINK"
	case TypeAddLink:
		return "ADD_LINK"
	case TypeAddLinkCont:
		return "ADD_LINK_CONT"
	case TypeDeleteLink:
		return "DELETE_LINK"
	case TypeConfirmRkey:
		return "CONFIRM_RKEY"
	case TypeTestLink:
		return "TEST_LINK"
	case TypeConfirmRkeyCont:
		return "CONFIRM_RKEY_CONT"
	case TypeDeleteRkey:
		return "DELETE_RKEY"
	case TypeCDC:
		return "CDC"
	case TypeConfirmLinkV2, TypeAddLinkV2, TypeDeleteLinkV2, TypeConfirmRkeyV2, TypeTestLinkV2, TypeDeleteRkeyV2:
		return (t &^ typeV2Bit).String() + "_V2"
	case TypeReqAddLinkV2:
		return "REQ_ADD_LINK_V2"
	}
	return fmt.Sprintf("type(0x%02x)", uint8(t))
}

// Flags is the header's flags byte. Bit meanings other than FlagResponse depend on
// the message type; the constants name the type they belong to.
type Flags uint8

const (
	FlagResponse Flags = 0x80 // every type: this answers a request

	FlagNoRMBEyecatcher Flags = 0x03 // CONFIRM_LINK: RMBEs carry no eyecatchers (Linux sets both bits)
	FlagAddLinkRejected Flags = 0x40 // ADD_LINK response: the new link is refused, see RejectReason
	FlagDeleteLinkAll   Flags = 0x40 // DELETE_LINK: delete every link, ending the link group
	FlagDeleteOrderly   Flags = 0x20 // DELETE_LINK: orderly, not after a failure
	FlagRkeyNegative    Flags = 0x20 // CONFIRM_RKEY(_CONT), DELETE_RKEY response: not (all) done
	FlagRkeyRetry       Flags = 0x10 // CONFIRM_RKEY(_CONT) negative response: try again later
)

// Response reports whether the response bit is set.
func (f Flags) Response() bool { return f&FlagResponse != 0 }

// QPN is an RC queue pair number (24 bits on the wire).
type QPN uint32

// PSN is an initial packet sequence number (24 bits on the wire).
type PSN uint32

// GID is an RDMA global identifier (for RoCE, an IPv6 or IPv4-mapped address).
type GID [16]byte

// MAC is an Ethernet address of a RoCE port.
type MAC [6]byte

// MTU is a path MTU code, as ADD_LINK carries it: 1..5 = 256..4096 bytes, as
// in InfiniBand; 0 where no QP is offered.
type MTU uint8

// The MTU codes.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Valid reports whether m is one of the codes.
func (m MTU) Valid() bool { return m >= MTU256 && m <= MTU4096 }

// LinkID is the link number the server assigns; unique within a link group.
type LinkID uint8

// LinkUID is a link's user ID (Linux: link-group ID + link number), kept for
// diagnostics.
type LinkUID [4]byte

// Errors callers branch on. Parse and Decode errors wrap one of these.
var (
	ErrShort       = errors.New("llc: message shorter than 44 bytes")
	ErrLength      = errors.New("llc: length field is not 44")
	ErrCDC         = errors.New("llc: CDC message, not LLC") // type 0xFE: hand to the CDC codec
	ErrUnknownType = errors.New("llc: unknown message type")
	ErrWrongType   = errors.New("llc: message has another type") // Decode on the wrong struct
	ErrCount       = errors.New("llc: count out of range")
	ErrMTU         = errors.New("llc: invalid MTU code")
	ErrField       = errors.New("llc: value does not fit its field") // encode only
)

// Message is one decoded LLC message: *ConfirmLink, *AddLink, *AddLinkCont,
// *DeleteLink, *ConfirmRkey, *TestLink, *ConfirmRkeyCont or *DeleteRkey.
type Message interface {
	// Type is the message's type byte.
	Type() Type
	// Response reports whether the message answers a request (flag 0x80).
	Response() bool
	// Encode writes the message into dst[:MsgLen], reserved bytes zeroed, without
	// allocating. dst must hold at least MsgLen bytes; bytes after MsgLen are left
	// alone. Nothing is written when it returns an error.
	Encode(dst []byte) error
	// AppendBinary appends the 44-byte encoding to b (encoding.BinaryAppender).
	AppendBinary(b []byte) ([]byte, error)
	// Decode parses b (at least MsgLen bytes) into the message, which must be of
	// b's type. It does not allocate.
	Decode(b []byte) error
}

// IsCDC reports whether b holds a CDC message rather than an LLC message: both share
// the receive slots, and only the first byte tells them apart.
func IsCDC(b []byte) bool { return len(b) > 0 && Type(b[offType]) == TypeCDC }

// PeekType checks the framing of b (size, length byte) and returns its type byte
// without decoding the body. A CDC message returns TypeCDC and no error.
func PeekType(b []byte) (Type, error) {
	if len(b) < MsgLen {
		return 0, fmt.Errorf("%w: %d bytes", ErrShort, len(b))
	}
	if b[offLength] != MsgLen {
		return 0, fmt.Errorf("%w: %d", ErrLength, b[offLength])
	}
	return Type(b[offType]), nil
}

// Parse decodes the LLC message at the start of b, a receive slot of at least MsgLen
// bytes (bytes after the 44th are ignored). A CDC message fails with ErrCDC, a type
// this package does not know with ErrUnknownType. Parse allocates the returned
// message only; use a type's Decode to avoid even that.
func Parse(b []byte) (Message, error) {
	t, err := PeekType(b)
	if err != nil {
		return nil, err
	}
	var m Message
	switch t {
	case TypeConfirmLink:
		m = new(ConfirmLink)
	case TypeAddLink:
		m = new(AddLink)
	case TypeAddLinkCont:
		m = new(AddLinkCont)
	case TypeDeleteLink:
		m = new(DeleteLink)
	case TypeConfirmRkey:
		m = new(ConfirmRkey)
	case TypeTestLink:
		m = new(TestLink)
	case TypeConfirmRkeyCont:
		m = new(ConfirmRkeyCont)
	case TypeDeleteRkey:
		m = new(DeleteRkey)
	case TypeCDC:
		return nil, ErrCDC
	default:
		return nil, fmt.Errorf("%w: 0x%02x", ErrUnknownType, uint8(t))
	}
	if err := m.Decode(b); err != nil {
		return nil, err
	}
	return m, nil
}

// checkFrame validates size, length byte and type for a Decode of type want.
func checkFrame(b []byte, want Type) error {
	t, err := PeekType(b)
	if err != nil {
		return err
	}
	if t == TypeCDC {
		return ErrCDC
	}
	if t != want {
		return fmt.Errorf("%w: %v, decoding %v", ErrWrongType, t, want)
	}
	return nil
}

// header zeroes dst[:MsgLen] and writes the common header; byte 2 carries reason
// (ADD_LINK only, zero elsewhere).
func header(dst []byte, t Type, reason uint8, f Flags) {
	clear(dst[:MsgLen])
	dst[offType] = byte(t)
	dst[offLength] = MsgLen
	dst[offReason] = reason
	dst[offFlags] = byte(f)
}

// checkDst reports a destination too small for one message.
func checkDst(dst []byte, t Type) error {
	if len(dst) < MsgLen {
		return fmt.Errorf("llc: encode %v: %w: buffer of %d bytes", t, ErrShort, len(dst))
	}
	return nil
}

// appendMsg implements AppendBinary for every type on top of Encode.
func appendMsg(b []byte, m Message) ([]byte, error) {
	n := len(b)
	if cap(b)-n < MsgLen {
		nb := make([]byte, n, n+MsgLen)
		copy(nb, b)
		b = nb
	}
	b = b[:n+MsgLen]
	if err := m.Encode(b[n:]); err != nil {
		return b[:n], err
	}
	return b, nil
}

func get24(b []byte) uint32 { return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]) }

func put24(b []byte, v uint32) {
	b[0] = byte(v >> 16)
	b[1] = byte(v >> 8)
	b[2] = byte(v)
}

var be = binary.BigEndian
