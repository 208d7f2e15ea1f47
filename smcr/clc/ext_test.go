// Tests of this project's extension envelope and its TLV iteration.
// Not RFC 7609: docs/protocol.md, section 1.

package clc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

const goldenEnvelope = `534d4358 | 01 | 0017 | 01 0002 0102 | 7f 0000 | 02 0005 6162636465`

func TestEnvelopeGolden(t *testing.T) {
	wire := unhex(t, goldenEnvelope)
	e, err := ParseEnvelope(wire)
	if err != nil {
		t.Fatal(err)
	}
	want := Envelope{TLVs: []TLV{{1, []byte{1, 2}}, {0x7f, []byte{}}, {2, []byte("abcde")}}}
	if !reflect.DeepEqual(e, want) {
		t.Fatalf("got %+v\nwant %+v", e, want)
	}
	enc, err := want.AppendTo([]byte{0xee})
	if err != nil || !bytes.Equal(enc[1:], wire) || enc[0] != 0xee || want.Len() != len(wire) {
		t.Fatalf("AppendTo = % x, %v", enc, err)
	}
	// A reader that knows only type 2 finds it behind the ones it skips.
	if v, ok := e.Find(2); !ok || string(v) != "abcde" {
		t.Fatalf("Find(2) = %q, %v", v, ok)
	}
	if _, ok := e.Find(3); ok {
		t.Fatalf("Find(3) found an absent type")
	}
	// A value cannot be grown into the next TLV.
	v, _ := e.Find(1)
	if cap(v) != 2 {
		t.Fatalf("value cap %d", cap(v))
	}
}

func TestEnvelopeErrors(t *testing.T) {
	wire := unhex(t, goldenEnvelope)
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrNoEnvelope},
		{"linux v2 extension", []byte{0, 1, 0, 0, 0, 0, 0, 0}, ErrNoEnvelope},
		{"magic only", []byte("SMCX"), ErrEnvelope},
		{"version 2", edit(wire, func(b []byte) []byte { b[envOffVersion] = 2; return b }), ErrEnvelopeVersion},
		{"length short", edit(wire, func(b []byte) []byte { b[envOffLength+1]--; return b }), ErrEnvelope},
		{"length long", edit(wire, func(b []byte) []byte { b[envOffLength+1]++; return b }), ErrEnvelope},
		{"tlv overruns", edit(wire, func(b []byte) []byte { b[len(b)-6]++; return b }), ErrEnvelope},
		{"tlv header cut", edit(wire, func(b []byte) []byte {
			b = append(b, 9, 0)
			b[envOffLength+1] += 2
			return b
		}), ErrEnvelope},
		{"too many tlvs", func() []byte {
			e := Envelope{TLVs: make([]TLV, MaxTLVs)}
			b, _ := e.AppendTo(nil)
			b = append(b, 1, 0, 0)
			b[envOffLength+1] += 3
			return b
		}(), ErrEnvelope},
	}
	for _, tc := range tests {
		if e, err := ParseEnvelope(tc.in); !errors.Is(err, tc.want) || e.TLVs != nil {
			t.Errorf("%s: ParseEnvelope = %+v, %v; want %v", tc.name, e, err, tc.want)
		}
	}
	if _, err := (&Envelope{TLVs: make([]TLV, MaxTLVs+1)}).AppendTo(nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("AppendTo with too many tlvs: %v", err)
	}
	if _, err := (&Envelope{TLVs: []TLV{{1, make([]byte, MaxLen)}}}).AppendTo(nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("AppendTo too long: %v", err)
	}
}

func TestTLVsStopsEarly(t *testing.T) {
	n := 0
	for range TLVs(unhex(t, "01000100 02000100 03000100")) {
		n++
		if n == 2 {
			break
		}
	}
	if n != 2 {
		t.Fatalf("iterated %d", n)
	}
}

