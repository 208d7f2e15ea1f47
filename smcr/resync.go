// Continuation over TCP: when the last link of a link group fails, each active
// connection resynchronises with its peer on its TCP connection and goes on there
// from the last byte the receiver holds, no byte lost or duplicated. This project's
// extension beyond RFC 7609 §4.3 (the RFC and Linux fail over to another link or
// abort); the message is drawn in docs/protocol.md.

package smcr

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr/clc"
)

// The resync message, sent once by each end on the TCP connection:
//
//	0  magic "SMCZ" (4)
//	4  version 1 (1)
//	5  flags (1): 0x80 we had sent sending-done, 0x40 we had closed
//	6  reserved (2)
//	8  received (8): bytes of the peer's stream we hold (our producer cursor, absolute)
const (
	resyncLen     = 16
	resyncVersion = 1
	resyncOffRecv = 8
)

var resyncMagic = [4]byte{'S', 'M', 'C', 'Z'}

var errResync = errors.New("smcr: bad resync message")

type resync struct {
	flags    uint8
	received uint64
}

func (r resync) encode() [resyncLen]byte {
	var b [resyncLen]byte
	copy(b[:4], resyncMagic[:])
	b[4], b[5] = resyncVersion, r.flags
	binary.BigEndian.PutUint64(b[resyncOffRecv:], r.received)
	return b
}

func parseResync(b []byte) (resync, error) {
	if len(b) != resyncLen || [4]byte(b[:4]) != resyncMagic || b[4] != resyncVersion {
		return resync{}, fmt.Errorf("%w: % x", errResync, b)
	}
	return resync{flags: b[5], received: binary.BigEndian.Uint64(b[resyncOffRecv:])}, nil
}

// watchTCP reads the peer's resync: nothing else arrives on the TCP connection of
// an SMC-R connection. It runs for the connection's life and ends with the TCP
// connection.
func (c *Conn) watchTCP() {
	defer close(c.cont.watchDone)
	if h := testHookWatch.Load(); h != nil {
		(*h)(c)
	}
	var b [resyncLen]byte
	if _, err := io.ReadFull(c.tcp, b[:]); err != nil {
		c.mu.Lock()
		detached := c.cont.detached
		c.mu.Unlock()
		if !detached {
			c.tcpEnded(err)
		}
		return
	}
	if [4]byte(b[:4]) == clc.Eyecatcher {
		c.declinedAfterConfirm(b[:])
		return
	}
	r, err := parseResync(b[:])
	if err != nil {
		c.e.st.protoErrors.Add(1)
	}
	c.cont.peerResync <- resyncResult{r, err}
	c.mu.Lock()
	c.startFailoverLocked()
	c.mu.Unlock()
}

// testHookWatch lets tests hold watchTCP back, as a busy machine may. Atomic:
// connections made before a test sets it read it from their own goroutines.
var testHookWatch atomic.Pointer[func(*Conn)]

// declinedAfterConfirm handles a Decline after our Confirm: the server refused
// the connection after all (a CONFIRM_RKEY that never came, values it found
// wrong, or its Decline crossed our Confirm) and went on as plain TCP. It never
// read our RMBE nor wrote into ours, so a peer of this engine gets every byte we
// wrote resent over TCP from the first, as a continuation from a resync that says
// it holds nothing (and ours is not sent: its application would read it). If our
// link failed first, our continuation is under way and its resync may be on the
// wire: the peer drops it (readAheadConn), and the continuation takes this
// Decline as the answer. Any other peer, or a Decline that does not parse, ends
// the connection.
func (c *Conn) declinedAfterConfirm(head []byte) {
	// version 1's 28 bytes or version 2's 44, as the header's length says
	c.tcp.SetReadDeadline(c.e.cfg.Clock.Now().Add(c.e.settings().CLCTimeout))
	m, err := clc.ReadMessage(io.MultiReader(bytes.NewReader(head), c.tcp), clc.DeclineV2Len)
	c.tcp.SetReadDeadline(noDeadline)
	d, _ := m.(*clc.Decline)
	if err == nil && d == nil {
		err = fmt.Errorf("not a decline: %v", m)
	}
	c.mu.Lock()
	if err == nil && c.canContinue() && c.rx.PeerProducerPos() == 0 {
		c.cont.declinedLate = true // a continuation not yet under way sends no resync
		c.mu.Unlock()
		c.e.log.Info("smcr: peer declined after confirm, continuing over tcp from the first byte",
			"conn", c.id, "code", fmt.Sprintf("%#08x", uint32(d.Code)), "reason", d.Code.String())
		c.cont.peerResync <- resyncResult{}
		c.mu.Lock()
		c.startFailoverLocked()
		c.mu.Unlock()
		return
	}
	c.e.st.protoErrors.Add(1)
	if c.err == nil {
		c.err = fmt.Errorf("%w: peer declined after confirm", ErrProtocol)
	}
	c.closing.peerClosed, c.closing.peerDone, c.closing.localTerm, c.lnkErr = true, true, true, true
	c.updateState("declined after confirm")
	c.mu.Unlock()
	c.wakeApp()
}

