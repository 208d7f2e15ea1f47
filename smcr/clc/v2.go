// CLC version 2: EIDs, the Proposal's SMC-Rv2 and SMC-Dv2 extensions, the Accept's
// and Confirm's first-contact extension, as Linux net/smc/smc_clc.h lays them out.
// Implements IBM's "SMC Version 2" (2.0 and 2.1), which extends RFC 7609 §3.7.

package clc

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/smcr-io/smcr/internal/ueid"
)

// EIDLen is the length of an Enterprise ID on the wire: blank-padded, no NUL.
const EIDLen = ueid.Len

// MaxUEIDs is the most User EIDs a Proposal carries (SMC_CLC_MAX_UEID).
const MaxUEIDs = ueid.Max

// MaxISMv2GIDs is the most ISMv2 GID/CHID entries a Proposal carries
// (SMCD_CLC_MAX_V2_GID_ENTRIES).
const MaxISMv2GIDs = 8

// HostnameLen is the first-contact extension's hostname field, blank-padded.
const HostnameLen = 32

// EID is an Enterprise ID (User EID or System EID) as carried on the wire.
type EID [EIDLen]byte

// String returns e without its blank padding.
func (e EID) String() string { return string(bytes.TrimRight(e[:], " \x00")) }

// ErrEID is wrapped by ParseEID for a name that cannot be a User EID.
var ErrEID = ueid.ErrInvalid

// ParseEID checks a User EID the way Linux's smc_clc_ueid_valid does (package
// ueid) and pads it with blanks: 1 to 32 characters, the first an upper-case
// letter or a digit, the rest upper-case letters, digits, '.' or '-'. Trailing
// blanks are padding.
func ParseEID(s string) (EID, error) {
	var e EID
	t, err := ueid.Check(s)
	if err != nil {
		return e, fmt.Errorf("clc: user eid %w", err)
	}
	copy(e[:], t)
	for i := len(t); i < EIDLen; i++ {
		e[i] = ' '
	}
	return e, nil
}

// OSType is the sender's operating system in a first-contact extension or a
// Decline (SMC_CLC_OS_*), 4 bits.
type OSType uint8

const (
	OSZOS   OSType = 1
	OSLinux OSType = 2
	OSAIX   OSType = 3
)

// ProposalV2 is what a version-2 Proposal carries beyond version 1's fields.
//
// Layout after the 40-byte base (header, peer ID, GID, MAC, iparea_offset), all of
// it Linux's smc_clc_msg_proposal_area:
//
//	40  ISM GID (8)  48 ISM CHID (2)  50 v2_ext_offset (2, from byte 52)
//	52  vendor OUI and options (8), reserved (20)
//	80  IP area (8 + 17 × IPv6 prefixes), only when SMCType is not SMCTypeN;
//	    iparea_offset is then 40, else 0
//	 X  SMC-Rv2 extension (40 + 32 × EIDs), only when SMCTypeV2 is not SMCTypeN:
//	    +0 EID count  +1 ISMv2 GID count  +2 reserved
//	    +3 release << 4 | SEID flag   +4 reserved (2)
//	    +6 SMC-Dv2 ext offset (2, from +8)   +8 RoCE v2 GID (16)
//	    +24 max conns  +25 max links  +26 feature mask (2)  +28 reserved (12)
//	    +40 User EIDs (32 each)
//	 D  SMC-Dv2 extension (48 + 10 × GIDs), only when SMCTypeV2 offers SMC-D:
//	    +0 System EID (32)  +32 reserved (16)  +48 {ISM GID (8), CHID (2)}...
//	    trailer (4)
//
// Every offset is what Linux's length check implies (smc_clc_msg_prop_valid): the
// codec refuses a Proposal whose offsets point anywhere else or whose length is not
// exactly the sum of its parts.
type ProposalV2 struct {
	ISMGID  uint64 // SMC-Dv1 native GID, 0 for SMC-R only
	ISMCHID uint16

	// The SMC-Rv2 extension's fields.
	Release     uint8 // 0: version 2.0, 1: version 2.1 (4 bits)
	SEID        bool  // the sender uses a System EID
	RoCEGID     [16]byte
	MaxConns    uint8 // 2.1: connections per link group the client accepts
	MaxLinks    uint8 // 2.1: links per link group the client accepts
	FeatureMask uint16
	UEIDs       []EID // at most MaxUEIDs

	// The SMC-Dv2 extension's fields, when SMCTypeV2 offers SMC-D.
	SystemEID EID
	ISMv2     []ISMv2GID // at most MaxISMv2GIDs
}

