// Connection setup beside CLC: the RMB and send buffer taken within max_memory
// (a server short of memory declines before its Accept), the peer's RMB noted
// from its Accept or Confirm, the connection made usable once CLC ends, and a
// setup that did not end in SMC-R undone. RFC 7609 §3.5 (connection setup),
// after Linux's smc_conn_create and smc_buf_create.

package smcr

import (
	"errors"
	"fmt"

	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr/clc"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// abandonSetup undoes a handshake that did not end in SMC-R.
func (c *Conn) abandonSetup() {
	c.mu.Lock()
	if c.closing.released {
		c.mu.Unlock()
		return
	}
	c.closing.released = true
	c.mu.Unlock()
	if c.lg != nil && c.lg.firstConn == c {
		c.lg.setReady(errors.New("smcr: first contact failed"))
	}
	if c.acceptSent && c.lg != nil && (c.lg.firstConn != c || c.lg.readyErr == nil) {
		// A Decline after our Accept: the client may have sent its Confirm and
		// begun writing before it reads the Decline. Its writes must land (a
		// write to a freed RMB fails the whole link) until it has stopped: it
		// continues over TCP from its first byte (declinedAfterConfirm). So
		// too on a first contact that failed after the group was ready
		// (readyErr nil: its link is up, setReady above changed nothing).
		c.e.freeLater(c)
		return
	}
	c.freeResources()
}

// linkFailed reports whether the link failed during setup.
func (c *Conn) linkFailed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lnkErr
}

// activate makes a set-up connection usable.
func (c *Conn) activate() {
	c.mu.Lock()
	c.mode = ModeSMCR // under c.mu for Engine.Conns, as the fields CLC set before
	c.activated = true
	c.updateState("clc done")
	pending := c.ctlPending
	c.ctlPending = 0
	if pending != 0 {
		c.queueCtlLocked(pending)
	}
	if c.lnkErr { // the link failed during setup (linkDown left it to us)
		if c.canContinue() {
			c.startFailoverLocked()
		} else if c.err == nil {
			c.err = fmt.Errorf("%w: during setup", ErrLinkDown)
		}
	}
	c.mu.Unlock()
	c.e.st.smc.Add(1)
	if c.v2 != nil {
		c.e.st.smcV2.Add(1)
	}
	if !c.client {
		c.e.st.srvSMC.Add(1)
	}
	if c.reusedLG {
		c.e.st.reused.Add(1) // counted once it is SMC-R: a setup may still fall back
	}
	c.e.st.active.Add(1)
	c.e.st.rxBuf.observe(uint64(c.rx.Size()))
	c.e.st.txBuf.observe(uint64(c.tx.Size()))
	if c.cont.smcx {
		c.cont.watchDone = make(chan struct{})
		go c.watchTCP()
	}
	c.e.log.Debug("smcr: connection up", "conn", c.id, "lg", c.lg.id, "token", c.token, "peer_token", c.peerToken)
}

