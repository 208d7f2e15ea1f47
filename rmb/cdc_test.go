package rmb

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

// Golden CDC messages, written byte by byte from the RFC's layout as Linux's smc_cdc.h
// has it (not produced by the encoder). Each string is split at the field boundaries:
// type len | seq | token | rsvd prod.wrap | prod.count | rsvd cons.wrap | cons.count |
// flags state | 18 reserved bytes.
var cdcGolden = []struct {
	name string
	hex  string
	msg  CDC
}{
	{
		name: "data",
		hex: "fe2c" + "0102" + "0a0b0c0d" + "0000" + "0003" + "00001000" + "0000" + "ffff" + "0007fffc" +
			"00" + "00" + strings.Repeat("00", 18),
		msg: CDC{Seq: 0x0102, Token: 0x0a0b0c0d, Prod: Cursor{Wrap: 3, Count: 0x1000},
			Cons: Cursor{Wrap: 0xffff, Count: 0x7fffc}},
	},
	{
		name: "all flags",
		hex: "fe2c" + "ffff" + "deadbeef" + "0000" + "0000" + "00000000" + "0000" + "0000" + "00000000" +
			"f8" + "e0" + strings.Repeat("00", 18),
		msg: CDC{Seq: 0xffff, Token: 0xdeadbeef,
			Flags: FlagWriteBlocked | FlagUrgentPending | FlagUrgentPresent | FlagUpdateRequested | FlagFailoverValidation,
			State: StateSendingDone | StateClosed | StateAbnormalClose},
	},
	{
		name: "write blocked, update requested, sending done",
		hex: "fe2c" + "0000" + "00000001" + "0000" + "0001" + "00003fff" + "0000" + "0002" + "00000000" +
			"90" + "80" + strings.Repeat("00", 18),
		msg: CDC{Seq: 0, Token: 1, Prod: Cursor{Wrap: 1, Count: 0x3fff}, Cons: Cursor{Wrap: 2},
			Flags: FlagWriteBlocked | FlagUpdateRequested, State: StateSendingDone},
	},
	{
		name: "urgent data, abnormal close",
		hex: "fe2c" + "8000" + "7fffffff" + "0000" + "8000" + "0007ffff" + "0000" + "7fff" + "00000001" +
			"60" + "20" + strings.Repeat("00", 18),
		msg: CDC{Seq: 0x8000, Token: 0x7fffffff, Prod: Cursor{Wrap: 0x8000, Count: 0x7ffff},
			Cons:  Cursor{Wrap: 0x7fff, Count: 1},
			Flags: FlagUrgentPending | FlagUrgentPresent, State: StateAbnormalClose},
	},
	{
		name: "failover validation, closed",
		hex: "fe2c" + "1234" + "00c0ffee" + "0000" + "0100" + "00010000" + "0000" + "0010" + "00020000" +
			"08" + "40" + strings.Repeat("00", 18),
		msg: CDC{Seq: 0x1234, Token: 0xc0ffee, Prod: Cursor{Wrap: 0x100, Count: 0x10000},
			Cons:  Cursor{Wrap: 0x10, Count: 0x20000},
			Flags: FlagFailoverValidation, State: StateClosed},
	},
}

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCDCGolden(t *testing.T) {
	for _, tc := range cdcGolden {
		t.Run(tc.name, func(t *testing.T) {
			wire := mustHex(t, tc.hex)
			if len(wire) != CDCLen {
				t.Fatalf("golden is %d bytes, want %d", len(wire), CDCLen)
			}
			got, err := ParseCDC(wire)
			if err != nil {
				t.Fatalf("ParseCDC: %v", err)
			}
			// Every field, one by one, so a failure names it.
			if got.Seq != tc.msg.Seq {
				t.Errorf("Seq = %#x, want %#x", got.Seq, tc.msg.Seq)
			}
			if got.Token != tc.msg.Token {
				t.Errorf("Token = %#x, want %#x", got.Token, tc.msg.Token)
			}
			if got.Prod != tc.msg.Prod {
				t.Errorf("Prod = %v, want %v", got.Prod, tc.msg.Prod)
			}
			if got.Cons != tc.msg.Cons {
				t.Errorf("Cons = %v, want %v", got.Cons, tc.msg.Cons)
			}
			if got.Flags != tc.msg.Flags {
				t.Errorf("Flags = %v, want %v", got.Flags, tc.msg.Flags)
			}
			if got.State != tc.msg.State {
				t.Errorf("State = %v, want %v", got.State, tc.msg.State)
			}

			enc := make([]byte, CDCLen)
			for i := range enc {
				enc[i] = 0xa5 // reserved bytes must be cleared, whatever the slot held
			}
			if err := tc.msg.Encode(enc); err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if !bytes.Equal(enc, wire) {
				t.Errorf("Encode =\n%x\nwant\n%x", enc, wire)
			}

			app, err := tc.msg.AppendBinary([]byte{0x11})
			if err != nil || !bytes.Equal(app[1:], wire) || app[0] != 0x11 {
				t.Errorf("AppendBinary = %x, %v; want 11%x", app, err, wire)
			}
			var rt CDC
			if err := rt.UnmarshalBinary(enc); err != nil || rt != tc.msg {
				t.Errorf("round trip = %+v, %v; want %+v", rt, err, tc.msg)
			}
		})
	}
}

