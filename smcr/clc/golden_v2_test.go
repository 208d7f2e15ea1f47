// Golden version-2 CLC messages: Linux 6.1's own, captured between two soft-RoCE
// guests, and hand-written ones from Linux's smc_clc.h layouts, checked both ways.

package clc

import (
	"errors"
	"strings"
	"testing"
)

// The probe's capture (shared/probes/smc-v2-rxe/result) cut each frame at 200
// bytes, so the first 134 bytes of each message are Linux's and the rest is what
// its layout puts there: the UEID's and hostname's blank padding, release 2.0's
// zero v2.1 fields, and the Confirm's GID list of the client's one GID.
var (
	linuxServerPeer = PeerID{0xd4, 0x36, 0x52, 0x54, 0x00, 0x00, 0x60, 0x01}
	linuxClientPeer = PeerID{0xd3, 0xc4, 0x52, 0x54, 0x00, 0x00, 0x60, 0x02}
	linuxServerGID  = [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 60, 14: 0, 15: 1}
	linuxClientGID  = [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 60, 14: 0, 15: 2}
	linuxServerMAC  = [6]byte{0x52, 0x54, 0x00, 0x00, 0x60, 0x01}
	linuxClientMAC  = [6]byte{0x52, 0x54, 0x00, 0x00, 0x60, 0x02}
	probeUEID       = mustEID("SMCR-V2PROBE.UEID")
	linuxNoHostname = hostname("(none)")
)

func mustEID(s string) EID {
	e, err := ParseEID(s)
	if err != nil {
		panic(err)
	}
	return e
}

func hostname(s string) (h [HostnameLen]byte) {
	for i := range h {
		h[i] = ' '
	}
	copy(h[:], s)
	return h
}

