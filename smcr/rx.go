// Receiving: bytes read from our RMBE between the consumer and producer cursors;
// the consumer cursor goes back to the peer once 10% of the RMBE is free again.
// RFC 7609 §4.2 and §4.5 (window updates), after smc_rx.

package smcr

import (
	"errors"
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"time"
)

// minReadSpin is the least a reader drives its link once its spins keep coming
// up empty.
const minReadSpin = time.Microsecond

// drive handles l's completions from the reading goroutine for a while, instead
// of sleeping until the poller hands over the CDC that brings our bytes: between
// two goroutines on two CPUs that hand-off is most of a small message's latency.
// It reports whether c was woken meanwhile (its wake is taken); it returns false
// at once when another reader drives l.
//
// The budget adapts (spinBudget), so a reader whose bytes come in well-spaced
// bursts (smcrd's relays, say) stops burning ReadSpin of CPU per Read, which on
// busy CPUs delays the very processes it waits for.
func (c *Conn) drive(l *link) bool {
	if !l.driving.CompareAndSwap(false, true) {
		return false
	}
	defer l.leaveDriving()
	bound := c.e.settings().ReadSpin
	budget := c.spin.next(bound)
	woken := c.driveFor(l, budget)
	c.spin.done(budget, bound, woken)
	return woken
}

// spinBudget is an adaptive busy-poll budget, as shm's CQ.Wait and an adaptive
// mutex spin: a spin that found what it waited for doubles the next (up to the
// bound), one that gave up halves it (down to minReadSpin), and every 32nd spins
// the whole bound, a probe that finds out when the awaited thing starts coming
// quickly again.
type spinBudget struct {
	cur   atomic.Int64 // a time.Duration
	spins atomic.Uint32
}

// next is the budget of the next spin under bound.
func (s *spinBudget) next(bound time.Duration) time.Duration {
	b := min(time.Duration(s.cur.Load()), bound)
	if s.spins.Add(1)%32 == 1 || b <= 0 {
		return bound
	}
	return b
}

// done adapts the budget to how a spin of budget ended.
func (s *spinBudget) done(budget, bound time.Duration, found bool) {
	if found {
		s.cur.Store(int64(min(2*budget, bound)))
	} else {
		s.cur.Store(int64(max(budget/2, minReadSpin)))
	}
}

// driveFor is drive's loop, for up to spin.
func (c *Conn) driveFor(l *link, spin time.Duration) bool {
	var start time.Time // read late: most drives end within the first rounds
	for i := 1; ; i++ {
		select {
		case <-c.rxWake:
			return true
		default:
		}
		if l.down.Load() {
			return false
		}
		if l.pollMu.TryLock() {
			var err error
			if !l.pollOff {
				var n int
				n, err = l.handle(c.driveWCs[:])
				l.driven.Add(uint64(n))
			}
			l.pollMu.Unlock()
			if err != nil {
				return false // the poller finds it too, and fails the link
			}
		}
		if i%16 == 0 {
			if start.IsZero() {
				start = realNow()
			} else if realNow().Sub(start) > spin {
				return false
			}
			// Let the goroutine a completion woke run (a writer whose space
			// came back, on this P's next slot).
			runtime.Gosched()
		}
	}
}

// smcRead is ReadMarked over SMC-R.
func (c *Conn) smcRead(p []byte) (int, bool, error) {
	c.rxMu.Lock()
	defer c.rxMu.Unlock()
	for {
		if isClosed(c.readDL.wait()) {
			return 0, false, errReadTimeout
		}
		c.mu.Lock()
		avail, urgent := c.untilMarkLocked(uint64(c.rx.Readable()))
		if avail > 0 && len(p) > 0 && !c.closing.appClosed {
			first, second := c.rx.Spans(uint32(min(avail, uint64(len(p)))))
			c.rxBusy = true // the RMB stays ours until the copy ends (maybeRelease)
			c.mu.Unlock()
			if h := testHookCopy.Load(); h != nil {
				(*h)(c, true)
			}
			// The peer does not write the readable bytes again until we
			// consume them.
			buf := c.rmb.Bytes()
			n := copy(p, buf[first.Off:first.End()])
			n += copy(p[n:], buf[second.Off:second.End()])
			c.mu.Lock()
			c.rxBusy = false
			c.rx.Consume(uint32(n)) // cannot fail: they were readable, and only this reader consumes
			c.passMarkLocked()
			// Taking an urgent byte reports the cursor at once, as smc_rx does:
			// a Linux writer sends nothing after urgent data until the peer has
			// confirmed consuming all of it (urg_tx_pend).
			update := c.rx.UpdateDue(urgent)
			closed := c.closing.appClosed
			c.mu.Unlock()
			if closed {
				c.maybeRelease() // closed during the copy: the release waited for us
			} else if update {
				c.sendCursors(0, cdcUpdate)
			}
			c.cs.rx.Add(uint64(n))
			c.e.st.rxBytes.Add(uint64(n))
			return n, urgent, nil
		}
		if c.cont.fo && !c.closing.appClosed && avail == 0 && c.cont.foReady {
			shed := c.rmb != nil
			c.mu.Unlock()
			if shed {
				c.shedBuffers() // read empty: the RMB serves no more
			}
			n, urgent, err := c.readMarkedTCP(c.tcp, p)
			c.cs.rx.Add(uint64(n))
			c.e.st.fbRx.Add(uint64(n))
			return n, urgent, err
		}
		if c.cont.fo && !c.closing.appClosed && !isClosed(c.cont.foDone) {
			c.mu.Unlock()
			select {
			case <-c.cont.foDone:
			case <-c.readDL.wait():
			case <-c.done:
			}
			continue
		}
		var err error
		switch {
		case c.closing.appClosed:
			err = net.ErrClosed
		case len(p) == 0:
			// As TCPConn's: not EOF or the error while bytes wait unread.
			c.mu.Unlock()
			return 0, false, nil
		default:
			err = c.readEndLocked()
		}
		lnk := c.lnk
		c.mu.Unlock()
		if err != nil {
			return 0, false, err
		}
		if lnk != nil && c.e.settings().ReadSpin > 0 && c.drive(lnk) {
			continue
		}
		select {
		case <-c.rxWake:
		case <-c.readDL.wait():
		case <-c.done:
		}
	}
}

// readEndLocked is what a Read returns once the readable bytes are taken: the
// terminal error, io.EOF, or nil while more may come.
func (c *Conn) readEndLocked() error {
	switch {
	case c.err != nil && !(c.closing.peerDone && errors.Is(c.err, ErrLinkDown)):
		// The first cause: ErrReset when the peer aborted first, not when
		// its abort answers ours (a protocol error we found, say).
		return c.err
	case c.closing.peerDone:
		// Its sending-done announced its last byte, and we read it: the
		// stream is whole though the link, or a continuation, failed
		// after (as TCP's read after a FIN, and Linux's SOCK_DONE).
		return io.EOF
	}
	return nil
}
