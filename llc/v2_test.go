// Golden version-2 LLC messages: Linux 6.1's own, from the soft-RoCE probe's
// capture, and hand-written ones; round trips, malformed counts, a fuzz target.

package llc

import (
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
	"testing"
)

var (
	v2ServerGID = GID{10: 0xff, 11: 0xff, 12: 10, 13: 60, 14: 0, 15: 1}
	v2ClientGID = GID{10: 0xff, 11: 0xff, 12: 10, 13: 60, 14: 0, 15: 2}
)

var goldensV2 = []struct {
	name string
	hex  string
	want MessageV2
}{
	{"linux-confirm-link", "212c000352540000600100000000000000000000ffff0a3c0001000011010000010102000000000000000000",
		&ConfirmLinkV2{ConfirmLink: ConfirmLink{Flags: FlagNoRMBEyecatcher, MAC: MAC{0x52, 0x54, 0, 0, 0x60, 1}, GID: v2ServerGID,
			QPN: 0x11, Link: 1, LinkUID: LinkUID{0, 0, 1, 1}, MaxLinks: 2}}},
	{"linux-confirm-link-response", "212c008352540000600200000000000000000000ffff0a3c0002000011010000010102000000000000000000",
		&ConfirmLinkV2{ConfirmLink: ConfirmLink{Flags: FlagResponse | FlagNoRMBEyecatcher, MAC: MAC{0x52, 0x54, 0, 0, 0x60, 2}, GID: v2ClientGID,
			QPN: 0x11, Link: 1, LinkUID: LinkUID{0, 0, 1, 1}, MaxLinks: 2}}},
	{"linux-add-link", "22580000525400006001000000000000000000000000ffff0a3c000100001202030c71a60000000000000000" +
		"800000000000000000000000ffff0a3c000100000000000000000100000003a8000005efff1d3de145910000",
		&AddLinkV2{AddLink: AddLink{MAC: MAC{0x52, 0x54, 0, 0, 0x60, 1}, GID: v2ServerGID, QPN: 0x12, Link: 2, MTU: MTU1024, PSN: 0x0c71a6},
			Ext: true, Direct: true, TargetGID: v2ServerGID, Rkeys: []RkeyV2{{Rkey: 0x3a8, NewRkey: 0x5ef, NewAddr: 0xff1d3de145910000}}}},
	// The one-device client's rejection: 44 bytes, response and rejected flags.
	{"linux-add-link-reject", "222c00c0525400006001000000000000000000000000ffff0a3c000100001202030c71a60000000000000000",
		&AddLinkV2{AddLink: AddLink{Flags: FlagResponse | FlagAddLinkRejected, MAC: MAC{0x52, 0x54, 0, 0, 0x60, 1}, GID: v2ServerGID,
			QPN: 0x12, Link: 2, MTU: MTU1024, PSN: 0x0c71a6}}},
	{"linux-delete-rkey", "292c000001000000000003a80000000000000000000000000000000000000000000000000000000000000000",
		&DeleteRkeyV2{Rkeys: []uint32{0x3a8}}},
	{"linux-delete-rkey-response", "292c008001000000000000000000000000000000000000000000000000000000000000000000000000000000",
		&DeleteRkeyV2{Flags: FlagResponse, Rkeys: []uint32{0}}},
	{"delete-rkey-12", "29380000" + "0c020000" + "0000000100000002000000030000000400000005000000060000000700000008000000090000000a0000000b0000000c",
		&DeleteRkeyV2{Invalid: 2, Rkeys: []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}}},
	{"req-add-link-2-gids", "253c0000" + "0000000000000000000000000000000000000000" + "02000000" +
		"00000000000000000000ffff0a3c0002" + "00000000000000000000ffff0a3d0002",
		&ReqAddLinkV2{GIDs: []GID{v2ClientGID, {10: 0xff, 11: 0xff, 12: 10, 13: 61, 14: 0, 15: 2}}}},
	{"confirm-link-v2.1-max-conns", "212c000352540000600100000000000000000000ffff0a3c0001000011010000010101800000000000000000",
		&ConfirmLinkV2{ConfirmLink: ConfirmLink{Flags: FlagNoRMBEyecatcher, MAC: MAC{0x52, 0x54, 0, 0, 0x60, 1}, GID: v2ServerGID,
			QPN: 0x11, Link: 1, LinkUID: LinkUID{0, 0, 1, 1}, MaxLinks: 1}, MaxConns: 128}},
}

