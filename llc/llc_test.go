// Golden, round-trip and validation tests for the LLC codec; the golden bytes are
// written by hand from the kernel's struct smc_llc_msg_* layouts (RFC 7609 §3.8).

package llc

import (
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// unhex decodes hex written as space-separated groups, one field per argument.
func unhex(t testing.TB, fields ...string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(strings.Join(fields, " ")), ""))
	if err != nil {
		t.Fatalf("bad golden hex: %v", err)
	}
	return b
}

func zeros(n int) string { return strings.Repeat("00 ", n) }

type golden struct {
	name string
	hex  []string // one field per element, as drawn in the package doc
	want Message
}

// goldens are the hand-written messages: each hex field is annotated with its offset.
var goldens = []golden{
	{
		name: "confirm link request",
		hex: []string{
			"01 2c 00 03",       // 0: type, length 44, reserved, flags: no RMBE eyecatchers
			"02 00 00 aa bb cc", // 4: sender MAC
			"fe 80 00 00 00 00 00 00 00 00 00 ff fe aa bb cc", // 10: sender GID
			"00 01 1a",    // 26: QPN
			"01",          // 29: link number
			"12 34 56 79", // 30: link UID
			"02",          // 34: max links
			zeros(9),      // 35..43: reserved
		},
		want: &ConfirmLink{
			Flags:    0x03,
			MAC:      MAC{0x02, 0, 0, 0xaa, 0xbb, 0xcc},
			GID:      GID{0xfe, 0x80, 11: 0xff, 12: 0xfe, 13: 0xaa, 14: 0xbb, 15: 0xcc},
			QPN:      0x11a,
			Link:     1,
			LinkUID:  LinkUID{0x12, 0x34, 0x56, 0x79},
			MaxLinks: 2,
		},
	},
	{
		name: "confirm link response",
		hex: []string{
			"01 2c 00 83",       // response | no eyecatchers
			"02 00 00 dd ee ff", // MAC
			"fe 80 00 00 00 00 00 00 00 00 00 ff fe dd ee ff", // GID
			"ab cd ef",    // QPN, all 24 bits used
			"01",          // link number
			"9a bc de f0", // link UID
			"02",          // max links
			zeros(9),
		},
		want: &ConfirmLink{
			Flags:    0x83,
			MAC:      MAC{0x02, 0, 0, 0xdd, 0xee, 0xff},
			GID:      GID{0xfe, 0x80, 11: 0xff, 12: 0xfe, 13: 0xdd, 14: 0xee, 15: 0xff},
			QPN:      0xabcdef,
			Link:     1,
			LinkUID:  LinkUID{0x9a, 0xbc, 0xde, 0xf0},
			MaxLinks: 2,
		},
	},
	{
		name: "add link request",
		hex: []string{
			"02 2c 00 00",       // 0: type, length, reason 0, flags 0
			"02 00 00 dd ee ff", // 4: MAC
			"00 00",             // 10: reserved
			"fe 80 00 00 00 00 00 00 00 00 00 ff fe dd ee ff", // 12: GID
			"00 02 2b", // 28: QPN
			"02",       // 31: link number
			"03",       // 32: MTU 1024 in the low nibble
			"ab cd ef", // 33: initial PSN
			zeros(8),   // 36..43: reserved
		},
		want: &AddLink{
			MAC:  MAC{0x02, 0, 0, 0xdd, 0xee, 0xff},
			GID:  GID{0xfe, 0x80, 11: 0xff, 12: 0xfe, 13: 0xdd, 14: 0xee, 15: 0xff},
			QPN:  0x22b,
			Link: 2,
			MTU:  MTU1024,
			PSN:  0xabcdef,
		},
	},
	{
		name: "add link rejected response",
		hex: []string{
			"02 2c 01 c0",       // reason 1 (no alternate path), flags response | rejected
			"02 00 00 11 22 33", // MAC
			"00 00",
			"fe 80 00 00 00 00 00 00 00 00 00 ff fe 11 22 33", // GID
			"00 00 07", // QPN
			"03",       // link number
			"05",       // MTU 4096
			"00 00 01", // PSN
			zeros(8),
		},
		want: &AddLink{
			Flags:        0xc0,
			RejectReason: RejectNoAltPath,
			MAC:          MAC{0x02, 0, 0, 0x11, 0x22, 0x33},
			GID:          GID{0xfe, 0x80, 11: 0xff, 12: 0xfe, 13: 0x11, 14: 0x22, 15: 0x33},
			QPN:          7,
			Link:         3,
			MTU:          MTU4096,
			PSN:          1,
		},
	},
	{
		name: "add link invitation",
		hex: []string{
			"02 2c 00 00",
			"02 00 00 44 55 66", // MAC of the client's alternate port
			"00 00",
			"fe 80 00 00 00 00 00 00 00 00 00 ff fe 44 55 66",
			"00 00 00", // no QP yet
			"00",       // no link number
			"00",       // MTU 0: none offered
			"00 00 00",
			zeros(8),
		},
		want: &AddLink{
			MAC: MAC{0x02, 0, 0, 0x44, 0x55, 0x66},
			GID: GID{0xfe, 0x80, 11: 0xff, 12: 0xfe, 13: 0x44, 14: 0x55, 15: 0x66},
		},
	},
	{
		name: "add link cont, more to follow",
		hex: []string{
			"03 2c 00 00",             // 0
			"02",                      // 4: link number
			"03",                      // 5: three rkeys still to send, two here
			"00 00",                   // 6: reserved
			"00 00 11 11",             // 8: rkey on the existing link
			"00 00 22 22",             // 12: rkey on the new link
			"00 00 7f 00 00 10 00 00", // 16: address on the new link
			"00 00 33 33",             // 24
			"00 00 44 44",             // 28
			"00 00 7f 00 00 20 00 00", // 32
			"00 00 00 00",             // 40: reserved
		},
		want: &AddLinkCont{
			Link:      2,
			Remaining: 3,
			Pairs: [2]RkeyPair{
				{RKey: 0x1111, NewRKey: 0x2222, NewAddr: 0x7f0000100000},
				{RKey: 0x3333, NewRKey: 0x4444, NewAddr: 0x7f0000200000},
			},
		},
	},
	{
		name: "add link cont response, last one",
		hex: []string{
			"03 2c 00 80",
			"02", "01", "00 00",
			"ff ff ff fe", "80 00 00 01", "ff ff ff ff ff ff ff f0",
			zeros(16), // second slot unused
			"00 00 00 00",
		},
		want: &AddLinkCont{
			Flags:     FlagResponse,
			Link:      2,
			Remaining: 1,
			Pairs:     [2]RkeyPair{{RKey: 0xfffffffe, NewRKey: 0x80000001, NewAddr: 0xfffffffffffffff0}},
		},
	},
	{
		name: "delete link all orderly",
		hex: []string{
			"04 2c 00 60", // flags: all | orderly
			"00",          // 4: link number (none: all links)
			"00 03 00 00", // 5: reason: program initiated
			zeros(35),     // 9..43
		},
		want: &DeleteLink{Flags: 0x60, Reason: ReasonProgram},
	},
	{
		name: "delete link response",
		hex: []string{
			"04 2c 00 80",
			"02",
			"00 01 00 00", // lost path
			zeros(35),
		},
		want: &DeleteLink{Flags: FlagResponse, Link: 2, Reason: ReasonLostPath},
	},
	{
		name: "confirm rkey request",
		hex: []string{
			"06 2c 00 00",
			"01",                                           // 4: one other link's rkey
			"00 00 12 34",                                  // 5: rkey on this link
			"00 00 7f 12 34 56 00 00",                      // 9: address on this link
			"02",                                           // 17: other link number
			"00 00 56 78",                                  // 18
			"00 00 7f 12 34 57 00 00",                      // 22
			"00", "00 00 00 00", "00 00 00 00 00 00 00 00", // 30: unused slot
			"00", // 43: reserved
		},
		want: &ConfirmRkey{
			NumOthers: 1,
			RKey:      0x1234,
			Addr:      0x7f1234560000,
			Others:    [2]RToken{{Link: 2, RKey: 0x5678, Addr: 0x7f1234570000}},
		},
	},
	{
		name: "confirm rkey negative retry",
		hex: []string{
			"06 2c 00 b0", // response | negative | retry
			"02",
			"de ad be ef", "01 02 03 04 05 06 07 08",
			"02", "00 00 00 0a", "00 00 00 00 00 00 00 0b",
			"03", "00 00 00 0c", "00 00 00 00 00 00 00 0d",
			"00",
		},
		want: &ConfirmRkey{
			Flags:     0xb0,
			NumOthers: 2,
			RKey:      0xdeadbeef,
			Addr:      0x0102030405060708,
			Others:    [2]RToken{{Link: 2, RKey: 10, Addr: 11}, {Link: 3, RKey: 12, Addr: 13}},
		},
	},
	{
		name: "test link request",
		hex: []string{
			"07 2c 00 00",
			"00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f", // 4: user data
			zeros(24), // 20..43
		},
		want: &TestLink{Data: [16]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}},
	},
	{
		name: "test link response",
		hex: []string{
			"07 2c 00 80",
			"ff ee dd cc bb aa 99 88 77 66 55 44 33 22 11 00",
			zeros(24),
		},
		want: &TestLink{Flags: FlagResponse, Data: [16]byte{0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x99, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x00}},
	},
	{
		name: "confirm rkey cont",
		hex: []string{
			"08 2c 00 00",
			"02",                                           // 4: two tokens left
			"01", "00 00 aa aa", "00 00 00 00 00 00 10 00", // 5
			"03", "00 00 bb bb", "00 00 00 00 00 00 20 00", // 18
			zeros(13), // 31: unused slot
		},
		want: &ConfirmRkeyCont{
			Remaining: 2,
			Tokens:    [3]RToken{{Link: 1, RKey: 0xaaaa, Addr: 0x1000}, {Link: 3, RKey: 0xbbbb, Addr: 0x2000}},
		},
	},
	{
		name: "delete rkey request",
		hex: []string{
			"09 2c 00 00",
			"01",          // 4: count
			"00",          // 5: error mask
			"00 00",       // 6: reserved
			"00 00 12 34", // 8: rkey 1
			zeros(28),     // rkeys 2..8
			"00 00 00 00", // 40: reserved
		},
		want: &DeleteRkey{Count: 1, RKeys: [8]uint32{0x1234}},
	},
	{
		name: "delete rkey negative response",
		hex: []string{
			"09 2c 00 a0", // response | negative
			"03",          // three rkeys
			"40",          // the second was unknown
			"00 00",
			"00 00 12 34", "00 00 56 78", "00 00 9a bc",
			zeros(20),
			"00 00 00 00",
		},
		want: &DeleteRkey{Flags: 0xa0, Count: 3, ErrMask: 0x40, RKeys: [8]uint32{0x1234, 0x5678, 0x9abc}},
	},
}

