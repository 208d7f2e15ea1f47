// Work requests and completions of a link: receive slots, send slots and credits,
// the completion poller that dispatches CDC by alert token and LLC to the link's
// worker (llc.go), and the posts of CDCs and RDMA WRITEs (postData).
// RFC 7609 §4.1 (RDMA work requests), after Linux's smc_wr.

package smcr

import (
	"context"
	"errors"
	"fmt"
	"runtime"

	"github.com/smcr-io/smcr/llc"
	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr/verbs"
)

const (
	slotSize   = 48  // LLC and CDC messages are 44 bytes, received into 48-byte slots
	nRecv      = 256 // receive slots per link: enough for 255 connections' CDCs in flight
	nSendSlots = 128
	maxSendWR  = 256
	// LLC messages have send slots of their own, beyond maxSendWR in the send
	// queue, half for responses and half for requests: under load the data slots
	// and credits go to CDCs and WRITEs of hundreds of connections, and an LLC
	// message queued behind them (a worker's answer behind every connection's
	// CONFIRM_RKEY request, too) came later than the peer's timeouts: the link
	// failed, or the server gave up waiting for a Confirm.
	nLLCSlots = 32
	llcQueue  = 4 * maxConnsPerLGR // each connection has at most one LLC request and one response in flight

	// maxInline is the inline space each QP asks for: CDC and LLC messages,
	// and RDMA WRITEs up to this size, go inline, as Linux sends them since
	// 5.19 ("send cdc msg inline", "rdma write inline if qp has sufficient
	// inline space"): the adapter takes the bytes from the work request
	// instead of reading them from memory, which saves small messages latency.
	maxInline = 64

	// recvSlotV2 is a version-2 link's receive slot: LLC messages of version 2
	// may be longer than 44 bytes (ADD_LINK with its rkeys: 72 + 16 per RMB of
	// the group), which Linux receives into a second, 8 KiB buffer of each
	// link group. One slot this size holds an ADD_LINK naming 59 RMBs; a
	// longer message completes in error and fails the link.
	recvSlotV2 = 1024

	tagSlot  = 1 // send work request IDs: tag<<56 | slot or alert token
	tagWrite = 2
)

func (l *link) postRecv(slot uint64) error {
	l.rsge[slot][0] = verbs.SGE{MR: l.recvMR, Offset: int(slot) * l.rslot, Length: l.rslot}
	l.rwr[slot] = verbs.RecvWR{ID: slot, SG: l.rsge[slot][:]}
	return l.qp.PostRecv(&l.rwr[slot])
}

// poll is the link's polling goroutine: it waits on the CQ when idle, and steps
// aside while a reader drives the link (Conn.drive).
func (l *link) poll() {
	defer l.wg.Done()
	wcs := make([]verbs.WorkCompletion, 32)
	for {
		// Once the link closes the poller takes every completion left, as it
		// always has: a CDC the peer saw complete must reach its connection.
		if l.driving.Load() && l.ctx.Err() == nil {
			select {
			case <-l.resume:
			case <-l.ctx.Done():
			}
			continue
		}
		l.pollMu.Lock()
		n, err := l.handle(wcs)
		l.pollMu.Unlock()
		if err != nil {
			l.fail(fmt.Errorf("poll cq: %w", err))
			return
		}
		if n == 0 {
			if err := l.cq.Wait(l.ctx); err != nil {
				if l.ctx.Err() == nil {
					l.fail(fmt.Errorf("wait cq: %w", err))
				}
				return
			}
			continue
		}
		// Let what the completions woke (a reader its CDC made runnable, in
		// this P's next slot) run now, not after another round of polling:
		// that wait would be part of every small message's round trip.
		runtime.Gosched()
	}
}

// handle polls up to len(wcs) completions and handles them; the caller holds
// pollMu.
func (l *link) handle(wcs []verbs.WorkCompletion) (int, error) {
	n, err := l.cq.Poll(wcs)
	if err != nil || n == 0 {
		return 0, err
	}
	l.polled.Add(uint64(n))
	for i := range wcs[:n] {
		l.complete(&wcs[i])
	}
	return n, nil
}