var goldensV2 = []golden{
	{
		name: "linux-v2-proposal",
		hex: `e2d4c3d9 | 01 | 009c | 22 |
			0000000000000000 | 00000000000000000000000000000000 | 000000000000 | 0000 |
			0000000000000000 | 0000 | 001c | 0000000000000000 | 0000000000000000000000000000000000000000 |
			01 | 00 | 00 | 00 | 0000 | 0000 | 00000000000000000000ffff0a3c0002 |
			00 | 00 | 0000 | 000000000000000000000000 |
			534d43522d563250524f42452e554549 44202020202020202020202020202020 |
			e2d4c3d9`,
		want: &Proposal{Version: 2, SMCType: SMCTypeN, SMCTypeV2: SMCTypeR,
			V2: &ProposalV2{RoCEGID: linuxClientGID, UEIDs: []EID{probeUEID}}},
	},
	{
		name: "linux-v2-accept",
		hex: `e2d4c3d9 | 02 | 00a0 | 28 |
			d436525400006001 | 00000000000000000000ffff0a3c0001 | 525400006001 |
			000011 | 000003a8 | 01 | 00000001 | 23 | 00 | ff1d3de145910000 | 00 | ba0da6 |
			534d43522d563250524f42452e554549 44202020202020202020202020202020 | 0000000000000000 |
			80 | 20 | 0000 | 286e6f6e652920202020202020202020 20202020202020202020202020202020 |
			00 | 00 | 0000 | 00000000 | 0000000000000000 |
			e2d4c3d9`,
		want: &Accept{LinkInfo{PeerID: linuxServerPeer, GID: linuxServerGID, MAC: linuxServerMAC,
			QPN: 0x11, RKey: 0x3a8, RMBEIndex: 1, AlertToken: 1, SizeCode: 2, MTU: MTU1024,
			RMBAddr: 0xff1d3de145910000, PSN: 0xba0da6, FirstContact: true,
			V2: &LinkInfoV2{EID: probeUEID, FirstContact: FirstContactExt{
				Direct: true, OSType: OSLinux, Hostname: linuxNoHostname}}}},
	},
	{
		name: "linux-v2-confirm",
		hex: `e2d4c3d9 | 03 | 00b4 | 28 |
			d3c4525400006002 | 00000000000000000000ffff0a3c0002 | 525400006002 |
			000011 | 00000351 | 01 | 00000001 | 23 | 00 | ff1dc1f605b30000 | 00 | 9e71ed |
			534d43522d563250524f42452e554549 44202020202020202020202020202020 | 0000000000000000 |
			80 | 20 | 0000 | 286e6f6e652920202020202020202020 20202020202020202020202020202020 |
			00 | 00 | 0000 | 00000000 | 0000000000000000 |
			01 | 000000 | 00000000000000000000ffff0a3c0002 |
			e2d4c3d9`,
		want: &Confirm{LinkInfo{PeerID: linuxClientPeer, GID: linuxClientGID, MAC: linuxClientMAC,
			QPN: 0x11, RKey: 0x351, RMBEIndex: 1, AlertToken: 1, SizeCode: 2, MTU: MTU1024,
			RMBAddr: 0xff1dc1f605b30000, PSN: 0x9e71ed, FirstContact: true,
			V2: &LinkInfoV2{EID: probeUEID, FirstContact: FirstContactExt{
				Direct: true, OSType: OSLinux, Hostname: linuxNoHostname},
				GIDs: [][16]byte{linuxClientGID}}}},
	},
	{
		// Version 1 and 2.1 offered together, as a Linux 6.6 client with a RoCE v1
		// and a v2 GID sends it: the IP area sits between the SMC-D area and the
		// v2 extension, whose offset counts it.
		name: "proposal-v1-and-v2.1",
		hex: `e2d4c3d9 | 01 | 00d5 | 20 |
			abcd5254006789ab | fe80000000000000525400fffe6789ab | 5254006789ab | 0028 |
			0000000000000000 | 0000 | 0035 | 0000000000000000 | 0000000000000000000000000000000000000000 |
			c0a80a00 | 18 | 0000 | 01 | 20010db8000100000000000000000000 | 40 |
			02 | 00 | 00 | 10 | 0000 | 0000 | 00000000000000000000ffffc0a80a02 |
			ff | 02 | 0001 | 000000000000000000000000 |
			534d43522d563250524f42452e554549 44202020202020202020202020202020 |
			4f54484552202020202020202020202020202020202020202020202020202020 |
			e2d4c3d9`,
		want: &Proposal{Version: 2, SMCType: SMCTypeR, SMCTypeV2: SMCTypeR,
			PeerID: clientPeer, GID: clientGID, MAC: clientMAC,
			Subnet: [4]byte{192, 168, 10, 0}, PrefixLen: 24,
			IPv6: []IPv6Prefix{{Addr: [16]byte{0x20, 0x01, 0x0d, 0xb8, 0x00, 0x01}, Len: 64}},
			V2: &ProposalV2{Release: 1, RoCEGID: [16]byte{10: 0xff, 11: 0xff, 12: 192, 13: 168, 14: 10, 15: 2},
				MaxConns: 255, MaxLinks: 2, FeatureMask: 1, UEIDs: []EID{probeUEID, mustEID("OTHER")}}},
	},
	{
		// SMC-R and SMC-D offered in both versions, with a System EID and one
		// ISMv2 device: the SMC-Dv2 extension follows the User EIDs.
		name: "proposal-both-types-smcd-v2",
		hex: `e2d4c3d9 | 01 | 00de | 2f |
			abcd5254006789ab | fe80000000000000525400fffe6789ab | 5254006789ab | 0028 |
			1122334455667788 | 0102 | 0024 | 0000000000000000 | 0000000000000000000000000000000000000000 |
			0a000000 | 08 | 0000 | 00 |
			01 | 01 | 00 | 11 | 0000 | 0040 | 00000000000000000000ffff0a000002 |
			00 | 00 | 0000 | 000000000000000000000000 |
			534d43522d563250524f42452e554549 44202020202020202020202020202020 |
			49424d2d53595354454d2d4549442020 20202020202020202020202020202020 |
			00000000000000000000000000000000 |
			8877665544332211 | 0203 |
			e2d4c3d9`,
		want: &Proposal{Version: 2, SMCType: SMCTypeB, SMCTypeV2: SMCTypeB,
			PeerID: clientPeer, GID: clientGID, MAC: clientMAC,
			Subnet: [4]byte{10, 0, 0, 0}, PrefixLen: 8,
			V2: &ProposalV2{ISMGID: 0x1122334455667788, ISMCHID: 0x0102, Release: 1, SEID: true,
				RoCEGID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 2}, UEIDs: []EID{probeUEID},
				SystemEID: mustEID("IBM-SYSTEM-EID"), ISMv2: []ISMv2GID{{GID: 0x8877665544332211, CHID: 0x0203}}}},
	},
	{
		name: "accept-v2-not-first-contact",
		hex: `e2d4c3d9 | 02 | 006c | 20 |
			1234525400123456 | 00000000000000000000ffff0a3c0001 | 525400123456 |
			000123 | 1a2b3c4d | 01 | 00000007 | 23 | 00 | 00007f0012340000 | 00 | abcdef |
			534d43522d563250524f42452e554549 44202020202020202020202020202020 | 0000000000000000 |
			e2d4c3d9`,
		want: &Accept{LinkInfo{PeerID: serverPeer, GID: linuxServerGID, MAC: serverMAC,
			QPN: 0x123, RKey: 0x1a2b3c4d, RMBEIndex: 1, AlertToken: 7, SizeCode: 2, MTU: MTU1024,
			RMBAddr: 0x7f0012340000, PSN: 0xabcdef, V2: &LinkInfoV2{EID: probeUEID}}},
	},
	{
		// Release 2.1's first contact: negotiated max conns and links, a feature,
		// a server behind a gateway (no v2_direct).
		name: "accept-v2.1-first-contact",
		hex: `e2d4c3d9 | 02 | 00a0 | 28 |
			1234525400123456 | 00000000000000000000ffff0a3c0001 | 525400123456 |
			000123 | 1a2b3c4d | 01 | 00000007 | 23 | 00 | 00007f0012340000 | 00 | abcdef |
			534d43522d563250524f42452e554549 44202020202020202020202020202020 | 0000000000000000 |
			00 | 21 | 0000 | 7365727665722d61202020202020202020202020202020202020202020202020 |
			80 | 01 | 0001 | 00000000 | 0000000000000000 |
			e2d4c3d9`,
		want: &Accept{LinkInfo{PeerID: serverPeer, GID: linuxServerGID, MAC: serverMAC,
			QPN: 0x123, RKey: 0x1a2b3c4d, RMBEIndex: 1, AlertToken: 7, SizeCode: 2, MTU: MTU1024,
			RMBAddr: 0x7f0012340000, PSN: 0xabcdef, FirstContact: true,
			V2: &LinkInfoV2{EID: probeUEID, FirstContact: FirstContactExt{OSType: OSLinux, Release: 1,
				Hostname: hostname("server-a"), MaxConns: 128, MaxLinks: 1, FeatureMask: 1}}}},
	},
	{
		name: "confirm-v2-two-gids",
		hex: `e2d4c3d9 | 03 | 00c4 | 28 |
			abcd5254006789ab | 00000000000000000000ffff0a3c0002 | 5254006789ab |
			000456 | 0badf00d | 01 | 00000009 | 54 | 00 | 0000555500001000 | 00 | 123456 |
			534d43522d563250524f42452e554549 44202020202020202020202020202020 | 0000000000000000 |
			80 | 21 | 0000 | 636c69656e742d62202020202020202020202020202020202020202020202020 |
			80 | 01 | 0001 | 00000000 | 0000000000000000 |
			02 | 000000 | 00000000000000000000ffff0a3c0002 | 00000000000000000000ffff0a3d0002 |
			e2d4c3d9`,
		want: &Confirm{LinkInfo{PeerID: clientPeer, GID: linuxClientGID, MAC: clientMAC,
			QPN: 0x456, RKey: 0x0badf00d, RMBEIndex: 1, AlertToken: 9, SizeCode: 5, MTU: MTU2048,
			RMBAddr: 0x555500001000, PSN: 0x123456, FirstContact: true,
			V2: &LinkInfoV2{EID: probeUEID, FirstContact: FirstContactExt{Direct: true, OSType: OSLinux, Release: 1,
				Hostname: hostname("client-b"), MaxConns: 128, MaxLinks: 1, FeatureMask: 1},
				GIDs: [][16]byte{linuxClientGID, {10: 0xff, 11: 0xff, 12: 10, 13: 61, 14: 0, 15: 2}}}}},
	},
	{
		// Linux's version-2 Decline: 44 bytes, its OS type, four more codes.
		name: "decline-v2",
		hex: `e2d4c3d9 | 04 | 002c | 20 |
			d436525400006001 | 02010000 | 20 000000 |
			03030008 | 00000000 | 00000000 | 00000000 |
			e2d4c3d9`,
		want: &Decline{PeerID: linuxServerPeer, Code: DeclineTimeoutConfirmLink, Version: Version2, OSType: OSLinux,
			MoreCodes: [MoreDeclineCodes]DeclineCode{DeclineNoUEID}},
	},
	{
		// Linux's version-1 Decline carries its OS type too.
		name: "decline-v1-os-type",
		hex: `e2d4c3d9 | 04 | 001c | 10 |
			d436525400006001 | 03030000 | 20 000000 |
			e2d4c3d9`,
		want: &Decline{PeerID: linuxServerPeer, Code: DeclineNoSMCDevice, OSType: OSLinux},
	},
}