func TestCDCFlagBits(t *testing.T) {
	// The bit of each named flag, as RFC 7609 and Linux smc_cdc.h place them.
	for _, tc := range []struct {
		flag ProdFlags
		bit  byte
	}{
		{FlagWriteBlocked, 0x80}, {FlagUrgentPending, 0x40}, {FlagUrgentPresent, 0x20},
		{FlagUpdateRequested, 0x10}, {FlagFailoverValidation, 0x08},
	} {
		b := make([]byte, CDCLen)
		m := CDC{Flags: tc.flag}
		if err := m.Encode(b); err != nil {
			t.Fatal(err)
		}
		if b[24] != tc.bit || b[25] != 0 {
			t.Errorf("%v encodes flags byte %#x state %#x, want %#x 0", tc.flag, b[24], b[25], tc.bit)
		}
	}
	for _, tc := range []struct {
		state ConnState
		bit   byte
	}{
		{StateSendingDone, 0x80}, {StateClosed, 0x40}, {StateAbnormalClose, 0x20},
	} {
		b := make([]byte, CDCLen)
		m := CDC{State: tc.state}
		if err := m.Encode(b); err != nil {
			t.Fatal(err)
		}
		if b[25] != tc.bit || b[24] != 0 {
			t.Errorf("%v encodes state byte %#x flags %#x, want %#x 0", tc.state, b[25], b[24], tc.bit)
		}
	}
}

func TestParseCDCIgnoresReserved(t *testing.T) {
	want := cdcGolden[0].msg
	wire := mustHex(t, cdcGolden[0].hex)
	for _, off := range []int{8, 9, 16, 17, 26, 30, 43} {
		wire[off] = 0xff
	}
	wire[24] |= 0x07                            // reserved producer-flag bits
	wire[25] |= 0x1f                            // reserved connection-state bits
	wire = append(wire, 0xee, 0xee, 0xee, 0xee) // rest of a 48-byte receive slot
	got, err := ParseCDC(wire)
	if err != nil {
		t.Fatalf("ParseCDC: %v", err)
	}
	if got != want {
		t.Errorf("ParseCDC = %+v, want %+v", got, want)
	}
}

func TestParseCDCErrors(t *testing.T) {
	good := mustHex(t, cdcGolden[0].hex)
	withByte := func(off int, v byte) []byte {
		b := bytes.Clone(good)
		b[off] = v
		return b
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrCDCShort},
		{"one short", good[:CDCLen-1], ErrCDCShort},
		{"llc confirm link", withByte(0, 0x01), ErrNotCDC},
		{"type zero", withByte(0, 0x00), ErrNotCDC},
		{"length 48", withByte(1, 48), ErrCDCLength},
		{"length 0", withByte(1, 0), ErrCDCLength},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := ParseCDC(tc.in)
			if !errors.Is(err, tc.want) {
				t.Fatalf("ParseCDC err = %v, want %v", err, tc.want)
			}
			if m != (CDC{}) {
				t.Errorf("ParseCDC returned %+v with an error", m)
			}
		})
	}
	m := cdcGolden[0].msg
	if err := m.Encode(make([]byte, CDCLen-1)); !errors.Is(err, ErrCDCShort) {
		t.Errorf("Encode into 43 bytes: err = %v, want ErrCDCShort", err)
	}
}

