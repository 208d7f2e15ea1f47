// Cursor arithmetic over an RMBE ring: positions as (wrap count, byte offset) pairs.
// Implements the producer and consumer cursors that RFC 7609 CDC messages carry.

package rmb

import "fmt"

// Cursor is a position in an RMBE ring of some size S: Count is the byte offset in
// [0, S) and Wrap counts how many times Count has passed the end of the ring, modulo
// 2^16. It is a value type, like gVisor's seqnum.Value; the ring size is passed to the
// operations that need it, since the cursor travels without it on the wire.
//
// Ordering and distances use serial-number arithmetic on Wrap (RFC 1982): two cursors
// compare correctly as long as they are less than 2^15 wraps apart, which any two
// cursors of one live connection are (the ring holds at most S bytes in flight).
type Cursor struct {
	Wrap  uint16
	Count uint32
}

func (c Cursor) String() string { return fmt.Sprintf("%d:%d", c.Wrap, c.Count) }

// Valid reports whether c can address a ring of size bytes: Count < size.
func (c Cursor) Valid(size uint32) bool { return c.Count < size }

// Add returns c advanced by n bytes in a ring of size bytes, incrementing Wrap once
// per pass over the end (Wrap itself wraps from 65535 to 0). n may exceed size.
// c must be valid for size and size must be non-zero.
func (c Cursor) Add(n, size uint32) Cursor {
	pos := uint64(c.Count) + uint64(n)
	wraps := pos / uint64(size)
	return Cursor{
		Wrap:  c.Wrap + uint16(wraps), // u16 wrap-around is intended
		Count: uint32(pos % uint64(size)),
	}
}

// Diff returns the number of bytes from c to d in a ring of size bytes: positive when
// d is newer than c, negative when d is older, zero when equal. Both cursors must be
// valid for size. The result lies in (−2^15·size, 2^15·size) and always fits an int64.
func (c Cursor) Diff(d Cursor, size uint32) int64 {
	dw := int64(int16(d.Wrap - c.Wrap)) // serial distance of the wrap counts
	return dw*int64(size) + int64(d.Count) - int64(c.Count)
}

// Less reports whether c is older than d (d is newer). It needs no size: for valid
// cursors with different wrap counts the wrap counts alone decide, which keeps Less
// consistent with the sign of Diff.
func (c Cursor) Less(d Cursor) bool {
	if c.Wrap == d.Wrap {
		return c.Count < d.Count
	}
	return int16(d.Wrap-c.Wrap) > 0
}

// LessEq reports whether c is older than or equal to d.
func (c Cursor) LessEq(d Cursor) bool { return c == d || c.Less(d) }