func TestGolden(t *testing.T) {
	seen := map[Type]bool{}
	for _, g := range goldens {
		t.Run(g.name, func(t *testing.T) {
			b := unhex(t, g.hex...)
			if len(b) != MsgLen {
				t.Fatalf("golden is %d bytes, want %d", len(b), MsgLen)
			}
			seen[g.want.Type()] = true

			// Decode checks every field: the want values are written by hand.
			got, err := Parse(b)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(got, g.want) {
				t.Fatalf("Parse =\n%+v\nwant\n%+v", got, g.want)
			}
			if got.Type() != Type(b[0]) {
				t.Errorf("Type() = %v, want %v", got.Type(), Type(b[0]))
			}
			if got.Response() != (b[3]&0x80 != 0) {
				t.Errorf("Response() = %v with flags %#x", got.Response(), b[3])
			}

			// A 48-byte receive slot with junk after the message parses the same.
			slot := append(bytes.Clone(b), 0xde, 0xad, 0xbe, 0xef)
			if got2, err := Parse(slot); err != nil || !reflect.DeepEqual(got2, g.want) {
				t.Errorf("Parse(48-byte slot) = %+v, %v", got2, err)
			}

			// Encode reproduces the golden over a dirty buffer and stops at 44 bytes.
			buf := bytes.Repeat([]byte{0xaa}, SlotLen)
			if err := g.want.Encode(buf); err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if !bytes.Equal(buf[:MsgLen], b) {
				t.Errorf("Encode =\n%x\nwant\n%x", buf[:MsgLen], b)
			}
			if !bytes.Equal(buf[MsgLen:], []byte{0xaa, 0xaa, 0xaa, 0xaa}) {
				t.Errorf("Encode wrote past byte 44: %x", buf[MsgLen:])
			}

			// AppendBinary appends the same bytes after a prefix.
			app, err := g.want.AppendBinary([]byte("pre"))
			if err != nil || string(app[:3]) != "pre" || !bytes.Equal(app[3:], b) {
				t.Errorf("AppendBinary = %x, %v", app, err)
			}

			// Decode into a fresh value of the same type, no Parse involved.
			fresh := reflect.New(reflect.TypeOf(g.want).Elem()).Interface().(Message)
			if err := fresh.Decode(b); err != nil || !reflect.DeepEqual(fresh, g.want) {
				t.Errorf("Decode = %+v, %v", fresh, err)
			}
		})
	}
	for _, typ := range []Type{TypeConfirmLink, TypeAddLink, TypeAddLinkCont, TypeDeleteLink,
		TypeConfirmRkey, TypeTestLink, TypeConfirmRkeyCont, TypeDeleteRkey} {
		if !seen[typ] {
			t.Errorf("no golden case for %v", typ)
		}
	}
}

