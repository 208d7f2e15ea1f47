// The CLC Decline, its diagnosis codes and the error that carries one.
// Implements RFC 7609 §3.7.4 (SMC Decline) with Linux's diagnosis codes (smc_clc.h).

package clc

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Decline sizes and offsets.
const (
	DeclineLen = 28

	declOffCode     = 16
	declOffReserved = 20 // Linux puts its OS type in the high nibble of byte 20
)

// DeclineCode is the diagnosis code of a Decline. The first byte is its class.
type DeclineCode uint32

// Decline codes (Linux SMC_CLC_DECL_*). Never renumber: they are on the wire.
const (
	DeclineNoMemory           DeclineCode = 0x01010000 // SMC_CLC_DECL_MEM
	DeclineTimeoutConfirmLink DeclineCode = 0x02010000 // SMC_CLC_DECL_TIMEOUT_CL
	DeclineTimeoutAddLink     DeclineCode = 0x02020000 // SMC_CLC_DECL_TIMEOUT_AL
	DeclineConfigError        DeclineCode = 0x03000000 // SMC_CLC_DECL_CNFERR
	DeclinePeerNoSMC          DeclineCode = 0x03010000 // SMC_CLC_DECL_PEERNOSMC
	DeclineIPsec              DeclineCode = 0x03020000 // SMC_CLC_DECL_IPSEC
	DeclineNoSMCDevice        DeclineCode = 0x03030000 // SMC_CLC_DECL_NOSMCDEV
	DeclineNoSMCDDevice       DeclineCode = 0x03030001 // SMC_CLC_DECL_NOSMCDDEV
	DeclineNoSMCRDevice       DeclineCode = 0x03030002 // SMC_CLC_DECL_NOSMCRDEV
	DeclineModeMismatch       DeclineCode = 0x03040000 // SMC_CLC_DECL_MODEUNSUPP
	DeclineRMBEEyecatcher     DeclineCode = 0x03050000 // SMC_CLC_DECL_RMBE_EC
	DeclineOptionUnsupported  DeclineCode = 0x03060000 // SMC_CLC_DECL_OPTUNSUPP
	DeclineIPSubnetMismatch   DeclineCode = 0x03070000 // SMC_CLC_DECL_DIFFPREFIX
	DeclineVLANError          DeclineCode = 0x03080000 // SMC_CLC_DECL_GETVLANERR
	DeclineNoActiveLink       DeclineCode = 0x030a0000 // SMC_CLC_DECL_NOACTLINK
	DeclineNoServerLink       DeclineCode = 0x030b0000 // SMC_CLC_DECL_NOSRVLINK
	DeclineVersionMismatch    DeclineCode = 0x030c0000 // SMC_CLC_DECL_VERSMISMAT
	DeclineSyncError          DeclineCode = 0x04000000 // SMC_CLC_DECL_SYNCERR; sets out of sync
	DeclinePeerDeclined       DeclineCode = 0x05000000 // SMC_CLC_DECL_PEERDECL
	DeclineInternal           DeclineCode = 0x09990000 // SMC_CLC_DECL_INTERR
	DeclineInternalRToken     DeclineCode = 0x09990001 // SMC_CLC_DECL_ERR_RTOK
	DeclineInternalReadyLink  DeclineCode = 0x09990002 // SMC_CLC_DECL_ERR_RDYLNK
	DeclineInternalRegBuf     DeclineCode = 0x09990003 // SMC_CLC_DECL_ERR_REGBUF
)

