// CDC: the connection data control message that moves cursors and connection-state
// flags, its validation against the rings, and the control messages sent off the
// poller. RFC 7609 §4.2 (CDC), after Linux's smc_cdc.

package smcr

import (
	"fmt"
	"sync/atomic"

	"github.com/smcr-io/smcr/rmb"
)

// ctlBits are control messages a connection owes the peer, sent by the link worker
// because the poller must never block on a send slot.
type ctlBits uint8

const (
	ctlUpdate  ctlBits = 1 << iota // consumer cursor update the peer asked for
	ctlAbort                       // abnormal close
	ctlRelease                     // free buffers (last WRITE completed or peer closed)
	ctlQueued  ctlBits = 0x80
)

// onCDC applies a CDC from the peer; it runs in the link's poller and never blocks.
// It returns how many bytes the CDC's producer cursor announces as newly written.
func (c *Conn) onCDC(m *rmb.CDC) (produced uint64) {
	c.mu.Lock()
	if c.closing.released {
		c.mu.Unlock()
		return
	}
	c.cs.cdcRecv.Add(1)
	if c.cont.fo {
		c.mu.Unlock()
		return // cursors are frozen at what the resync reported
	}
	if h := testHookCDC.Load(); h != nil {
		cp := *m // a copy: m itself must not escape (no allocation per CDC)
		(*h)(c, &cp)
		*m = cp // what a test changed is what is applied
	}
	if m.Flags&rmb.FlagFailoverValidation != 0 {
		// The peer moved us to another link. Its validation names its last
		// completed CDC and carries no cursors to take (Linux's are zero; a
		// normal CDC follows). Linux aborts when that number is one it never
		// saw: ours need not, as every CDC repeats all cursors and state, so
		// the next one brings what a lost one said. Answer with our cursors,
		// in case a consumer update was lost with the old link.
		if c.rxSeqSet && rmb.SeqBefore(c.rxSeq, m.Seq) {
			c.e.log.Debug("smcr: failover validation names a CDC not seen", "conn", c.id, "seq", m.Seq, "last", c.rxSeq)
		}
		c.queueCtlLocked(ctlUpdate)
		c.mu.Unlock()
		return
	}
	if c.rxSeqSet && rmb.SeqBefore(m.Seq, c.rxSeq) {
		// Overtaken by a newer one (over another link after a failover): all it
		// says, the newer one said again. smc_cdc_rx_handler drops it too.
		c.e.st.cdcStale.Add(1)
		c.mu.Unlock()
		return
	}
	c.rxSeq, c.rxSeqSet = m.Seq, true
	before := c.rx.PeerProducerPos()
	err := c.applyCursors(m)
	produced = c.rx.PeerProducerPos() - before
	if produced > 0 && c.rx.Full() {
		c.e.st.rxFull.Add(1)
	}
	if err != nil {
		c.e.st.protoErrors.Add(1)
		if c.err == nil {
			// Once: a peer may send many more before the application
			// closes the connection; they are counted.
			c.e.log.Warn("smcr: peer broke the protocol, aborting connection", "conn", c.id, "err", err)
		}
		c.abortLocked(fmt.Errorf("%w: %v", ErrProtocol, err))
		c.mu.Unlock()
		c.wakeApp()
		return
	}
	if produced > 0 && m.Flags&rmb.FlagUrgentPresent != 0 {
		// The last byte the CDC announces is urgent (smc_cdc_handle_urg_data_arrival).
		c.rxUrgentAt, c.rxUrgent = c.rx.PeerProducerPos()-1, true
	}
	if m.Flags&(rmb.FlagUpdateRequested|rmb.FlagFailoverValidation) != 0 {
		c.queueCtlLocked(ctlUpdate)
	}
	if !c.closing.peerDone && !c.cont.smcx && m.State&(rmb.StateClosed|rmb.StateSendingDone) != 0 &&
		m.State&rmb.StateAbnormalClose == 0 {
		c.closing.peerLate = c.rx.PeerProducerPos()-c.rx.ConfirmedPos() >= uint64(c.rx.Size()) // lateWrites
	}
	if m.State&rmb.StateAbnormalClose != 0 && !c.closing.peerAbort {
		c.closing.abortEarly = !c.closing.peerDone
		c.closing.peerAbort, c.closing.peerClosed, c.closing.peerDone = true, true, true
		c.e.st.aborts.Add(1)
		if c.err == nil {
			c.err = ErrReset
		}
		if !c.closing.localTerm {
			c.queueCtlLocked(ctlAbort) // answer, so the peer may free its buffers
		}
	}
	if m.State&rmb.StateClosed != 0 {
		c.closing.peerClosed, c.closing.peerDone = true, true
	}
	if m.State&rmb.StateSendingDone != 0 {
		c.closing.peerDone = true
	}
	c.updateState("cdc")
	c.queueReleaseIfDueLocked()
	c.mu.Unlock()
	c.wakeApp()
	return produced
}