// TestAccessors checks the flag and count helpers against the golden messages.
func TestAccessors(t *testing.T) {
	byName := map[string]Message{}
	for _, g := range goldens {
		m, err := Parse(unhex(t, g.hex...))
		if err != nil {
			t.Fatalf("%s: %v", g.name, err)
		}
		byName[g.name] = m
	}
	cl := byName["confirm link request"].(*ConfirmLink)
	if !cl.NoRMBEyecatcher() || cl.Response() {
		t.Errorf("confirm link request: NoRMBEyecatcher %v Response %v", cl.NoRMBEyecatcher(), cl.Response())
	}
	if (&ConfirmLink{Flags: FlagResponse}).NoRMBEyecatcher() {
		t.Error("NoRMBEyecatcher true without either bit")
	}
	rej := byName["add link rejected response"].(*AddLink)
	if !rej.Rejected() || !rej.Response() || rej.RejectReason.String() != "no alternate path" {
		t.Errorf("add link rejected: Rejected %v Response %v reason %v", rej.Rejected(), rej.Response(), rej.RejectReason)
	}
	if byName["add link request"].(*AddLink).Rejected() {
		t.Error("add link request reads as rejected")
	}
	if n := len(byName["add link cont, more to follow"].(*AddLinkCont).Entries()); n != 2 {
		t.Errorf("ADD_LINK_CONT with 3 remaining: %d entries, want 2", n)
	}
	last := byName["add link cont response, last one"].(*AddLinkCont).Entries()
	if len(last) != 1 || last[0].NewRKey != 0x80000001 {
		t.Errorf("ADD_LINK_CONT with 1 remaining: entries %+v", last)
	}
	dl := byName["delete link all orderly"].(*DeleteLink)
	if !dl.All() || !dl.Orderly() || dl.Response() {
		t.Errorf("delete link all orderly: All %v Orderly %v Response %v", dl.All(), dl.Orderly(), dl.Response())
	}
	dr := byName["delete link response"].(*DeleteLink)
	if dr.All() || dr.Orderly() || !dr.Response() || dr.Reason.String() != "lost path" {
		t.Errorf("delete link response: All %v Orderly %v Response %v reason %v", dr.All(), dr.Orderly(), dr.Response(), dr.Reason)
	}
	cr := byName["confirm rkey request"].(*ConfirmRkey)
	if e := cr.Entries(); len(e) != 1 || e[0].Link != 2 || cr.Negative() {
		t.Errorf("confirm rkey request: entries %+v negative %v", e, cr.Negative())
	}
	crn := byName["confirm rkey negative retry"].(*ConfirmRkey)
	if !crn.Negative() || crn.Flags&FlagRkeyRetry == 0 || len(crn.Entries()) != 2 {
		t.Errorf("confirm rkey negative: %+v", crn)
	}
	crc := byName["confirm rkey cont"].(*ConfirmRkeyCont)
	if e := crc.Entries(); len(e) != 2 || e[1].Link != 3 {
		t.Errorf("confirm rkey cont entries %+v", e)
	}
	del := byName["delete rkey negative response"].(*DeleteRkey)
	if !del.Negative() || len(del.Entries()) != 3 || del.Failed(0) || !del.Failed(1) || del.Failed(2) {
		t.Errorf("delete rkey negative: %+v failed %v %v %v", del, del.Failed(0), del.Failed(1), del.Failed(2))
	}
	// Building the same response with SetFailed gives the same mask.
	resp := DeleteRkey{Flags: FlagResponse | FlagRkeyNegative, Count: 3, RKeys: del.RKeys}
	resp.SetFailed(1)
	if resp.ErrMask != del.ErrMask {
		t.Errorf("SetFailed(1) mask %#x, want %#x", resp.ErrMask, del.ErrMask)
	}
}

