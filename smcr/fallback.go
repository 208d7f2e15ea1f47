// Fallback: the one place a connection gives up on SMC-R and becomes plain TCP on
// the TCP connection it was set up on. RFC 7609 §3.7.4 (Decline) and §4.3 (fallback),
// after Linux's smc_switch_to_fallback.

package smcr

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/smcr-io/smcr/smcr/clc"
)

// DeclineCode is a CLC diagnosis code (clc.DeclineCode).
type DeclineCode = clc.DeclineCode

// Codes this engine uses beyond Linux's list. Class 2 is "timeout": Linux has no
// code for a CLC message that never came (it fails the connect instead of falling
// back); we fall back and record this one.
const (
	DeclineTimeoutCLC DeclineCode = 0x02000000
)

// Decline says why a Conn fell back to TCP.
type Decline struct {
	Code DeclineCode
	Side Side  // SidePeer: the peer's Decline; SideLocal: our decision
	Sent bool  // a Decline message went to the peer
	Err  error // the local cause, when there was one
}

func (d *Decline) Error() string {
	s := fmt.Sprintf("smcr: fallback (%s): %v (%#08x)", d.Side, d.Code, uint32(d.Code))
	if d.Err != nil {
		s += ": " + d.Err.Error()
	}
	return s
}

// Unwrap lets errors.Is find ErrFallback, the code and the cause.
func (d *Decline) Unwrap() []error {
	errs := []error{ErrFallback, &clc.DeclineError{Code: d.Code, Local: d.Side == SideLocal}}
	if d.Err != nil {
		errs = append(errs, d.Err)
	}
	return errs
}

// fallbackWhy is why a connection falls back, and whether the peer is told.
type fallbackWhy struct {
	code DeclineCode
	side Side
	tell bool  // send a Decline: the peer speaks CLC and waits for our answer
	err  error // the local cause, if any
}

// decline is our decision, told to the peer in a Decline.
func decline(code DeclineCode, err error) fallbackWhy {
	return fallbackWhy{code: code, side: SideLocal, tell: true, err: err}
}

// giveUp is our decision, not told: the peer speaks no CLC, or cannot hear it.
func giveUp(code DeclineCode, err error) fallbackWhy {
	return fallbackWhy{code: code, side: SideLocal, err: err}
}

// peerDeclined is the peer's Decline; err is what it interrupted, if anything.
func peerDeclined(code DeclineCode, err error) fallbackWhy {
	return fallbackWhy{code: code, side: SidePeer, err: err}
}

// fallback makes c a TCP connection: it sends a Decline when why.tell is set,
// stores the reason on c, counts it, and frees whatever SMC-R setup had begun.
// br holds bytes read ahead during CLC that belong to the application; they are
// returned first by Read.
func (e *Engine) fallback(c *Conn, why fallbackWhy, br *bufio.Reader) *Conn {
	code := why.code
	d := &Decline{Code: code, Side: why.side, Err: why.err}
	if why.tell {
		msg := clc.Decline{PeerID: e.peerID, Code: code, OutOfSync: code == clc.DeclineSyncError}
		b, _ := msg.AppendTo(make([]byte, 0, clc.DeclineLen))
		// A fresh deadline: the CLC one may be what just expired.
		c.tcp.SetWriteDeadline(e.cfg.Clock.Now().Add(e.settings().CLCTimeout))
		if _, err := c.tcp.Write(b); err == nil {
			d.Sent = true
		}
	}
	c.abandonSetup()
	if c.endCLC != nil {
		c.endCLC()
	}
	c.tcp.SetDeadline(noDeadline)
	c.mu.Lock() // for Engine.Conns
	c.mode, c.decline = ModeFallback, d
	c.mu.Unlock()
	c.fb = c.tcp
	skip := c.clcUnread // the rest of a message read in part, before anything else
	switch {
	case skip < 0:
		// A CLC message whose end is unknown: where the peer's data begins
		// cannot be found, and a guess would hand its bytes to the
		// application as data. The connection ends instead (a reset).
		if tc, ok := c.tcp.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.tcp.Close()
	case d.Sent:
		// The peer may have answered or given up at the same time: its Accept or
		// Decline crosses ours.
		if br == nil {
			br = c.clcReader(clcMaxLen) // room for the longest CLC message
		}
		c.fb = &readAheadConn{Conn: c.tcp, r: br, mark: c.clcIn, skip: skip, crossing: true, peer: c.clcPeer}
	case skip > 0 || br != nil && br.Buffered() > 0:
		if br == nil {
			br = c.clcReader(clcMaxLen)
		}
		c.fb = &readAheadConn{Conn: c.tcp, r: br, mark: c.clcIn, skip: skip}
	}
	if c.clcIn != nil {
		c.clcIn.marking = true // the bytes from here on are the application's
	}
	e.st.countFallback(code, why.side)
	if !c.client {
		e.st.srvFallback.Add(1)
	}
	e.log.Info("smcr: fallback to tcp", "conn", c.id, "code", fmt.Sprintf("%#08x", uint32(code)),
		"reason", code.String(), "side", why.side.String(), "decline_sent", d.Sent, "cause", why.err,
		"remote", c.tcp.RemoteAddr())
	e.untrack(c)
	e.trackFallback(c)
	return c
}

