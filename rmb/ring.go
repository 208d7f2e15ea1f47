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

// Split returns the at most two contiguous pieces that the n bytes of the stream from
// position pos occupy in a ring of size bytes: first runs from pos's offset towards the
// end of the ring, second (empty when the bytes do not wrap) from offset 0. n is
// clipped to size. With n zero both are empty and size is not looked at (it may be 0).
func Split(pos uint64, n, size uint32) (first, second Span) {
	n = min(n, size)
	if n == 0 {
		return Span{}, Span{}
	}
	off := uint32(pos % uint64(size))
	first = Span{Off: off, Len: min(n, size-off)}
	if rest := n - first.Len; rest > 0 {
		second = Span{Off: 0, Len: rest}
	}
	return first, second
}

// AppendSpans appends to dst the non-empty pieces of Split(pos, n, size): none, one,
// or two when the bytes wrap. With dst a slice of a caller's [2]Span it allocates
// nothing.
func AppendSpans(dst []Span, pos uint64, n, size uint32) []Span {
	first, second := Split(pos, n, size)
	for _, s := range [2]Span{first, second} {
		if s.Len > 0 {
			dst = append(dst, s)
		}
	}
	return dst
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
// cursor and the peer's consumer cursor as last reported in a CDC, both kept as
// positions (see the package doc). The zero value has size 0: a connection whose
// peer RMBE is not yet known; only Size, Pos and PeerConsumerPos may be called on it.
// Not safe for concurrent use.
type Producer struct {
	size     uint32
	prod     uint64 // position of the next byte this end writes
	peerCons uint64 // how far the peer has consumed, as it last told us
}

// NewProducer returns the accounting for a peer RMBE of size bytes (validated by
// DecodeSizeCode; size must be non-zero), with both positions at 0.
func NewProducer(size uint32) Producer {
	if size == 0 {
		panic("rmb: NewProducer with size 0")
	}
	return Producer{size: size}
}

// Size returns the size of the peer's RMBE (0 while it is not known).
func (p *Producer) Size() uint32 { return p.size }

// Pos returns the producer position: the bytes produced since the start.
func (p *Producer) Pos() uint64 { return p.prod }

// Cursor returns the producer cursor: the value the next CDC carries.
func (p *Producer) Cursor() Cursor { return CursorAt(p.prod, p.size) }

// PeerConsumerPos returns the peer's consumer position as last accepted.
func (p *Producer) PeerConsumerPos() uint64 { return p.peerCons }

// PeerConsumer returns the peer's consumer cursor as last accepted.
func (p *Producer) PeerConsumer() Cursor { return CursorAt(p.peerCons, p.size) }

// InFlight returns the bytes written into the peer's RMBE that it has not yet reported
// consumed.
func (p *Producer) InFlight() uint32 { return uint32(p.prod - p.peerCons) }

// Free returns how many bytes this end may still write into the peer's RMBE: all of it
// once everything is consumed (see "The producer limit" in the package doc). When it
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
		return p.Cursor(), fmt.Errorf("rmb: produce %d bytes, %d free: %w", n, free, ErrOverrun)
	}
	p.prod += uint64(n)
	return p.Cursor(), nil
}

// CheckPeerConsumer checks the consumer cursor of a CDC the peer sent, changing
// nothing, and returns its position for SetPeerConsumer. A cursor older than the one
// already accepted is stale (a reordered or replayed CDC, for example after failover)
// and is to be ignored. A cursor outside the ring, or past what this end has produced,
// is a *CursorError (ErrPeerCursor).
func (p *Producer) CheckPeerConsumer(c Cursor) (pos uint64, stale bool, err error) {
	pos, stale, err = c.Pos(p.peerCons, p.size)
	if err != nil || stale {
		return 0, stale, withLimit(err, "consumer", p.Cursor())
	}
	if pos > p.prod {
		return 0, false, &CursorError{Which: "consumer", Got: c, Limit: p.Cursor(), Size: p.size,
			Reason: "consumed more than was produced"}
	}
	return pos, false, nil
}

// SetPeerConsumer takes a position CheckPeerConsumer returned.
func (p *Producer) SetPeerConsumer(pos uint64) { p.peerCons = pos }

// OnPeerConsumer checks and takes the consumer cursor from a CDC the peer sent, and
// returns the bytes it frees; a stale or invalid one changes nothing
// (CheckPeerConsumer).
func (p *Producer) OnPeerConsumer(c Cursor) (freed uint32, stale bool, err error) {
	pos, stale, err := p.CheckPeerConsumer(c)
	if err != nil || stale {
		return 0, stale, err
	}
	freed = uint32(pos - p.peerCons)
	p.peerCons = pos
	return freed, false, nil
}

// Consumer accounts for the peer's writes into this end's RMBE: the peer's producer
// cursor as last reported in a CDC, this end's consumer cursor, and the consumer cursor
// last reported to the peer, all kept as positions. The zero value has size 0: a
// connection whose RMB is not yet allocated; only Size and the position getters may be
// called on it. Not safe for concurrent use.
type Consumer struct {
	size      uint32
	cons      uint64 // position of the next byte this end reads
	peerProd  uint64 // how far the peer has written, as it last told us
	confirmed uint64 // the consumer position last sent to the peer
}

// NewConsumer returns the accounting for this end's RMBE of size bytes (non-zero),
// with all positions at 0.
func NewConsumer(size uint32) Consumer {
	if size == 0 {
		panic("rmb: NewConsumer with size 0")
	}
	return Consumer{size: size}
}

