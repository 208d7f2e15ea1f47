// The CLC Accept and Confirm: each side's RoCE identity, queue pair and RMB.
// Implements RFC 7609 §3.7.2 (SMC Accept) and §3.7.3 (SMC Confirm).

package clc

import (
	"encoding/binary"
	"fmt"
)

// Accept/Confirm sizes and offsets.
const (
	// AcceptConfirmLen is an Accept or Confirm without extension area.
	AcceptConfirmLen = 68

	acOffQPN       = 38
	acOffRKey      = 41
	acOffRMBEIdx   = 45
	acOffToken     = 46
	acOffSizeMTU   = 50
	acOffReserved1 = 51
	acOffRMBAddr   = 52
	acOffReserved2 = 60
	acOffPSN       = 61
	acOffExt       = 64

	// MaxSizeCode is the largest size code the nibble holds; Linux caps SMC-R
	// RMBEs at LinuxMaxSizeCode (512 KiB).
	MaxSizeCode      = 15
	LinuxMaxSizeCode = 5

	max24 = 1<<24 - 1
)

// MTU codes (IB path MTU) as carried in the low nibble of byte 50.
const (
	MTU256  = 1
	MTU512  = 2
	MTU1024 = 3
	MTU2048 = 4
	MTU4096 = 5
)

// MTUBytes returns the MTU of code in bytes, 0 for a code outside 1..5.
func MTUBytes(code uint8) int {
	if code < MTU256 || code > MTU4096 {
		return 0
	}
	return 128 << code
}

// RMBESize returns the RMBE size of a size code: 16 KiB << code.
func RMBESize(code uint8) int { return 16 << 10 << code }

// SizeCode returns the smallest size code whose RMBE holds n bytes, as Linux rounds
// sizes up to a power of two; n beyond 16 KiB << MaxSizeCode gives MaxSizeCode+1.
func SizeCode(n int) uint8 {
	var c uint8
	for c <= MaxSizeCode && RMBESize(c) < n {
		c++
	}
	return c
}

// LinkInfo is the body shared by Accept and Confirm: the sender's values.
type LinkInfo struct {
	PeerID PeerID
	GID    [16]byte
	MAC    [6]byte

	QPN        uint32 // 24 bits
	RKey       uint32 // of the sender's RMB
	RMBEIndex  uint8  // Linux always sends 1; the engine must check it
	AlertToken uint32 // connection id carried in every CDC
	SizeCode   uint8  // RMBE size = 16 KiB << SizeCode, at most MaxSizeCode
	MTU        uint8  // MTU code 1..5
	RMBAddr    uint64 // virtual address of the RMB
	PSN        uint32 // initial packet sequence number, 24 bits

	// FirstContact is the header flag: this connection creates the link group.
	FirstContact bool

	// Ext is the extension area between byte 64 and the trailer in version 1.
	// smcr sends it only to a peer whose Proposal carried our extension; it holds
	// an Envelope.
	Ext []byte

	// V2 is set exactly for a version-2 message: its EID, first-contact extension
	// and GID list; Ext is then nil.
	V2 *LinkInfoV2
}

// Validate checks the size code against the engine's bound (at most MaxSizeCode);
// Parse has checked everything else the wire format fixes.
func (l *LinkInfo) Validate(maxSizeCode uint8) error {
	if l.SizeCode > min(maxSizeCode, MaxSizeCode) {
		return fmt.Errorf("clc: size code %d > %d: %w", l.SizeCode, min(maxSizeCode, MaxSizeCode), ErrInvalid)
	}
	return nil
}

// Len is the encoded length of an Accept; a Confirm may differ (encodedLen).
func (l *LinkInfo) Len() int { return l.encodedLen(TypeAccept) }

func (l *LinkInfo) encodedLen(t MsgType) int {
	if l.V2 != nil {
		return l.lenV2(t)
	}
	return AcceptConfirmLen + len(l.Ext)
}