// lateWrites: Linux's close (smc_close_active, smc_close_shutdown_write) waits
// at most 2 s for its send buffer to drain, then sends closed or sending-done
// with bytes still unsent, and writes them later, whenever one of our CDCs gives
// it room (smc_cdc_msg_recv_action does not look at its own close). Bytes can be
// unsent only if our RMBE was full in its view, so a standard peer whose close
// came then (peerLate) may write after it: those bytes are taken as any others,
// where from our own peers they are a protocol error. Once we have given such a
// peer room after its close (peerLateRoom), a WRITE of its may still be on its
// way as we release, and the RMB must outlive the release (releaseBuffers).

// applyCursors checks both cursors before taking either (rmb's checks: the
// producer cursor within the room we reported, the consumer cursor within what
// we wrote; older ones are stale and ignored).
func (c *Conn) applyCursors(m *rmb.CDC) error {
	np, stale, err := c.rx.CheckPeerProducer(m.Prod)
	if err != nil {
		return err
	}
	// The peer's close, or our own peers' sending-done, announced its last
	// byte: a Read may have returned EOF already, and must not return data
	// after it. A standard peer's sending-done is not checked: Linux's
	// shutdown, as its close, may leave bytes unsent to write later
	// (lateWrites), and peerLate cannot tell every such case.
	last := c.closing.peerClosed || c.cont.smcx && c.closing.peerDone
	if !stale && last && np > c.rx.PeerProducerPos() && !c.closing.peerLate {
		return fmt.Errorf("data after its last byte")
	}
	var nc uint64
	cstale := true
	if c.tx.Size() > 0 { // else our Confirm is not out: the peer has nothing of ours
		if nc, cstale, err = c.tx.CheckPeerConsumer(m.Cons); err != nil {
			return err
		}
	}
	if !stale {
		c.rx.SetPeerProducer(np)
	}
	if !cstale {
		c.tx.SetPeerConsumer(nc)
	}
	return nil
}

// queueCtlLocked asks the link worker to send control messages for c.
func (c *Conn) queueCtlLocked(b ctlBits) {
	c.ctlPending |= b
	if c.ctlPending&ctlQueued != 0 || c.st == stateInit || c.lnk == nil {
		return // already queued, or activate will queue it
	}
	select {
	case c.lnk.ctl <- c:
		c.ctlPending |= ctlQueued
	default:
		// Cannot happen with one queue entry per connection; the next CDC retries.
	}
}

// runCtl sends what queueCtlLocked asked for; it runs in the worker of link l.
func (c *Conn) runCtl(l *link) {
	c.mu.Lock()
	b := c.ctlPending
	c.ctlPending = 0
	c.mu.Unlock()
	if b&ctlAbort != 0 {
		c.mu.Lock()
		// No WRITE after the abort, whose peer drops its RMB: wait for a
		// writer posting, and for a move to another link, but not for a move
		// off l. That one waits for this worker to end (linkFailed: a wait
		// here deadlocked both, TestCloseDuringMove hung in CI), and sends
		// the abort again behind its resend (moveTo).
		c.awaitPostersLocked(c.lnk != l)
		c.closing.localTerm, c.closing.localAbort = true, true
		c.mu.Unlock()
		c.sendCDC(0)
	} else if b&ctlUpdate != 0 {
		c.sendCursors(0, cdcUpdate)
	}
	if b&(ctlRelease|ctlAbort) != 0 {
		// Off the worker: a release closes the TCP connection and deregisters
		// or pools buffers, and a worker serving every connection of the link
		// fell behind under churn, holding closed connections' slots of the
		// group's 255 (TestLinkGroupReuse under -race).
		go c.maybeRelease()
	}
}

