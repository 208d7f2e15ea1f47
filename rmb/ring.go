// Ring accounting over RMBEs: free space, readable bytes, wrap-around splits, stale and
// invalid peer cursors, when to report the consumer cursor (RFC 7609 RMBE data flow).

package rmb

import (
	"errors"
	"fmt"
)

// Span is one contiguous piece of an RMBE: Len bytes from offset Off.
type Span struct {
	Off, Len uint32
}

// End returns the offset just past the span.
func (s Span) End() uint32 { return s.Off + s.Len }

// Split returns the at most two contiguous pieces that n bytes starting at cursor c
// occupy in a ring of size bytes: first runs from c towards the end of the ring, second
// (empty when the bytes do not wrap) from offset 0. n is clipped to size. c must be
// valid for size.
func Split(c Cursor, n, size uint32) (first, second Span) {
	n = min(n, size)
	first = Span{Off: c.Count, Len: min(n, size-c.Count)}
	if rest := n - first.Len; rest > 0 {
		second = Span{Off: 0, Len: rest}
	}
	return first, second
}

// ErrPeerCursor is the sentinel for a peer cursor that breaks the protocol: one
// outside the ring, a producer cursor past the free space, or a consumer cursor past
// what was produced. The connection must be aborted; the typed *CursorError says more.
var ErrPeerCursor = errors.New("rmb: peer cursor out of range")

// ErrOverrun is returned when this end asks to produce more than the free space or to
// consume more than is readable: a bug in the caller, never caused by the peer.
var ErrOverrun = errors.New("rmb: ring overrun")

// CursorError describes a peer cursor that breaks the protocol. It unwraps to
// ErrPeerCursor.
type CursorError struct {
	Which  string // "producer" or "consumer"
	Got    Cursor // the cursor the peer sent
	Limit  Cursor // the newest cursor the peer could legitimately have sent
	Size   uint32 // the ring size
	Reason string
}

func (e *CursorError) Error() string {
	return fmt.Sprintf("rmb: peer %s cursor %v: %s (limit %v, ring %d bytes)",
		e.Which, e.Got, e.Reason, e.Limit, e.Size)
}

func (e *CursorError) Unwrap() error { return ErrPeerCursor }

// Producer accounts for this end's writes into the peer's RMBE: its own producer
// cursor and the peer's consumer cursor as last reported in a CDC. The zero value is
// not usable; call NewProducer. Not safe for concurrent use.
type Producer struct {
	size     uint32
	prod     Cursor // where this end writes its next byte in the peer's RMBE
	peerCons Cursor // how far the peer has consumed, as it last told us
}

// NewProducer returns the accounting for a peer RMBE of size bytes (validated by
// DecodeSizeCode; size must be non-zero), with both cursors at 0:0.
func NewProducer(size uint32) Producer {
	if size == 0 {
		panic("rmb: NewProducer with size 0")
	}
	return Producer{size: size}
}

// Size returns the size of the peer's RMBE.
func (p *Producer) Size() uint32 { return p.size }

// Cursor returns the producer cursor: the value the next CDC carries.
func (p *Producer) Cursor() Cursor { return p.prod }

// PeerConsumer returns the peer's consumer cursor as last accepted.
func (p *Producer) PeerConsumer() Cursor { return p.peerCons }

// InFlight returns the bytes written into the peer's RMBE that it has not yet reported
// consumed.
func (p *Producer) InFlight() uint32 { return uint32(p.peerCons.Diff(p.prod, p.size)) }

// Free returns how many bytes this end may still write into the peer's RMBE. When it
// is 0 and data is waiting, the next CDC should carry FlagWriteBlocked.
func (p *Producer) Free() uint32 { return p.size - p.InFlight() }

// Spans returns where the next min(n, Free()) bytes go in the peer's RMBE: at most two
// contiguous pieces, the second one only when the write wraps. The total of both
// lengths is the number of bytes that may be written now.
func (p *Producer) Spans(n uint32) (first, second Span) {
	return Split(p.prod, min(n, p.Free()), p.size)
}

// Produce advances the producer cursor by n bytes after they were written, and returns
// the new cursor. It fails with ErrOverrun, leaving the cursor alone, when n exceeds
// Free().
func (p *Producer) Produce(n uint32) (Cursor, error) {
	if free := p.Free(); n > free {
		return p.prod, fmt.Errorf("rmb: produce %d bytes, %d free: %w", n, free, ErrOverrun)
	}
	p.prod = p.prod.Add(n, p.size)
	return p.prod, nil
}

// OnPeerConsumer takes the consumer cursor from a CDC the peer sent and returns the
// bytes it frees. A cursor older than the one already accepted is stale (a reordered or
// replayed CDC, for example after failover): it is ignored and reported with stale set.
// A cursor outside the ring, or past what this end has produced, is a *CursorError
// (ErrPeerCursor) and changes nothing.
func (p *Producer) OnPeerConsumer(c Cursor) (freed uint32, stale bool, err error) {
	if !c.Valid(p.size) {
		return 0, false, &CursorError{Which: "consumer", Got: c, Limit: p.prod, Size: p.size,
			Reason: "offset beyond the ring"}
	}
	d := p.peerCons.Diff(c, p.size)
	if d < 0 {
		return 0, true, nil
	}
	if c.Diff(p.prod, p.size) < 0 {
		return 0, false, &CursorError{Which: "consumer", Got: c, Limit: p.prod, Size: p.size,
			Reason: "consumed more than was produced"}
	}
	p.peerCons = c
	return uint32(d), false, nil
}