// ISMv2GID is one ISMv2 device of an SMC-Dv2 extension.
type ISMv2GID struct {
	GID  uint64
	CHID uint16
}

// Version-2 Proposal sizes and offsets.
const (
	proposalV2BaseLen = 80 // base (40) and SMC-D area (40), before the IP area
	proposalV2MinLen  = proposalV2BaseLen + TrailerLen

	propOffISMGID     = 40
	propOffISMCHID    = 48
	propOffV2ExtOff   = 50
	propV2ExtOffBase  = 52 // v2_ext_offset counts from here
	v2ExtFixedLen     = 40
	smcdV2ExtFixedLen = 48
	ismv2EntryLen     = 10

	v2OffEIDCount     = 0
	v2OffISMGIDCount  = 1
	v2OffFlag         = 3
	v2OffSMCDExtOff   = 6
	v2SMCDExtOffBase  = 8 // the SMC-Dv2 extension offset counts from here
	v2OffRoCEGID      = 8
	v2OffMaxConns     = 24
	v2OffMaxLinks     = 25
	v2OffFeatureMask  = 26
	v2OffUEIDs        = 40
	v2FlagSEID        = 0x01
	smcdV2OffSEID     = 0
	smcdV2OffEntries  = 48
	linuxV2IPAreaSkip = 40 // iparea_offset of a version-2 Proposal with an IP area
)

func smcrOffered(t SMCType) bool { return t == SMCTypeR || t == SMCTypeB }
func smcdOffered(t SMCType) bool { return t == SMCTypeD || t == SMCTypeB }

// ipAreaLen is the IP area of p: none when p offers no version-1 type.
func (p *Proposal) ipAreaLen() int {
	if p.SMCType == SMCTypeN {
		return 0
	}
	return ipOffPrefixes + ipv6PrefixLen*len(p.IPv6)
}

// v2ExtLen is the SMC-Rv2 extension's length, 0 when typev2 is SMCTypeN.
func (p *Proposal) v2ExtLen() int {
	if p.SMCTypeV2 == SMCTypeN || p.V2 == nil {
		return 0
	}
	return v2ExtFixedLen + EIDLen*len(p.V2.UEIDs)
}

// smcdV2ExtLen is the SMC-Dv2 extension's length, 0 when typev2 offers no SMC-D.
func (p *Proposal) smcdV2ExtLen() int {
	if !smcdOffered(p.SMCTypeV2) || p.V2 == nil {
		return 0
	}
	return smcdV2ExtFixedLen + ismv2EntryLen*len(p.V2.ISMv2)
}

func (p *Proposal) lenV2() int {
	return proposalV2BaseLen + p.ipAreaLen() + p.v2ExtLen() + p.smcdV2ExtLen() + TrailerLen
}