var declineNames = map[DeclineCode]string{
	DeclineNoMemory:           "insufficient memory",
	DeclineTimeoutConfirmLink: "timeout waiting for CONFIRM LINK",
	DeclineTimeoutAddLink:     "timeout waiting for ADD LINK",
	DeclineConfigError:        "configuration error",
	DeclinePeerNoSMC:          "peer did not send the SMC option",
	DeclineIPsec:              "IPsec in use",
	DeclineNoSMCDevice:        "no SMC device",
	DeclineNoSMCDDevice:       "no SMC-D device",
	DeclineNoSMCRDevice:       "no SMC-R device",
	DeclineModeMismatch:       "SMC mode mismatch",
	DeclineRMBEEyecatcher:     "peer has eyecatcher in RMBE",
	DeclineOptionUnsupported:  "socket option not supported",
	DeclineIPSubnetMismatch:   "IP subnet mismatch",
	DeclineVLANError:          "cannot get VLAN id",
	DeclineNoActiveLink:       "no active link in the link group",
	DeclineNoServerLink:       "server link not found",
	DeclineVersionMismatch:    "version mismatch",
	DeclineSyncError:          "synchronisation error",
	DeclinePeerDeclined:       "peer declined during handshake",
	DeclineInternal:           "internal error",
	DeclineInternalRToken:     "internal error: rtoken handling failed",
	DeclineInternalReadyLink:  "internal error: link not ready",
	DeclineInternalRegBuf:     "internal error: buffer registration failed",
}

var declineClasses = map[uint8]string{
	0x01: "resources",
	0x02: "timeout",
	0x03: "configuration",
	0x04: "synchronisation",
	0x05: "peer",
	0x09: "internal",
}

// Class returns the first byte of the code: 1 resources, 2 timeout, 3
// configuration, 4 synchronisation, 5 peer, 9 internal.
func (c DeclineCode) Class() uint8 { return uint8(c >> 24) }

// Known reports whether c is a code this package names.
func (c DeclineCode) Known() bool {
	_, ok := declineNames[c]
	return ok
}

// String returns the human-readable meaning that operators see in statistics; a
// code this package does not know is named by its class and its value.
func (c DeclineCode) String() string {
	if s, ok := declineNames[c]; ok {
		return s
	}
	if s, ok := declineClasses[c.Class()]; ok {
		return fmt.Sprintf("%s error %#08x", s, uint32(c))
	}
	return fmt.Sprintf("decline code %#08x", uint32(c))
}

// Error lets a code stand for itself in errors.Is: errors.Is(err,
// DeclineIPSubnetMismatch) holds for a *DeclineError with that code.
func (c DeclineCode) Error() string { return "clc: decline: " + c.String() }

// ErrDeclined matches every *DeclineError in errors.Is.
var ErrDeclined = errors.New("clc: declined")

// DeclineError is an SMC setup that ended in a Decline: sent by us (Local) or
// received from the peer.
type DeclineError struct {
	Code  DeclineCode
	Local bool
}

func (e *DeclineError) Error() string {
	who := "peer declined"
	if e.Local {
		who = "declined"
	}
	return fmt.Sprintf("clc: %s: %v (%#08x)", who, e.Code, uint32(e.Code))
}

// Is matches ErrDeclined and the error's own DeclineCode.
func (e *DeclineError) Is(target error) bool {
	if target == ErrDeclined {
		return true
	}
	c, ok := target.(DeclineCode)
	return ok && c == e.Code
}

// Decline ends the CLC exchange; the connection falls back to TCP.
type Decline struct {
	PeerID PeerID
	Code   DeclineCode
	// OutOfSync is the header flag: the sender's link group state no longer
	// matches ours (sent with DeclineSyncError), so the link group must go.
	OutOfSync bool
}

// Type reports TypeDecline.
func (*Decline) Type() MsgType { return TypeDecline }

// Len is the encoded length: always DeclineLen.
func (*Decline) Len() int { return DeclineLen }

// Err returns the Decline as a received *DeclineError.
func (d *Decline) Err() error { return &DeclineError{Code: d.Code} }

// AppendTo appends the encoded Decline to b.
func (d *Decline) AppendTo(b []byte) ([]byte, error) {
	var flags uint8
	if d.OutOfSync {
		flags = flagBit
	}
	b = appendHeader(b, TypeDecline, DeclineLen, Version1, flags)
	b = append(b, d.PeerID[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(d.Code))
	b = append(b, 0, 0, 0, 0)
	return appendTrailer(b), nil
}

// parseDecline parses b, whose header, length and trailer Parse has checked.
func parseDecline(h Header, b []byte) *Decline {
	d := &Decline{
		Code:      DeclineCode(binary.BigEndian.Uint32(b[declOffCode:])),
		OutOfSync: h.Flags&flagBit != 0,
	}
	copy(d.PeerID[:], b[offPeerID:])
	return d
}