// Consumer accounts for the peer's writes into this end's RMBE: the peer's producer
// cursor as last reported in a CDC, this end's consumer cursor, and the consumer cursor
// last reported to the peer. The zero value is not usable; call NewConsumer. Not safe
// for concurrent use.
type Consumer struct {
	size      uint32
	cons      Cursor // where this end reads its next byte
	peerProd  Cursor // how far the peer has written, as it last told us
	confirmed Cursor // the consumer cursor last sent to the peer
}

// NewConsumer returns the accounting for this end's RMBE of size bytes (non-zero),
// with all cursors at 0:0.
func NewConsumer(size uint32) Consumer {
	if size == 0 {
		panic("rmb: NewConsumer with size 0")
	}
	return Consumer{size: size}
}

// Size returns the size of this end's RMBE.
func (c *Consumer) Size() uint32 { return c.size }

// Cursor returns the consumer cursor: the value every CDC this end sends carries.
func (c *Consumer) Cursor() Cursor { return c.cons }

// PeerProducer returns the peer's producer cursor as last accepted.
func (c *Consumer) PeerProducer() Cursor { return c.peerProd }

// Confirmed returns the consumer cursor last reported to the peer.
func (c *Consumer) Confirmed() Cursor { return c.confirmed }

// Readable returns the bytes the peer has written that this end has not yet consumed.
func (c *Consumer) Readable() uint32 { return uint32(c.cons.Diff(c.peerProd, c.size)) }

// Spans returns where the next min(n, Readable()) bytes lie in this end's RMBE: at
// most two contiguous pieces, the second only when the data wraps.
func (c *Consumer) Spans(n uint32) (first, second Span) {
	return Split(c.cons, min(n, c.Readable()), c.size)
}

// Consume advances the consumer cursor by n bytes after they were read, and returns
// the new cursor. It fails with ErrOverrun, changing nothing, when n exceeds Readable().
func (c *Consumer) Consume(n uint32) (Cursor, error) {
	if r := c.Readable(); n > r {
		return c.cons, fmt.Errorf("rmb: consume %d bytes, %d readable: %w", n, r, ErrOverrun)
	}
	c.cons = c.cons.Add(n, c.size)
	return c.cons, nil
}

// OnPeerProducer takes the producer cursor from a CDC the peer sent and returns the
// bytes it makes readable. A cursor older than the one already accepted is stale and
// ignored (stale set). A cursor outside the ring, or one that claims more than the
// space this end has reported free (more than Size() bytes past the confirmed consumer
// cursor), is a *CursorError (ErrPeerCursor) and changes nothing.
func (c *Consumer) OnPeerProducer(p Cursor) (added uint32, stale bool, err error) {
	limit := c.confirmed.Add(c.size, c.size)
	if !p.Valid(c.size) {
		return 0, false, &CursorError{Which: "producer", Got: p, Limit: limit, Size: c.size,
			Reason: "offset beyond the ring"}
	}
	d := c.peerProd.Diff(p, c.size)
	if d < 0 {
		return 0, true, nil
	}
	if c.confirmed.Diff(p, c.size) > int64(c.size) {
		return 0, false, &CursorError{Which: "producer", Got: p, Limit: limit, Size: c.size,
			Reason: "wrote past the free space"}
	}
	c.peerProd = p
	return uint32(d), false, nil
}

// Unconfirmed returns the bytes consumed since the consumer cursor was last reported:
// space the peer does not yet know is free.
func (c *Consumer) Unconfirmed() uint32 { return uint32(c.confirmed.Diff(c.cons, c.size)) }

// UpdateDue reports whether this end should send a CDC now just to report its consumer
// cursor: when the peer asked for it (requested: FlagUpdateRequested in its last CDC)
// or once at least 10% of the RMBE has been consumed since the last report. Reporting
// every read would cost a CDC per read; waiting longer would stall a blocked sender.
// No deadlock follows: a sender is blocked only when its whole view of the ring is
// unconsumed, so reading everything frees 100%, past the 10% threshold.
// (Linux smc_tx_consumer_update additionally waits for the sender to be half full or
// blocked; we report at 10% as docs/protocol.md, section 4, states.)
func (c *Consumer) UpdateDue(requested bool) bool {
	return requested || uint64(c.Unconfirmed())*10 >= uint64(c.size)
}

// Confirm records that a CDC carrying consumer cursor sent was posted to the peer.
// Every CDC carries the consumer cursor, so call it for data CDCs too. A cursor older
// than the last confirmed one is ignored (CDCs built out of order); one past the
// consumer cursor fails with ErrOverrun.
func (c *Consumer) Confirm(sent Cursor) error {
	if c.cons.Less(sent) || !sent.Valid(c.size) {
		return fmt.Errorf("rmb: confirm %v beyond consumer cursor %v: %w", sent, c.cons, ErrOverrun)
	}
	if c.confirmed.Less(sent) {
		c.confirmed = sent
	}
	return nil
}