// leaveDriving ends a reader's turn at driving l and hands the completions back
// to the poller.
func (l *link) leaveDriving() {
	l.driving.Store(false)
	wake(l.resume)
}

func (l *link) complete(wc *verbs.WorkCompletion) {
	e := l.lg.e
	recv := wc.Opcode == verbs.WCRecv || wc.Opcode == verbs.WCRecvRDMAImm
	if wc.Status != verbs.WCSuccess {
		// A failed completion names no operation (an adapter leaves it
		// undefined): our IDs tell, receives untagged, sends tagged.
		recv = wc.ID>>56 == 0
	}
	switch {
	case recv:
		if wc.Status != verbs.WCSuccess {
			l.countErr(wc.Status)
			l.fail(fmt.Errorf("receive: %v", wc.Status))
			return
		}
		if wc.ID >= nRecv {
			l.fail(fmt.Errorf("receive completion for slot %d", wc.ID))
			return
		}
		l.received.Add(1)
		off := int(wc.ID) * l.rslot
		b := l.recvMR.Bytes()[off : off+llc.MsgLen]
		n := int(wc.ByteLen)
		done := false
		if l.rslot > slotSize && n >= llc.MsgLen && n <= l.rslot && llcV2(b) {
			// A version-2 LLC message: to version 1's form (llc.go), or
			// done with there.
			done = !l.fromV2(l.recvMR.Bytes()[off : off+n])
			n = llc.MsgLen
		}
		switch {
		case done:
		case n != llc.MsgLen:
			l.protoError()
			e.log.Debug("smcr: message of wrong length", "lg", l.lg.id, "len", wc.ByteLen)
		case b[0] == rmb.CDCType:
			l.onCDC(b)
		default:
			e.st.llcRecv.Add(1)
			if l.earlyLLC(b) {
				break
			}
			select {
			case l.llcIn <- [llc.MsgLen]byte(b):
			default:
				// The peer floods LLC faster than we answer: a protocol violation.
				l.protoError()
				l.fail(errors.New("llc queue overflow"))
				return
			}
		}
		if err := l.postRecv(wc.ID); err != nil {
			l.fail(fmt.Errorf("post receive: %w", err))
		}
	default:
		tag := wc.ID >> 56
		switch tag {
		case tagSlot:
			s := uint16(wc.ID)
			if s >= nSendSlots {
				l.llcPool(s) <- s
				break
			}
			if c := l.slotConn[s]; c != nil {
				if wc.Status == verbs.WCSuccess {
					c.cdcDone(l.slotProd[s], l.slotSeq[s], l.slotTerm[s])
				}
				l.slotConn[s] = nil
			}
			l.slots <- s
			l.credits <- struct{}{}
		case tagWrite:
			l.credits <- struct{}{}
			c := l.lg.conn(uint32(wc.ID))
			if c != nil {
				c.move.wrOutOn[l.ix].Add(-1)
				c.writeDone()
			}
			if wc.Status != verbs.WCSuccess && c != nil {
				e.log.Debug("smcr: rdma write failed", "conn", c.id, "rkey", c.peerRKey, "status", wc.Status)
			}
		}
		if wc.Status != verbs.WCSuccess {
			l.countErr(wc.Status)
			l.fail(fmt.Errorf("send completion: %v", wc.Status))
		}
	}
}

// countErr counts a completion in error on l; flushes, which follow the
// first error of a QP, are not counted again.
func (l *link) countErr(st verbs.WCStatus) {
	if st != verbs.WCWRFlushErr {
		l.errs.Add(1)
		l.errKinds[min(st, verbs.WCGeneralErr)].Add(1)
	}
}

// protoError counts a malformed or misdirected message the peer sent on l.
func (l *link) protoError() {
	l.errs.Add(1)
	l.errKinds[protoErrKind].Add(1)
	l.lg.e.st.protoErrors.Add(1)
}

// protoErrKind is the index of protocol errors in a link's errKinds, after
// the completion statuses.
const protoErrKind = verbs.WCGeneralErr + 1

