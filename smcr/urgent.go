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
	case c.rxCons < c.rxUrgentAt:
		return min(avail, c.rxUrgentAt-c.rxCons), false
	case c.rxCons == c.rxUrgentAt:
		return 1, true
	}
	return avail, false
}

// passMarkLocked forgets the mark once the reader is past it.
func (c *Conn) passMarkLocked() {
	if c.rxUrgent && c.rxCons > c.rxUrgentAt {
		c.rxUrgent = false
	}
}

// readMarkedTCP reads from a TCP path of the connection (the fallback's, or the
// continuation's), stopping at the kernel's urgent mark.
func (c *Conn) readMarkedTCP(r net.Conn, p []byte) (int, bool, error) {
	if ra, ok := r.(*readAheadConn); ok {
		if !ra.drained() {
			n, err := ra.Read(p) // bytes CLC read ahead: no mark among them
			return n, false, err
		}
		r = ra.Conn
	}
	if t, ok := r.(*net.TCPConn); ok {
		c.urgOnce.Do(func() { c.urgR, _ = tcpurg.NewReader(t) })
		if c.urgR != nil {
			return c.urgR.ReadMarked(p)
		}
	}
	n, err := r.Read(p) // a test's conn: no mark
	return n, false, err
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