// TestHostileCounts checks that "remaining" counts larger than the slots never make
// Entries reach past the message.
func TestHostileCounts(t *testing.T) {
	b := make([]byte, MsgLen)
	b[1] = MsgLen
	for _, c := range []struct {
		typ  Type
		off  int // count byte
		want int
	}{
		{TypeAddLinkCont, 5, 2},
		{TypeConfirmRkey, 4, 2},
		{TypeConfirmRkeyCont, 4, 3},
	} {
		b[0] = byte(c.typ)
		clear(b[4:])
		b[c.off] = 255
		m, err := Parse(b)
		if err != nil {
			t.Fatalf("%v with count 255: %v", c.typ, err)
		}
		var n int
		switch m := m.(type) {
		case *AddLinkCont:
			n = len(m.Entries())
		case *ConfirmRkey:
			n = len(m.Entries())
		case *ConfirmRkeyCont:
			n = len(m.Entries())
		}
		if n != c.want {
			t.Errorf("%v with count 255: %d entries, want %d", c.typ, n, c.want)
		}
	}
	// A DeleteRkey built by hand with a bad count still clamps.
	if n := len((&DeleteRkey{Count: 200}).Entries()); n != DeleteRkeyMax {
		t.Errorf("DeleteRkey{Count: 200}.Entries(): %d", n)
	}
	if (&DeleteRkey{ErrMask: 0xff}).Failed(8) || (&DeleteRkey{ErrMask: 0xff}).Failed(-1) {
		t.Error("Failed out of range reports true")
	}
}

