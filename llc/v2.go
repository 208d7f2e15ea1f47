// LLC version 2 (SMC-Rv2): the 0x2X types, the 16-bit length, ADD_LINK with its
// rkey list, REQ_ADD_LINK, DELETE_RKEY and CONFIRM_LINK's max conns, as Linux 6.x
// writes them (net/smc/smc_llc.c), checked against its bytes on soft-RoCE.

package llc

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Version-2 types: the version-1 type with 0x20 set (Linux SMC_LLC_*_V2).
const (
	TypeConfirmLinkV2 = typeV2Bit | TypeConfirmLink
	TypeAddLinkV2     = typeV2Bit | TypeAddLink
	TypeDeleteLinkV2  = typeV2Bit | TypeDeleteLink
	TypeReqAddLinkV2  = typeV2Bit | 0x05 // REQ_ADD_LINK exists in version 2 only
	TypeConfirmRkeyV2 = typeV2Bit | TypeConfirmRkey
	TypeTestLinkV2    = typeV2Bit | TypeTestLink
	TypeDeleteRkeyV2  = typeV2Bit | TypeDeleteRkey

	typeV2Bit Type = 0x20
)

// Version-2 sizes. A version-2 message is at least MsgLen bytes; ADD_LINK,
// REQ_ADD_LINK and DELETE_RKEY may be longer and then travel in Linux's separate
// 8 KiB buffer, so a receiver must post buffers of MaxV2Len.
const (
	MaxV2Len = 8192 // SMC_WR_BUF_V2_SIZE

	offLengthV2 = 1 // 2 bytes, little-endian: Linux writes its u16 length_v2 in host order

	alv2Direct     = 44 // 0x80: v2_direct
	alv2TargetGID  = 46
	alv2NumRkeys   = 70 // 2 bytes, little-endian as Linux writes it
	alv2Rkeys      = 72
	rkeyV2EntryLen = 16

	rav2GIDCount = 24
	rav2GIDs     = 28

	drv2Count   = 4
	drv2Invalid = 5
	drv2Rkeys   = 8

	clMaxConns = 35

	// MaxAddLinkV2Rkeys is how many rkey entries fit one ADD_LINK in MaxV2Len.
	MaxAddLinkV2Rkeys = (MaxV2Len - alv2Rkeys) / rkeyV2EntryLen
	// MaxReqAddLinkGIDs bounds REQ_ADD_LINK's GID list (Linux sends one per device).
	MaxReqAddLinkGIDs = 8
)

// ErrNotV2 is returned by ParseV2 for a message that is not of version 2.
var ErrNotV2 = errors.New("llc: not a version-2 message")

// HeaderV2 is a version-2 message's header: type, length, flags.
type HeaderV2 struct {
	Type   Type
	Length int
	Flags  Flags
}

// ParseHeaderV2 reads the header of a version-2 message in b and checks that its
// length is at least MsgLen, at most MaxV2Len and within b.
func ParseHeaderV2(b []byte) (HeaderV2, error) {
	if len(b) < MsgLen {
		return HeaderV2{}, fmt.Errorf("%w: %d bytes", ErrShort, len(b))
	}
	h := HeaderV2{Type: Type(b[offType]), Length: int(binary.LittleEndian.Uint16(b[offLengthV2:])), Flags: Flags(b[offFlags])}
	switch {
	case h.Type&0xf0 != typeV2Bit:
		return h, fmt.Errorf("%w: type 0x%02x", ErrNotV2, uint8(h.Type))
	case h.Length < MsgLen || h.Length > MaxV2Len || h.Length > len(b):
		return h, fmt.Errorf("%w: %v length %d of %d bytes", ErrLength, h.Type, h.Length, len(b))
	}
	return h, nil
}

func headerV2(b []byte, t Type, n int, f Flags) {
	b[offType] = byte(t)
	binary.LittleEndian.PutUint16(b[offLengthV2:], uint16(n))
	b[offFlags] = byte(f)
}