func TestGoldenV2(t *testing.T) {
	for _, g := range goldensV2 {
		t.Run(g.name, func(t *testing.T) {
			wire, err := hex.DecodeString(g.hex)
			if err != nil {
				t.Fatal(err)
			}
			if g.want.Len() != len(wire) {
				t.Fatalf("Len() = %d, wire %d", g.want.Len(), len(wire))
			}
			// A receive buffer holds more than the message: the rest is ignored.
			got, err := ParseV2(append(bytes.Clone(wire), 0xee, 0xee))
			if err != nil || !reflect.DeepEqual(got, g.want) {
				t.Fatalf("ParseV2 = %+v, %v\nwant %+v", got, err, g.want)
			}
			enc, err := g.want.AppendBinary([]byte("x"))
			if err != nil || !bytes.Equal(enc[1:], wire) || enc[0] != 'x' {
				t.Fatalf("AppendBinary = %x, %v\nwant x%x", enc, err, wire)
			}
		})
	}
}

func TestParseV2Malformed(t *testing.T) {
	golden := func(name string) []byte {
		for _, g := range goldensV2 {
			if g.name == name {
				b, _ := hex.DecodeString(g.hex)
				return b
			}
		}
		t.Fatalf("no golden %s", name)
		return nil
	}
	edit := func(name string, f func(b []byte) []byte) []byte { return f(golden(name)) }
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"version 1 type", edit("linux-confirm-link", func(b []byte) []byte { b[0] = 0x01; return b }), ErrNotV2},
		{"cdc", edit("linux-confirm-link", func(b []byte) []byte { b[0] = 0xfe; return b }), ErrNotV2},
		{"unknown v2 type", edit("linux-confirm-link", func(b []byte) []byte { b[0] = 0x2f; return b }), ErrUnknownType},
		{"short buffer", golden("linux-confirm-link")[:43], ErrShort},
		{"length past the buffer", edit("linux-add-link", func(b []byte) []byte { b[1] = 0x59; return b }), ErrLength},
		{"length below 44", edit("linux-confirm-link", func(b []byte) []byte { b[1] = 43; return b }), ErrLength},
		{"length over 8 KiB", edit("linux-confirm-link", func(b []byte) []byte { b[1], b[2] = 0x01, 0x20; return b }), ErrLength},
		{"big-endian length read as little-endian", edit("linux-confirm-link", func(b []byte) []byte { b[1], b[2] = 0, 0x2c; return b }), ErrLength},
		{"confirm link of 48 bytes", edit("linux-confirm-link", func(b []byte) []byte { b[1] = 48; return append(b, 0, 0, 0, 0) }), ErrLength},
		{"add link rkey count past the length", edit("linux-add-link", func(b []byte) []byte { b[alv2NumRkeys] = 2; return b }), ErrCount},
		{"add link rkey count big-endian", edit("linux-add-link", func(b []byte) []byte { b[alv2NumRkeys], b[alv2NumRkeys+1] = 0, 1; return b }), ErrCount},
		{"add link between 44 and 72 bytes", edit("linux-add-link", func(b []byte) []byte { b[1] = 60; return b }), ErrLength},
		{"add link bad mtu", edit("linux-add-link", func(b []byte) []byte { b[alMTU] = 7; return b }), ErrMTU},
		{"delete rkey count past the length", edit("delete-rkey-12", func(b []byte) []byte { b[drv2Count] = 13; return b }), ErrCount},
		{"delete rkey 44 bytes, count 10", edit("linux-delete-rkey", func(b []byte) []byte { b[drv2Count] = 10; return b }), ErrCount},
		{"req add link 9 gids", edit("req-add-link-2-gids", func(b []byte) []byte { b[rav2GIDCount] = 9; return b }), ErrCount},
		{"req add link count past the length", edit("req-add-link-2-gids", func(b []byte) []byte { b[rav2GIDCount] = 3; return b }), ErrCount},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ParseV2(tt.in)
			if !errors.Is(err, tt.want) || m != nil {
				t.Fatalf("ParseV2 = %+v, %v; want %v", m, err, tt.want)
			}
		})
	}
}

