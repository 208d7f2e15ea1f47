// CLC header and trailer, message types, the type switch of Parse, and the errors.
// Implements the common framing of RFC 7609 §3.7 (CLC message header and trailer).

package clc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Eyecatcher is "SMCR" in EBCDIC; it opens and closes every CLC message.
var Eyecatcher = [4]byte{0xE2, 0xD4, 0xC3, 0xD9}

// MsgType is the CLC message type at byte 4 of the header.
type MsgType uint8

const (
	TypeProposal MsgType = 1
	TypeAccept   MsgType = 2
	TypeConfirm  MsgType = 3
	TypeDecline  MsgType = 4
)

func (t MsgType) String() string {
	switch t {
	case TypeProposal:
		return "proposal"
	case TypeAccept:
		return "accept"
	case TypeConfirm:
		return "confirm"
	case TypeDecline:
		return "decline"
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// SMCType is the low two bits of the header's version byte (typev1 in Linux): which
// SMC variants the sender offers (Proposal) or chose (Accept, Confirm).
type SMCType uint8

const (
	SMCTypeR SMCType = 0 // SMC-R only
	SMCTypeD SMCType = 1 // SMC-D only
	SMCTypeN SMCType = 2 // neither
	SMCTypeB SMCType = 3 // both
)

// CLC versions: the high nibble of the header's byte 7.
const (
	Version1 = 1
	// Version2 is SMC version 2 (SMC-Rv2: RoCE v2 GIDs, EIDs); its releases
	// (2.0, 2.1) are negotiated in the v2 extensions, not in the header.
	Version2 = 2
)

// Sizes and header offsets.
const (
	HeaderLen  = 8
	TrailerLen = 4

	offType    = 4
	offLength  = 5
	offVersion = 7
	offPeerID  = 8
	offGID     = 16
	offMAC     = 32

	flagBit    = 0x08 // first contact (Accept, Confirm), out of sync (Decline); the high bit of typev2
	reservedBt = 0x04
	typeMask   = 0x03

	// MaxLen bounds every CLC message this package parses or builds. Linux's largest
	// (a version-2 Proposal with every EID) stays well below; it leaves room for this
	// project's extension area. ReadMessage never allocates more.
	MaxLen = 4096
)

// PeerID identifies a host: 2 random bytes and the 6-byte MAC of its first active
// RoCE port (Linux's local_systemid).
type PeerID [8]byte

func (p PeerID) String() string { return fmt.Sprintf("%x", p[:]) }

// Errors callers branch on (errors.Is). Parse and ReadMessage wrap them with the
// message type and the detail; truncated input wraps io.ErrUnexpectedEOF instead.
var (
	ErrEyecatcher  = errors.New("wrong eyecatcher")
	ErrTrailer     = errors.New("wrong trailer eyecatcher")
	ErrUnknownType = errors.New("unknown message type")
	ErrVersion     = errors.New("unsupported version")
	ErrTooShort    = errors.New("length too short for the message type")
	ErrTooLong     = errors.New("length too long for the message type")
	ErrMalformed   = errors.New("malformed message")
	// ErrInvalid is returned by AppendTo for a field that cannot be encoded.
	ErrInvalid = errors.New("invalid field")
)

// Message is a parsed CLC message: *Proposal, *Accept, *Confirm or *Decline.
type Message interface {
	Type() MsgType
	// Len is the encoded length, trailer included.
	Len() int
	// AppendTo appends the encoded message to b. It fails, leaving b as it was,
	// only for a field that does not fit the wire format.
	AppendTo(b []byte) ([]byte, error)
}

// lengthBounds is the smallest and largest length field a message type allows in
// a version (1, or 2 and up).
func lengthBounds(t MsgType, version uint8) (lo, hi int, ok bool) {
	v2 := version >= Version2
	switch {
	case t == TypeProposal && v2:
		return proposalV2MinLen, MaxLen, true
	case t == TypeProposal:
		return ProposalMinLen, MaxLen, true
	case (t == TypeAccept || t == TypeConfirm) && v2:
		return AcceptConfirmV2Len, MaxLen, true
	case t == TypeAccept || t == TypeConfirm:
		return AcceptConfirmLen, MaxLen, true
	case t == TypeDecline && v2:
		return DeclineV2Len, DeclineV2Len, true
	case t == TypeDecline:
		return DeclineLen, DeclineLen, true
	}
	return 0, 0, false
}

// Header is the fixed 8-byte header, as ReadMessage sees it before the body.
type Header struct {
	Type    MsgType
	Length  int   // whole message, trailer included
	Version uint8 // high nibble of byte 7
	Flags   uint8 // low nibble of byte 7
}

// ParseHeader checks the eyecatcher, the type, the version and the length bounds of
// the type; b must hold at least HeaderLen bytes.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, fmt.Errorf("clc: header: %w", io.ErrUnexpectedEOF)
	}
	if [4]byte(b[:4]) != Eyecatcher {
		return Header{}, fmt.Errorf("clc: header % x: %w", b[:4], ErrEyecatcher)
	}
	h := Header{
		Type:    MsgType(b[offType]),
		Length:  int(binary.BigEndian.Uint16(b[offLength:])),
		Version: b[offVersion] >> 4,
		Flags:   b[offVersion] & 0x0f,
	}
	lo, hi, ok := lengthBounds(h.Type, h.Version)
	if !ok {
		return h, fmt.Errorf("clc: header: %d: %w", b[offType], ErrUnknownType)
	}
	// A Proposal of a version above 2 is read as version 2, as Linux reads it (a
	// newer peer offers what it can down to ours); answers are version 1 or 2.
	if h.Version < Version1 || (h.Type != TypeProposal && h.Version > Version2) {
		return h, fmt.Errorf("clc: %v version %d: %w", h.Type, h.Version, ErrVersion)
	}
	if h.Length < lo {
		return h, fmt.Errorf("clc: %v length %d < %d: %w", h.Type, h.Length, lo, ErrTooShort)
	}
	if h.Length > hi {
		return h, fmt.Errorf("clc: %v length %d > %d: %w", h.Type, h.Length, hi, ErrTooLong)
	}
	return h, nil
}

