// The CLC Proposal: the client's offer, its RoCE identity and its IP subnets.
// Implements RFC 7609 §3.7.1 (SMC Proposal) in the layout Linux sends.

package clc

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// Proposal sizes and offsets.
const (
	// ProposalLen is Linux's IPv4 Proposal with no IPv6 prefix and no extension.
	ProposalLen = 92
	// ProposalMinLen is the old form: iparea_offset 0, no prefix, no extension.
	ProposalMinLen = 52
	// LinuxIPAreaOffset is the iparea_offset Linux sends: the SMC-D area it skips.
	LinuxIPAreaOffset = 40
	// MaxIPv6Prefixes is the most IPv6 prefixes a Proposal may carry.
	MaxIPv6Prefixes = 8

	propOffIPAreaOffset = 38
	propOffSkip         = 40 // the skipped area, then the IP area

	ipOffSubnet    = 0
	ipOffPrefixLen = 4
	ipOffReserved  = 5
	ipOffCount     = 7
	ipOffPrefixes  = 8
	ipv6PrefixLen  = 17
)

// IPv6Prefix is one IPv6 prefix of a Proposal. Len is what the peer sent, not
// checked against 128: a prefix that matches nothing is the engine's decline.
type IPv6Prefix struct {
	Addr [16]byte
	Len  uint8
}

// Prefix returns p as a netip.Prefix; it is invalid when Len > 128.
func (p IPv6Prefix) Prefix() netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom16(p.Addr), int(p.Len))
}

// Proposal is the client's first CLC message.
type Proposal struct {
	// Version is the header version. A Proposal from a newer peer is read with its
	// version kept; 0 is sent as Version1.
	Version uint8
	// SMCType is the variants offered (SMCTypeR for us; a Linux peer with ISM
	// offers SMCTypeB). SMCTypeV2 is the version-2 type bits, zero in version 1.
	SMCType   SMCType
	SMCTypeV2 SMCType

	PeerID PeerID
	GID    [16]byte
	MAC    [6]byte

	// SkipArea is what iparea_offset skips between byte 40 and the IP area. nil
	// means Linux's form: iparea_offset 40 over 40 zero bytes (ISM GID, CHID and v2
	// extension offset all zero). Parse returns nil for exactly that form, an empty
	// non-nil slice for the old form (iparea_offset 0), and the bytes otherwise
	// (for example a version-2 peer's SMC-D fields and v2 extension offset).
	SkipArea []byte

	Subnet    [4]byte // IPv4 subnet of the outgoing interface, address masked
	PrefixLen uint8   // of Subnet, not checked against 32 (see IPv6Prefix)
	IPv6      []IPv6Prefix

	// Ext is the area after the IPv6 prefixes, before the trailer, in version 1.
	// Ours holds an Envelope (ParseEnvelope).
	Ext []byte

	// V2 holds a version-2 Proposal's further fields; it is set exactly when
	// Version is 2 or more, and then SkipArea and Ext are nil (see ProposalV2).
	V2 *ProposalV2
}

// Type reports TypeProposal.
func (*Proposal) Type() MsgType { return TypeProposal }

// IPv4 returns the subnet as a netip.Prefix; it is invalid when PrefixLen > 32.
func (p *Proposal) IPv4() netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4(p.Subnet), int(p.PrefixLen))
}

// Len is the encoded length of p.
func (p *Proposal) Len() int {
	if p.Version >= Version2 {
		return p.lenV2()
	}
	skip := LinuxIPAreaOffset
	if p.SkipArea != nil {
		skip = len(p.SkipArea)
	}
	return propOffSkip + skip + ipOffPrefixes + ipv6PrefixLen*len(p.IPv6) + len(p.Ext) + TrailerLen
}

// AppendTo appends the encoded Proposal to b.
func (p *Proposal) AppendTo(b []byte) ([]byte, error) {
	n := p.Len()
	switch {
	case len(p.IPv6) > MaxIPv6Prefixes:
		return b, fmt.Errorf("clc: proposal: %d ipv6 prefixes > %d: %w", len(p.IPv6), MaxIPv6Prefixes, ErrInvalid)
	case n > MaxLen:
		return b, fmt.Errorf("clc: proposal: length %d > %d: %w", n, MaxLen, ErrInvalid)
	case p.Version > 15 || p.SMCType > 3 || p.SMCTypeV2 > 3:
		return b, fmt.Errorf("clc: proposal: version %d type %d typev2 %d: %w", p.Version, p.SMCType, p.SMCTypeV2, ErrInvalid)
	case p.Version < Version2 && p.V2 != nil:
		return b, fmt.Errorf("clc: proposal: version %d with v2 fields: %w", p.Version, ErrInvalid)
	}
	if p.Version >= Version2 {
		return p.appendV2(b)
	}
	v := p.Version
	if v == 0 {
		v = Version1
	}
	b = appendHeader(b, TypeProposal, n, v, uint8(p.SMCTypeV2)<<2|uint8(p.SMCType))
	b = append(b, p.PeerID[:]...)
	b = append(b, p.GID[:]...)
	b = append(b, p.MAC[:]...)
	if p.SkipArea == nil {
		b = binary.BigEndian.AppendUint16(b, LinuxIPAreaOffset)
		b = append(b, make([]byte, LinuxIPAreaOffset)...)
	} else {
		b = binary.BigEndian.AppendUint16(b, uint16(len(p.SkipArea)))
		b = append(b, p.SkipArea...)
	}
	b = append(b, p.Subnet[:]...)
	b = append(b, p.PrefixLen, 0, 0, byte(len(p.IPv6)))
	for _, pf := range p.IPv6 {
		b = append(b, pf.Addr[:]...)
		b = append(b, pf.Len)
	}
	b = append(b, p.Ext...)
	return appendTrailer(b), nil
}

