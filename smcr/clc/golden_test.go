// Golden CLC messages written by hand from the RFC's layouts (Linux's smc_clc.h), checked both ways.
// Covers RFC 7609 §3.7.1–§3.7.4 (Proposal, Accept, Confirm, Decline).

package clc

import (
	"bytes"
	"encoding/hex"
	"reflect"
	"strings"
	"testing"
)

// unhex decodes a golden string; spaces, newlines and "|" only group the fields.
func unhex(t testing.TB, s string) []byte {
	t.Helper()
	s = strings.NewReplacer(" ", "", "\n", "", "\t", "", "|", "").Replace(s)
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad golden hex: %v", err)
	}
	return b
}

var (
	serverPeer = PeerID{0x12, 0x34, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	serverGID  = [16]byte{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x52, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56}
	serverMAC  = [6]byte{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	clientPeer = PeerID{0xab, 0xcd, 0x52, 0x54, 0x00, 0x67, 0x89, 0xab}
	clientGID  = [16]byte{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x52, 0x54, 0x00, 0xff, 0xfe, 0x67, 0x89, 0xab}
	clientMAC  = [6]byte{0x52, 0x54, 0x00, 0x67, 0x89, 0xab}
)

type golden struct {
	name string
	hex  string
	want Message
}

// Fields of a golden string are separated by "|" in the order of the tables.
var goldens = []golden{
	{
		name: "proposal-ipv4-linux",
		hex: `e2d4c3d9 | 01 | 005c | 10 |
			abcd525400 6789ab | fe80000000000000 525400fffe6789ab | 5254006789ab | 0028 |
			0000000000000000 | 0000 | 0000 | 00000000000000000000000000000000000000000000000000000000 |
			c0a80a00 | 18 | 0000 | 00 |
			e2d4c3d9`,
		want: &Proposal{Version: 1, PeerID: clientPeer, GID: clientGID, MAC: clientMAC,
			Subnet: [4]byte{192, 168, 10, 0}, PrefixLen: 24},
	},
	{
		name: "proposal-ipv4-old-form",
		hex: `e2d4c3d9 | 01 | 0034 | 10 |
			abcd5254006789ab | fe80000000000000525400fffe6789ab | 5254006789ab | 0000 |
			0a000000 | 08 | 0000 | 00 |
			e2d4c3d9`,
		want: &Proposal{Version: 1, PeerID: clientPeer, GID: clientGID, MAC: clientMAC,
			SkipArea: []byte{}, Subnet: [4]byte{10, 0, 0, 0}, PrefixLen: 8},
	},
	{
		name: "proposal-ipv6-prefixes",
		hex: `e2d4c3d9 | 01 | 007e | 10 |
			abcd5254006789ab | fe80000000000000525400fffe6789ab | 5254006789ab | 0028 |
			0000000000000000 | 0000 | 0000 | 00000000000000000000000000000000000000000000000000000000 |
			c0a80a00 | 18 | 0000 | 02 |
			20010db8000100000000000000000000 | 40 |
			fd000000000000000000000000000000 | 08 |
			e2d4c3d9`,
		want: &Proposal{Version: 1, PeerID: clientPeer, GID: clientGID, MAC: clientMAC,
			Subnet: [4]byte{192, 168, 10, 0}, PrefixLen: 24,
			IPv6: []IPv6Prefix{
				{Addr: [16]byte{0x20, 0x01, 0x0d, 0xb8, 0x00, 0x01}, Len: 64},
				{Addr: [16]byte{0xfd}, Len: 8},
			}},
	},
	{
		name: "proposal-extension",
		hex: `e2d4c3d9 | 01 | 007c | 10 |
			abcd5254006789ab | fe80000000000000525400fffe6789ab | 5254006789ab | 0028 |
			0000000000000000 | 0000 | 0000 | 00000000000000000000000000000000000000000000000000000000 |
			c0a80a00 | 18 | 0000 | 01 |
			fd000000000000000000000000000000 | 08 |
			534d4358 | 01 | 000f | 01 0002 0102 | 7f 0000 |
			e2d4c3d9`,
		want: &Proposal{Version: 1, PeerID: clientPeer, GID: clientGID, MAC: clientMAC,
			Subnet: [4]byte{192, 168, 10, 0}, PrefixLen: 24,
			IPv6: []IPv6Prefix{{Addr: [16]byte{0xfd}, Len: 8}},
			Ext:  []byte("SMCX\x01\x00\x0f\x01\x00\x02\x01\x02\x7f\x00\x00")},
	},
	{
		name: "accept-first-contact",
		hex: `e2d4c3d9 | 02 | 0044 | 18 |
			1234525400123456 | fe80000000000000525400fffe123456 | 525400123456 |
			000123 | 1a2b3c4d | 01 | 00000007 | 23 | 00 | 00007f0012340000 | 00 | abcdef |
			e2d4c3d9`,
		want: &Accept{LinkInfo{PeerID: serverPeer, GID: serverGID, MAC: serverMAC,
			QPN: 0x123, RKey: 0x1a2b3c4d, RMBEIndex: 1, AlertToken: 7, SizeCode: 2, MTU: MTU1024,
			RMBAddr: 0x7f0012340000, PSN: 0xabcdef, FirstContact: true}},
	},
	{
		name: "accept-not-first-contact",
		hex: `e2d4c3d9 | 02 | 0044 | 10 |
			1234525400123456 | fe80000000000000525400fffe123456 | 525400123456 |
			ffffff | 00000001 | 01 | 80000000 | 55 | 00 | ffffffffffffffff | 00 | 000000 |
			e2d4c3d9`,
		want: &Accept{LinkInfo{PeerID: serverPeer, GID: serverGID, MAC: serverMAC,
			QPN: 0xffffff, RKey: 1, RMBEIndex: 1, AlertToken: 0x80000000, SizeCode: 5, MTU: MTU4096,
			RMBAddr: 0xffffffffffffffff}},
	},
	{
		name: "accept-extension",
		hex: `e2d4c3d9 | 02 | 0051 | 18 |
			1234525400123456 | fe80000000000000525400fffe123456 | 525400123456 |
			000123 | 1a2b3c4d | 01 | 00000007 | 23 | 00 | 00007f0012340000 | 00 | abcdef |
			534d4358 | 01 | 000d | 01 0003 020103 |
			e2d4c3d9`,
		want: &Accept{LinkInfo{PeerID: serverPeer, GID: serverGID, MAC: serverMAC,
			QPN: 0x123, RKey: 0x1a2b3c4d, RMBEIndex: 1, AlertToken: 7, SizeCode: 2, MTU: MTU1024,
			RMBAddr: 0x7f0012340000, PSN: 0xabcdef, FirstContact: true,
			Ext: []byte("SMCX\x01\x00\x0d\x01\x00\x03\x02\x01\x03")}},
	},
	{
		name: "confirm-first-contact",
		hex: `e2d4c3d9 | 03 | 0044 | 18 |
			abcd5254006789ab | fe80000000000000525400fffe6789ab | 5254006789ab |
			000456 | 0badf00d | 01 | 00000009 | 54 | 00 | 0000555500001000 | 00 | 123456 |
			e2d4c3d9`,
		want: &Confirm{LinkInfo{PeerID: clientPeer, GID: clientGID, MAC: clientMAC,
			QPN: 0x456, RKey: 0x0badf00d, RMBEIndex: 1, AlertToken: 9, SizeCode: 5, MTU: MTU2048,
			RMBAddr: 0x555500001000, PSN: 0x123456, FirstContact: true}},
	},
	{
		name: "decline-subnet",
		hex: `e2d4c3d9 | 04 | 001c | 10 |
			1234525400123456 | 03070000 | 00000000 |
			e2d4c3d9`,
		want: &Decline{PeerID: serverPeer, Code: DeclineIPSubnetMismatch},
	},
	{
		name: "decline-out-of-sync",
		hex: `e2d4c3d9 | 04 | 001c | 18 |
			abcd5254006789ab | 04000000 | 00000000 |
			e2d4c3d9`,
		want: &Decline{PeerID: clientPeer, Code: DeclineSyncError, OutOfSync: true},
	},
	{
		// smcr's envelope with one rdma offer in the area iparea_offset skips,
		// zero-padded: the form a Linux server accepts (SetEnvelope).
		name: "proposal-ipv4-smcx-in-skip-area",
		hex: `e2d4c3d9 | 01 | 005c | 10 |
			abcd525400 6789ab | fe80000000000000 525400fffe6789ab | 5254006789ab | 0028 |
			534d4358 | 01 | 0023 | 01 0019 | 01 fe80000000000000525400fffe6789ab 5254006789ab 03 00 | 0000000000 |
			c0a80a00 | 18 | 0000 | 00 |
			e2d4c3d9`,
		want: &Proposal{Version: 1, PeerID: clientPeer, GID: clientGID, MAC: clientMAC,
			SkipArea: append(append([]byte("SMCX\x01\x00\x23\x01\x00\x19\x01"), clientGID[:]...),
				append(clientMAC[:], 3, 0, 0, 0, 0, 0, 0)...),
			Subnet: [4]byte{192, 168, 10, 0}, PrefixLen: 24},
	},
}

func TestGolden(t *testing.T) {
	for _, g := range goldens {
		t.Run(g.name, func(t *testing.T) {
			wire := unhex(t, g.hex)
			if h, err := ParseHeader(wire); err != nil || h.Length != len(wire) {
				t.Fatalf("golden length field %d != %d bytes (%v)", h.Length, len(wire), err)
			}
			got, err := Parse(wire)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(got, g.want) {
				t.Fatalf("Parse:\n got %+v\nwant %+v", got, g.want)
			}
			if got.Type() != MsgType(wire[offType]) {
				t.Errorf("Type() = %v, wire says %d", got.Type(), wire[offType])
			}
			prefix := []byte("prefix")
			enc, err := g.want.AppendTo(append([]byte(nil), prefix...))
			if err != nil {
				t.Fatalf("AppendTo: %v", err)
			}
			if !bytes.HasPrefix(enc, prefix) {
				t.Fatalf("AppendTo clobbered the caller's bytes: %q", enc[:len(prefix)])
			}
			if enc = enc[len(prefix):]; !bytes.Equal(enc, wire) {
				t.Fatalf("AppendTo:\n got %x\nwant %x", enc, wire)
			}
			again, err := Parse(enc)
			if err != nil || !reflect.DeepEqual(again, got) {
				t.Fatalf("round trip: %+v, %v", again, err)
			}
			// Parse copies: scribbling on the input leaves the message alone.
			for i := range wire {
				wire[i] ^= 0xff
			}
			if !reflect.DeepEqual(got, g.want) {
				t.Fatalf("message shares memory with its input")
			}
		})
	}
}

func TestGoldenFields(t *testing.T) {
	// Accessors over the decoded fields, beyond DeepEqual.
	p := goldens[2].want.(*Proposal)
	if got := p.IPv4().String(); got != "192.168.10.0/24" {
		t.Errorf("IPv4() = %s", got)
	}
	if got := p.IPv6[0].Prefix().String(); got != "2001:db8:1::/64" {
		t.Errorf("IPv6[0].Prefix() = %s", got)
	}
	if n := p.Len(); n != ProposalLen+2*17 {
		t.Errorf("Len() = %d", n)
	}
	e, err := ParseEnvelope(goldens[3].want.(*Proposal).Ext)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := e.Find(1); !ok || !bytes.Equal(v, []byte{1, 2}) {
		t.Errorf("Find(1) = %x, %v", v, ok)
	}
}

func TestProposalSkipArea(t *testing.T) {
	// A version-1 Proposal whose skipped area is not Linux's (its iparea_offset is
	// not 40, a byte in it is set) must be kept byte for byte.
	skip := make([]byte, 44)
	skip[11] = 0x22
	p := &Proposal{Version: 1, SMCType: SMCTypeB, SMCTypeV2: SMCTypeR, PeerID: clientPeer, SkipArea: skip,
		Subnet: [4]byte{10, 1, 0, 0}, PrefixLen: 16, Ext: []byte{9, 9, 9}}
	b, err := p.AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	if b[offVersion] != 0x13 || b[propOffIPAreaOffset+1] != 44 || len(b) != p.Len() {
		t.Fatalf("encoded % x", b)
	}
	got, err := Parse(b)
	if err != nil || !reflect.DeepEqual(got, p) {
		t.Fatalf("Parse = %+v, %v", got, err)
	}
	// The zero Version is sent as version 1.
	p.Version = 0
	if b, _ = p.AppendTo(nil); b[offVersion]>>4 != Version1 {
		t.Fatalf("zero version sent as %#x", b[offVersion])
	}
}