// errorsByKind is l's errors by kind, the kinds it has had: a completion
// status's name, or "protocol error".
func (l *link) errorsByKind() map[string]uint64 {
	var out map[string]uint64
	for i := range l.errKinds {
		n := l.errKinds[i].Load()
		if n == 0 {
			continue
		}
		if out == nil {
			out = map[string]uint64{}
		}
		kind := "protocol error"
		if i != int(protoErrKind) {
			kind = verbs.WCStatus(i).String()
		}
		out[kind] = n
	}
	return out
}

// onCDC validates and dispatches one CDC message, in the poller.
func (l *link) onCDC(b []byte) {
	e := l.lg.e
	m, err := rmb.ParseCDC(b)
	if err != nil {
		l.protoError()
		return
	}
	e.st.cdcRecv.Add(1)
	c := l.lg.conn(m.Token)
	if c == nil {
		l.protoError()
		e.log.Debug("smcr: cdc for unknown alert token", "lg", l.lg.id, "token", m.Token)
		return
	}
	if m.Flags&rmb.FlagFailoverValidation != 0 {
		c.fenceMovedFrom(l)
	}
	l.rxBytes.Add(c.onCDC(&m))
}

// acquire takes a send slot and n work-request credits (its SEND's and those
// of WRITEs posted with it), and a read hold on useMu that the caller releases
// after posting.
func (l *link) acquire(n int) (uint16, error) {
	s, ok := take(l.ctx, l.slots)
	if !ok {
		return 0, ErrLinkDown
	}
	if !l.takeCredits(n) {
		l.slots <- s
		return 0, ErrLinkDown
	}
	l.useMu.RLock()
	if l.freed {
		l.useMu.RUnlock()
		l.slots <- s
		l.giveCredits(n)
		return 0, ErrLinkDown
	}
	return s, nil
}

// takeCredits takes n work-request credits, or none once l is down. Takers of
// several queue behind creditMu, so that no two hold part of what they need:
// between them they could hold every credit, and none would come back.
func (l *link) takeCredits(n int) bool {
	if n > 1 {
		l.creditMu.Lock()
		defer l.creditMu.Unlock()
	}
	for i := range n {
		if _, ok := take(l.ctx, l.credits); !ok {
			l.giveCredits(i)
			return false
		}
	}
	return true
}

func (l *link) giveCredits(n int) {
	for range n {
		l.credits <- struct{}{}
	}
}

// take receives from pool (send slots or credits), waiting until ctx ends. It
// tries without waiting first: a receive alone costs a fraction of a select with
// ctx, and the pools are rarely empty (two of them per message on the hot path).
func take[T any](ctx context.Context, pool chan T) (T, bool) {
	select {
	case v := <-pool:
		return v, true
	default:
	}
	select {
	case v := <-pool:
		return v, true
	case <-ctx.Done():
		var zero T
		return zero, false
	}
}

// postSlot sends the 44 bytes already encoded in slot s.
func (l *link) postSlot(s uint16) error {
	l.postMu.Lock()
	err := l.qp.PostSend(l.slotWR(0, s))
	l.postMu.Unlock()
	if err != nil {
		l.putSlot(s)
		l.fail(fmt.Errorf("post send: %w", err))
		return ErrLinkDown
	}
	l.posted.Add(1)
	return nil
}

// slotWR fills the post's request i with the SEND of slot s. The caller holds
// postMu.
func (l *link) slotWR(i int, s uint16) *verbs.SendWR {
	l.sge[i][0] = verbs.SGE{MR: l.sendMR, Offset: int(s) * slotSize, Length: llc.MsgLen}
	l.wr[i] = verbs.SendWR{ID: tagSlot<<56 | uint64(s), Opcode: verbs.OpSend, SG: l.sge[i][:], Signaled: true, Inline: true}
	return &l.wr[i]
}