func init() { goldens = append(goldens, goldensV2...) }

func TestGoldenV2Len(t *testing.T) {
	for _, g := range goldensV2 {
		if got, want := g.want.Len(), len(unhex(t, g.hex)); got != want {
			t.Errorf("%s: Len() = %d, wire %d", g.name, got, want)
		}
	}
}

// TestParseV2Malformed: every peer-supplied count, offset and length of version 2
// is checked against the bytes there are; each edit below breaks one.
func TestParseV2Malformed(t *testing.T) {
	g := func(name string) []byte { return goldenBytes(t, name) }
	setLen := func(b []byte, n int) { b[offLength], b[offLength+1] = byte(n>>8), byte(n) }
	grow := func(b []byte, n int) []byte { // n zero bytes before the trailer
		out := append(append(append([]byte(nil), b[:len(b)-TrailerLen]...), make([]byte, n)...), Eyecatcher[:]...)
		setLen(out, len(out))
		return out
	}
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"proposal v2_ext_offset off by one", edit(g("linux-v2-proposal"), func(b []byte) []byte { b[propOffV2ExtOff+1]++; return b }), ErrMalformed},
		{"proposal 9 user eids", edit(g("linux-v2-proposal"), func(b []byte) []byte { b[80] = 9; return grow(b, 8*EIDLen) }), ErrMalformed},
		{"proposal eid count past the end", edit(g("linux-v2-proposal"), func(b []byte) []byte { b[80] = 2; return b }), ErrMalformed},
		{"proposal extra byte", grow(g("linux-v2-proposal"), 1), ErrMalformed},
		{"proposal iparea_offset without ip area", edit(g("linux-v2-proposal"), func(b []byte) []byte { b[propOffIPAreaOffset+1] = 40; return b }), ErrMalformed},
		{"proposal iparea_offset not 40", edit(g("proposal-v1-and-v2.1"), func(b []byte) []byte { b[propOffIPAreaOffset+1] = 44; return b }), ErrMalformed},
		{"proposal 9 ipv6 prefixes", edit(g("proposal-v1-and-v2.1"), func(b []byte) []byte { b[proposalV2BaseLen+ipOffCount] = 9; return b }), ErrMalformed},
		{"proposal ipv6 prefixes past the end", edit(g("proposal-v1-and-v2.1"), func(b []byte) []byte { b[proposalV2BaseLen+ipOffCount] = 8; return b }), ErrMalformed},
		{"proposal ismv2 count without SMC-D", edit(g("linux-v2-proposal"), func(b []byte) []byte { b[81] = 1; return b }), ErrMalformed},
		{"proposal 9 ismv2 gids", edit(g("proposal-both-types-smcd-v2"), func(b []byte) []byte { b[88+1] = 9; return grow(b, 8*ismv2EntryLen) }), ErrMalformed},
		{"proposal SMC-Dv2 offset wrong", edit(g("proposal-both-types-smcd-v2"), func(b []byte) []byte { b[88+v2OffSMCDExtOff+1]++; return b }), ErrMalformed},
		{"proposal no typev2, extension bytes", edit(g("linux-v2-proposal"), func(b []byte) []byte { b[offVersion] = 0x2a; return b }), ErrMalformed},
		{"proposal too short for its base", edit(g("linux-v2-proposal"), func(b []byte) []byte {
			b = append(b[:proposalV2BaseLen], Eyecatcher[:]...)
			setLen(b, len(b))
			return b
		}), ErrMalformed},
		{"accept first contact without its extension", edit(g("accept-v2-not-first-contact"), func(b []byte) []byte { b[offVersion] |= flagBit; return b }), ErrMalformed},
		{"accept first contact one byte long", grow(g("linux-v2-accept"), 1), ErrMalformed},
		{"accept not first contact with extension", edit(g("linux-v2-accept"), func(b []byte) []byte { b[offVersion] &^= flagBit; return b }), ErrMalformed},
		{"confirm gid count past the end", edit(g("linux-v2-confirm"), func(b []byte) []byte { b[acOffFCE+fceLen] = 2; return b }), ErrMalformed},
		{"confirm gid count over the limit", edit(g("linux-v2-confirm"), func(b []byte) []byte {
			b[acOffFCE+fceLen] = MaxConfirmGIDs + 1
			return grow(b, 16*MaxConfirmGIDs)
		}), ErrMalformed},
		{"confirm first contact without the gid list", edit(g("linux-v2-accept"), func(b []byte) []byte { b[offType] = byte(TypeConfirm); return b }), ErrMalformed},
		{"decline v2 of 28 bytes", edit(g("decline-v1-os-type"), func(b []byte) []byte { b[offVersion] = 0x20; return b }), ErrTooShort},
		{"decline v1 of 44 bytes", edit(g("decline-v2"), func(b []byte) []byte { b[offVersion] = 0x10; return b }), ErrTooLong},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Parse(tt.in)
			if !errors.Is(err, tt.want) || m != nil {
				t.Fatalf("Parse = %+v, %v; want %v", m, err, tt.want)
			}
		})
	}
}