func (p *Proposal) appendV2(b []byte) ([]byte, error) {
	n := p.lenV2()
	v := p.V2
	switch {
	case v == nil:
		return b, fmt.Errorf("clc: proposal: version %d without its v2 fields: %w", p.Version, ErrInvalid)
	case p.SkipArea != nil || len(p.Ext) > 0:
		return b, fmt.Errorf("clc: proposal: version %d has no skipped or extension area: %w", p.Version, ErrInvalid)
	case p.SMCType == SMCTypeN && (p.Subnet != [4]byte{} || p.PrefixLen != 0 || len(p.IPv6) > 0):
		return b, fmt.Errorf("clc: proposal: no version-1 type, yet an IP area: %w", ErrInvalid)
	case len(v.UEIDs) > MaxUEIDs:
		return b, fmt.Errorf("clc: proposal: %d user eids > %d: %w", len(v.UEIDs), MaxUEIDs, ErrInvalid)
	case len(v.ISMv2) > MaxISMv2GIDs:
		return b, fmt.Errorf("clc: proposal: %d ismv2 gids > %d: %w", len(v.ISMv2), MaxISMv2GIDs, ErrInvalid)
	case p.SMCTypeV2 == SMCTypeN && (len(v.UEIDs) > 0 || len(v.ISMv2) > 0):
		return b, fmt.Errorf("clc: proposal: no version-2 type, yet v2 extension entries: %w", ErrInvalid)
	case !smcdOffered(p.SMCTypeV2) && (len(v.ISMv2) > 0 || v.SystemEID != EID{}):
		return b, fmt.Errorf("clc: proposal: SMC-Dv2 fields without SMC-Dv2 offered: %w", ErrInvalid)
	case v.Release > 15:
		return b, fmt.Errorf("clc: proposal: release %d: %w", v.Release, ErrInvalid)
	}
	b = appendHeader(b, TypeProposal, n, p.Version, uint8(p.SMCTypeV2)<<2|uint8(p.SMCType))
	b = append(b, p.PeerID[:]...)
	b = append(b, p.GID[:]...)
	b = append(b, p.MAC[:]...)
	ip := p.ipAreaLen()
	if ip > 0 {
		b = binary.BigEndian.AppendUint16(b, linuxV2IPAreaSkip)
	} else {
		b = binary.BigEndian.AppendUint16(b, 0)
	}
	var smcd [proposalV2BaseLen - propOffISMGID]byte
	binary.BigEndian.PutUint64(smcd[:], v.ISMGID) // smcd starts at propOffISMGID
	binary.BigEndian.PutUint16(smcd[propOffISMCHID-propOffISMGID:], v.ISMCHID)
	if p.SMCTypeV2 != SMCTypeN {
		binary.BigEndian.PutUint16(smcd[propOffV2ExtOff-propOffISMGID:], uint16(proposalV2BaseLen-propV2ExtOffBase+ip))
	}
	b = append(b, smcd[:]...)
	if ip > 0 {
		b = append(b, p.Subnet[:]...)
		b = append(b, p.PrefixLen, 0, 0, byte(len(p.IPv6)))
		for _, pf := range p.IPv6 {
			b = append(b, pf.Addr[:]...)
			b = append(b, pf.Len)
		}
	}
	if p.SMCTypeV2 != SMCTypeN {
		var x [v2ExtFixedLen]byte
		x[v2OffEIDCount] = byte(len(v.UEIDs))
		x[v2OffISMGIDCount] = byte(len(v.ISMv2))
		x[v2OffFlag] = v.Release << 4
		if v.SEID {
			x[v2OffFlag] |= v2FlagSEID
		}
		if smcdOffered(p.SMCTypeV2) {
			binary.BigEndian.PutUint16(x[v2OffSMCDExtOff:], uint16(v2ExtFixedLen-v2SMCDExtOffBase+EIDLen*len(v.UEIDs)))
		}
		copy(x[v2OffRoCEGID:], v.RoCEGID[:])
		x[v2OffMaxConns] = v.MaxConns
		x[v2OffMaxLinks] = v.MaxLinks
		binary.BigEndian.PutUint16(x[v2OffFeatureMask:], v.FeatureMask)
		b = append(b, x[:]...)
		for _, e := range v.UEIDs {
			b = append(b, e[:]...)
		}
	}
	if smcdOffered(p.SMCTypeV2) {
		b = append(b, v.SystemEID[:]...)
		b = append(b, make([]byte, smcdV2OffEntries-EIDLen)...)
		for _, g := range v.ISMv2 {
			b = binary.BigEndian.AppendUint64(b, g.GID)
			b = binary.BigEndian.AppendUint16(b, g.CHID)
		}
	}
	return appendTrailer(b), nil
}

// v2ExtView is a typed view of an SMC-Rv2 extension whose fixed part is in bounds.
type v2ExtView []byte

func (x v2ExtView) eidCount() int     { return int(x[v2OffEIDCount]) }
func (x v2ExtView) ismGIDCount() int  { return int(x[v2OffISMGIDCount]) }
func (x v2ExtView) release() uint8    { return x[v2OffFlag] >> 4 }
func (x v2ExtView) seid() bool        { return x[v2OffFlag]&v2FlagSEID != 0 }
func (x v2ExtView) smcdExtOff() int   { return int(binary.BigEndian.Uint16(x[v2OffSMCDExtOff:])) }
func (x v2ExtView) maxConns() uint8   { return x[v2OffMaxConns] }
func (x v2ExtView) maxLinks() uint8   { return x[v2OffMaxLinks] }
func (x v2ExtView) features() uint16  { return binary.BigEndian.Uint16(x[v2OffFeatureMask:]) }
func (x v2ExtView) roceGID() [16]byte { return [16]byte(x[v2OffRoCEGID:]) }
func (x v2ExtView) ueid(i int) EID    { return EID(x[v2OffUEIDs+EIDLen*i:]) }