// Size returns the size of this end's RMBE (0 while there is none).
func (c *Consumer) Size() uint32 { return c.size }

// Pos returns the consumer position: the bytes consumed since the start.
func (c *Consumer) Pos() uint64 { return c.cons }

// Cursor returns the consumer cursor: the value every CDC this end sends carries.
func (c *Consumer) Cursor() Cursor { return CursorAt(c.cons, c.size) }

// PeerProducerPos returns the peer's producer position as last accepted.
func (c *Consumer) PeerProducerPos() uint64 { return c.peerProd }

// PeerProducer returns the peer's producer cursor as last accepted.
func (c *Consumer) PeerProducer() Cursor { return CursorAt(c.peerProd, c.size) }

// ConfirmedPos returns the consumer position last reported to the peer.
func (c *Consumer) ConfirmedPos() uint64 { return c.confirmed }

// Confirmed returns the consumer cursor last reported to the peer.
func (c *Consumer) Confirmed() Cursor { return CursorAt(c.confirmed, c.size) }

// Readable returns the bytes the peer has written that this end has not yet consumed.
func (c *Consumer) Readable() uint32 { return uint32(c.peerProd - c.cons) }

// Full reports whether the peer has filled the whole RMBE.
func (c *Consumer) Full() bool { return c.size > 0 && c.Readable() == c.size }

// Spans returns where the next min(n, Readable()) bytes lie in this end's RMBE: at
// most two contiguous pieces, the second only when the data wraps.
func (c *Consumer) Spans(n uint32) (first, second Span) {
	return Split(c.cons, min(n, c.Readable()), c.size)
}

// Consume advances the consumer cursor by n bytes after they were read, and returns
// the new cursor. It fails with ErrOverrun, changing nothing, when n exceeds Readable().
func (c *Consumer) Consume(n uint32) (Cursor, error) {
	if r := c.Readable(); n > r {
		return c.Cursor(), fmt.Errorf("rmb: consume %d bytes, %d readable: %w", n, r, ErrOverrun)
	}
	c.cons += uint64(n)
	return c.Cursor(), nil
}

// CheckPeerProducer checks the producer cursor of a CDC the peer sent, changing
// nothing, and returns its position for SetPeerProducer. A cursor older than the one
// already accepted is stale and is to be ignored. A cursor outside the ring, or one
// that claims more than the space this end has reported free (more than Size() bytes
// past the confirmed consumer cursor: "The producer limit" in the package doc), is a
// *CursorError (ErrPeerCursor).
func (c *Consumer) CheckPeerProducer(p Cursor) (pos uint64, stale bool, err error) {
	limit := c.confirmed + uint64(c.size)
	pos, stale, err = p.Pos(c.peerProd, c.size)
	if err != nil || stale {
		return 0, stale, withLimit(err, "producer", CursorAt(limit, c.size))
	}
	if pos > limit {
		return 0, false, &CursorError{Which: "producer", Got: p, Limit: CursorAt(limit, c.size), Size: c.size,
			Reason: "wrote past the free space"}
	}
	return pos, false, nil
}

// SetPeerProducer takes a position CheckPeerProducer returned.
func (c *Consumer) SetPeerProducer(pos uint64) { c.peerProd = pos }

// OnPeerProducer checks and takes the producer cursor from a CDC the peer sent, and
// returns the bytes it makes readable; a stale or invalid one changes nothing
// (CheckPeerProducer).
func (c *Consumer) OnPeerProducer(p Cursor) (added uint32, stale bool, err error) {
	pos, stale, err := c.CheckPeerProducer(p)
	if err != nil || stale {
		return 0, stale, err
	}
	added = uint32(pos - c.peerProd)
	c.peerProd = pos
	return added, false, nil
}

// Unconfirmed returns the bytes consumed since the consumer cursor was last reported:
// space the peer does not yet know is free.
func (c *Consumer) Unconfirmed() uint32 { return uint32(c.cons - c.confirmed) }

// UpdateDue reports whether this end should send a CDC now just to report its consumer
// cursor: when the peer asked for it (requested: FlagUpdateRequested in its last CDC,
// or an urgent byte just read) or once at least 10% of the RMBE has been consumed
// since the last report. Reporting every read would cost a CDC per read; waiting
// longer would stall a blocked sender. No deadlock follows: a sender is blocked only
// when its whole view of the ring is unconsumed, so reading everything frees 100%,
// past the 10% threshold. (Linux smc_tx_consumer_update additionally waits for the
// sender to be half full or blocked; we report at 10% as docs/protocol.md, section 4,
// states.)
func (c *Consumer) UpdateDue(requested bool) bool {
	return requested || uint64(c.Unconfirmed())*10 >= uint64(c.size)
}

// Report returns the consumer cursor for a CDC about to be sent and records it as
// reported. Every CDC carries the consumer cursor, so call it for data CDCs too.
func (c *Consumer) Report() Cursor {
	c.confirmed = c.cons
	return c.Cursor()
}

// withLimit completes the *CursorError of Cursor.Pos with which cursor it was and
// the limit; nil stays nil.
func withLimit(err error, which string, limit Cursor) error {
	var ce *CursorError
	if errors.As(err, &ce) {
		ce.Which, ce.Limit = which, limit
	}
	return err
}
