// ReadMessage: reads exactly one CLC message from the TCP stream, bounded in size.
// Implements the CLC framing of RFC 7609 §3.7 (length-delimited, eyecatcher-framed).

package clc

import (
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
func ReadMessage(r io.Reader, maxLen int) (Message, error) {
	var hdr [HeaderLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		return nil, fmt.Errorf("clc: read header: %w", err)
	}
	h, err := ParseHeader(hdr[:])
	if err != nil {
		return nil, err
	}
	if h.Length > maxLen {
		return nil, fmt.Errorf("clc: %v length %d > limit %d: %w", h.Type, h.Length, maxLen, ErrTooLong)
	}
	b := make([]byte, h.Length)
	copy(b, hdr[:])
	if _, err := io.ReadFull(r, b[HeaderLen:]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("clc: read %v: %w", h.Type, err)
	}
	return Parse(b)
}