// parseProposalV2 parses a version-2 Proposal into p, whose header, length and
// trailer Parse has checked and whose base fields are filled.
func parseProposalV2(h Header, b []byte, p *Proposal) (*Proposal, error) {
	v := &ProposalV2{
		ISMGID:  binary.BigEndian.Uint64(b[propOffISMGID:]),
		ISMCHID: binary.BigEndian.Uint16(b[propOffISMCHID:]),
	}
	p.V2 = v
	end := len(b) - TrailerLen
	off := proposalV2BaseLen
	iparea := int(binary.BigEndian.Uint16(b[propOffIPAreaOffset:]))
	if p.SMCType != SMCTypeN {
		if iparea != linuxV2IPAreaSkip {
			return nil, fmt.Errorf("clc: proposal v%d: iparea_offset %d, want %d: %w", h.Version, iparea, linuxV2IPAreaSkip, ErrMalformed)
		}
		if off+ipOffPrefixes > end {
			return nil, fmt.Errorf("clc: proposal v%d: ip area past the trailer: %w", h.Version, ErrMalformed)
		}
		a := b[off:end]
		copy(p.Subnet[:], a[ipOffSubnet:])
		p.PrefixLen = a[ipOffPrefixLen]
		count := int(a[ipOffCount])
		if count > MaxIPv6Prefixes {
			return nil, fmt.Errorf("clc: proposal v%d: %d ipv6 prefixes > %d: %w", h.Version, count, MaxIPv6Prefixes, ErrMalformed)
		}
		off += ipOffPrefixes + count*ipv6PrefixLen
		if off > end {
			return nil, fmt.Errorf("clc: proposal v%d: %d ipv6 prefixes past the trailer: %w", h.Version, count, ErrMalformed)
		}
		if count > 0 {
			p.IPv6 = make([]IPv6Prefix, count)
			for i := range p.IPv6 {
				e := a[ipOffPrefixes+i*ipv6PrefixLen:]
				copy(p.IPv6[i].Addr[:], e)
				p.IPv6[i].Len = e[16]
			}
		}
	} else if iparea != 0 {
		return nil, fmt.Errorf("clc: proposal v%d: iparea_offset %d without an ip area: %w", h.Version, iparea, ErrMalformed)
	}
	extOff := int(binary.BigEndian.Uint16(b[propOffV2ExtOff:]))
	if p.SMCTypeV2 == SMCTypeN {
		if extOff != 0 || off != end {
			return nil, fmt.Errorf("clc: proposal v%d: no version-2 type, yet %d more bytes: %w", h.Version, end-off, ErrMalformed)
		}
		return p, nil
	}
	if propV2ExtOffBase+extOff != off {
		return nil, fmt.Errorf("clc: proposal v%d: v2 extension at %d, want %d: %w", h.Version, propV2ExtOffBase+extOff, off, ErrMalformed)
	}
	if off+v2ExtFixedLen > end {
		return nil, fmt.Errorf("clc: proposal v%d: v2 extension past the trailer: %w", h.Version, ErrMalformed)
	}
	x := v2ExtView(b[off:end])
	neid, nism := x.eidCount(), x.ismGIDCount()
	switch {
	case neid > MaxUEIDs:
		return nil, fmt.Errorf("clc: proposal v%d: %d user eids > %d: %w", h.Version, neid, MaxUEIDs, ErrMalformed)
	case smcdOffered(p.SMCTypeV2) && nism > MaxISMv2GIDs:
		return nil, fmt.Errorf("clc: proposal v%d: %d ismv2 gids > %d: %w", h.Version, nism, MaxISMv2GIDs, ErrMalformed)
	case !smcdOffered(p.SMCTypeV2) && (nism != 0 || x.smcdExtOff() != 0):
		return nil, fmt.Errorf("clc: proposal v%d: ismv2 gids without SMC-Dv2 offered: %w", h.Version, ErrMalformed)
	}
	want := off + v2ExtFixedLen + EIDLen*neid
	if smcdOffered(p.SMCTypeV2) {
		if v2SMCDExtOffBase+x.smcdExtOff() != v2ExtFixedLen+EIDLen*neid {
			return nil, fmt.Errorf("clc: proposal v%d: SMC-Dv2 extension offset %d: %w", h.Version, x.smcdExtOff(), ErrMalformed)
		}
		want += smcdV2ExtFixedLen + ismv2EntryLen*nism
	}
	if want != end {
		return nil, fmt.Errorf("clc: proposal v%d: length %d, its parts make %d: %w", h.Version, len(b), want+TrailerLen, ErrMalformed)
	}
	v.Release, v.SEID = x.release(), x.seid()
	v.RoCEGID = x.roceGID()
	v.MaxConns, v.MaxLinks, v.FeatureMask = x.maxConns(), x.maxLinks(), x.features()
	if neid > 0 {
		v.UEIDs = make([]EID, neid)
		for i := range v.UEIDs {
			v.UEIDs[i] = x.ueid(i)
		}
	}
	if smcdOffered(p.SMCTypeV2) {
		d := b[off+v2ExtFixedLen+EIDLen*neid : end]
		v.SystemEID = EID(d[smcdV2OffSEID:])
		if nism > 0 {
			v.ISMv2 = make([]ISMv2GID, nism)
			for i := range v.ISMv2 {
				e := d[smcdV2OffEntries+ismv2EntryLen*i:]
				v.ISMv2[i] = ISMv2GID{GID: binary.BigEndian.Uint64(e), CHID: binary.BigEndian.Uint16(e[8:])}
			}
		}
	}
	return p, nil
}

