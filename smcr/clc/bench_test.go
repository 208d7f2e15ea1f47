// Benchmarks of the CLC codec: one encode and one parse per connection setup.
// Covers RFC 7609 §3.7 messages on the connection-setup path.

package clc

import (
	"bytes"
	"testing"
)

func BenchmarkAppendAccept(b *testing.B) {
	m := goldens[4].want
	buf := make([]byte, 0, MaxLen)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = m.AppendTo(buf[:0])
	}
}

func BenchmarkParseAccept(b *testing.B) {
	wire := goldenBytes(b, "accept-first-contact")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(wire); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadProposal(b *testing.B) {
	wire := goldenBytes(b, "proposal-extension")
	r := bytes.NewReader(wire)
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(wire)
		if _, err := ReadMessage(r, MaxLen); err != nil {
			b.Fatal(err)
		}
	}
}