// tcpEnded answers a continuation when the TCP connection ends without the peer's
// resync: a peer that had closed (its last CDC said so), or one whose application
// we closed ours to, and that consumed everything we wrote, released its end and
// closed TCP, and is owed nothing; the continuation goes on with what we hold
// (then EOF). Otherwise it fails now rather than at its timeout.
func (c *Conn) tcpEnded(err error) {
	c.mu.Lock()
	var r resyncResult
	// (Our application closed: whatever the peer still had for it would be
	// dropped, so only what we owe the peer matters.)
	if (c.closing.peerClosed || c.closing.appClosed) && !c.closing.peerAbort && c.tx.InFlight() == 0 {
		r = resyncResult{r: resync{flags: 0xc0, received: c.tx.Pos()}}
	} else {
		r = resyncResult{err: fmt.Errorf("tcp ended without a resync: %w", err)}
	}
	c.mu.Unlock()
	select {
	case c.cont.peerResync <- r:
	default:
	}
}

type resyncResult struct {
	r   resync
	err error
}

// canContinue reports whether a link failure should continue over TCP. The caller
// holds c.mu.
func (c *Conn) canContinue() bool {
	return c.cont.smcx && !c.cont.detached && c.st != stateInit && !c.closing.released && !c.closing.peerAbort && !c.closing.localAbort && c.err == nil
}

// startFailoverLocked freezes the cursors and starts the resync. Caller holds c.mu.
func (c *Conn) startFailoverLocked() {
	if c.cont.fo || !c.canContinue() {
		return
	}
	c.cont.fo = true
	go c.failover()
}

// failover runs the resync: both ends say how much of the other's stream they
// hold; each resends the rest from its send buffer (which still holds every byte
// the peer has not consumed), then the connection is plain TCP.
func (c *Conn) failover() {
	err := c.resync()
	c.mu.Lock()
	if err != nil {
		if c.err == nil {
			c.err = fmt.Errorf("%w: continuation over tcp failed: %v", ErrLinkDown, err)
		}
		c.lnkErr = true
	}
	c.cont.foReady = err == nil
	if c.cont.foReady {
		// The application's deadlines go to the TCP connection now, under c.mu:
		// a SetDeadline meanwhile found continued() false and set only ours.
		c.tcp.SetReadDeadline(c.readDL.get())
		c.tcp.SetWriteDeadline(c.writeDL.get())
	}
	c.lnkErr = true // the link is no longer this connection's, whatever happened
	c.updateState("continued over tcp")
	c.mu.Unlock()
	if h := testHookFailoverEnd.Load(); h != nil {
		(*h)(c)
	}
	close(c.cont.foDone)
	c.wakeApp()
	if err != nil {
		c.e.log.Warn("smcr: continuation over tcp failed", "conn", c.id, "err", err)
		resetTCP(c.tcp) // the peer may have continued: a FIN would end a cut stream
	} else {
		c.e.st.continued.Add(1)
		c.e.log.Info("smcr: connection continues over tcp", "conn", c.id)
	}
	// Closed before foDone, however shortly: Close left the release to us.
	if !c.maybeRelease() && err == nil {
		c.shedBuffers()
	}
}