// sendCDC sends our cursors and connection state with flags. CDCs go out in the
// order of their numbers: writer, reader and link worker all send them.
//
// A failover validation (flags has FlagFailoverValidation) carries the number of
// our last CDC that completed, not a new one, as Linux's does: the peer checks it
// has seen that number, and drops no later CDC for it.
func (c *Conn) sendCDC(flags rmb.ProdFlags) error { return c.sendCDCKind(flags, cdcState) }

// cdcKind says what a CDC is for, which decides whether it still goes once our
// closing or abnormal-close CDC is out (or going): that one carries the cursors,
// which no longer move, and a CDC after it could reach a peer that has let the
// connection go. A move to another link sends the closing state again (moveTo).
type cdcKind uint8

const (
	cdcState   cdcKind = iota // a change of connection state, a failover validation: always
	cdcCursors                // a Write's producer cursor: not after the closing CDC
	cdcUpdate                 // a consumer-cursor update (Read's, or asked for): nor, and counted
)

// sendCursors sends a CDC of kind cdcCursors or cdcUpdate. The closing CDC is
// checked for under cdcMu, so a Close finds this CDC sent or sends its own after.
func (c *Conn) sendCursors(flags rmb.ProdFlags, kind cdcKind) error {
	if h := testHookCursors.Load(); h != nil {
		(*h)(c)
	}
	return c.sendCDCKind(flags, kind)
}

// sendCDCKind builds and sends the CDC under cdcMu, which keeps numbers in order
// and holds CDCs back while a move resends (moveTo).
func (c *Conn) sendCDCKind(flags rmb.ProdFlags, kind cdcKind) error {
	c.cdcMu.Lock()
	defer c.cdcMu.Unlock()
	return c.sendCDCHeld(flags, kind)
}

// sendCDCHeld is sendCDCKind with cdcMu held.
func (c *Conn) sendCDCHeld(flags rmb.ProdFlags, kind cdcKind) error {
	c.mu.Lock()
	m, ok, err := c.nextCDCLocked(flags, kind)
	lnk, prod := c.lnk, c.tx.Pos()
	c.mu.Unlock()
	if !ok {
		return err
	}
	return lnk.sendConnCDC(c, prod, &m)
}

// nextCDCLocked builds our next CDC with flags, numbered; ok is false when none
// of kind goes (with ErrLinkDown when the link cannot carry one). The caller
// holds cdcMu and c.mu, and sends it.
func (c *Conn) nextCDCLocked(flags rmb.ProdFlags, kind cdcKind) (m rmb.CDC, ok bool, err error) {
	if c.tx.Size() == 0 || c.closing.released || c.lnkErr || c.cont.fo {
		return m, false, ErrLinkDown
	}
	if kind != cdcState && c.closing.localTerm {
		return m, false, nil
	}
	if kind == cdcUpdate {
		c.cs.updates.Add(1)
	}
	seq := uint16(c.move.seqAcked.Load())
	if flags&rmb.FlagFailoverValidation == 0 {
		c.seq++
		seq = c.seq
		if c.txUrgent {
			flags |= rmb.FlagUrgentPresent
			c.txUrgent = false
		}
	}
	if c.closing.peerLate && c.rx.Unconfirmed() > 0 {
		c.closing.peerLateRoom = true // lateWrites
	}
	m = rmb.CDC{Seq: seq, Token: c.peerToken, Prod: c.tx.Cursor(), Cons: c.rx.Report(), Flags: flags}
	if c.closing.localDone {
		m.State |= rmb.StateSendingDone
	}
	if c.closing.localTerm && !c.closing.localAbort {
		m.State |= rmb.StateClosed
	}
	if c.closing.localAbort {
		m.State |= rmb.StateAbnormalClose
	}
	c.cs.cdcSent.Add(1)
	return m, true, nil
}

// testHookCursors lets tests act before sendCursors decides, outside every lock,
// and before a Write counts a chunk (sendChunk), with cdcMu held and txBusy set:
// a Close there waits for the chunk.
var testHookCursors atomic.Pointer[func(*Conn)]

// testHookCDC sees each CDC for a live connection before it is applied, under
// c.mu, and may change it.
var testHookCDC atomic.Pointer[func(*Conn, *rmb.CDC)]
