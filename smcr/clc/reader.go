// ReadMessage: reads exactly one CLC message from the TCP stream, bounded in size.
// Implements the CLC framing of RFC 7609 §3.7 (length-delimited, eyecatcher-framed).

package clc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// ReadMessage reads exactly one CLC message from r: the header first, then the rest
// as its length field says. A length larger than maxLen (or MaxLen), or outside what
// the type allows, is refused before anything more is allocated or read, as are a
// wrong eyecatcher, an unknown type and an unsupported version. A stream that ends
// inside the message gives an error wrapping io.ErrUnexpectedEOF; one that ends
// before the first byte gives io.EOF itself.
//
// Deadlines are the caller's: Linux waits 6 s for each CLC message.
//
// An error after part of a message was consumed is a *PartialError, which says
// how much of it is still on the stream: a caller that goes on with the stream
// (a fallback to TCP) must skip that much, or the peer's message would be read
// as its data.
func ReadMessage(r io.Reader, maxLen int) (Message, error) {
	var hdr [HeaderLen]byte
	if n, err := io.ReadFull(r, hdr[:]); err != nil {
		if n == 0 {
			if errors.Is(err, io.EOF) {
				return nil, io.EOF
			}
			return nil, fmt.Errorf("clc: read header: %w", err)
		}
		unread := -1 // the length field is not all here
		if n >= offLength+2 {
			unread = max(int(binary.BigEndian.Uint16(hdr[offLength:]))-n, -1)
		}
		return nil, &PartialError{Unread: unread, Err: fmt.Errorf("clc: read header: %w", err)}
	}
	h, err := ParseHeader(hdr[:])
	if err != nil {
		return nil, &PartialError{Unread: max(h.Length-HeaderLen, -1), Err: err}
	}
	if h.Length > maxLen {
		return nil, &PartialError{Unread: h.Length - HeaderLen,
			Err: fmt.Errorf("clc: %v length %d > limit %d: %w", h.Type, h.Length, maxLen, ErrTooLong)}
	}
	b := make([]byte, h.Length)
	copy(b, hdr[:])
	if n, err := io.ReadFull(r, b[HeaderLen:]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, &PartialError{Unread: h.Length - HeaderLen - n, Err: fmt.Errorf("clc: read %v: %w", h.Type, err)}
	}
	return Parse(b)
}

// PartialError is ReadMessage's error once part of a message is consumed.
type PartialError struct {
	// Unread is how many bytes of the message, by its length field, are still
	// on the stream; -1 when the length field is missing or below the header's.
	Unread int
	Err    error
}

func (e *PartialError) Error() string { return e.Err.Error() }
func (e *PartialError) Unwrap() error { return e.Err }
