// Tests of ReadMessage and Parse on broken input: every error the reader reports.
// Covers the CLC framing rules of RFC 7609 §3.7.

package clc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"

	"github.com/smcr-io/smcr/internal/race"
)

// countingReader counts the bytes ReadMessage takes from the stream.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func goldenBytes(t testing.TB, name string) []byte {
	t.Helper()
	for _, g := range goldens {
		if g.name == name {
			return unhex(t, g.hex)
		}
	}
	t.Fatalf("no golden %q", name)
	return nil
}

// edit returns a copy of b changed by f.
func edit(b []byte, f func(b []byte) []byte) []byte { return f(append([]byte(nil), b...)) }

func TestReadMessageStream(t *testing.T) {
	// Messages back to back on one stream: each read takes exactly one.
	var stream []byte
	for _, g := range goldens {
		stream = append(stream, unhex(t, g.hex)...)
	}
	r := &countingReader{r: bytes.NewReader(stream)}
	off := 0
	for _, g := range goldens {
		m, err := ReadMessage(r, MaxLen)
		if err != nil {
			t.Fatalf("%s: %v", g.name, err)
		}
		off += len(unhex(t, g.hex))
		if r.n != off {
			t.Fatalf("%s: read %d bytes, want %d", g.name, r.n, off)
		}
		if m.Type() != g.want.Type() {
			t.Fatalf("%s: got %v", g.name, m.Type())
		}
	}
	if _, err := ReadMessage(r, MaxLen); err != io.EOF {
		t.Fatalf("at end of stream: %v, want io.EOF", err)
	}
}

