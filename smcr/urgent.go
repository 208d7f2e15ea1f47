// Urgent data: TCP's MSG_OOB, one byte with a mark in the stream. Over SMC-R the
// CDC whose producer cursor first covers the byte carries urgent-data-present, and
// the byte is the last one that CDC announces (RFC 7609 §4.2 prod_flags, Linux's
// smc_cdc_handle_urg_data_arrival). Here the byte stays in the stream, as with
// SO_OOBINLINE: a read stops before it and returns it alone, reported as urgent,
// which is what smcrd needs to hand it on as urgent data. Over TCP (a fallback, a
// continuation) the kernel's urgent mark does the same (internal/tcpurg).
//
// Only the latest mark is kept, as TCP keeps one urgent pointer.

package smcr

import (
	"bufio"
	"net"

	"github.com/smcr-io/smcr/internal/tcpurg"
)

// WriteUrgent writes b as TCP urgent data would be sent (send with MSG_OOB, one
// byte): after every byte written before it, marked so that the peer's
// ReadMarked reports it (and a Linux peer's recv with MSG_OOB finds it).
func (c *Conn) WriteUrgent(b byte) error {
	if c.mode == ModeFallback {
		return writeUrgentTCP(c.tcp, b)
	}
	_, err := c.smcWrite([]byte{b}, true)
	return err
}

// untilMarkLocked limits avail, the bytes ready in the RMBE, to those before the
// peer's urgent byte, or to the urgent byte alone when it is next (urgent). The
// read that takes it passes the mark (passMarkLocked).
func (c *Conn) untilMarkLocked(avail uint64) (uint64, bool) {
	if !c.rxUrgent || avail == 0 {
		return avail, false
	}
	switch {
	case c.rx.Pos() < c.rxUrgentAt:
		return min(avail, c.rxUrgentAt-c.rx.Pos()), false
	case c.rx.Pos() == c.rxUrgentAt:
		return 1, true
	}
	return avail, false
}

// passMarkLocked forgets the mark once the reader is past it.
func (c *Conn) passMarkLocked() {
	if c.rxUrgent && c.rx.Pos() > c.rxUrgentAt {
		c.rxUrgent = false
	}
}

// readMarkedTCP reads from a TCP path of the connection (the fallback's, or the
// continuation's), stopping at the kernel's urgent mark.
func (c *Conn) readMarkedTCP(r net.Conn, p []byte) (int, bool, error) {
	if ra, ok := r.(*readAheadConn); ok {
		if err := ra.dropCLC(); err != nil {
			return 0, false, err
		}
		if !ra.drained() {
			return ra.readBuffered(p) // bytes CLC read ahead
		}
		r = ra.Conn
	}
	if urg := c.urgentReader(r); urg != nil {
		return urg.ReadMarked(p)
	}
	n, err := r.Read(p) // a test's conn: no mark
	return n, false, err
}

// urgentReader is the Reader of the connection's TCP socket r, made at its
// first use; nil when r is no TCP socket (a test's conn).
func (c *Conn) urgentReader(r net.Conn) *tcpurg.Reader {
	if t, ok := r.(*net.TCPConn); ok {
		c.urgOnce.Do(func() { c.urgR, _ = tcpurg.NewReader(t) })
	}
	return c.urgR
}

// markReader reads the TCP socket for CLC's bufio.Reader. Where application
// bytes may come it reads as readMarkedTCP does, never past the urgent mark,
// and notes where in the stream the urgent byte was, so that an urgent byte
// among the bytes CLC read ahead keeps its mark (readAheadConn): a plain read
// that began at the mark would take the byte inline with what follows. Those
// reads are the connection's first (a peer that speaks no CLC) and all after
// a fallback (marking). Between them come CLC messages only, each read from
// where the one before ended, which a plain read serves with one system call
// rather than three.
type markReader struct {
	conn     net.Conn
	urg      *tcpurg.Reader // nil: conn is no TCP socket, no mark to see
	marking  bool           // every read looks for the mark, not only the first
	read     int64          // bytes read from conn
	urgentAt int64          // stream offset of the last urgent byte read; -1: none
}

// clcReader returns the buffered reader CLC reads c's messages with, size bytes
// ahead at most, and keeps its markReader for a fallback's readAheadConn.
func (c *Conn) clcReader(size int) *bufio.Reader {
	c.clcIn = &markReader{conn: c.tcp, urgentAt: -1}
	if _, ok := c.tcp.(*net.TCPConn); ok {
		// Only the socket itself: urg reads it directly, past any wrapper's
		// buffered bytes.
		c.clcIn.urg = c.urgentReader(c.tcp)
	}
	return bufio.NewReaderSize(c.clcIn, size)
}

func (m *markReader) Read(p []byte) (int, error) {
	if m.urg == nil || m.read > 0 && !m.marking {
		n, err := m.conn.Read(p)
		m.read += int64(n)
		return n, err
	}
	n, urgent, err := m.urg.ReadMarked(p)
	if urgent {
		m.urgentAt = m.read
	}
	m.read += int64(n)
	return n, err
}

// markIn returns where the urgent byte lies among the buffered bytes of br,
// which reads through m: their index, or -1 when it is not among them.
func (m *markReader) markIn(br *bufio.Reader) int {
	if m == nil || m.urgentAt < 0 {
		return -1
	}
	at := m.urgentAt - (m.read - int64(br.Buffered()))
	if at < 0 || at >= int64(br.Buffered()) {
		return -1
	}
	return int(at)
}

// writeUrgentTCP sends b with MSG_OOB on the connection's TCP socket.
func writeUrgentTCP(tcp net.Conn, b byte) error {
	if ra, ok := tcp.(*readAheadConn); ok {
		tcp = ra.Conn
	}
	if t, ok := tcp.(*net.TCPConn); ok {
		return tcpurg.WriteUrgent(t, b)
	}
	_, err := tcp.Write([]byte{b}) // not a TCP socket (tests): no mark to set
	return err
}
