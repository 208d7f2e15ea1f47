// This project's CLC extension envelope: a self-describing block of TLVs carried in
// the extension area of a Proposal, Accept or Confirm. Not part of RFC 7609; version-1
// peers skip it (see docs/protocol.md, section 1).

package clc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
)

// EnvelopeMagic opens an Envelope ("SMCX" in ASCII, unlike the EBCDIC eyecatcher).
var EnvelopeMagic = [4]byte{'S', 'M', 'C', 'X'}

// Envelope sizes and offsets.
const (
	EnvelopeVersion   = 1
	EnvelopeHeaderLen = 7
	TLVHeaderLen      = 3
	// MaxTLVs bounds the TLVs of one envelope, so that a parse of many empty TLVs
	// cannot allocate much more than the message itself.
	MaxTLVs = 64

	envOffVersion = 4
	envOffLength  = 5
)

// Envelope errors, for errors.Is. ErrNoEnvelope means the area is not ours at all
// (empty, or a version-2 Linux extension): the peer is a plain version-1 peer.
var (
	ErrNoEnvelope      = errors.New("no smcr extension envelope")
	ErrEnvelopeVersion = errors.New("unsupported extension envelope version")
	ErrEnvelope        = errors.New("malformed extension envelope")
)

// TLVType is the type of one TLV in an Envelope. The engine defines the types; this
// package gives them no meaning. 0 is reserved.
type TLVType uint8

// TLV is one {type, length, value} entry.
type TLV struct {
	Type  TLVType
	Value []byte
}

// Envelope is a parsed extension envelope: its TLVs in wire order, unknown types
// included (a reader skips the types it does not know).
type Envelope struct {
	TLVs []TLV
}

// Find returns the value of the first TLV of type t.
func (e *Envelope) Find(t TLVType) ([]byte, bool) {
	for _, v := range e.TLVs {
		if v.Type == t {
			return v.Value, true
		}
	}
	return nil, false
}

// Len is the encoded length of e.
func (e *Envelope) Len() int {
	n := EnvelopeHeaderLen
	for _, v := range e.TLVs {
		n += TLVHeaderLen + len(v.Value)
	}
	return n
}

// AppendTo appends the encoded envelope to b. It fails when the envelope would not
// fit a CLC message.
func (e *Envelope) AppendTo(b []byte) ([]byte, error) {
	n := e.Len()
	if len(e.TLVs) > MaxTLVs {
		return b, fmt.Errorf("clc: envelope: %d tlvs > %d: %w", len(e.TLVs), MaxTLVs, ErrInvalid)
	}
	if n > MaxLen-ProposalLen {
		return b, fmt.Errorf("clc: envelope length %d > %d: %w", n, MaxLen-ProposalLen, ErrInvalid)
	}
	b = append(b, EnvelopeMagic[:]...)
	b = append(b, EnvelopeVersion)
	b = binary.BigEndian.AppendUint16(b, uint16(n))
	for _, v := range e.TLVs {
		b = append(b, byte(v.Type))
		b = binary.BigEndian.AppendUint16(b, uint16(len(v.Value)))
		b = append(b, v.Value...)
	}
	return b, nil
}

// HasEnvelope reports whether an extension area starts with the envelope magic.
func HasEnvelope(area []byte) bool {
	return len(area) >= len(EnvelopeMagic) && [4]byte(area[:4]) == EnvelopeMagic
}

// ParseEnvelope parses an extension area that must hold exactly one envelope. Every
// TLV is bounds-checked here, so iterating the result cannot fail. The values share
// memory with area.
func ParseEnvelope(area []byte) (Envelope, error) {
	if !HasEnvelope(area) {
		return Envelope{}, ErrNoEnvelope
	}
	if len(area) < EnvelopeHeaderLen {
		return Envelope{}, fmt.Errorf("clc: envelope header of %d bytes: %w", len(area), ErrEnvelope)
	}
	if v := area[envOffVersion]; v != EnvelopeVersion {
		return Envelope{}, fmt.Errorf("clc: envelope version %d: %w", v, ErrEnvelopeVersion)
	}
	if n := int(binary.BigEndian.Uint16(area[envOffLength:])); n != len(area) {
		return Envelope{}, fmt.Errorf("clc: envelope length %d in a %d-byte area: %w", n, len(area), ErrEnvelope)
	}
	var e Envelope
	for t, err := range TLVs(area[EnvelopeHeaderLen:]) {
		if err != nil {
			return Envelope{}, err
		}
		if len(e.TLVs) == MaxTLVs {
			return Envelope{}, fmt.Errorf("clc: envelope: more than %d tlvs: %w", MaxTLVs, ErrEnvelope)
		}
		e.TLVs = append(e.TLVs, t)
	}
	return e, nil
}

// TLVs iterates over a run of TLVs. It stops after the first error, which it yields
// with a zero TLV; a TLV whose length runs past b is an error, never a short value.
func TLVs(b []byte) iter.Seq2[TLV, error] {
	return func(yield func(TLV, error) bool) {
		for off := 0; off < len(b); {
			if len(b)-off < TLVHeaderLen {
				yield(TLV{}, fmt.Errorf("clc: tlv header at %d: %d bytes left: %w", off, len(b)-off, ErrEnvelope))
				return
			}
			t := TLVType(b[off])
			n := int(binary.BigEndian.Uint16(b[off+1:]))
			off += TLVHeaderLen
			if n > len(b)-off {
				yield(TLV{}, fmt.Errorf("clc: tlv %d length %d: %d bytes left: %w", t, n, len(b)-off, ErrEnvelope))
				return
			}
			if !yield(TLV{Type: t, Value: b[off : off+n : off+n]}, nil) {
				return
			}
			off += n
		}
	}
}
