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
func (c *Conn) smcWrite(p []byte) (int, error) {
	c.txMu.Lock()
	defer c.txMu.Unlock()
	total := 0
	for total < len(p) || len(p) == 0 {
		if isClosed(c.writeDL.wait()) {
			return total, timeoutError{}
		}
		c.mu.Lock()
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
		c.mu.Unlock()

		buf := c.snd.Bytes()
		first := min(n, c.peerSize-off)
		copy(buf[off:off+first], p[total:])
		if err := c.lnk.postWrite(c, int(off), int(first)); err != nil {
			return total, c.linkError(err)
		}
		if first < n {
			copy(buf[:n-first], p[total+int(first):])
			if err := c.lnk.postWrite(c, 0, int(n-first)); err != nil {
				return total, c.linkError(err)
			}
		}
		c.mu.Lock()
		c.txProd += n
		var flags rmb.ProdFlags
		if c.txProd-c.txCons == c.peerSize && total+int(n) < len(p) {
			flags = rmb.FlagWriteBlocked
		}
		c.mu.Unlock()
		if err := c.sendCDC(flags); err != nil {
			return total, c.linkError(err)
		}
		total += int(n)
		c.cs.tx.Add(n)
		c.e.st.txBytes.Add(n)
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
