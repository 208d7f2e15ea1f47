// Fuzz targets: Parse, ReadMessage and ParseEnvelope never panic, and what they
// accept re-encodes to the same bytes (reserved bytes and bits come back zero).

package clc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"testing"
)

// canonical returns b with the bytes and bits the codec ignores set to zero, as
// AppendTo writes them. b must have parsed.
func canonical(b []byte) []byte {
	c := append([]byte(nil), b...)
	zero := func(from, to int) { clear(c[from:to]) }
	v2 := c[offVersion]>>4 >= Version2
	switch MsgType(c[offType]) {
	case TypeProposal:
		if v2 {
			canonicalProposalV2(c)
			break
		}
		ip := propOffSkip + int(binary.BigEndian.Uint16(c[propOffIPAreaOffset:]))
		c[ip+ipOffReserved], c[ip+ipOffReserved+1] = 0, 0
	case TypeAccept, TypeConfirm:
		c[offVersion] &^= reservedBt
		c[acOffReserved1], c[acOffReserved2] = 0, 0
		if !v2 {
			break
		}
		zero(acOffEID+EIDLen, acOffFCE)
		if c[offVersion]&flagBit != 0 {
			c[acOffFCE+fceOffFlags] &= fceDirect
			zero(acOffFCE+2, acOffFCE+fceOffHostname)
			zero(acOffFCE+fceOffVendor+4, acOffFCE+fceLen)
			if MsgType(c[offType]) == TypeConfirm {
				zero(acOffFCE+fceLen+1, acOffFCE+fceLen+gidListHdrLen)
			}
		}
	case TypeDecline:
		c[offVersion] &^= reservedBt | typeMask
		c[declOffOSType] &= 0xf0
		zero(declOffReserved, declOffMore)
	}
	return c
}

// canonicalProposalV2 zeroes the reserved bytes and bits of a parsed version-2
// Proposal: the SMC-D area after v2_ext_offset, the IP area's reserved bytes and
// the extensions' reserved fields.
func canonicalProposalV2(c []byte) {
	clear(c[propV2ExtOffBase:proposalV2BaseLen])
	off := proposalV2BaseLen
	if c[offVersion]&typeMask != byte(SMCTypeN) {
		c[off+ipOffReserved], c[off+ipOffReserved+1] = 0, 0
		off += ipOffPrefixes + ipv6PrefixLen*int(c[off+ipOffCount])
	}
	typev2 := SMCType(c[offVersion] >> 2 & typeMask)
	if typev2 == SMCTypeN {
		return
	}
	c[off+2] = 0
	c[off+v2OffFlag] &= 0xf0 | v2FlagSEID
	c[off+4], c[off+5] = 0, 0
	clear(c[off+v2OffFeatureMask+2 : off+v2OffUEIDs])
	if smcdOffered(typev2) {
		d := off + v2ExtFixedLen + EIDLen*int(c[off+v2OffEIDCount])
		clear(c[d+EIDLen : d+smcdV2OffEntries])
	}
}

func addGoldenSeeds(f *testing.F) {
	for _, g := range goldens {
		f.Add(unhex(f, g.hex))
	}
}

func checkReencode(t *testing.T, in []byte, m Message) {
	t.Helper()
	out, err := m.AppendTo(nil)
	if err != nil {
		t.Fatalf("parsed message does not encode: %v\n%+v", err, m)
	}
	if want := canonical(in); !bytes.Equal(out, want) {
		t.Fatalf("re-encoding differs:\n  in %x\n out %x", want, out)
	}
	again, err := Parse(out)
	if err != nil || !reflect.DeepEqual(again, m) {
		t.Fatalf("re-parse: %+v, %v\nwant %+v", again, err, m)
	}
}

func FuzzParse(f *testing.F) {
	addGoldenSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Parse(b)
		if err != nil {
			if m != nil {
				t.Fatalf("message with error %v", err)
			}
			return
		}
		checkReencode(t, b, m)
		if p, ok := m.(*Proposal); ok {
			ParseEnvelope(p.EnvelopeArea()) // wherever the peer put it: no panic
		}
	})
}

func FuzzReadMessage(f *testing.F) {
	for _, g := range goldens {
		b := unhex(f, g.hex)
		f.Add(b, uint16(MaxLen))
		f.Add(b[:len(b)-1], uint16(len(b)))
		f.Add(append(b, b...), uint16(len(b)-1))
	}
	f.Fuzz(func(t *testing.T, b []byte, maxLen uint16) {
		r := bytes.NewReader(b)
		m, err := ReadMessage(r, int(maxLen))
		used := len(b) - r.Len()
		if err != nil {
			if m != nil {
				t.Fatalf("message with error %v", err)
			}
			// Nothing past the header is read for a header the reader refuses.
			var bad bool
			for _, e := range []error{ErrEyecatcher, ErrUnknownType, ErrVersion, ErrTooShort, ErrTooLong} {
				bad = bad || errors.Is(err, e)
			}
			if bad && used > HeaderLen {
				t.Fatalf("read %d bytes before refusing: %v", used, err)
			}
			if len(b) == 0 && err != io.EOF {
				t.Fatalf("empty input: %v", err)
			}
			return
		}
		if used > int(maxLen) {
			t.Fatalf("read %d bytes, limit %d", used, maxLen)
		}
		checkReencode(t, b[:used], m)
	})
}

func FuzzEnvelope(f *testing.F) {
	f.Add(unhex(f, goldenEnvelope))
	for _, g := range goldens {
		switch m := g.want.(type) {
		case *Proposal:
			f.Add(m.EnvelopeArea())
		case *Accept:
			f.Add(m.Ext)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := ParseEnvelope(b)
		if err != nil {
			if e.TLVs != nil {
				t.Fatalf("tlvs with error %v", err)
			}
			return
		}
		out, err := e.AppendTo(nil)
		if err != nil || !bytes.Equal(out, b) {
			t.Fatalf("re-encoding: %x, %v\nwant %x", out, err, b)
		}
		// The iterator sees the same TLVs on the bare run.
		i := 0
		for tlv, err := range TLVs(b[EnvelopeHeaderLen:]) {
			if err != nil || !reflect.DeepEqual(tlv, e.TLVs[i]) {
				t.Fatalf("TLVs #%d: %+v, %v", i, tlv, err)
			}
			i++
		}
		if i != len(e.TLVs) {
			t.Fatalf("TLVs yielded %d of %d", i, len(e.TLVs))
		}
	})
}