func TestParseErrors(t *testing.T) {
	valid := unhex(t, goldens[0].hex...)
	mod := func(f func(b []byte)) []byte {
		b := bytes.Clone(valid)
		f(b)
		return b
	}
	delRkey := func(count, mask byte) []byte {
		b := make([]byte, MsgLen)
		b[0], b[1], b[4], b[5] = byte(TypeDeleteRkey), MsgLen, count, mask
		return b
	}
	addLinkMTU := func(mtu byte) []byte {
		b := make([]byte, MsgLen)
		b[0], b[1], b[32] = byte(TypeAddLink), MsgLen, mtu
		return b
	}
	for _, c := range []struct {
		name string
		b    []byte
		want error
	}{
		{"nil", nil, ErrShort},
		{"43 bytes", valid[:43], ErrShort},
		{"length 43", mod(func(b []byte) { b[1] = 43 }), ErrLength},
		{"length 48", mod(func(b []byte) { b[1] = 48 }), ErrLength},
		{"length 0", mod(func(b []byte) { b[1] = 0 }), ErrLength},
		{"CDC", mod(func(b []byte) { b[0] = 0xfe }), ErrCDC},
		{"type 0", mod(func(b []byte) { b[0] = 0 }), ErrUnknownType},
		{"type 5 (v2.1 REQ_ADD_LINK)", mod(func(b []byte) { b[0] = 5 }), ErrUnknownType},
		{"type 0x0a", mod(func(b []byte) { b[0] = 0x0a }), ErrUnknownType},
		{"type 0x21 (v2 CONFIRM_LINK)", mod(func(b []byte) { b[0] = 0x21 }), ErrUnknownType},
		{"type 0xff", mod(func(b []byte) { b[0] = 0xff }), ErrUnknownType},
		{"delete rkey count 0", delRkey(0, 0), ErrCount},
		{"delete rkey count 9", delRkey(9, 0), ErrCount},
		{"delete rkey count 255", delRkey(255, 0), ErrCount},
		{"delete rkey mask beyond count", delRkey(3, 0x10), ErrCount},
		{"delete rkey mask beyond count 1", delRkey(1, 0x01), ErrCount},
		{"add link MTU 6", addLinkMTU(6), ErrMTU},
		{"add link MTU 15", addLinkMTU(0x0f), ErrMTU},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := Parse(c.b)
			if !errors.Is(err, c.want) {
				t.Fatalf("Parse = %v, %v; want %v", m, err, c.want)
			}
			if m != nil {
				t.Errorf("Parse returned a message with an error: %+v", m)
			}
		})
	}
	// The edges of the valid ranges parse.
	for _, b := range [][]byte{delRkey(8, 0xff), delRkey(1, 0x80), delRkey(3, 0xe0), addLinkMTU(0), addLinkMTU(5), addLinkMTU(0xf5)} {
		if _, err := Parse(b); err != nil {
			t.Errorf("Parse(%x): %v", b[:8], err)
		}
	}
}