func TestCDCFlagStrings(t *testing.T) {
	if s := (FlagWriteBlocked | FlagUpdateRequested).String(); s != "write-blocked|update-requested" {
		t.Errorf("flags string = %q", s)
	}
	if s := (StateClosed | 0x01).String(); s != "closed|0x01" {
		t.Errorf("state string = %q", s)
	}
	if s := ProdFlags(0).String(); s != "none" {
		t.Errorf("zero flags string = %q", s)
	}
}

func TestSeqBefore(t *testing.T) {
	for _, tc := range []struct {
		a, b uint16
		want bool
	}{
		{1, 2, true}, {2, 1, false}, {5, 5, false},
		{0xffff, 0, true}, {0, 0xffff, false}, // across the u16 wrap
		{0xfff0, 0x0010, true}, {0x0010, 0xfff0, false},
	} {
		if got := SeqBefore(tc.a, tc.b); got != tc.want {
			t.Errorf("SeqBefore(%#x, %#x) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestCDCNoAllocs(t *testing.T) {
	m := cdcGolden[1].msg
	buf := make([]byte, CDCLen)
	wire := mustHex(t, cdcGolden[1].hex)
	if n := testing.AllocsPerRun(100, func() {
		if err := m.Encode(buf); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Encode allocates %v times per call", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := ParseCDC(wire); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("ParseCDC allocates %v times per call", n)
	}
	app := make([]byte, 0, CDCLen)
	if n := testing.AllocsPerRun(100, func() {
		if _, err := m.AppendBinary(app[:0]); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("AppendBinary with capacity allocates %v times per call", n)
	}
}

// FuzzParseCDC checks that a parse either fails or re-encodes to the input with its
// reserved bytes and bits cleared, and that the re-encoding parses to the same message.
func FuzzParseCDC(f *testing.F) {
	for _, tc := range cdcGolden {
		f.Add(mustHex(f, tc.hex))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := ParseCDC(in)
		if err != nil {
			return
		}
		want := bytes.Clone(in[:CDCLen])
		clear(want[8:10])
		clear(want[16:18])
		clear(want[26:])
		want[24] &= 0xf8
		want[25] &= 0xe0
		out := make([]byte, CDCLen)
		if err := m.Encode(out); err != nil {
			t.Fatalf("Encode after successful parse: %v", err)
		}
		if !bytes.Equal(out, want) {
			t.Fatalf("re-encoding differs:\n in  %x\n out %x\nwant %x", in, out, want)
		}
		m2, err := ParseCDC(out)
		if err != nil || m2 != m {
			t.Fatalf("reparse = %+v, %v; want %+v", m2, err, m)
		}
	})
}

func BenchmarkCDCEncode(b *testing.B) {
	m := cdcGolden[0].msg
	buf := make([]byte, CDCLen)
	b.ReportAllocs()
	for b.Loop() {
		m.Seq++
		if err := m.Encode(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCDCMarshalBinary is the baseline: the allocating encoder.
func BenchmarkCDCMarshalBinary(b *testing.B) {
	m := cdcGolden[0].msg
	b.ReportAllocs()
	for b.Loop() {
		m.Seq++
		if _, err := m.MarshalBinary(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCDCParse(b *testing.B) {
	wire := mustHex(b, cdcGolden[0].hex)
	b.ReportAllocs()
	var sink CDC
	for b.Loop() {
		m, err := ParseCDC(wire)
		if err != nil {
			b.Fatal(err)
		}
		sink = m
	}
	_ = sink
}
