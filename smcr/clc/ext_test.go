// Tests of this project's extension envelope and its TLV iteration.
// Not RFC 7609: PROTOCOL.md, "This project's extensions".

package clc

import (
	"bytes"
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
			ext = m.Ext
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
