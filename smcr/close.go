// Closing: sending done (half-close), closed, and abnormal close (abort) through the
// CDC connection-state flags; buffers freed once both ends are done; the TCP
// connection closed after the SMC-R connection. RFC 7609 §4.4, after smc_close.

package smcr

import (
	"net"
	"sync/atomic"
)

// updateState derives the state from the close flags: the one transition function.
// The caller holds c.mu.
func (c *Conn) updateState(why string) {
	var s state
	switch {
	case c.closing.released:
		s = stateClosed
	case !c.activated:
		s = stateInit
	case c.closing.peerAbort:
		s = stateProcessAbort
	case c.closing.localAbort:
		s = statePeerAbortWait
	case c.closing.appClosed && c.closing.peerClosed:
		s = stateClosed
	case c.closing.appClosed:
		s = statePeerFinCloseWait
	case c.closing.localDone && c.closing.peerDone:
		if c.st == stateAppCloseWait1 {
			s = stateAppFinCloseWait
		} else {
			s = statePeerCloseWait2
		}
	case c.closing.localDone:
		s = statePeerCloseWait1
	case c.closing.peerDone:
		s = stateAppCloseWait1
	default:
		s = stateActive
	}
	c.setState(s, why)
}

// CloseWrite shuts down writing: the peer reads everything written so far, then EOF.
func (c *Conn) CloseWrite() error {
	if c.mode == ModeFallback {
		if cw, ok := c.fb.(interface{ CloseWrite() error }); ok {
			return cw.CloseWrite()
		}
		return nil
	}
	c.txMu.Lock() // after any Write in progress
	defer c.txMu.Unlock()
	c.mu.Lock()
	if c.closing.appClosed {
		c.mu.Unlock()
		return net.ErrClosed // as Read and Write after Close, and TCP's
	}
	if c.cont.fo {
		c.closing.localDone = true
		c.updateState("close write")
		c.mu.Unlock()
		<-c.cont.foDone
		if c.continued() {
			return closeWrite(c.tcp)
		}
		return c.linkError(ErrLinkDown)
	}
	if c.closing.localDone || c.closing.localTerm || c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	c.closing.localDone = true
	c.updateState("close write")
	c.mu.Unlock()
	c.mu.Lock()
	lnk := c.lnk
	c.mu.Unlock()
	if err := c.sendCDC(0); err != nil {
		// The link went down under us: the move to another link (its CDC) or the
		// continuation over TCP (the resync) carries the close.
		c.awaitLinkDown(lnk)
		c.mu.Lock()
		fo, cerr := c.cont.fo, c.err
		c.mu.Unlock()
		if fo {
			<-c.cont.foDone
			if !c.continued() {
				return c.linkError(ErrLinkDown)
			}
			return nil
		}
		return cerr
	}
	return nil
}

// Close closes the connection: the peer reads what was written, then EOF; our
// buffers go once the peer has closed too (or after CloseTimeout). With bytes
// received and not read, the peer reads ErrReset instead, as TCP's reset.
func (c *Conn) Close() error {
	first := false
	c.closeOnce.Do(func() { first = true; close(c.done) })
	if !first {
		return errClosedTwice // as TCPConn's second Close
	}
	if c.mode == ModeFallback {
		c.e.untrack(c)
		return c.fb.Close()
	}
	c.mu.Lock()
	c.closing.appClosed = true
	// A WRITE posted after our closing CDC could reach an RMB the peer has let
	// go once it saw the close: let a Write that is posting, or a move's resend,
	// finish (no new Write starts now), as Linux's close waits for the socket
	// lock that sendmsg and the switch of a connection to another link hold.
	c.awaitPostersLocked(true)
	// With c.err set and the link up, an abort (ours, or our answer to the
	// peer's) is queued for the worker: a closed flag ahead of it would show
	// the peer a graceful end, EOF where it must read ErrReset.
	send := !c.closing.localTerm && !c.lnkErr && !c.cont.fo && c.err == nil
	if send && c.rx.Readable() > 0 && !c.closing.peerClosed {
		// Bytes the application never read end the connection abnormally, as
		// a TCP close with unread data sends a reset and Linux's
		// smc_close_final an abnormal close: a peer still reading must not
		// take the end for orderly. (One that closed already needs nothing.)
		c.abortLocked(ErrAborted)
		send = false
	}
	if send {
		c.closing.localTerm, c.closing.localDone = true, true
	}
	c.updateState("close")
	c.mu.Unlock()
	c.wakeApp()
	if send {
		c.sendCDC(0)
	}
	if !c.maybeRelease() {
		c.mu.Lock()
		if !c.closing.released {
			c.closing.closeTimer = c.e.cfg.Clock.AfterFunc(c.e.cfg.CloseTimeout, c.closeTimedOut)
		}
		c.mu.Unlock()
	}
	return nil
}

func (c *Conn) closeTimedOut() {
	c.mu.Lock()
	if c.closing.released {
		c.mu.Unlock()
		return
	}
	c.e.log.Info("smcr: peer did not close in time, aborting", "conn", c.id)
	c.closing.peerClosed = true // stop waiting for it
	fo, aborted := c.cont.fo, c.closing.localAbort
	c.abortLocked(ErrAborted)
	c.mu.Unlock()
	if fo {
		// A continuation's resend to a peer that does not read would hold the
		// connection for ever: reset it, as Abort does, and failover releases.
		resetTCP(c.tcp)
	}
	if aborted {
		// Our abort went before (and likely completed): abortLocked queued
		// nothing, and no completion is left to release the connection.
		c.maybeRelease()
	}
}