// MessageV2 is a decoded version-2 message: *ConfirmLinkV2, *AddLinkV2,
// *ReqAddLinkV2 or *DeleteRkeyV2.
type MessageV2 interface {
	Type() Type
	// Len is the encoded length, the header's length field.
	Len() int
	// AppendBinary appends the encoding to b.
	AppendBinary(b []byte) ([]byte, error)
}

// ParseV2 decodes the version-2 message at the start of b (a receive buffer; bytes
// after the length field's count are ignored). Every count is checked against
// that length.
func ParseV2(b []byte) (MessageV2, error) {
	h, err := ParseHeaderV2(b)
	if err != nil {
		return nil, err
	}
	b = b[:h.Length]
	var m MessageV2
	switch h.Type {
	case TypeConfirmLinkV2:
		m, err = nonNil(parseConfirmLinkV2(h, b))
	case TypeAddLinkV2:
		m, err = nonNil(parseAddLinkV2(h, b))
	case TypeReqAddLinkV2:
		m, err = nonNil(parseReqAddLinkV2(h, b))
	case TypeDeleteRkeyV2:
		m, err = nonNil(parseDeleteRkeyV2(h, b))
	default:
		err = fmt.Errorf("%w: 0x%02x", ErrUnknownType, uint8(h.Type))
	}
	return m, err
}

// nonNil returns m as a MessageV2, or a nil interface (never a typed nil) with err.
func nonNil[T MessageV2](m T, err error) (MessageV2, error) {
	if err != nil {
		return nil, err
	}
	return m, nil
}

// asV1 returns a copy of a 44-byte version-2 message's first 44 bytes as the
// version-1 message of the same layout, for the version-1 Decode.
func asV1(b []byte, t Type) [MsgLen]byte {
	var v1 [MsgLen]byte
	copy(v1[:], b[:MsgLen])
	v1[offType], v1[offLength], v1[offReason] = byte(t), MsgLen, 0
	return v1
}

// encodeV1Body encodes m as version 1 into the first 44 bytes of out and gives
// them version 2's header.
func encodeV1Body(out []byte, m Message, t Type, n int, f Flags) error {
	if err := m.Encode(out); err != nil {
		return err
	}
	headerV2(out, t, n, f)
	return nil
}

// ConfirmLinkV2 is CONFIRM_LINK of version 2: version 1's fields and, in release
// 2.1, the max conns the server chose (byte 35).
type ConfirmLinkV2 struct {
	ConfirmLink
	MaxConns uint8
}

func (*ConfirmLinkV2) Type() Type { return TypeConfirmLinkV2 }
func (*ConfirmLinkV2) Len() int   { return MsgLen }

func parseConfirmLinkV2(h HeaderV2, b []byte) (*ConfirmLinkV2, error) {
	if h.Length != MsgLen {
		return nil, fmt.Errorf("%w: CONFIRM_LINK v2 length %d", ErrLength, h.Length)
	}
	m := &ConfirmLinkV2{MaxConns: b[clMaxConns]}
	v1 := asV1(b, TypeConfirmLink)
	if err := m.ConfirmLink.Decode(v1[:]); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *ConfirmLinkV2) AppendBinary(b []byte) ([]byte, error) {
	var out [MsgLen]byte
	if err := encodeV1Body(out[:], &m.ConfirmLink, TypeConfirmLinkV2, MsgLen, m.Flags); err != nil {
		return b, err
	}
	out[clMaxConns] = m.MaxConns
	return append(b, out[:]...), nil
}

// RkeyV2 is one entry of ADD_LINK v2's rkey list: an RMB's rkey on the existing
// link, and its rkey and address on the new one.
type RkeyV2 struct {
	Rkey    uint32
	NewRkey uint32
	NewAddr uint64
}