// writeWR fills the post's request i with the WRITE of w of c's send buffer
// (snd, its registration on l) to the same offset of the peer's RMBE. The
// caller holds postMu.
func (l *link) writeWR(i int, c *Conn, snd verbs.MR, w rmb.Span) *verbs.SendWR {
	l.sge[i][0] = verbs.SGE{MR: snd, Offset: int(w.Off), Length: int(w.Len)}
	l.wr[i] = verbs.SendWR{ID: tagWrite<<56 | uint64(c.token), Opcode: verbs.OpWrite, SG: l.sge[i][:],
		RemoteAddr: c.peerAddr + uint64(w.Off), RKey: c.peerRKey, Signaled: true, Inline: w.Len <= maxInline}
	return &l.wr[i]
}

func (l *link) sendCDC(m *rmb.CDC) error { return l.sendConnCDC(nil, 0, m) }

// sendConnCDC sends c's CDC announcing producer cursor prod (absolute).
func (l *link) sendConnCDC(c *Conn, prod uint64, m *rmb.CDC) error {
	s, err := l.acquire(1)
	if err != nil {
		return err
	}
	defer l.useMu.RUnlock()
	l.fillCDC(s, c, prod, m)
	return l.postSlot(s)
}

// fillCDC puts c's CDC m, announcing prod, in send slot s.
func (l *link) fillCDC(s uint16, c *Conn, prod uint64, m *rmb.CDC) {
	l.slotConn[s], l.slotProd[s], l.slotSeq[s] = c, prod, m.Seq
	l.slotTerm[s] = m.State&(rmb.StateClosed|rmb.StateAbnormalClose) != 0
	m.Encode(l.sendMR.Bytes()[int(s)*slotSize:])
	l.lg.e.st.cdcSent.Add(1)
}

// putSlot gives back a send slot after a failed post or encoding.
func (l *link) putSlot(s uint16) {
	if s >= nSendSlots {
		l.llcPool(s) <- s
		return
	}
	l.slotConn[s] = nil
	l.slots <- s
	l.credits <- struct{}{}
}

// postData posts, as one chain, the WRITEs of c's spans ws and, when m is not
// nil, c's CDC m announcing prod behind them: RC executes the chain in order, so
// the peer holds the bytes when it takes the CDC, and one post is one doorbell
// on an adapter (one system call on rxe) where a post per request cost two.
func (l *link) postData(c *Conn, ws []rmb.Span, m *rmb.CDC, prod uint64) error {
	var s uint16
	if m != nil {
		var err error
		if s, err = l.acquire(1 + len(ws)); err != nil {
			return err
		}
		defer l.useMu.RUnlock()
	} else if !l.takeCredits(len(ws)) {
		return ErrLinkDown
	}
	c.wrOut.Add(int32(len(ws)))
	c.move.wrOutOn[l.ix].Add(int32(len(ws)))
	snd := c.move.sndOn[l.ix] // registered before c moved to l (multilink.go)
	if snd == nil {
		snd = c.snd
	}
	if m != nil {
		l.fillCDC(s, c, prod, m)
	}
	l.postMu.Lock()
	var bytes uint64
	for i, w := range ws {
		l.writeWR(i, c, snd, w)
		bytes += uint64(w.Len)
	}
	k := len(ws)
	if m != nil {
		l.slotWR(k, s)
		k++
	}
	for i := range k - 1 {
		l.wr[i].Next = &l.wr[i+1]
	}
	err := l.qp.PostSend(&l.wr[0])
	l.postMu.Unlock()
	if err != nil {
		posted := verbs.Posted(err)
		for range len(ws) - min(posted, len(ws)) {
			l.unpostWrite(c)
		}
		if m != nil { // last in the chain: never posted when the post failed
			l.putSlot(s)
		}
		l.posted.Add(uint64(posted))
		l.fail(fmt.Errorf("post data: %w", err))
		return ErrLinkDown
	}
	l.posted.Add(uint64(k))
	l.txBytes.Add(bytes)
	return nil
}

// unpostWrite undoes the counts of one of c's WRITEs that was not posted, unless
// a failover already took it from wrOutOn and called writeDone for it
// (linkFailed, moveTo): then wrOut is settled.
func (l *link) unpostWrite(c *Conn) {
	if c.move.wrOutOn[l.ix].Add(-1) >= 0 {
		c.wrOut.Add(-1)
	} else {
		c.move.wrOutOn[l.ix].Add(1)
	}
	l.credits <- struct{}{}
}