func TestDecodeWrongType(t *testing.T) {
	b := unhex(t, goldens[0].hex...) // CONFIRM_LINK
	var tl TestLink
	if err := tl.Decode(b); !errors.Is(err, ErrWrongType) {
		t.Errorf("TestLink.Decode(CONFIRM_LINK) = %v, want ErrWrongType", err)
	}
	b[0] = 0xfe
	if err := tl.Decode(b); !errors.Is(err, ErrCDC) {
		t.Errorf("TestLink.Decode(CDC) = %v, want ErrCDC", err)
	}
	var dr DeleteRkey
	if err := dr.Decode(b[:10]); !errors.Is(err, ErrShort) {
		t.Errorf("Decode(10 bytes) = %v, want ErrShort", err)
	}
}

func TestEncodeErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		m    Message
		want error
	}{
		{"confirm link QPN 25 bits", &ConfirmLink{QPN: 1 << 24}, ErrField},
		{"add link QPN 25 bits", &AddLink{QPN: 1 << 24}, ErrField},
		{"add link PSN 25 bits", &AddLink{PSN: 1 << 24}, ErrField},
		{"add link reason 16", &AddLink{RejectReason: 16}, ErrField},
		{"add link MTU 6", &AddLink{MTU: 6}, ErrMTU},
		{"add link MTU 16", &AddLink{MTU: 16}, ErrMTU},
		{"delete rkey count 0", &DeleteRkey{}, ErrCount},
		{"delete rkey count 9", &DeleteRkey{Count: 9}, ErrCount},
		{"delete rkey stray mask", &DeleteRkey{Count: 2, ErrMask: 0x20}, ErrCount},
	} {
		t.Run(c.name, func(t *testing.T) {
			buf := bytes.Repeat([]byte{0x55}, MsgLen)
			if err := c.m.Encode(buf); !errors.Is(err, c.want) {
				t.Fatalf("Encode = %v, want %v", err, c.want)
			}
			if !bytes.Equal(buf, bytes.Repeat([]byte{0x55}, MsgLen)) {
				t.Errorf("Encode wrote into dst despite the error: %x", buf)
			}
			out, err := c.m.AppendBinary([]byte{1, 2})
			if !errors.Is(err, c.want) || !bytes.Equal(out, []byte{1, 2}) {
				t.Errorf("AppendBinary = %x, %v", out, err)
			}
		})
	}
	// Every type refuses a destination shorter than one message.
	for _, g := range goldens {
		if err := g.want.Encode(make([]byte, MsgLen-1)); !errors.Is(err, ErrShort) {
			t.Errorf("%s: Encode(43 bytes) = %v, want ErrShort", g.name, err)
		}
	}
	// The largest 24-bit values encode.
	if err := (&AddLink{QPN: 1<<24 - 1, PSN: 1<<24 - 1, RejectReason: 15}).Encode(make([]byte, MsgLen)); err != nil {
		t.Errorf("max 24-bit QPN/PSN: %v", err)
	}
}

// reservedMask returns, for a message of type t, the bits the layout reserves: they
// are ignored on decode and zero on encode. Written from the kernel structs, not from
// the codec's constants.
func reservedMask(t Type) [MsgLen]byte {
	var m [MsgLen]byte
	set := func(from, to int) { // inclusive
		for i := from; i <= to; i++ {
			m[i] = 0xff
		}
	}
	switch t {
	case TypeConfirmLink:
		set(2, 2)
		set(35, 43)
	case TypeAddLink:
		m[2] = 0xf0 // reject reason is the low nibble
		set(10, 11)
		m[32] = 0xf0 // MTU is the low nibble
		set(36, 43)
	case TypeAddLinkCont:
		set(2, 2)
		set(6, 7)
		set(40, 43)
	case TypeDeleteLink:
		set(2, 2)
		set(9, 43)
	case TypeConfirmRkey:
		set(2, 2)
		set(43, 43)
	case TypeTestLink:
		set(2, 2)
		set(20, 43)
	case TypeConfirmRkeyCont:
		set(2, 2)
	case TypeDeleteRkey:
		set(2, 2)
		set(6, 7)
		set(40, 43)
	}
	return m
}