// shedBuffers gives back, with their share of max_memory, the buffers a
// connection continued over TCP no longer needs once its link group has ended:
// the send buffer (the resend is done, writes go to TCP) and, once read empty,
// the RMB (the cursors are frozen: nothing more is read from it). They were
// held until the connection closed, and after an outage the connections that
// lived on kept new ones from SMC-R for want of memory. While the group lives
// (the peer declined after our Confirm; the connection could not move to the
// group's other link) a WRITE may still read or land in them: they stay.
func (c *Conn) shedBuffers() {
	c.mu.Lock()
	// A cursor-driven Conn's application may still use its buffers.
	todo := c.cont.foReady && !c.closing.released && !c.cursors && (c.snd != nil || c.rmb != nil && c.rx.Readable() == 0)
	regs := c.move.regLink
	c.mu.Unlock()
	if !todo {
		return
	}
	c.lg.mu.RLock()
	ended := c.lg.dead
	c.lg.mu.RUnlock()
	if !ended {
		return
	}
	// Once its QP is closed a link neither reads nor writes our buffers. The
	// group's end closes its links; this waits for any close under way.
	for _, l := range regs {
		if l != nil {
			l.close()
		}
	}
	var bufs []*pooledBuf
	c.mu.Lock()
	if c.closing.released {
		c.mu.Unlock()
		return
	}
	if b := c.detachBufLocked(false); b != nil {
		bufs = append(bufs, b)
		c.snd, c.move.sndHome = nil, nil
	}
	if c.rx.Readable() == 0 && !c.rxBusy {
		if b := c.detachBufLocked(true); b != nil {
			bufs = append(bufs, b)
			c.rmb, c.move.rmbHome = nil, nil
		}
	}
	for _, b := range bufs {
		c.memHeld -= int64(b.size)
	}
	c.mu.Unlock()
	for _, b := range bufs {
		c.lg.dropHeld(b)
	}
}

// testHookFailoverEnd lets tests act as a continuation ends, outside c.mu and
// before foDone closes.
var testHookFailoverEnd atomic.Pointer[func(*Conn)]

func (c *Conn) resync() error {
	c.mu.Lock()
	var flags uint8
	if c.closing.localDone {
		flags |= 0x80
	}
	if c.closing.appClosed {
		flags |= 0x40
	}
	mine := resync{flags: flags, received: c.rx.PeerProducerPos()}
	if c.cont.release {
		mine.received = c.cont.releaseAt // Release: the peer resends what the application did not read
	}
	declined := c.cont.declinedLate
	c.mu.Unlock()
	wait := resyncWait(c.e.settings().CLCTimeout)
	dl := c.e.cfg.Clock.Now().Add(wait)
	c.tcp.SetWriteDeadline(dl)
	// A peer that declined after our Confirm is plain TCP already
	// (declinedAfterConfirm): no resync for it.
	if b := mine.encode(); !declined {
		if _, err := c.tcp.Write(b[:]); err != nil {
			return fmt.Errorf("send resync: %w", err)
		}
	}
	peer, err := c.awaitPeerResync(wait)
	if err != nil {
		return err
	}
	if peer.err != nil {
		return peer.err
	}
	// The wait was for the peer's resync. The resend waits for the peer's
	// application to make room, as TCP's send buffer would: its bytes were
	// written already, whatever deadline the application sets now.
	c.tcp.SetWriteDeadline(noDeadline)
	// A Write may be posting a chunk: wait for it, so the resend covers every
	// byte the writer will report as written. Writers start no new chunk once
	// the continuation began, and a chunk is counted before it is posted.
	c.mu.Lock()
	c.awaitPostersLocked(false)
	from, to, cons, urgEnd := peer.r.received, c.tx.Pos(), c.tx.PeerConsumerPos(), c.txUrgentEnd
	c.mu.Unlock()
	if from < cons || from > to {
		return fmt.Errorf("%w: peer holds %d, we wrote %d and it consumed %d", errResync, from, to, cons)
	}
	// Our last urgent byte among them lost its CDC's flag with the link: it goes
	// with MSG_OOB, so the peer's ReadMarked still reports it.
	if from < urgEnd && urgEnd <= to {
		if err := c.resend(from, urgEnd-1); err != nil {
			return err
		}
		if err := writeUrgentTCP(c.tcp, c.snd.Bytes()[(urgEnd-1)%uint64(c.tx.Size())]); err != nil {
			return fmt.Errorf("resend urgent byte: %w", err)
		}
		from = urgEnd
	}
	if err := c.resend(from, to); err != nil {
		return err
	}
	c.mu.Lock()
	done := c.closing.localDone && !c.closing.appClosed
	c.mu.Unlock()
	if done {
		closeWrite(c.tcp)
	}
	return nil
}