// allocRMB takes our RMBE, pooled or new, and an alert token, and holds
// max_memory for the send buffer beside it (sndHeld, which setPeer settles):
// send bytes, the peer's RMBE or, on the server, which learns it only from the
// Confirm, the size we are configured with (the client is likely configured as
// we are). A server short of memory must decline here, before its Accept:
// after the client's Confirm a Decline comes too late, the client already
// writes into our RMBE. A pooled send buffer of that size needs no new memory.
func (c *Conn) allocRMB(send int) (DeclineCode, error) {
	want := c.e.settings().RMBSize
	// A pooled send buffer of the size needs no new memory: setPeer takes it,
	// unless another setup does first.
	b, size, share, ok := c.rmbFor(want, send, !c.cursors && c.lg.pooledHas(false, uint64(send), c.lnk))
	if !ok {
		return clc.DeclineNoMemory, fmt.Errorf("rmb of %d bytes (or at least %d) and a send buffer of %d exceed max memory %d",
			want, minRMB, send, c.e.settings().MaxMemory)
	}
	c.memHeld += int64(share)
	c.sndHeld = int64(share)
	if size < want {
		c.e.st.rxDowngrades.Add(1)
		c.e.log.Debug("smcr: rmb downgraded for lack of memory", "conn", c.id, "want", want, "size", size)
	}
	if b != nil {
		c.adopt(b)
		c.rmbPooled = true
		c.e.st.rxReuses.Add(1)
	} else {
		c.memHeld += int64(size)
		mr, err := c.lnk.pd.AllocMR(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		if err != nil {
			return clc.DeclineInternalRegBuf, fmt.Errorf("alloc rmb: %w", err)
		}
		c.rmb, c.rx, c.move.rmbHome = mr, rmb.NewConsumer(uint32(size)), c.lnk
		c.mu.Lock()
		c.move.rmbOn[c.lnk.ix] = mr
		c.move.regLink[c.lnk.ix] = c.lnk
		c.mu.Unlock()
		c.lnk.holdPD()
	}
	c.token = c.e.newToken(c)
	if !c.lg.addConn(c) {
		return clc.DeclineNoActiveLink, errors.New("link group ended during setup")
	}
	return 0, nil
}

// rmbFor finds an RMB of want bytes with send bytes of max_memory beside it,
// none if sendPooled (a pooled send buffer will do): pooled, or new memory.
// When they do not fit, and freeing the pools would not make room either, it
// takes a smaller RMB, halving down to minRMB, as Linux's smc_buf_create tries
// smaller buffers (a downgrade): a pooled one first. It reserves the send
// share, and size for a new RMB (nil), and returns the share.
func (c *Conn) rmbFor(want, send int, sendPooled bool) (*pooledBuf, int, int, bool) {
	share := send
	if sendPooled {
		share = 0
	}
	for size := want; size >= minRMB; size /= 2 {
		if b := c.takePooled(true, uint64(size)); b != nil {
			if c.e.reserve(int64(share)) {
				return b, size, share, true
			}
			if !c.lg.keep(b) {
				c.lg.free(b)
			}
		}
		if c.e.reserve(int64(size + share)) {
			return nil, size, share, true
		}
		// Idle pools give way before a connection gets less buffer; the
		// pooled send buffer goes with them.
		if c.e.fitsWithoutPools(int64(size + send)) {
			c.e.trimPools()
			share = send
			if c.e.reserve(int64(size + share)) {
				return nil, size, share, true
			}
		}
	}
	return nil, 0, 0, false
}

// setPeer takes the peer's RMBE from its Accept/Confirm and makes our send buffer.
func (c *Conn) setPeer(li *clc.LinkInfo) (DeclineCode, error) {
	size := clc.RMBESize(li.SizeCode)
	if b := c.takePooled(false, uint64(size)); b != nil {
		if held := c.sndHeld; held > 0 {
			c.sndHeld = 0
			c.memHeld -= held
			c.e.unreserve(held) // the pooled buffer brings its own share
		}
		c.adopt(b)
		c.e.st.txReuses.Add(1)
		c.setPeerKey(li)
		return 0, nil
	}
	if held := c.sndHeld; held > 0 {
		// The hold allocRMB took: a surplus goes back, and what it lacks must
		// fit in max_memory like any buffer (refused on the server, the
		// connection falls back after the Confirm, as the client expects).
		if extra := int64(size) - held; extra > 0 && !c.e.reserveOrTrim(extra) {
			return clc.DeclineNoMemory, fmt.Errorf("send buffer of %d bytes for the peer's RMB exceeds max memory %d", size, c.e.settings().MaxMemory)
		} else if extra < 0 {
			c.e.unreserve(-extra)
		}
		c.sndHeld = 0
		c.memHeld -= held
	} else if !c.e.reserveOrTrim(int64(size)) {
		return clc.DeclineNoMemory, fmt.Errorf("send buffer of %d bytes exceeds max memory %d", size, c.e.settings().MaxMemory)
	}
	c.memHeld += int64(size)
	mr, err := c.lnk.pd.AllocMR(size, verbs.AccessLocalWrite)
	if err != nil && !c.linkFailed() {
		return clc.DeclineInternalRegBuf, fmt.Errorf("alloc send buffer: %w", err)
	}
	// (With the link gone during setup there may be no buffer: the connection
	// continues over TCP at once and never writes through the link. Nor does
	// it hold the buffer's memory, which nothing would give back before it
	// closed.)
	if err != nil {
		c.memHeld -= int64(size)
		c.e.unreserve(int64(size))
	}
	c.mu.Lock()
	if err == nil {
		c.snd, c.move.sndHome = mr, c.lnk
		c.move.sndOn[c.lnk.ix] = mr
		c.move.regLink[c.lnk.ix] = c.lnk
		c.lnk.holdPD()
	}
	c.mu.Unlock()
	c.setPeerKey(li)
	return 0, nil
}

// setPeerKey records the peer's RMB from its Accept/Confirm.
func (c *Conn) setPeerKey(li *clc.LinkInfo) {
	c.lg.notePeerRMB(c.lnk, li.RKey, li.RMBAddr)
	c.mu.Lock()
	c.tx = rmb.NewProducer(uint32(clc.RMBESize(li.SizeCode)))
	c.peerToken, c.peerRKey, c.peerAddr = li.AlertToken, li.RKey, li.RMBAddr
	c.move.peerKey = rkeyOn{c.lnk.num, li.RKey}
	c.mu.Unlock()
}
