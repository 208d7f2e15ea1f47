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
	// DeclineV2Len is a version-2 Decline: four more diagnosis codes.
	DeclineV2Len = 44
	// MoreDeclineCodes is how many further codes a version-2 Decline carries.
	MoreDeclineCodes = 4

	declOffCode     = 16
	declOffOSType   = 20 // high nibble; the low nibble and bytes 21-23 are reserved
	declOffReserved = 21
	declOffMore     = 24 // version 2 only
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
	DeclineNoISMv2Support     DeclineCode = 0x03030003 // SMC_CLC_DECL_NOISM2SUPP
	DeclineNoV2Extension      DeclineCode = 0x03030004 // SMC_CLC_DECL_NOV2EXT
	DeclineNoSMCDv2Extension  DeclineCode = 0x03030005 // SMC_CLC_DECL_NOV2DEXT
	DeclineNoSEID             DeclineCode = 0x03030006 // SMC_CLC_DECL_NOSEID
	DeclineNoSMCDv2Device     DeclineCode = 0x03030007 // SMC_CLC_DECL_NOSMCD2DEV
	DeclineNoUEID             DeclineCode = 0x03030008 // SMC_CLC_DECL_NOUEID
	DeclineReleaseMismatch    DeclineCode = 0x03030009 // SMC_CLC_DECL_RELEASEERR
	DeclineMaxConnsMismatch   DeclineCode = 0x0303000a // SMC_CLC_DECL_MAXCONNERR
	DeclineMaxLinksMismatch   DeclineCode = 0x0303000b // SMC_CLC_DECL_MAXLINKERR
	DeclineModeMismatch       DeclineCode = 0x03040000 // SMC_CLC_DECL_MODEUNSUPP
	DeclineRMBEEyecatcher     DeclineCode = 0x03050000 // SMC_CLC_DECL_RMBE_EC
	DeclineOptionUnsupported  DeclineCode = 0x03060000 // SMC_CLC_DECL_OPTUNSUPP
	DeclineIPSubnetMismatch   DeclineCode = 0x03070000 // SMC_CLC_DECL_DIFFPREFIX
	DeclineVLANError          DeclineCode = 0x03080000 // SMC_CLC_DECL_GETVLANERR
	DeclineNoActiveLink       DeclineCode = 0x030a0000 // SMC_CLC_DECL_NOACTLINK
	DeclineNoServerLink       DeclineCode = 0x030b0000 // SMC_CLC_DECL_NOSRVLINK
	DeclineVersionMismatch    DeclineCode = 0x030c0000 // SMC_CLC_DECL_VERSMISMAT
	DeclineNoRoute            DeclineCode = 0x030e0000 // SMC_CLC_DECL_NOROUTE
	DeclineIndirectMismatch   DeclineCode = 0x030f0000 // SMC_CLC_DECL_NOINDIRECT
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
	DeclineNoISMv2Support:     "no ISMv2 support",
	DeclineNoV2Extension:      "peer sent no v2 extension",
	DeclineNoSMCDv2Extension:  "peer sent no SMC-Dv2 extension",
	DeclineNoSEID:             "peer sent no system EID",
	DeclineNoSMCDv2Device:     "no SMC-Dv2 device",
	DeclineNoUEID:             "no common user EID",
	DeclineReleaseMismatch:    "release negotiation failed",
	DeclineMaxConnsMismatch:   "max connections negotiation failed",
	DeclineMaxLinksMismatch:   "max links negotiation failed",
	DeclineModeMismatch:       "SMC mode mismatch",
	DeclineRMBEEyecatcher:     "peer has eyecatcher in RMBE",
	DeclineOptionUnsupported:  "socket option not supported",
	DeclineIPSubnetMismatch:   "IP subnet mismatch",
	DeclineVLANError:          "cannot get VLAN id",
	DeclineNoActiveLink:       "no active link in the link group",
	DeclineNoServerLink:       "server link not found",
	DeclineVersionMismatch:    "version mismatch",
	DeclineNoRoute:            "no route to the peer's RoCE v2 GID",
	DeclineIndirectMismatch:   "peer's direct or indirect route mismatch",
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
	// Version is 0 for the 28-byte version-1 form (Parse never sets 1) and
	// Version2 for the 44-byte form that carries MoreCodes.
	Version uint8
	// OSType is the sender's operating system (OSLinux ...), 4 bits; 0 when unset.
	OSType OSType
	// MoreCodes are a version-2 Decline's further diagnosis codes.
	MoreCodes [MoreDeclineCodes]DeclineCode
}

// Type reports TypeDecline.
func (*Decline) Type() MsgType { return TypeDecline }

// Len is the encoded length: DeclineLen, or DeclineV2Len for version 2.
func (d *Decline) Len() int {
	if d.Version >= Version2 {
		return DeclineV2Len
	}
	return DeclineLen
}

// Err returns the Decline as a received *DeclineError.
func (d *Decline) Err() error { return &DeclineError{Code: d.Code} }

// AppendTo appends the encoded Decline to b.
func (d *Decline) AppendTo(b []byte) ([]byte, error) {
	switch {
	case d.Version > Version2:
		return b, fmt.Errorf("clc: decline: version %d: %w", d.Version, ErrInvalid)
	case d.OSType > 15:
		return b, fmt.Errorf("clc: decline: os type %d: %w", d.OSType, ErrInvalid)
	case d.Version < Version2 && d.MoreCodes != [MoreDeclineCodes]DeclineCode{}:
		return b, fmt.Errorf("clc: decline: version %d carries no further codes: %w", d.Version, ErrInvalid)
	}
	var flags uint8
	if d.OutOfSync {
		flags = flagBit
	}
	b = appendHeader(b, TypeDecline, d.Len(), max(d.Version, Version1), flags)
	b = append(b, d.PeerID[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(d.Code))
	b = append(b, byte(d.OSType)<<4, 0, 0, 0)
	if d.Version >= Version2 {
		for _, c := range d.MoreCodes {
			b = binary.BigEndian.AppendUint32(b, uint32(c))
		}
	}
	return appendTrailer(b), nil
}

// parseDecline parses b, whose header, length and trailer Parse has checked.
func parseDecline(h Header, b []byte) *Decline {
	d := &Decline{
		Code:      DeclineCode(binary.BigEndian.Uint32(b[declOffCode:])),
		OutOfSync: h.Flags&flagBit != 0,
		OSType:    OSType(b[declOffOSType] >> 4),
	}
	copy(d.PeerID[:], b[offPeerID:])
	if h.Version >= Version2 {
		d.Version = h.Version
		for i := range d.MoreCodes {
			d.MoreCodes[i] = DeclineCode(binary.BigEndian.Uint32(b[declOffMore+4*i:]))
		}
	}
	return d
}