// Abort ends the connection abnormally, the SMC-R form of a TCP RST.
func (c *Conn) Abort() error {
	if c.mode == ModeFallback {
		lingerZero(c.tcp)
		return c.Close()
	}
	c.mu.Lock()
	fo := c.cont.fo
	c.abortLocked(ErrAborted)
	c.mu.Unlock()
	c.wakeApp()
	if fo {
		// Over TCP, or resyncing there (the link can carry no abnormal close):
		// TCP's reset, at once; a resend under way stops.
		resetTCP(c.tcp)
	}
	return c.Close()
}

// abortLocked records err and has the worker send the abnormal close.
func (c *Conn) abortLocked(err error) {
	if c.err == nil {
		c.err = err
	}
	if !c.closing.localAbort && !c.lnkErr {
		c.queueCtlLocked(ctlAbort)
		if c.st == stateInit {
			c.closing.localTerm, c.closing.localAbort = true, true
		}
	}
	c.updateState("abort")
}

// settledLocked reports whether a connection owes its peer nothing and wants
// nothing from it: both applications closed and the peer consumed every byte we
// wrote. A link failure then ends it without a continuation (only the
// completion of our closing CDC was missing). The caller holds c.mu.
func (c *Conn) settledLocked() bool {
	return c.closing.appClosed && c.closing.peerClosed && !c.closing.peerAbort && c.tx.InFlight() == 0
}

// linkDown ends the connection because its link group is gone.
func (c *Conn) linkDown(err error) {
	c.mu.Lock()
	c.lnkErr = true
	if c.st == stateInit && !c.closing.released {
		// In setup: CLC sees the link gone and falls back, or, its last message
		// sent, activates the connection, which then continues over TCP.
		c.mu.Unlock()
		return
	}
	if c.canContinue() && !c.settledLocked() {
		c.startFailoverLocked()
		// A continuation the peer began may have ended while the group lived:
		// its buffers can go now.
		shed := c.cont.foReady
		c.mu.Unlock()
		if shed {
			go c.shedBuffers()
		}
		return
	}
	if c.err == nil {
		c.err = err
	}
	c.updateState("link down")
	c.mu.Unlock()
	c.wakeApp()
	go c.maybeRelease()
}

// writeDone counts a completed RDMA WRITE; it runs in the poller.
func (c *Conn) writeDone() {
	if c.wrOut.Add(-1) == 0 {
		c.mu.Lock()
		c.queueReleaseIfDueLocked()
		c.mu.Unlock()
	}
}

// queueReleaseIfDueLocked has the link worker release c once maybeRelease's
// conditions hold on the SMC-R side: both ends sent their last CDC, ours
// completed, and no WRITE of ours is outstanding. The caller holds c.mu.
func (c *Conn) queueReleaseIfDueLocked() {
	if c.closing.termAcked && c.closing.peerClosed && c.wrOut.Load() == 0 && !c.closing.released {
		c.queueCtlLocked(ctlRelease)
	}
}

// awaitPostersLocked waits until no Write is between taking space in the send
// buffer and posting the chunk (txBusy: its copy, count, WRITEs and CDC) and, with
// move, until the connection has moved to another link (moving: moveTo resends
// from the send buffer). The caller holds c.mu, which is released while waiting.
func (c *Conn) awaitPostersLocked(move bool) {
	for c.txBusy || move && c.move.moving {
		c.mu.Unlock()
		pause()
		c.mu.Lock()
	}
}

// testHookCopy lets tests act, outside c.mu, while a Read copies out of the RMB
// (rx), or a Write copies into the send buffer or a move resends from it.
var testHookCopy atomic.Pointer[func(c *Conn, rx bool)]

// maybeRelease frees the connection's buffers once nothing can touch them: both ends
// sent their last CDC (or the link is gone) and no WRITE reads our send buffer.
// Ours must have completed: if it is lost with a failing link, the connection
// moves to the other link, whose failover-validation CDC carries the close again
// (moveTo); a released connection would not move and its peer would wait.
func (c *Conn) maybeRelease() bool {
	c.mu.Lock()
	if c.closing.released {
		c.mu.Unlock()
		return true
	}
	ok := c.closing.appClosed && (c.lnkErr || (c.closing.termAcked && c.closing.peerClosed && c.wrOut.Load() == 0))
	if c.txBusy || c.rxBusy || c.move.moving {
		ok = false // a Read, Write or move uses our buffers: it releases when done
	}
	if c.cont.fo && !isClosed(c.cont.foDone) {
		ok = false // failover still needs the send buffer; it releases when done
	}
	if !ok {
		c.mu.Unlock()
		return false
	}
	c.closing.released = true
	if c.closing.closeTimer != nil {
		c.closing.closeTimer.Stop()
	}
	c.updateState("released")
	c.mu.Unlock()
	c.e.st.active.Add(-1)
	c.freeResources()
	c.tcp.Close() // after the SMC-R connection, as Linux does
	c.e.untrack(c)
	return true
}

// freeResources returns the RMB, send buffer, token and link-group slot.
func (c *Conn) freeResources() {
	if c.lg != nil && c.token != 0 {
		c.lg.removeConn(c)
	}
	if c.token != 0 {
		c.e.freeToken(c.token)
	}
	// The peer's RMB stays known: the peer may pool it and give it to a next
	// connection without announcing it again, and withdraws it with DELETE_RKEY
	// when it frees it (as ours, releaseBuffers).
	kept := c.releaseBuffers()
	c.e.unreserve(c.memHeld - kept)
	c.memHeld = 0
	if c.reserved {
		c.reserved = false
		c.lg.unreserve()
	}
}