// HasSMCRv2 reports whether p offers SMC-R version 2: a version-2 header whose
// typev2 includes SMC-R.
func (p *Proposal) HasSMCRv2() bool {
	return p.Version >= Version2 && p.V2 != nil && smcrOffered(p.SMCTypeV2)
}

// Version-2 Accept and Confirm sizes and offsets (SMC-R).
const (
	// AcceptConfirmV2Len is a version-2 Accept or Confirm without first contact:
	// the version-1 fields, the EID and 8 reserved bytes.
	AcceptConfirmV2Len = 108
	// AcceptV2FirstContactLen is a version-2 Accept with the first-contact
	// extension (Linux's smc_clc_first_contact_ext_v2x, 52 bytes).
	AcceptV2FirstContactLen = 160
	// MaxConfirmGIDs bounds a Confirm's GID list; Linux sends at most one per
	// link of a link group (SMC_LINKS_PER_LGR_MAX, 3).
	MaxConfirmGIDs = 8

	acOffEID        = 64
	acOffFCE        = 104
	fceOffFlags     = 0 // 0x80: v2_direct
	fceOffOSRelease = 1 // os type << 4 | release
	fceOffHostname  = 4
	fceOffMaxConns  = 36
	fceOffMaxLinks  = 37
	fceOffFeatures  = 38
	fceOffVendor    = 40
	fceLen          = 52
	fceDirect       = 0x80
	gidListHdrLen   = 4 // GID count (1), reserved (3)
)

// FirstContactExt is the first-contact extension of a version-2 Accept or Confirm
// (Linux's smc_clc_first_contact_ext_v2x), at byte 104:
//
//	+0 v2_direct (0x80)  +1 OS type << 4 | release  +2 reserved (2)
//	+4 hostname (32, blank-padded)  +36 max conns  +37 max links
//	+38 feature mask (2)  +40 vendor options (4)  +44 reserved (8)
type FirstContactExt struct {
	// Direct is v2_direct: the peers reach each other without a gateway.
	Direct   bool
	OSType   OSType
	Release  uint8 // 4 bits: the release the server chose, echoed by the client
	Hostname [HostnameLen]byte
	// MaxConns, MaxLinks and FeatureMask are release 2.1's negotiated values;
	// Linux sends zeros in release 2.0.
	MaxConns      uint8
	MaxLinks      uint8
	FeatureMask   uint16
	VendorOptions uint32
}

// LinkInfoV2 holds what a version-2 Accept or Confirm adds to LinkInfo:
//
//	 64 EID (32)   96 reserved (8)
//	104 first-contact extension (52), only with the first-contact flag
//	156 Confirm with first contact only: GID count (1), reserved (3),
//	    GIDs (16 each): the client's RoCE v2 GIDs for the link group's links
type LinkInfoV2 struct {
	EID          EID // the negotiated EID
	FirstContact FirstContactExt
	GIDs         [][16]byte
}

func (l *LinkInfo) lenV2(t MsgType) int {
	if !l.FirstContact {
		return AcceptConfirmV2Len
	}
	if t == TypeAccept {
		return AcceptV2FirstContactLen
	}
	return AcceptV2FirstContactLen + gidListHdrLen + 16*len(l.V2.GIDs)
}

