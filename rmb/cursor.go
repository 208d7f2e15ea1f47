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

// CursorAt returns the cursor of stream position pos (the number of bytes before it
// since the start) in a ring of size bytes: its offset, and its wrap count modulo
// 2^16. Size 0 (a ring not yet known) gives the zero cursor.
func CursorAt(pos uint64, size uint32) Cursor {
	if size == 0 {
		return Cursor{}
	}
	return Cursor{Wrap: uint16(pos / uint64(size)), Count: uint32(pos % uint64(size))}
}

// Pos returns the stream position a peer's cursor c stands for in a ring of size
// bytes, relative to ref, the last position accepted from that peer: c's wrap count
// says how many rings on from ref's it lies. stale: c lies behind ref (an older CDC
// overtaken by a newer one), judged as Less judges. An offset outside the ring is a
// *CursorError (ErrPeerCursor).
func (c Cursor) Pos(ref uint64, size uint32) (pos uint64, stale bool, err error) {
	if !c.Valid(size) {
		return 0, false, &CursorError{Got: c, Size: size, Reason: "offset beyond the ring"}
	}
	s := uint64(size)
	dw := c.Wrap - uint16(ref/s) // u16 wrap-around is intended
	if int16(dw) < 0 {
		return 0, true, nil
	}
	pos = (ref/s+uint64(dw))*s + uint64(c.Count)
	if pos < ref {
		return 0, true, nil
	}
	return pos, false, nil
}