func TestReadMessageErrors(t *testing.T) {
	accept := goldenBytes(t, "accept-first-contact")
	decline := goldenBytes(t, "decline-subnet")
	proposal := goldenBytes(t, "proposal-ipv4-linux")
	setLen := func(n int) func([]byte) []byte {
		return func(b []byte) []byte { b[offLength], b[offLength+1] = byte(n>>8), byte(n); return b }
	}
	tests := []struct {
		name   string
		in     []byte
		maxLen int
		want   error
		// consumed is how many bytes the reader may take: the header only, for
		// errors that must be found before the body is read.
		consumed int
	}{
		{"eyecatcher", edit(accept, func(b []byte) []byte { b[0] = 0xe3; return b }), MaxLen, ErrEyecatcher, HeaderLen},
		{"ascii eyecatcher", edit(accept, func(b []byte) []byte { copy(b, "SMCR"); return b }), MaxLen, ErrEyecatcher, HeaderLen},
		{"trailer", edit(accept, func(b []byte) []byte { b[len(b)-1] = 0; return b }), MaxLen, ErrTrailer, len(accept)},
		{"unknown type 0", edit(accept, func(b []byte) []byte { b[offType] = 0; return b }), MaxLen, ErrUnknownType, HeaderLen},
		{"unknown type 5", edit(accept, func(b []byte) []byte { b[offType] = 5; return b }), MaxLen, ErrUnknownType, HeaderLen},
		{"version 3 accept", edit(accept, func(b []byte) []byte { b[offVersion] = 0x38; return b }), MaxLen, ErrVersion, HeaderLen},
		{"version 2 accept of version-1 length", edit(accept, func(b []byte) []byte { b[offVersion] = 0x28; return b }), MaxLen, ErrTooShort, HeaderLen},
		{"version 2 decline of version-1 length", edit(decline, func(b []byte) []byte { b[offVersion] = 0x20; return b }), MaxLen, ErrTooShort, HeaderLen},
		{"version 0 proposal", edit(proposal, func(b []byte) []byte { b[offVersion] = 0x00; return b }), MaxLen, ErrVersion, HeaderLen},
		{"version 0 decline", edit(decline, func(b []byte) []byte { b[offVersion] = 0x08; return b }), MaxLen, ErrVersion, HeaderLen},
		{"accept too short", edit(accept, setLen(AcceptConfirmLen-1)), MaxLen, ErrTooShort, HeaderLen},
		{"confirm length 0", edit(goldenBytes(t, "confirm-first-contact"), setLen(0)), MaxLen, ErrTooShort, HeaderLen},
		{"proposal too short", edit(proposal, setLen(ProposalMinLen-1)), MaxLen, ErrTooShort, HeaderLen},
		{"decline too short", edit(decline, setLen(DeclineLen-1)), MaxLen, ErrTooShort, HeaderLen},
		{"decline too long", edit(decline, setLen(DeclineLen+1)), MaxLen, ErrTooLong, HeaderLen},
		{"accept over MaxLen", edit(accept, setLen(MaxLen+1)), 1 << 16, ErrTooLong, HeaderLen},
		{"proposal over maxLen", edit(proposal, setLen(0xffff)), 200, ErrTooLong, HeaderLen},
		{"proposal over small maxLen", proposal, ProposalLen - 1, ErrTooLong, HeaderLen},
		{"header truncated", accept[:5], MaxLen, io.ErrUnexpectedEOF, 5},
		{"body truncated", accept[:40], MaxLen, io.ErrUnexpectedEOF, 40},
		{"trailer truncated", accept[:len(accept)-1], MaxLen, io.ErrUnexpectedEOF, len(accept) - 1},
		{"length beyond stream", edit(decline, setLen(DeclineLen))[:DeclineLen-4], MaxLen, io.ErrUnexpectedEOF, DeclineLen - 4},
		{"empty", nil, MaxLen, io.EOF, 0},
		{"mtu 0", edit(accept, func(b []byte) []byte { b[acOffSizeMTU] = 0x20; return b }), MaxLen, ErrMalformed, len(accept)},
		{"mtu 6", edit(accept, func(b []byte) []byte { b[acOffSizeMTU] = 0x26; return b }), MaxLen, ErrMalformed, len(accept)},
		{"smc-d accept", edit(accept, func(b []byte) []byte { b[offVersion] |= byte(SMCTypeD); return b }), MaxLen, ErrMalformed, len(accept)},
		{"iparea outside", edit(proposal, func(b []byte) []byte { b[propOffIPAreaOffset+1] = 41; return b }), MaxLen, ErrMalformed, len(proposal)},
		{"iparea far outside", edit(proposal, func(b []byte) []byte { b[propOffIPAreaOffset] = 0xff; return b }), MaxLen, ErrMalformed, len(proposal)},
		{"9 ipv6 prefixes", edit(proposal, func(b []byte) []byte {
			b = setLen(ProposalLen + 9*17)(b[:ProposalLen-TrailerLen])
			b[ProposalLen-TrailerLen-1] = 9
			b = append(b, make([]byte, 9*17)...)
			return append(b, Eyecatcher[:]...)
		}), MaxLen, ErrMalformed, ProposalLen + 9*17},
		{"prefixes past trailer", edit(proposal, func(b []byte) []byte { b[ProposalLen-TrailerLen-1] = 1; return b }), MaxLen, ErrMalformed, len(proposal)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &countingReader{r: bytes.NewReader(tc.in)}
			m, err := ReadMessage(r, tc.maxLen)
			if !errors.Is(err, tc.want) {
				t.Fatalf("ReadMessage = %v, %v; want %v", m, err, tc.want)
			}
			if m != nil {
				t.Fatalf("message %+v with error", m)
			}
			if r.n != tc.consumed {
				t.Fatalf("read %d bytes, want %d", r.n, tc.consumed)
			}
			// A message read in part says how much of it is left on the
			// stream, by its length field; -1 when that cannot be trusted.
			length := -1
			if len(tc.in) >= offLength+2 && !errors.Is(err, ErrEyecatcher) {
				length = int(binary.BigEndian.Uint16(tc.in[offLength:]))
			}
			var pe *PartialError
			switch {
			case errors.As(err, &pe):
				want := -1
				if length >= HeaderLen {
					want = length - tc.consumed
				}
				if pe.Unread != want {
					t.Fatalf("unread %d, want %d (length field %d, %d bytes read)", pe.Unread, want, length, tc.consumed)
				}
			case tc.consumed != 0 && tc.consumed != length:
				t.Fatalf("%d bytes of a %d-byte message read, and no PartialError", tc.consumed, length)
			}
			// Parse agrees on the same bytes, but for the reader's own limits.
			if tc.maxLen >= MaxLen && tc.want != io.EOF {
				if _, perr := Parse(tc.in); !errors.Is(perr, tc.want) {
					t.Fatalf("Parse = %v; want %v", perr, tc.want)
				}
			}
		})
	}
}

func TestParseExtraBytes(t *testing.T) {
	b := append(goldenBytes(t, "decline-subnet"), 0)
	if _, err := Parse(b); !errors.Is(err, ErrMalformed) {
		t.Fatalf("Parse with a byte after the trailer: %v", err)
	}
}