// Parse parses exactly one CLC message filling all of b. The result shares no
// memory with b.
func Parse(b []byte) (Message, error) {
	h, err := ParseHeader(b)
	if err != nil {
		return nil, err
	}
	if len(b) < h.Length {
		return nil, fmt.Errorf("clc: %v: %d of %d bytes: %w", h.Type, len(b), h.Length, io.ErrUnexpectedEOF)
	}
	if len(b) > h.Length {
		return nil, fmt.Errorf("clc: %v: %d bytes after the message: %w", h.Type, len(b)-h.Length, ErrMalformed)
	}
	if [4]byte(b[len(b)-TrailerLen:]) != Eyecatcher {
		return nil, fmt.Errorf("clc: %v trailer % x: %w", h.Type, b[len(b)-TrailerLen:], ErrTrailer)
	}
	switch h.Type {
	case TypeProposal:
		p, err := parseProposal(h, b)
		if err != nil {
			return nil, err // never a typed nil in the interface
		}
		return p, nil
	case TypeAccept:
		l, err := parseLinkInfo(h, b)
		if err != nil {
			return nil, err
		}
		return &Accept{l}, nil
	case TypeConfirm:
		l, err := parseLinkInfo(h, b)
		if err != nil {
			return nil, err
		}
		return &Confirm{l}, nil
	default: // TypeDecline; ParseHeader let no other type through
		return parseDecline(h, b), nil
	}
}

// appendHeader appends a header for a message of n bytes in all.
func appendHeader(b []byte, t MsgType, n int, version, flags uint8) []byte {
	b = append(b, Eyecatcher[:]...)
	b = append(b, byte(t))
	b = binary.BigEndian.AppendUint16(b, uint16(n))
	return append(b, version<<4|flags&0x0f)
}

func appendTrailer(b []byte) []byte { return append(b, Eyecatcher[:]...) }

// copyBytes returns a copy of b, nil for an empty b.
func copyBytes(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

func put24(b []byte, v uint32) { b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v) }

func get24(b []byte) uint32 { return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]) }