func TestAppendV2Invalid(t *testing.T) {
	for _, m := range []MessageV2{
		&AddLinkV2{Rkeys: []RkeyV2{{}}},                                   // rkeys in the 44-byte form
		&AddLinkV2{Ext: true, Rkeys: make([]RkeyV2, MaxAddLinkV2Rkeys+1)}, // too many for 8 KiB
		&AddLinkV2{AddLink: AddLink{RejectReason: RejectNoAltPath}},       // no reason nibble in v2
		&ReqAddLinkV2{GIDs: make([]GID, MaxReqAddLinkGIDs+1)},             // too many gids
		&DeleteRkeyV2{Rkeys: make([]uint32, 256)},                         // count over a byte
		&ConfirmLinkV2{ConfirmLink: ConfirmLink{QPN: 1 << 24}},            // QPN over 24 bits
	} {
		if b, err := m.AppendBinary([]byte("x")); err == nil || string(b) != "x" {
			t.Errorf("%T %+v: %q, %v; want an error and the input", m, m, b, err)
		}
	}
}

// canonicalV2 returns the bytes of a parsed m with its reserved bytes and bits
// zeroed, as AppendBinary writes them.
func canonicalV2(in []byte, m MessageV2) []byte {
	c := bytes.Clone(in)
	zero := func(from, to int) { clear(c[from:min(to, len(c))]) }
	switch m := m.(type) {
	case *ConfirmLinkV2:
		zero(clMaxConns+1, MsgLen)
	case *AddLinkV2:
		zero(10, alGID)
		c[alMTU] &= 0x0f
		zero(alPSN+3, MsgLen)
		if m.Ext {
			c[alv2Direct] &= 0x80
			zero(alv2Direct+1, alv2TargetGID)
			zero(alv2TargetGID+16, alv2NumRkeys)
		}
	case *DeleteRkeyV2:
		zero(drv2Invalid+1, drv2Rkeys)
		zero(drv2Rkeys+4*len(m.Rkeys), len(c))
	case *ReqAddLinkV2:
		zero(offFlags+1, rav2GIDCount)
		zero(rav2GIDCount+1, rav2GIDs)
		zero(rav2GIDs+16*len(m.GIDs), len(c))
	}
	return c
}

// FuzzParseV2 checks that ParseV2 never panics and that what it accepts re-encodes
// to the message's bytes with reserved bytes and bits cleared.
func FuzzParseV2(f *testing.F) {
	for _, g := range goldensV2 {
		b, _ := hex.DecodeString(g.hex)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseV2(b)
		if err != nil {
			if m != nil {
				t.Fatalf("ParseV2 returned %+v with error %v", m, err)
			}
			return
		}
		out, err := m.AppendBinary(nil)
		if err != nil {
			t.Fatalf("AppendBinary of a parsed %v: %v", m.Type(), err)
		}
		if len(out) != m.Len() {
			t.Fatalf("AppendBinary wrote %d bytes, Len %d", len(out), m.Len())
		}
		if want := canonicalV2(b[:m.Len()], m); !bytes.Equal(out, want) {
			t.Fatalf("re-encoded %v differs:\n in  %x\n out %x", m.Type(), want, out)
		}
		again, err := ParseV2(out)
		if err != nil || !reflect.DeepEqual(again, m) {
			t.Fatalf("re-parse: %+v, %v\nwant %+v", again, err, m)
		}
	})
}
