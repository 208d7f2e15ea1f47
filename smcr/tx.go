// Sending: bytes RDMA-WRITten into the peer's RMBE at the producer cursor, split at
// the ring's end, then a CDC that moves the cursor. RFC 7609 §4.2, after smc_tx.

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
		c.mu.Lock()
		if c.moving && !c.fo && c.err == nil {
			c.mu.Unlock()
			select { // the connection moves to another link (multilink.go)
			case <-c.txWake:
			case <-c.writeDL.wait():
			case <-c.done:
			}
			continue
		}
		// Before the continuation's branch: the same errors over TCP.
		switch {
		case c.err != nil:
			err := c.err
			c.mu.Unlock()
			return total, err
		case c.appClosed:
			c.mu.Unlock()
			return total, net.ErrClosed
		case c.localDone || c.peerClosed:
			c.mu.Unlock()
			return total, ErrWriteClosed
		}
		if c.fo {
			c.mu.Unlock()
			select {
			case <-c.foDone:
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
			return 0, nil
		}
		free := c.peerSize - (c.txProd - c.txCons)
		if free == 0 {
			c.cs.blocked.Add(1)
			c.e.st.writeBlocked.Add(1)
			c.mu.Unlock()
			select {
			case <-c.txWake:
			case <-c.writeDL.wait():
			case <-c.done:
			}
			continue
		}
		n := min(uint64(len(p)-total), free)
		off := c.txProd % c.peerSize
		c.txBusy = true // a continuation must wait until txProd counts this chunk
		lnk := c.lnk
		c.mu.Unlock()
		if h := testHookCopy.Load(); h != nil {
			(*h)(c, false)
		}

		buf := c.snd.Bytes()
		first := min(n, c.peerSize-off)
		copy(buf[off:off+first], p[total:])
		if err := lnk.postWrite(c, int(off), int(first)); err != nil {
			c.mu.Lock()
			c.txBusy = false
			release = c.appClosed
			c.mu.Unlock()
			c.awaitLinkDown(lnk)
			continue // the bytes were not counted: the continuation or the error path
		}
		if first < n {
			copy(buf[:n-first], p[total+int(first):])
			if err := lnk.postWrite(c, 0, int(n-first)); err != nil {
				// The first part may have landed: count only it, the resync sorts it out.
				c.mu.Lock()
				c.txProd += first
				c.txBusy = false
				release = c.appClosed
				c.mu.Unlock()
				total += int(first)
				c.awaitLinkDown(lnk)
				continue
			}
		}
		c.mu.Lock()
		c.txProd += n
		c.txBusy = false
		release = c.appClosed
		if urgent && total+int(n) == len(p) {
			c.txUrgent = true // on whichever CDC first announces it (sendCDC)
			c.txUrgentEnd = c.txProd
		}
		var flags rmb.ProdFlags
		if c.txProd-c.txCons == c.peerSize && total+int(n) < len(p) {
			flags = rmb.FlagWriteBlocked
		}
		c.mu.Unlock()
		total += int(n)
		c.cs.tx.Add(n)
		c.e.st.txBytes.Add(n)
		if release {
			// Closed meanwhile: Close waited for this chunk, and its closing CDC
			// announces it. Ours would follow that one, to a peer that may have
			// let the connection go.
			continue
		}
		if err := c.sendCursors(flags, cdcCursors); err != nil {
			// The bytes are in txProd: the resync resends them if the peer lacks them.
			c.awaitLinkDown(lnk)
		}
	}
	return total, nil
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
	case <-c.foDone:
	case <-c.done:
	}
}