// AddLinkV2 is ADD_LINK of version 2: version 1's fields and, except in a 44-byte
// rejection, an extension at byte 44 with the RMBs' rkeys for the new link in
// place of ADD_LINK_CONT:
//
//	44 flags (0x80 v2_direct)  45 reserved  46 target GID (16)  62 reserved (8)
//	70 rkey count (2, little-endian)  72 {rkey, new rkey, new address} (16 each)
type AddLinkV2 struct {
	AddLink
	// Ext is false for the 44-byte form: a rejection, or a request without QP.
	Ext       bool
	Direct    bool
	TargetGID GID
	Rkeys     []RkeyV2
}

func (*AddLinkV2) Type() Type { return TypeAddLinkV2 }

func (m *AddLinkV2) Len() int {
	if !m.Ext {
		return MsgLen
	}
	return alv2Rkeys + rkeyV2EntryLen*len(m.Rkeys)
}

func parseAddLinkV2(h HeaderV2, b []byte) (*AddLinkV2, error) {
	m := &AddLinkV2{}
	v1 := asV1(b, TypeAddLink)
	if err := m.AddLink.Decode(v1[:]); err != nil {
		return nil, err
	}
	m.RejectReason = 0 // byte 2 is the length's high byte in version 2
	if h.Length == MsgLen {
		return m, nil
	}
	if h.Length < alv2Rkeys {
		return nil, fmt.Errorf("%w: ADD_LINK v2 length %d", ErrLength, h.Length)
	}
	n := int(binary.LittleEndian.Uint16(b[alv2NumRkeys:]))
	if h.Length != alv2Rkeys+rkeyV2EntryLen*n {
		return nil, fmt.Errorf("%w: ADD_LINK v2 %d rkeys in %d bytes", ErrCount, n, h.Length)
	}
	m.Ext, m.Direct = true, b[alv2Direct]&0x80 != 0
	m.TargetGID = GID(b[alv2TargetGID : alv2TargetGID+16])
	if n > 0 {
		m.Rkeys = make([]RkeyV2, n)
		for i := range m.Rkeys {
			e := b[alv2Rkeys+rkeyV2EntryLen*i:]
			m.Rkeys[i] = RkeyV2{Rkey: be.Uint32(e), NewRkey: be.Uint32(e[4:]), NewAddr: be.Uint64(e[8:])}
		}
	}
	return m, nil
}

func (m *AddLinkV2) AppendBinary(b []byte) ([]byte, error) {
	switch {
	case !m.Ext && (m.Direct || m.TargetGID != GID{} || len(m.Rkeys) > 0):
		return b, fmt.Errorf("llc: encode ADD_LINK v2: %w: extension fields in the 44-byte form", ErrField)
	case len(m.Rkeys) > MaxAddLinkV2Rkeys:
		return b, fmt.Errorf("llc: encode ADD_LINK v2: %w: %d rkeys > %d", ErrCount, len(m.Rkeys), MaxAddLinkV2Rkeys)
	case m.RejectReason != 0:
		return b, fmt.Errorf("llc: encode ADD_LINK v2: %w: no reject reason in version 2's header", ErrField)
	}
	n := m.Len()
	out := make([]byte, n)
	if err := encodeV1Body(out, &m.AddLink, TypeAddLinkV2, n, m.Flags); err != nil {
		return b, err
	}
	if m.Ext {
		if m.Direct {
			out[alv2Direct] = 0x80
		}
		copy(out[alv2TargetGID:], m.TargetGID[:])
		binary.LittleEndian.PutUint16(out[alv2NumRkeys:], uint16(len(m.Rkeys)))
		for i, r := range m.Rkeys {
			e := out[alv2Rkeys+rkeyV2EntryLen*i:]
			be.PutUint32(e, r.Rkey)
			be.PutUint32(e[4:], r.NewRkey)
			be.PutUint64(e[8:], r.NewAddr)
		}
	}
	return append(b, out...), nil
}