// readAheadConn returns the bytes CLC read past its messages before reading on.
// With crossing set (we sent a Decline), it first drops an Accept, Confirm or
// Decline the peer (of ID peer, when known) sent while ours was on the way, and
// then a resync saying it holds nothing of ours (a client whose link failed
// before it read our Decline): its application wrote neither. (A client whose
// Confirm crossed our Decline resends its bytes over TCP after them,
// declinedAfterConfirm.)
type readAheadConn struct {
	net.Conn
	r        *bufio.Reader
	mark     *markReader // r's, which knows where an urgent byte in r lies
	skip     int         // bytes of a CLC message read in part, to drop first
	crossing bool
	peer     [8]byte
}

func (c *readAheadConn) Read(p []byte) (int, error) {
	if err := c.dropCLC(); err != nil {
		return 0, err
	}
	if !c.drained() {
		return c.r.Read(p[:min(len(p), c.r.Buffered())])
	}
	return c.Conn.Read(p)
}

// readBuffered reads the bytes CLC read ahead as ReadMarked reads a stream:
// up to the urgent byte among them, and that byte alone, reported as urgent.
func (c *readAheadConn) readBuffered(p []byte) (int, bool, error) {
	n := min(len(p), c.r.Buffered())
	at := c.mark.markIn(c.r)
	switch {
	case at == 0:
		n = min(n, 1)
	case at > 0:
		n = min(n, at)
	}
	n, err := c.r.Read(p[:n])
	return n, at == 0 && n == 1, err
}

// dropCLC drops what is left of CLC at the start of the bytes read ahead: the
// rest of a message read in part, and a message that crossed our Decline.
func (c *readAheadConn) dropCLC() error {
	for c.skip > 0 {
		n, err := c.r.Discard(c.skip)
		c.skip -= n
		if err != nil {
			return err
		}
	}
	if c.crossing {
		c.crossing = false
		if n := crossingCLC(c.r, c.peer); n > 0 {
			confirm := c.isType(clc.TypeConfirm)
			c.r.Discard(n)
			// A client whose first contact then failed (no CONFIRM_LINK
			// came) declines after its Confirm: drop that too.
			if confirm {
				if n := crossingCLC(c.r, c.peer); n > 0 && c.isType(clc.TypeDecline) {
					c.r.Discard(n)
				}
			}
		}
		if crossingResync(c.r) {
			c.r.Discard(resyncLen)
		}
	}
	return nil
}

// isType reports whether the buffered bytes start with a CLC message of type t
// (crossingCLC vouched for one there).
func (c *readAheadConn) isType(t clc.MsgType) bool {
	b, _ := c.r.Peek(5)
	return len(b) == 5 && clc.MsgType(b[4]) == t
}