func (l *LinkInfo) appendV2(b []byte, t MsgType) ([]byte, error) {
	v := l.V2
	f := &v.FirstContact
	switch {
	case len(l.Ext) > 0:
		return b, fmt.Errorf("clc: %v v2: no extension area: %w", t, ErrInvalid)
	case !l.FirstContact && (*f != FirstContactExt{} || len(v.GIDs) > 0):
		return b, fmt.Errorf("clc: %v v2: first-contact fields without first contact: %w", t, ErrInvalid)
	case t == TypeAccept && len(v.GIDs) > 0:
		return b, fmt.Errorf("clc: accept v2: carries no gid list: %w", ErrInvalid)
	case len(v.GIDs) > MaxConfirmGIDs:
		return b, fmt.Errorf("clc: %v v2: %d gids > %d: %w", t, len(v.GIDs), MaxConfirmGIDs, ErrInvalid)
	case f.OSType > 15 || f.Release > 15:
		return b, fmt.Errorf("clc: %v v2: os type %d release %d: %w", t, f.OSType, f.Release, ErrInvalid)
	}
	b = append(b, v.EID[:]...)
	b = append(b, make([]byte, acOffFCE-acOffEID-EIDLen)...)
	if !l.FirstContact {
		return b, nil
	}
	var x [fceLen]byte
	if f.Direct {
		x[fceOffFlags] = fceDirect
	}
	x[fceOffOSRelease] = byte(f.OSType)<<4 | f.Release
	copy(x[fceOffHostname:], f.Hostname[:])
	x[fceOffMaxConns], x[fceOffMaxLinks] = f.MaxConns, f.MaxLinks
	binary.BigEndian.PutUint16(x[fceOffFeatures:], f.FeatureMask)
	binary.BigEndian.PutUint32(x[fceOffVendor:], f.VendorOptions)
	b = append(b, x[:]...)
	if t == TypeConfirm {
		b = append(b, byte(len(v.GIDs)), 0, 0, 0)
		for _, g := range v.GIDs {
			b = append(b, g[:]...)
		}
	}
	return b, nil
}

// fceView is a typed view of a first-contact extension in bounds.
type fceView []byte

func (x fceView) direct() bool       { return x[fceOffFlags]&fceDirect != 0 }
func (x fceView) osType() OSType     { return OSType(x[fceOffOSRelease] >> 4) }
func (x fceView) release() uint8     { return x[fceOffOSRelease] & 0x0f }
func (x fceView) maxConns() uint8    { return x[fceOffMaxConns] }
func (x fceView) maxLinks() uint8    { return x[fceOffMaxLinks] }
func (x fceView) features() uint16   { return binary.BigEndian.Uint16(x[fceOffFeatures:]) }
func (x fceView) vendor() uint32     { return binary.BigEndian.Uint32(x[fceOffVendor:]) }
func (x fceView) hostname() [32]byte { return [32]byte(x[fceOffHostname:]) }

// parseLinkInfoV2 parses the version-2 part of an Accept or Confirm into l, with
// the exact lengths Linux sends.
func parseLinkInfoV2(h Header, b []byte, l *LinkInfo) error {
	want := l.lenV2Parse(h, b)
	if want < 0 || len(b) != want {
		return fmt.Errorf("clc: %v v2: length %d does not match its parts: %w", h.Type, len(b), ErrMalformed)
	}
	v := &LinkInfoV2{EID: EID(b[acOffEID:])}
	l.V2, l.Ext = v, nil
	if !l.FirstContact {
		return nil
	}
	x := fceView(b[acOffFCE : acOffFCE+fceLen])
	v.FirstContact = FirstContactExt{
		Direct: x.direct(), OSType: x.osType(), Release: x.release(), Hostname: x.hostname(),
		MaxConns: x.maxConns(), MaxLinks: x.maxLinks(), FeatureMask: x.features(), VendorOptions: x.vendor(),
	}
	if h.Type == TypeConfirm {
		n := int(b[acOffFCE+fceLen])
		if n > 0 {
			v.GIDs = make([][16]byte, n)
			for i := range v.GIDs {
				v.GIDs[i] = [16]byte(b[acOffFCE+fceLen+gidListHdrLen+16*i:])
			}
		}
	}
	return nil
}

// lenV2Parse is the length b must have by its flag and, for a first-contact
// Confirm, its GID count; -1 when even the count is out of bounds or too large.
func (l *LinkInfo) lenV2Parse(h Header, b []byte) int {
	switch {
	case !l.FirstContact:
		return AcceptConfirmV2Len
	case h.Type == TypeAccept:
		return AcceptV2FirstContactLen
	}
	at := acOffFCE + fceLen
	if at >= len(b)-TrailerLen {
		return -1
	}
	n := int(b[at])
	if n > MaxConfirmGIDs {
		return -1
	}
	return AcceptV2FirstContactLen + gidListHdrLen + 16*n
}