func TestProposalOffsets(t *testing.T) {
	// Any iparea_offset that keeps the IP area inside the message is accepted and
	// locates the IP area; one byte further is malformed.
	old := goldenBytes(t, "proposal-ipv4-old-form")
	for _, skip := range []int{0, 1, 39, 40, 41, 200} {
		b := append([]byte(nil), old[:propOffSkip]...)
		b[propOffIPAreaOffset], b[propOffIPAreaOffset+1] = byte(skip>>8), byte(skip)
		b = append(b, bytes.Repeat([]byte{0xa5}, skip)...)
		b = append(b, old[propOffSkip:]...)
		n := len(b)
		b[offLength], b[offLength+1] = byte(n>>8), byte(n)
		m, err := Parse(b)
		if err != nil {
			t.Fatalf("offset %d: %v", skip, err)
		}
		p := m.(*Proposal)
		if p.IPv4().String() != "10.0.0.0/8" || len(p.SkipArea) != skip {
			t.Fatalf("offset %d: %+v", skip, p)
		}
		b[propOffIPAreaOffset+1]++
		if _, err := Parse(b); !errors.Is(err, ErrMalformed) {
			t.Fatalf("offset %d+1: %v", skip, err)
		}
	}
}

func TestEncodeInvalid(t *testing.T) {
	ok := LinkInfo{MTU: MTU1024}
	tests := []struct {
		name string
		m    Message
	}{
		{"qpn", &Accept{func() LinkInfo { l := ok; l.QPN = 1 << 24; return l }()}},
		{"psn", &Confirm{func() LinkInfo { l := ok; l.PSN = 1 << 24; return l }()}},
		{"mtu 0", &Accept{func() LinkInfo { l := ok; l.MTU = 0; return l }()}},
		{"mtu 6", &Accept{func() LinkInfo { l := ok; l.MTU = 6; return l }()}},
		{"size 16", &Accept{func() LinkInfo { l := ok; l.SizeCode = 16; return l }()}},
		{"accept ext", &Accept{func() LinkInfo { l := ok; l.Ext = make([]byte, MaxLen); return l }()}},
		{"9 prefixes", &Proposal{IPv6: make([]IPv6Prefix, 9)}},
		{"proposal ext", &Proposal{Ext: make([]byte, MaxLen)}},
		{"version 16", &Proposal{Version: 16}},
	}
	for _, tc := range tests {
		b, err := tc.m.AppendTo([]byte("x"))
		if !errors.Is(err, ErrInvalid) || string(b) != "x" {
			t.Errorf("%s: AppendTo = %q, %v", tc.name, b, err)
		}
	}
	if b, err := (&Accept{ok}).AppendTo(nil); err != nil || len(b) != AcceptConfirmLen {
		t.Errorf("valid accept: %d bytes, %v", len(b), err)
	}
}

func TestValidateSizeCode(t *testing.T) {
	for _, tc := range []struct {
		code, bound uint8
		ok          bool
	}{
		{5, LinuxMaxSizeCode, true}, {6, LinuxMaxSizeCode, false},
		{15, 255, true}, {0, 0, true}, {1, 0, false},
	} {
		l := LinkInfo{SizeCode: tc.code, MTU: MTU256}
		if err := l.Validate(tc.bound); (err == nil) != tc.ok {
			t.Errorf("size code %d bound %d: %v", tc.code, tc.bound, err)
		}
	}
}

func TestSizes(t *testing.T) {
	for _, tc := range []struct{ n, code, size int }{
		{1, 0, 16 << 10}, {16 << 10, 0, 16 << 10}, {16<<10 + 1, 1, 32 << 10}, {512 << 10, 5, 512 << 10},
	} {
		c := SizeCode(tc.n)
		if int(c) != tc.code || RMBESize(c) != tc.size {
			t.Errorf("SizeCode(%d) = %d (%d bytes), want %d (%d)", tc.n, c, RMBESize(c), tc.code, tc.size)
		}
	}
	for code, want := range map[uint8]int{0: 0, 1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096, 6: 0} {
		if got := MTUBytes(code); got != want {
			t.Errorf("MTUBytes(%d) = %d, want %d", code, got, want)
		}
	}
}

func TestReadMessageAllocationBound(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates: counts do not hold")
	}
	// A header claiming 64 KiB over a limit allocates nothing for the body; a valid
	// message allocates about its own size.
	huge := edit(goldenBytes(t, "proposal-ipv4-linux"), func(b []byte) []byte { b[offLength], b[offLength+1] = 0xff, 0xff; return b })
	if a := bytesPerRead(huge, 1<<16); a > 256 {
		t.Errorf("refused header allocated %d bytes", a)
	}
	if a := bytesPerRead(goldenBytes(t, "proposal-extension"), MaxLen); a > 1024 {
		t.Errorf("124-byte proposal allocated %d bytes", a)
	}
}

func bytesPerRead(msg []byte, maxLen int) uint64 {
	const n = 200
	r := bytes.NewReader(msg)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range n {
		r.Reset(msg)
		_, _ = ReadMessage(r, maxLen)
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / n
}