func (l *LinkInfo) appendTo(b []byte, t MsgType) ([]byte, error) {
	n := l.encodedLen(t)
	switch {
	case l.QPN > max24:
		return b, fmt.Errorf("clc: %v: qpn %#x over 24 bits: %w", t, l.QPN, ErrInvalid)
	case l.PSN > max24:
		return b, fmt.Errorf("clc: %v: psn %#x over 24 bits: %w", t, l.PSN, ErrInvalid)
	case MTUBytes(l.MTU) == 0:
		return b, fmt.Errorf("clc: %v: mtu code %d: %w", t, l.MTU, ErrInvalid)
	case l.SizeCode > MaxSizeCode:
		return b, fmt.Errorf("clc: %v: size code %d: %w", t, l.SizeCode, ErrInvalid)
	case n > MaxLen:
		return b, fmt.Errorf("clc: %v: length %d > %d: %w", t, n, MaxLen, ErrInvalid)
	}
	var flags uint8
	if l.FirstContact {
		flags = flagBit
	}
	version := uint8(Version1)
	if l.V2 != nil {
		version = Version2
	}
	start := len(b)
	b = appendHeader(b, t, n, version, flags|uint8(SMCTypeR))
	var body [acOffExt - HeaderLen]byte
	f := body[:]
	const o = HeaderLen // offsets below are of the message, f starts after the header
	copy(f[offPeerID-o:], l.PeerID[:])
	copy(f[offGID-o:], l.GID[:])
	copy(f[offMAC-o:], l.MAC[:])
	put24(f[acOffQPN-o:], l.QPN)
	binary.BigEndian.PutUint32(f[acOffRKey-o:], l.RKey)
	f[acOffRMBEIdx-o] = l.RMBEIndex
	binary.BigEndian.PutUint32(f[acOffToken-o:], l.AlertToken)
	f[acOffSizeMTU-o] = l.SizeCode<<4 | l.MTU
	binary.BigEndian.PutUint64(f[acOffRMBAddr-o:], l.RMBAddr)
	put24(f[acOffPSN-o:], l.PSN)
	b = append(b, f...)
	if l.V2 != nil {
		var err error
		if b, err = l.appendV2(b, t); err != nil {
			return b[:start], err
		}
		return appendTrailer(b), nil
	}
	b = append(b, l.Ext...)
	return appendTrailer(b), nil
}

// parseLinkInfo parses b, whose header, length and trailer Parse has checked.
func parseLinkInfo(h Header, b []byte) (LinkInfo, error) {
	if t := SMCType(h.Flags & typeMask); t != SMCTypeR {
		// An SMC-D Accept has another layout: never read it as SMC-R.
		return LinkInfo{}, fmt.Errorf("clc: %v: smc type %d, not SMC-R: %w", h.Type, t, ErrMalformed)
	}
	l := LinkInfo{
		QPN:          get24(b[acOffQPN:]),
		RKey:         binary.BigEndian.Uint32(b[acOffRKey:]),
		RMBEIndex:    b[acOffRMBEIdx],
		AlertToken:   binary.BigEndian.Uint32(b[acOffToken:]),
		SizeCode:     b[acOffSizeMTU] >> 4,
		MTU:          b[acOffSizeMTU] & 0x0f,
		RMBAddr:      binary.BigEndian.Uint64(b[acOffRMBAddr:]),
		PSN:          get24(b[acOffPSN:]),
		FirstContact: h.Flags&flagBit != 0,
		Ext:          copyBytes(b[acOffExt : len(b)-TrailerLen]),
	}
	copy(l.PeerID[:], b[offPeerID:])
	copy(l.GID[:], b[offGID:])
	copy(l.MAC[:], b[offMAC:])
	if MTUBytes(l.MTU) == 0 {
		return LinkInfo{}, fmt.Errorf("clc: %v: mtu code %d: %w", h.Type, l.MTU, ErrMalformed)
	}
	if h.Version >= Version2 {
		if err := parseLinkInfoV2(h, b, &l); err != nil {
			return LinkInfo{}, err
		}
	}
	return l, nil
}

// Accept is the server's answer to a Proposal, carrying the server's values.
type Accept struct{ LinkInfo }

// Type reports TypeAccept.
func (*Accept) Type() MsgType { return TypeAccept }

// AppendTo appends the encoded Accept to b.
func (m *Accept) AppendTo(b []byte) ([]byte, error) { return m.appendTo(b, TypeAccept) }

// Confirm is the client's answer to an Accept, carrying the client's values.
type Confirm struct{ LinkInfo }

// Type reports TypeConfirm.
func (*Confirm) Type() MsgType { return TypeConfirm }

// Len is the encoded length; a version-2 first-contact Confirm carries a GID list.
func (m *Confirm) Len() int { return m.encodedLen(TypeConfirm) }

// AppendTo appends the encoded Confirm to b.
func (m *Confirm) AppendTo(b []byte) ([]byte, error) { return m.appendTo(b, TypeConfirm) }
