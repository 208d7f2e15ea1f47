// Sending: bytes RDMA-WRITten into the peer's RMBE at the producer cursor, split at
// the ring's end, and the CDC that moves the cursor, posted behind them in one
// chain. RFC 7609 §4.2, after smc_tx.

package smcr

import (
	"net"

	"github.com/smcr-io/smcr/rmb"
)

// smcWrite is Write over SMC-R. The send buffer mirrors the peer's RMBE: a byte
// goes to the same offset in both, so a region is reused only after the peer has
// consumed it, which implies the WRITE that filled it has landed.
func (c *Conn) smcWrite(p []byte, urgent bool) (int, error) {
	c.txMu.Lock()
	defer c.txMu.Unlock()
	// Closed while we copied and posted (txBusy): the release waited for us.
	var release bool
	defer func() {
		if release {
			c.maybeRelease()
		}
	}()
	total := 0
	for total < len(p) || len(p) == 0 {
		if isClosed(c.writeDL.wait()) {
			return total, errWriteTimeout
		}
		// cdcMu first: a chunk's count, CDC and post happen under it (sendChunk).
		c.cdcMu.Lock()
		c.mu.Lock()
		if c.awaitMoveLocked() {
			continue
		}
		// Before the continuation's branch: the same errors over TCP.
		err := c.writeErrLocked()
		if err != nil {
			c.mu.Unlock()
			c.cdcMu.Unlock()
			return total, err
		}
		if c.cont.fo {
			c.mu.Unlock()
			c.cdcMu.Unlock()
			select {
			case <-c.cont.foDone:
			case <-c.writeDL.wait():
				continue
			case <-c.done:
				continue
			}
			if !c.continued() {
				return total, c.linkError(ErrLinkDown)
			}
			if urgent { // p is the urgent byte alone (WriteUrgent)
				if err := writeUrgentTCP(c.tcp, p[0]); err != nil {
					return total, err
				}
				return len(p), nil
			}
			n, err := c.tcp.Write(p[total:])
			c.cs.tx.Add(uint64(n))
			c.e.st.fbTx.Add(uint64(n))
			return total + n, err
		}
		if len(p) == 0 {
			c.mu.Unlock()
			c.cdcMu.Unlock()
			return 0, nil
		}
		free := c.tx.Free()
		if free == 0 {
			c.cs.blocked.Add(1)
			c.e.st.writeBlocked.Add(1)
			c.awaitTxUnlocking()
			continue
		}
		n := uint32(min(len(p)-total, int(free)))
		var w [2]rmb.Span
		ws := rmb.AppendSpans(w[:0], c.tx.Pos(), n, c.tx.Size())
		c.txBusy = true // a Close, move or continuation waits until this chunk is posted
		lnk := c.lnk
		c.mu.Unlock()
		if h := testHookCopy.Load(); h != nil {
			(*h)(c, false)
		}

		buf := c.snd.Bytes()
		k := total
		for _, s := range ws {
			k += copy(buf[s.Off:s.End()], p[k:])
		}
		last := total+int(n) == len(p)
		err = c.sendChunk(lnk, ws, n, urgent && last, !last)
		c.cdcMu.Unlock()
		total += int(n)
		c.cs.tx.Add(uint64(n))
		c.e.st.txBytes.Add(uint64(n))
		c.mu.Lock()
		c.txBusy = false
		release = c.closing.appClosed
		c.mu.Unlock()
		if err != nil {
			// The bytes are in the producer cursor: a move to another link or the
			// continuation resends them if the peer lacks them.
			c.awaitLinkDown(lnk)
		}
	}
	return total, nil
}

// awaitMoveLocked reports whether the connection is moving to another link
// (multilink.go), with cdcMu and c.mu held; if so it has unlocked both and
// waited for the move's end, the write deadline or Close, and the writer
// starts over.
func (c *Conn) awaitMoveLocked() bool {
	if !c.move.moving || c.cont.fo || c.err != nil {
		return false
	}
	c.awaitTxUnlocking()
	return true
}

// awaitTxUnlocking unlocks c.mu and cdcMu, then waits for a writer's wake,
// the write deadline or Close.
func (c *Conn) awaitTxUnlocking() {
	c.mu.Unlock()
	c.cdcMu.Unlock()
	select {
	case <-c.txWake:
	case <-c.writeDL.wait():
	case <-c.done:
	}
}

// writeErrLocked is why nothing more can be written: the terminal error, our
// Close, or either end's close of our direction; nil if bytes may go.
func (c *Conn) writeErrLocked() error {
	switch {
	case c.err != nil:
		return c.err
	case c.closing.appClosed:
		return net.ErrClosed
	case c.closing.localDone || c.closing.peerClosed:
		return ErrWriteClosed
	}
	return nil
}

// sendChunk counts the n bytes of the send buffer in spans ws (rmb.AppendSpans)
// in the producer cursor and posts their WRITEs and the CDC that
// announces them as one chain (postData): RC executes it in order, so the peer
// holds the bytes when it takes the CDC, and the whole goes in one post. The
// caller holds cdcMu, so no other CDC of c's announces the bytes first, and
// keeps txBusy until the post, so a Close, move or continuation finds the
// chunk posted. urgent says the chunk ends with an urgent byte; more, that the
// Write has more to send (the CDC says so when the ring is full).
func (c *Conn) sendChunk(lnk *link, ws []rmb.Span, n uint32, urgent, more bool) error {
	if h := testHookCursors.Load(); h != nil {
		(*h)(c)
	}
	c.mu.Lock()
	c.tx.Produce(n) // cannot fail: n was free, and only this writer produces
	if urgent {
		c.txUrgent = true // on whichever CDC first announces it (nextCDCLocked)
		c.txUrgentEnd = c.tx.Pos()
	}
	var flags rmb.ProdFlags
	if c.tx.Free() == 0 && more {
		flags = rmb.FlagWriteBlocked
	}
	m, ok, cdcErr := c.nextCDCLocked(flags, cdcCursors)
	prod := c.tx.Pos()
	c.mu.Unlock()
	cdc := &m
	if !ok {
		cdc = nil // the WRITEs go alone: cdcErr says why
	}
	if err := lnk.postData(c, ws, cdc, prod); err != nil {
		return err
	}
	return cdcErr
}

// linkError returns the connection's terminal error after a failed post.
func (c *Conn) linkError(err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	return err
}

// awaitLinkDown waits, after a failed post on l, until the link group has told the
// connection (moving to another link, continuation started or error set): the
// link's context ends only after every connection's linkDown ran. A continuation
// on a link that stays up (the peer declined after our Confirm) ends with foDone.
func (c *Conn) awaitLinkDown(l *link) {
	select {
	case <-l.ctx.Done():
	case <-c.cont.foDone:
	case <-c.done:
	}
}