// TestAppendV2Invalid: AppendTo refuses version-2 fields that cannot be encoded,
// leaving the caller's bytes as they were.
func TestAppendV2Invalid(t *testing.T) {
	tooMany := make([]EID, MaxUEIDs+1)
	tests := []struct {
		name string
		m    Message
	}{
		{"proposal v2 without V2", &Proposal{Version: 2}},
		{"proposal v1 with V2", &Proposal{Version: 1, V2: &ProposalV2{}}},
		{"proposal 9 user eids", &Proposal{Version: 2, SMCType: SMCTypeN, V2: &ProposalV2{UEIDs: tooMany}}},
		{"proposal ip area without v1 type", &Proposal{Version: 2, SMCType: SMCTypeN, PrefixLen: 8, V2: &ProposalV2{}}},
		{"proposal SMC-Dv2 fields without SMC-D", &Proposal{Version: 2, V2: &ProposalV2{ISMv2: []ISMv2GID{{}}}}},
		{"proposal v2 with envelope", &Proposal{Version: 2, Ext: []byte("SMCX"), V2: &ProposalV2{}}},
		{"proposal release over 4 bits", &Proposal{Version: 2, V2: &ProposalV2{Release: 16}}},
		{"accept with gids", &Accept{LinkInfo{MTU: MTU1024, FirstContact: true, V2: &LinkInfoV2{GIDs: [][16]byte{{}}}}}},
		{"confirm first-contact fields without first contact", &Confirm{LinkInfo{MTU: MTU1024, V2: &LinkInfoV2{FirstContact: FirstContactExt{Direct: true}}}}},
		{"confirm 9 gids", &Confirm{LinkInfo{MTU: MTU1024, FirstContact: true, V2: &LinkInfoV2{GIDs: make([][16]byte, MaxConfirmGIDs+1)}}}},
		{"accept v2 with envelope", &Accept{LinkInfo{MTU: MTU1024, Ext: []byte("SMCX"), V2: &LinkInfoV2{}}}},
		{"decline v1 with more codes", &Decline{MoreCodes: [MoreDeclineCodes]DeclineCode{DeclineNoUEID}}},
		{"decline os type over 4 bits", &Decline{OSType: 16}},
		{"decline version 3", &Decline{Version: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := tt.m.AppendTo([]byte("x"))
			if !errors.Is(err, ErrInvalid) || string(b) != "x" {
				t.Fatalf("AppendTo = %q, %v; want ErrInvalid and the input", b, err)
			}
		})
	}
}

// TestParseEID: the rule is package ueid's (tested there); ParseEID pads with
// blanks and wraps its error.
func TestParseEID(t *testing.T) {
	e, err := ParseEID("A.B-C  ")
	if err != nil || string(e[:]) != "A.B-C"+strings.Repeat(" ", EIDLen-5) || e.String() != "A.B-C" {
		t.Fatalf("ParseEID = %q (%q), %v", e[:], e.String(), err)
	}
	if _, err := ParseEID("lower"); !errors.Is(err, ErrEID) {
		t.Fatalf("ParseEID(lower) = %v, want ErrEID", err)
	}
}