// awaitPeerResync waits for the peer's resync, as watchTCP reads it. A wait
// that ran out is no evidence against the peer until we looked: its resync may
// have come in time and lie unread on the socket, its reader not yet run on a
// busy host (then the wait goes on), or have been read as the timer fired.
func (c *Conn) awaitPeerResync(wait time.Duration) (resyncResult, error) {
	for {
		t := newTimer(c.e.cfg.Clock, wait)
		select {
		case r := <-c.cont.peerResync:
			t.Stop()
			return r, nil
		case <-t.C:
		}
		select {
		case r := <-c.cont.peerResync:
			return r, nil
		default:
		}
		if !pendingInput(underlyingConn(c.tcp)) {
			return resyncResult{}, errors.New("no resync from the peer")
		}
		c.e.log.Debug("smcr: the peer's resync waits unread, waiting on", "conn", c.id)
	}
}

// resend writes bytes [from, to) of our stream to the TCP connection from the
// send buffer, which mirrors the peer's RMBE (the caller checked that the peer
// consumed all before from, so they are in it). With nothing to resend it
// touches no buffer: a connection continued during setup may have none.
func (c *Conn) resend(from, to uint64) error {
	var w [2]rmb.Span
	for _, s := range rmb.AppendSpans(w[:0], from, uint32(to-from), c.tx.Size()) {
		if _, err := c.tcp.Write(c.snd.Bytes()[s.Off:s.End()]); err != nil {
			return fmt.Errorf("resend: %w", err)
		}
	}
	return nil
}

// closeWrite half-closes the TCP connection. The continuation and CloseWrite may
// both do it; the second finds the socket shut down (ENOTCONN once the peer
// closed too), which is no error.
func closeWrite(tcp any) error {
	if cw, ok := tcp.(interface{ CloseWrite() error }); ok {
		if err := cw.CloseWrite(); err != nil && !errors.Is(err, syscall.ENOTCONN) {
			return err
		}
	}
	return nil
}

// resetTCP closes tcp with a reset rather than a FIN, so the peer reads an
// error, never a clean end, after bytes it may not have got.
func resetTCP(tcp net.Conn) {
	lingerZero(tcp)
	tcp.Close()
}

// lingerZero has tcp's close send a reset (SO_LINGER 0), as TCP's abort.
func lingerZero(tcp net.Conn) {
	if l, ok := underlyingConn(tcp).(interface{ SetLinger(sec int) error }); ok {
		l.SetLinger(0)
	}
}

// minResyncWait bounds from below how long a continuation waits for the peer's
// resync: the CLC timeout, which an operator may shorten to fail handshakes
// fast, would end every connection of a failed link on a busy host, where
// hundreds of continuations answer at once (the peer answers as soon as it
// reads ours; a peer that is gone closes TCP or never answers either way).
const minResyncWait = 5 * time.Second

// underlyingConn is the connection under CLC's read-ahead, if tcp has one.
func underlyingConn(tcp net.Conn) net.Conn {
	if ra, ok := tcp.(*readAheadConn); ok {
		return ra.Conn
	}
	return tcp
}

func resyncWait(clcTimeout time.Duration) time.Duration { return max(clcTimeout, minResyncWait) }

// StopTCPWatch ends the engine's reading of the TCP connection (watchTCP, the
// peer's resync) where the connection's bytes never travel on it, the direct
// mode's same-host bypass, before the socket carries the application's bytes
// at a release (daemon/directrelease.go): from here on the connection can no
// longer continue over TCP, and a link failure ends it. An error wrapping
// ErrNoRelease where it continues over TCP already.
func (c *Conn) StopTCPWatch() error {
	c.mu.Lock()
	if c.cont.fo {
		c.mu.Unlock()
		return fmt.Errorf("%w: it continues over tcp already", ErrNoRelease)
	}
	c.cont.detached = true
	done := c.cont.watchDone
	c.mu.Unlock()
	if done == nil {
		return nil // no watcher: a peer without our extensions
	}
	c.tcp.SetReadDeadline(time.Unix(1, 0))
	<-done
	c.tcp.SetReadDeadline(noDeadline)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cont.fo {
		return fmt.Errorf("%w: it continues over tcp already", ErrNoRelease)
	}
	return nil
}