// SetEnvelope places an encoded Envelope where a Linux server accepts it. Linux
// (smc_clc_msg_prop_valid, from 5.10) rejects a version-1 Proposal whose length is
// not exactly its fixed part, the skipped area, the IP area and the trailer, and
// then closes the connection, so an envelope after the IPv6 prefixes kills the
// connection to a Linux SMC-R server. The skipped area holds up to
// LinuxIPAreaOffset bytes (newer kernels refuse a larger iparea_offset), which a
// version-1 SMC-R Proposal leaves unread (it is SMC-D's): an envelope that fits
// goes there, zero-padded; a longer one still goes after the prefixes.
func (p *Proposal) SetEnvelope(env []byte) {
	if len(env) <= LinuxIPAreaOffset {
		p.SkipArea = append(env[:len(env):len(env)], make([]byte, LinuxIPAreaOffset-len(env))...)
		p.Ext = nil
		return
	}
	p.SkipArea, p.Ext = nil, env
}

// EnvelopeArea returns the area that holds p's Envelope, if it has one (see
// SetEnvelope): the skipped area cut to the envelope's length when it starts with
// the magic and the rest is zero padding, else the extension area.
func (p *Proposal) EnvelopeArea() []byte {
	a := p.SkipArea
	if !HasEnvelope(a) || len(a) < EnvelopeHeaderLen {
		return p.Ext
	}
	n := int(binary.BigEndian.Uint16(a[envOffLength:]))
	if n < EnvelopeHeaderLen || n > len(a) || !allZero(a[n:]) {
		return a // ParseEnvelope says what is wrong with it
	}
	return a[:n]
}

// parseProposal parses b, whose header, length and trailer Parse has checked.
func parseProposal(h Header, b []byte) (*Proposal, error) {
	p := &Proposal{
		Version:   h.Version,
		SMCType:   SMCType(h.Flags & typeMask),
		SMCTypeV2: SMCType(h.Flags >> 2),
	}
	copy(p.PeerID[:], b[offPeerID:])
	copy(p.GID[:], b[offGID:])
	copy(p.MAC[:], b[offMAC:])
	if h.Version >= Version2 {
		return parseProposalV2(h, b, p)
	}
	end := len(b) - TrailerLen
	skip := int(binary.BigEndian.Uint16(b[propOffIPAreaOffset:]))
	ip := propOffSkip + skip
	if ip+ipOffPrefixes > end {
		return nil, fmt.Errorf("clc: proposal: iparea_offset %d outside %d-byte message: %w", skip, len(b), ErrMalformed)
	}
	if skip != LinuxIPAreaOffset || !allZero(b[propOffSkip:ip]) {
		p.SkipArea = append([]byte{}, b[propOffSkip:ip]...)
	}
	a := b[ip:end]
	copy(p.Subnet[:], a[ipOffSubnet:])
	p.PrefixLen = a[ipOffPrefixLen]
	count := int(a[ipOffCount])
	if count > MaxIPv6Prefixes {
		return nil, fmt.Errorf("clc: proposal: %d ipv6 prefixes > %d: %w", count, MaxIPv6Prefixes, ErrMalformed)
	}
	rest := a[ipOffPrefixes:]
	if count*ipv6PrefixLen > len(rest) {
		return nil, fmt.Errorf("clc: proposal: %d ipv6 prefixes past the trailer: %w", count, ErrMalformed)
	}
	if count > 0 {
		p.IPv6 = make([]IPv6Prefix, count)
		for i := range p.IPv6 {
			e := rest[i*ipv6PrefixLen:]
			copy(p.IPv6[i].Addr[:], e)
			p.IPv6[i].Len = e[16]
		}
	}
	p.Ext = copyBytes(rest[count*ipv6PrefixLen:])
	return p, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