// ReqAddLinkV2 is REQ_ADD_LINK (0x25): a client with more devices asks the server
// to add links, naming its GIDs:
//
//	4 reserved (20)  24 GID count  25 reserved (3)  28 GIDs (16 each)
//
// Its length is 28 + 16 per GID, at least 44.
type ReqAddLinkV2 struct {
	Flags Flags
	GIDs  []GID
}

func (*ReqAddLinkV2) Type() Type { return TypeReqAddLinkV2 }

func (m *ReqAddLinkV2) Len() int { return max(MsgLen, rav2GIDs+16*len(m.GIDs)) }

func parseReqAddLinkV2(h HeaderV2, b []byte) (*ReqAddLinkV2, error) {
	n := int(b[rav2GIDCount])
	if n > MaxReqAddLinkGIDs || h.Length != max(MsgLen, rav2GIDs+16*n) {
		return nil, fmt.Errorf("%w: REQ_ADD_LINK %d gids in %d bytes", ErrCount, n, h.Length)
	}
	m := &ReqAddLinkV2{Flags: h.Flags}
	if n > 0 {
		m.GIDs = make([]GID, n)
		for i := range m.GIDs {
			m.GIDs[i] = GID(b[rav2GIDs+16*i:])
		}
	}
	return m, nil
}

func (m *ReqAddLinkV2) AppendBinary(b []byte) ([]byte, error) {
	if len(m.GIDs) > MaxReqAddLinkGIDs {
		return b, fmt.Errorf("llc: encode REQ_ADD_LINK: %w: %d gids > %d", ErrCount, len(m.GIDs), MaxReqAddLinkGIDs)
	}
	out := make([]byte, m.Len())
	headerV2(out, TypeReqAddLinkV2, len(out), m.Flags)
	out[rav2GIDCount] = byte(len(m.GIDs))
	for i, g := range m.GIDs {
		copy(out[rav2GIDs+16*i:], g[:])
	}
	return append(b, out...), nil
}

// DeleteRkeyV2 is DELETE_RKEY of version 2: a count, the count of rkeys the
// responder could not delete, and the rkeys, 4 bytes each from byte 8. Its length
// is 8 + 4 per rkey, at least 44 (Linux pads to 44).
type DeleteRkeyV2 struct {
	Flags   Flags
	Invalid uint8 // response: how many of the rkeys were not deleted
	Rkeys   []uint32
}

func (*DeleteRkeyV2) Type() Type { return TypeDeleteRkeyV2 }

func (m *DeleteRkeyV2) Len() int { return max(MsgLen, drv2Rkeys+4*len(m.Rkeys)) }

func parseDeleteRkeyV2(h HeaderV2, b []byte) (*DeleteRkeyV2, error) {
	n := int(b[drv2Count])
	if h.Length != max(MsgLen, drv2Rkeys+4*n) {
		return nil, fmt.Errorf("%w: DELETE_RKEY v2 %d rkeys in %d bytes", ErrCount, n, h.Length)
	}
	m := &DeleteRkeyV2{Flags: h.Flags, Invalid: b[drv2Invalid]}
	if n > 0 {
		m.Rkeys = make([]uint32, n)
		for i := range m.Rkeys {
			m.Rkeys[i] = be.Uint32(b[drv2Rkeys+4*i:])
		}
	}
	return m, nil
}

func (m *DeleteRkeyV2) AppendBinary(b []byte) ([]byte, error) {
	if len(m.Rkeys) > 255 {
		return b, fmt.Errorf("llc: encode DELETE_RKEY v2: %w: %d rkeys > 255", ErrCount, len(m.Rkeys))
	}
	out := make([]byte, m.Len())
	headerV2(out, TypeDeleteRkeyV2, len(out), m.Flags)
	out[drv2Count], out[drv2Invalid] = byte(len(m.Rkeys)), m.Invalid
	for i, r := range m.Rkeys {
		be.PutUint32(out[drv2Rkeys+4*i:], r)
	}
	return append(b, out...), nil
}