// TestReservedIgnored sets every reserved bit of each golden and checks the message
// decodes to the same value and re-encodes to the golden (reserved bits zero).
func TestReservedIgnored(t *testing.T) {
	for _, g := range goldens {
		b := unhex(t, g.hex...)
		mask := reservedMask(g.want.Type())
		dirty := bytes.Clone(b)
		for i := range dirty {
			dirty[i] |= mask[i]
		}
		m, err := Parse(dirty)
		if err != nil {
			t.Fatalf("%s with reserved bits set: %v", g.name, err)
		}
		if !reflect.DeepEqual(m, g.want) {
			t.Errorf("%s with reserved bits set: %+v", g.name, m)
		}
		out := make([]byte, MsgLen)
		if err := m.Encode(out); err != nil || !bytes.Equal(out, b) {
			t.Errorf("%s re-encoded = %x, %v", g.name, out, err)
		}
	}
}

func TestIsCDC(t *testing.T) {
	cdc := make([]byte, MsgLen)
	cdc[0], cdc[1] = 0xfe, MsgLen
	if !IsCDC(cdc) || IsCDC(unhex(t, goldens[0].hex...)) || IsCDC(nil) {
		t.Error("IsCDC misclassifies")
	}
	if typ, err := PeekType(cdc); err != nil || typ != TypeCDC {
		t.Errorf("PeekType(CDC) = %v, %v", typ, err)
	}
}

func TestStrings(t *testing.T) {
	for typ, want := range map[Type]string{
		TypeConfirmLink: "CONFIRM_LINK", TypeAddLink: "ADD_LINK", TypeAddLinkCont: "ADD_LINK_CONT",
		TypeDeleteLink: "DELETE_LINK", TypeConfirmRkey: "CONFIRM_RKEY", TypeTestLink: "TEST_LINK",
		TypeConfirmRkeyCont: "CONFIRM_RKEY_CONT", TypeDeleteRkey: "DELETE_RKEY", TypeCDC: "CDC",
		0x05: "type(0x05)",
	} {
		if got := typ.String(); got != want {
			t.Errorf("Type(%#x).String() = %q, want %q", uint8(typ), got, want)
		}
	}
	for r, want := range map[DeleteReason]string{
		ReasonLostPath: "lost path", ReasonOperator: "operator initiated termination",
		ReasonProgram: "program initiated termination", ReasonProtocolViolation: "LLC protocol violation",
		ReasonNoAsymNeeded: "asymmetric link no longer needed", ReasonUnknownLink: "unknown link",
		ReasonUnknownLinkGroup: "unknown link group", 0x00070000: "reason 0x00070000",
	} {
		if got := r.String(); got != want {
			t.Errorf("DeleteReason(%#x).String() = %q, want %q", uint32(r), got, want)
		}
	}
	if got := RejectReason(9).String(); got != "reject reason 9" {
		t.Errorf("RejectReason(9) = %q", got)
	}
	if got := RejectInvalidMTU.String(); got != "invalid MTU" {
		t.Errorf("RejectInvalidMTU = %q", got)
	}
}

// TestNoAllocs checks that Encode, Decode and AppendBinary into a large enough
// buffer do not allocate, and Parse allocates only the message.
func TestNoAllocs(t *testing.T) {
	buf := make([]byte, SlotLen)
	app := make([]byte, 0, 64)
	for _, g := range goldens {
		b := unhex(t, g.hex...)
		m := g.want
		if n := testing.AllocsPerRun(100, func() { _ = m.Encode(buf) }); n != 0 {
			t.Errorf("%s: Encode allocates %v", g.name, n)
		}
		if n := testing.AllocsPerRun(100, func() { _, _ = m.AppendBinary(app[:0]) }); n != 0 {
			t.Errorf("%s: AppendBinary allocates %v", g.name, n)
		}
		if n := testing.AllocsPerRun(100, func() { _ = m.Decode(b) }); n != 0 {
			t.Errorf("%s: Decode allocates %v", g.name, n)
		}
		if n := testing.AllocsPerRun(100, func() { _, _ = Parse(b) }); n > 1 {
			t.Errorf("%s: Parse allocates %v", g.name, n)
		}
	}
}