// drained reports whether the bytes CLC read ahead are all consumed, crossing
// messages included: reads go to the socket directly from then on.
func (c *readAheadConn) drained() bool {
	if c.crossing || c.skip > 0 {
		return false
	}
	if c.r != nil && c.r.Buffered() == 0 {
		c.r = nil
	}
	return c.r == nil
}

// crossingCLC reports the length of the Accept, Confirm or Decline from peer (any peer
// when zero) that br starts with, or 0. It stops waiting at the first byte that
// cannot belong to one, so application bytes are never waited on longer than they
// look like a CLC message.
func crossingCLC(br *bufio.Reader, peer [8]byte) int {
	n := 0 // the message length, once its header is read
	for i := 0; n == 0 || i < n; i++ {
		got, _ := br.Peek(i + 1)
		if len(got) <= i {
			return 0
		}
		ok := true
		switch x := got[i]; {
		case i < 4:
			ok = x == clc.Eyecatcher[i]
		case i == 4:
			ok = clc.MsgType(x) == clc.TypeAccept || clc.MsgType(x) == clc.TypeConfirm || clc.MsgType(x) == clc.TypeDecline
		case i == 6:
			n = int(binary.BigEndian.Uint16(got[5:7]))
			ok = n >= clc.DeclineLen && n <= clcMaxLen && (clc.MsgType(got[4]) != clc.TypeDecline || n == clc.DeclineLen || n == clc.DeclineV2Len)
		case i >= 8 && i < 16 && peer != [8]byte{}:
			ok = x == peer[i-8]
		case n > 0 && i >= n-4:
			ok = x == clc.Eyecatcher[i-(n-4)]
		}
		if !ok {
			return 0
		}
	}
	return n
}

// crossingResync reports whether br starts with a resync that holds nothing of
// ours (resync.go), the only one a peer we declined can send. Like crossingCLC it
// stops at the first byte that cannot belong to one.
func crossingResync(br *bufio.Reader) bool {
	for i := 0; i < resyncLen; i++ {
		got, _ := br.Peek(i + 1)
		if len(got) <= i {
			return false
		}
		ok := true
		switch x := got[i]; {
		case i < 4:
			ok = x == resyncMagic[i]
		case i == 4:
			ok = x == resyncVersion
		case i == 5:
			ok = x&^0xc0 == 0
		default: // reserved, and received = 0
			ok = x == 0
		}
		if !ok {
			return false
		}
	}
	return true
}

// CloseWrite half-closes the TCP connection, so io.Copy-style proxies work.
func (c *readAheadConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// DetachTCP hands a fallback connection's TCP socket back to the caller, who
// carries the stream on without the Conn (smcrd's direct mode returns the
// socket to the program that owns it). It returns the bytes CLC read ahead that
// belong to the application. Before them it drops what is not the
// application's: the rest of a CLC message read in part, and a CLC message the
// peer sent while our Decline was on the way, which it waits for at most
// crossing (a peer's crossing message left before ours reached it: a few round
// trips bound it). The Conn is finished after; its TCP connection stays open.
func (c *Conn) DetachTCP(crossing time.Duration) ([]byte, error) {
	if c.mode != ModeFallback {
		return nil, errors.New("smcr: detach: not a fallback connection")
	}
	c.closeOnce.Do(func() { close(c.done) })
	c.e.untrack(c)
	rc, ok := c.fb.(*readAheadConn)
	if !ok {
		return nil, nil
	}
	if rc.skip > 0 || rc.crossing {
		// The rest of a message read in part is on its way for sure: it
		// gets the CLC timeout. A crossing message only may come.
		wait := crossing
		if rc.skip > 0 {
			wait = c.e.settings().CLCTimeout
		}
		c.tcp.SetReadDeadline(c.e.cfg.Clock.Now().Add(wait))
		err := rc.dropCLC()
		c.tcp.SetReadDeadline(noDeadline)
		if rc.skip > 0 {
			return nil, fmt.Errorf("smcr: detach: the rest of a CLC message: %w", err)
		}
	}
	if rc.r == nil || rc.r.Buffered() == 0 {
		return nil, nil
	}
	b, _ := rc.r.Peek(rc.r.Buffered())
	return bytes.Clone(b), nil
}