func TestEnvelopeInMessages(t *testing.T) {
	// The extension of each golden message that has one is an envelope.
	for _, g := range goldens {
		var ext []byte
		switch m := g.want.(type) {
		case *Proposal:
			ext = m.EnvelopeArea()
		case *Accept:
			ext = m.Ext
		}
		if len(ext) == 0 {
			continue
		}
		if !HasEnvelope(ext) {
			t.Errorf("%s: no envelope", g.name)
		}
		if _, err := ParseEnvelope(ext); err != nil {
			t.Errorf("%s: %v", g.name, err)
		}
	}
}

// linuxAcceptsV1 is Linux's smc_clc_msg_prop_valid for a version-1 Proposal (5.10
// on, with the 2024 iparea_offset bound): the length must be exactly the fixed
// part, the skipped area, the IP area and the trailer. Linux closes the
// connection on a Proposal that fails it.
func linuxAcceptsV1(b []byte) bool {
	skip := int(binary.BigEndian.Uint16(b[propOffIPAreaOffset:]))
	if skip > LinuxIPAreaOffset || propOffSkip+skip+ipOffPrefixes > len(b) {
		return false
	}
	count := int(b[propOffSkip+skip+ipOffCount])
	return int(binary.BigEndian.Uint16(b[offLength:])) == propOffSkip+skip+ipOffPrefixes+count*ipv6PrefixLen+TrailerLen
}

// TestProposalEnvelopePlacement: an envelope of up to 40 bytes (one offer without
// an endpoint: rdma) rides in the area iparea_offset skips, where a Linux server
// accepts the Proposal; a longer one goes after the prefixes. Either way the
// receiver finds it.
func TestProposalEnvelopePlacement(t *testing.T) {
	for _, tc := range []struct {
		name      string
		valueLen  int
		linuxSafe bool
	}{
		{"one rdma offer", 25, true},
		{"largest in the skipped area", LinuxIPAreaOffset - EnvelopeHeaderLen - TLVHeaderLen, true},
		{"one byte more", LinuxIPAreaOffset - EnvelopeHeaderLen - TLVHeaderLen + 1, false},
		{"shm and soft offers", 120, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := Envelope{TLVs: []TLV{{Type: 1, Value: bytes.Repeat([]byte{0xab}, tc.valueLen)}}}
			area, err := env.AppendTo(nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, v6 := range [][]IPv6Prefix{nil, {{Len: 64}, {Len: 48}}} {
				p := &Proposal{SMCType: SMCTypeR, PrefixLen: 24, IPv6: v6}
				p.SetEnvelope(area)
				b, err := p.AppendTo(nil)
				if err != nil {
					t.Fatal(err)
				}
				if got := linuxAcceptsV1(b); got != tc.linuxSafe {
					t.Errorf("%d ipv6 prefixes: Linux accepts it: %v, want %v", len(v6), got, tc.linuxSafe)
				}
				m, err := Parse(b)
				if err != nil {
					t.Fatal(err)
				}
				got, err := ParseEnvelope(m.(*Proposal).EnvelopeArea())
				if err != nil || !reflect.DeepEqual(got, env) {
					t.Fatalf("envelope back: %+v, %v", got, err)
				}
			}
		})
	}
	// Linux's own Proposal (40 zero bytes skipped, nothing after the prefixes)
	// has no envelope, and neither has a skipped area with other bytes.
	b, _ := (&Proposal{SMCType: SMCTypeR}).AppendTo(nil)
	m, _ := Parse(b)
	if !linuxAcceptsV1(b) || len(m.(*Proposal).EnvelopeArea()) != 0 {
		t.Fatalf("plain proposal: linux %v, envelope area %x", linuxAcceptsV1(b), m.(*Proposal).EnvelopeArea())
	}
	skip := make([]byte, LinuxIPAreaOffset)
	copy(skip, "SMCX\x01\x00\x07 not padding")
	p := &Proposal{SMCType: SMCTypeR, SkipArea: skip}
	if _, err := ParseEnvelope(p.EnvelopeArea()); err == nil {
		t.Fatal("an envelope followed by bytes other than padding parsed")
	}
}
