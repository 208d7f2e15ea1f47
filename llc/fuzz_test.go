// Fuzz target and benchmarks for the LLC codec (RFC 7609 §3.8 message formats).

package llc

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

// FuzzParse checks that Parse never panics and that whatever it accepts re-encodes to
// the input's first 44 bytes with the reserved bits cleared, then parses back to the
// same value.
func FuzzParse(f *testing.F) {
	for _, g := range goldens {
		f.Add(unhex(f, g.hex...))
	}
	f.Add(make([]byte, MsgLen))
	f.Add([]byte{0xfe, MsgLen})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Parse(b)
		if err != nil {
			if m != nil {
				t.Fatalf("Parse returned %+v with error %v", m, err)
			}
			return
		}
		out := make([]byte, MsgLen)
		if err := m.Encode(out); err != nil {
			t.Fatalf("Encode of a parsed %v failed: %v", m.Type(), err)
		}
		want := bytes.Clone(b[:MsgLen])
		mask := reservedMask(m.Type())
		for i := range want {
			want[i] &^= mask[i]
		}
		if !bytes.Equal(out, want) {
			t.Fatalf("re-encoded %v differs:\n in  %x\n out %x", m.Type(), want, out)
		}
		m2, err := Parse(out)
		if err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("second parse = %+v, %v; first %+v", m2, err, m)
		}
	})
}

// BenchmarkCopyBaseline is the floor: copying 44 bytes into a slot.
func BenchmarkCopyBaseline(b *testing.B) {
	src := unhex(b, goldens[0].hex...)
	dst := make([]byte, SlotLen)
	b.ReportAllocs()
	b.SetBytes(MsgLen)
	for b.Loop() {
		copy(dst, src)
	}
}

func BenchmarkEncode(b *testing.B) {
	dst := make([]byte, SlotLen)
	for _, g := range goldens {
		m := g.want
		b.Run(strings.ReplaceAll(g.name, " ", "_"), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(MsgLen)
			for b.Loop() {
				if err := m.Encode(dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	var tl TestLink
	src := make([]byte, MsgLen)
	if err := (&TestLink{Data: [16]byte{1, 2, 3}}).Encode(src); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(MsgLen)
	for b.Loop() {
		if err := tl.Decode(src); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParse(b *testing.B) {
	src := unhex(b, goldens[len(goldens)-1].hex...) // DELETE_RKEY, the largest validation
	b.ReportAllocs()
	b.SetBytes(MsgLen)
	for b.Loop() {
		if _, err := Parse(src); err != nil {
			b.Fatal(err)
		}
	}
}
