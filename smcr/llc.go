// LLC flows of a link: its worker, CONFIRM_LINK, CONFIRM_RKEY, DELETE_RKEY,
// TEST_LINK and DELETE_LINK, and the requests that wait for their responses.
// RFC 7609 §3.8 (LLC), after Linux's smc_llc.

package smcr

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/smcr-io/smcr/llc"
	"github.com/smcr-io/smcr/smcr/clc"
	"github.com/smcr-io/smcr/smcr/verbs"
)

var errLLCTimeout = errors.New("smcr: llc response timeout")

// Version-2 LLC (SMC-Rv2): a link group of version 2 sends every LLC message
// with the version-2 header, the type's 0x20 bit set and a 16-bit length in
// bytes 1-2, little-endian as Linux writes it on x86 (llc/v2.go); its 44-byte
// messages keep version 1's bodies, and CONFIRM_LINK of release 2.1 carries the
// group's max conns in byte 35. The engine speaks version 1's forms inside:
// encodeLLC turns them to version 2 on the way out, fromV2 back on the way in.
const (
	llcV2Bit         = 0x20
	llcOffMaxConnsV2 = 35
)

// llcV2 reports whether the message in b (at least 44 bytes) is an LLC
// message of version 2 (a CDC's type is 0xFE).
func llcV2(b []byte) bool { return b[0]&0xf0 == llcV2Bit }

// encodeLLC encodes m into LLC send slot s, in version 2's form in a
// version-2 link group.
func (l *link) encodeLLC(m llc.Message, s uint16) error {
	b := l.sendMR.Bytes()[int(s)*slotSize : int(s)*slotSize+llc.MsgLen]
	if err := m.Encode(b); err != nil {
		return err
	}
	if !l.lg.key.v2 {
		return nil
	}
	t := llc.Type(b[0])
	b[0] |= llcV2Bit
	binary.LittleEndian.PutUint16(b[1:], llc.MsgLen)
	if t == llc.TypeConfirmLink && l.lg.v2.Release >= clc.Release21 {
		b[llcOffMaxConnsV2] = l.lg.v2.MaxConns
	}
	return nil
}

// fromV2 turns the version-2 LLC message b (its whole received length) into
// version 1's 44-byte form in place, for the flows of this file. It reports
// false for a message it has dealt with itself, or refused: a malformed one, or
// a REQ_ADD_LINK (the group keeps its one link: no answer, as Linux's server
// gives none when it adds no link).
func (l *link) fromV2(b []byte) bool {
	h, err := llc.ParseHeaderV2(b)
	if err == nil && h.Length != len(b) {
		err = fmt.Errorf("llc v2: length %d in a message of %d bytes", h.Length, len(b))
	}
	if err != nil {
		l.protoError()
		l.lg.e.log.Debug("smcr: bad llc v2 message", "lg", l.lg.id, "err", err)
		return false
	}
	if h.Type == llc.TypeReqAddLinkV2 {
		l.lg.e.log.Debug("smcr: llc v2 req_add_link ignored: one link per version-2 group", "lg", l.lg.id)
		return false
	}
	// ADD_LINK's rkey list (past byte 44) is not needed: a version-2 group
	// rejects it (onAddLink); DELETE_RKEY beyond 8 rkeys fails version 1's
	// decoding and counts as a protocol error.
	b[0] &^= llcV2Bit
	b[1], b[2] = llc.MsgLen, 0
	return true
}

type pendKey struct {
	t   llc.Type
	key uint64
}

// earlyLLC does in the poller what must not wait behind the worker, whose queue
// may hold a backlog of answers and control messages, each waiting for a send
// slot, longer than the peer's timeouts: it takes a peer's new rkey (a connection
// setup waits for it in waitPeerRKey), answers CONFIRM_RKEY, DELETE_RKEY and
// TEST_LINK when a response slot is free (else the worker does, or for
// DELETE_RKEY a goroutine), and hands over their responses, whose timers fail
// the link. It reports whether the message is done with.
func (l *link) earlyLLC(b []byte) bool {
	switch llc.Type(b[0]) {
	case llc.TypeConfirmRkey:
		var r llc.ConfirmRkey
		if r.Decode(b) != nil {
			return false
		}
		if !r.Response() {
			// Applied here, in order with DELETE_RKEY; the answer goes later
			// when no slot is free, not through the worker, which would apply
			// the request again, perhaps after its withdrawal.
			l.answerConfirmRkey(&r)
			l.respond(&r)
			return true
		}
		l.deliver(pendKey{t: llc.TypeConfirmRkey, key: uint64(r.RKey)}, b)
		return true
	case llc.TypeDeleteRkey:
		// Here too, so that a withdrawal and a later CONFIRM_RKEY of the same
		// rkey (a device may hand it out again) take effect in their order.
		var r llc.DeleteRkey
		if r.Decode(b) != nil {
			return false
		}
		if !r.Response() {
			l.answerDeleteRkey(&r)
			l.respond(&r)
			return true
		}
		l.deliver(l.deleteRkeyKey(&r), b)
		return true
	case llc.TypeTestLink:
		var r llc.TestLink
		if r.Decode(b) != nil {
			return false
		}
		if !r.Response() {
			r.Flags |= llc.FlagResponse
			return l.tryRespond(&r)
		}
		l.deliver(pendKey{t: llc.TypeTestLink, key: binary.BigEndian.Uint64(r.Data[:])}, b)
		return true
	}
	return false
}

// deleteRkeyKey is the pending request a DELETE_RKEY response r answers: by
// its first rkey, or in a version-2 group, whose responses carry none, the one
// request in flight (deleteRKey).
func (l *link) deleteRkeyKey(r *llc.DeleteRkey) pendKey {
	if l.lg.key.v2 {
		return pendKey{t: llc.TypeDeleteRkey}
	}
	return pendKey{t: llc.TypeDeleteRkey, key: uint64(r.RKeys[0])}
}

// tryRespond sends an LLC response from the poller if a response slot is free at
// once; otherwise the worker answers. The worker may be waiting for a data slot
// (runCtl), behind which an answer would miss the peer's LLC timeout.
func (l *link) tryRespond(m llc.Message) bool {
	var s uint16
	select {
	case s = <-l.llcSlots:
	default:
		return false
	}
	l.useMu.RLock()
	defer l.useMu.RUnlock()
	if l.freed || l.encodeLLC(m, s) != nil {
		l.llcSlots <- s
		return false
	}
	l.lg.e.st.llcSent.Add(1)
	l.postSlot(s)
	return true
}

// respond sends an LLC response at once when a slot is free, else soon
// (respondLate): never through the worker.
func (l *link) respond(m llc.Message) {
	if !l.tryRespond(m) {
		l.respondLate(m)
	}
}

// respondLate sends, from a goroutine, a response tryRespond found no slot for.
// A peer has at most one request per connection unanswered (llcQueue), so more
// responses than that waiting for a slot mean a peer flooding requests: the link
// fails, as when the worker's queue overflows, rather than run a goroutine per
// request it sends.
func (l *link) respondLate(m llc.Message) {
	if l.lateResps.Add(1) > llcQueue {
		l.lateResps.Add(-1)
		l.lg.e.st.protoErrors.Add(1)
		l.fail(errors.New("llc: peer floods requests"))
		return
	}
	go func() {
		defer l.lateResps.Add(-1)
		l.sendLLC(m)
	}()
}

// llcPool is the pool LLC slot s belongs to.
func (l *link) llcPool(s uint16) chan uint16 {
	if s < nSendSlots+nLLCSlots/2 {
		return l.llcSlots
	}
	return l.reqSlots
}

// acquireLLC takes a slot from an LLC pool, and a read hold on useMu.
func (l *link) acquireLLC(pool chan uint16) (uint16, error) {
	var s uint16
	select {
	case s = <-pool:
	case <-l.ctx.Done():
		return 0, ErrLinkDown
	}
	l.useMu.RLock()
	if l.freed {
		l.useMu.RUnlock()
		pool <- s
		return 0, ErrLinkDown
	}
	return s, nil
}

func (l *link) sendLLC(m llc.Message) error {
	pool := l.reqSlots
	if m.Response() {
		pool = l.llcSlots
	}
	s, err := l.acquireLLC(pool)
	if err != nil {
		return err
	}
	defer l.useMu.RUnlock()
	if err := l.encodeLLC(m, s); err != nil {
		l.putSlot(s)
		return err
	}
	l.lg.e.st.llcSent.Add(1)
	return l.postSlot(s)
}

// work runs the LLC flows and the connections' control messages, off the poller.
func (l *link) work() {
	defer l.wg.Done()
	l.armTestLink()
	for {
		select {
		case <-l.ctx.Done():
			return
		case b := <-l.llcIn:
			l.handleLLC(b[:])
		case c := <-l.ctl:
			c.runCtl(l)
		case <-l.testDue:
			go l.testLink()
		}
	}
}

// armTestLink has the worker test l once an interval passes in which l
// received nothing, as Linux's smc_llc_testlink_work: a link that carries
// traffic is alive, and a busy host that answered a TEST_LINK late would fail
// a healthy link with every connection on it. It looks every quarter
// interval, so an idle link is tested within 1.25 intervals of its last
// receive; with the test off, every second, for the setting to come back.
func (l *link) armTestLink() { l.watchIdle(0, l.received.Load()) }

const testLinkTicks = 4 // looks per interval

func (l *link) watchIdle(idle int, seen uint64) {
	if l.ctx.Err() != nil {
		return
	}
	iv := l.lg.e.settings().TestLinkInterval
	tick := iv / testLinkTicks
	if iv <= 0 {
		tick = time.Second
	}
	l.lg.e.cfg.Clock.AfterFunc(tick, func() {
		if l.sendStalled(l.lg.e.cfg.Clock.Now()) {
			l.fail(fmt.Errorf("sends got no completion for %v: the peer takes no more", sendStallTime(l.lg.e.cfg)))
			return
		}
		now := l.received.Load()
		// A link still being set up (its QP in RESET, INIT or RTR) is not
		// idle: it cannot send yet, and a TEST_LINK would fail it. Linux,
		// too, tests active links only.
		settingUp := l.qp.State() < verbs.QPRTS
		switch iv := l.lg.e.settings().TestLinkInterval; {
		case iv <= 0 || now != seen || settingUp:
			l.watchIdle(0, now)
		case idle+1 < testLinkTicks:
			l.watchIdle(idle+1, seen)
		default:
			l.testsDue.Add(1)
			wake(l.testDue)
		}
	})
}

// sendStallTime is how long sends may wait for any completion before the link
// fails. An RC queue pair retries a peer that posts no receive for ever (RNR
// retry 7, as Linux's), so a peer that stops reposting them, or a path that
// drops everything, would hold every writer on the link for good; and a peer
// that keeps sending its own messages keeps the link from looking idle to
// TEST_LINK. A live peer answers within round trips, not seconds.
func sendStallTime(cfg Config) time.Duration { return 4 * cfg.LLCTimeout }

// sendStalled takes one look (from watchIdle's goroutine only): whether sends
// are outstanding and none has completed for sendStallTime. Time alone is no
// evidence against the peer: on a busy host our own poller, or the reader
// driving the link, may not have run for that long, with the completions
// waiting in the CQ. So before it decides, it takes them itself (takeCompletions).
func (l *link) sendStalled(now time.Time) bool {
	if l.sendProgress(now) || now.Sub(l.sendSince) < sendStallTime(l.lg.e.cfg) {
		return false
	}
	return l.takeCompletions() && !l.sendProgress(now)
}

// sendProgress reports whether no send is outstanding or sends completed since
// the last look, and then starts the stall's clock again at now.
func (l *link) sendProgress(now time.Time) bool {
	// polled counts every completion and received the receives; one polled
	// but not yet counted as received reads as progress, which only delays.
	done := int64(l.polled.Load()) - int64(l.received.Load())
	if int64(l.posted.Load())-done <= 0 || done != l.sendSeen || l.sendSince.IsZero() {
		l.sendSeen, l.sendSince = done, now
		return true
	}
	return false
}

// takeCompletions handles every completion waiting in l's CQ, as a driving
// reader does. It reports false, having taken none, when another goroutine
// handles completions now (which is progress of ours, not the peer's silence)
// or the CQ is gone.
func (l *link) takeCompletions() bool {
	if !l.pollMu.TryLock() {
		return false
	}
	defer l.pollMu.Unlock()
	if l.pollOff {
		return false
	}
	var wcs [32]verbs.WorkCompletion
	for {
		n, err := l.handle(wcs[:])
		if err != nil || n < len(wcs) {
			return err == nil
		}
	}
}

func (l *link) register(k pendKey) chan [llc.MsgLen]byte {
	ch := make(chan [llc.MsgLen]byte, 1)
	l.pmu.Lock()
	l.pending[k] = ch
	l.pmu.Unlock()
	return ch
}

func (l *link) unregister(k pendKey) {
	l.pmu.Lock()
	delete(l.pending, k)
	l.pmu.Unlock()
}

// deliver hands the response b to the request waiting for it under k, if any.
func (l *link) deliver(k pendKey, b []byte) {
	l.pmu.Lock()
	ch := l.pending[k]
	delete(l.pending, k)
	l.pmu.Unlock()
	if ch == nil {
		l.lg.e.log.Debug("smcr: unexpected llc response", "lg", l.lg.id, "type", k.t)
		return
	}
	ch <- [llc.MsgLen]byte(b)
}

// request sends m and waits for the response registered under k.
func (l *link) request(ctx context.Context, k pendKey, m llc.Message, timeout time.Duration) ([llc.MsgLen]byte, error) {
	ch := l.register(k)
	defer l.unregister(k)
	if err := l.sendLLC(m); err != nil {
		return [llc.MsgLen]byte{}, err
	}
	t := newTimer(l.lg.e.cfg.Clock, timeout)
	defer t.Stop()
	select {
	case b := <-ch:
		return b, nil
	case <-t.C:
		return [llc.MsgLen]byte{}, errLLCTimeout
	case <-ctx.Done():
		return [llc.MsgLen]byte{}, ctx.Err()
	case <-l.ctx.Done():
		return [llc.MsgLen]byte{}, ErrLinkDown
	}
}

func (l *link) confirmLinkMsg(resp bool) *llc.ConfirmLink {
	qa := l.qp.Attr()
	// No eyecatchers in our RMBEs: Linux refuses a CONFIRM_LINK, request or
	// response, that does not say so (smc_llc_eval_conf_link), and declines
	// with 0x03050000.
	m := &llc.ConfirmLink{Flags: llc.FlagNoRMBEyecatcher, MAC: qa.MAC, GID: qa.GID, QPN: llc.QPN(qa.QPN), Link: llc.LinkID(l.num), LinkUID: l.uid, MaxLinks: maxLinks}
	if l.lg.key.v2 && l.lg.v2.Release >= clc.Release21 {
		m.MaxLinks = l.lg.v2.MaxLinks // and max conns: encodeLLC
	}
	if resp {
		m.Flags |= llc.FlagResponse
	}
	return m
}

// confirmLinkServer runs CONFIRM_LINK as the server: request, then the client's answer.
func (l *link) confirmLinkServer(ctx context.Context) error {
	b, err := l.request(ctx, pendKey{t: llc.TypeConfirmLink}, l.confirmLinkMsg(false), 2*l.lg.e.cfg.LLCTimeout)
	if err != nil {
		return fmt.Errorf("smcr: confirm link: %w", err)
	}
	var m llc.ConfirmLink
	if err := m.Decode(b[:]); err != nil {
		return fmt.Errorf("smcr: confirm link response: %w", err)
	}
	if uint32(m.QPN) != l.peer.QPN {
		return fmt.Errorf("smcr: confirm link response from qp %d, want %d", m.QPN, l.peer.QPN)
	}
	l.lg.e.st.linkConfirms.Add(1)
	return nil
}

// confirmLinkClient waits for the server's CONFIRM_LINK and answers it.
func (l *link) confirmLinkClient(ctx context.Context) error {
	t := newTimer(l.lg.e.cfg.Clock, 2*l.lg.e.cfg.LLCTimeout)
	defer t.Stop()
	select {
	case m := <-l.clReq:
		if uint32(m.QPN) != l.peer.QPN {
			return fmt.Errorf("smcr: confirm link from qp %d, want %d", m.QPN, l.peer.QPN)
		}
	case <-t.C:
		return fmt.Errorf("smcr: confirm link: %w", errLLCTimeout)
	case <-ctx.Done():
		return ctx.Err()
	case <-l.ctx.Done():
		return ErrLinkDown
	}
	if err := l.sendLLC(l.confirmLinkMsg(true)); err != nil {
		return err
	}
	l.lg.e.st.linkConfirms.Add(1)
	return nil
}

// announceRKey sends CONFIRM_RKEY for a new RMB without waiting for the answer:
// the CLC message naming the rkey follows at once, and the peer waits for the
// request to arrive before it uses the rkey (linkGroup.waitPeerRKey). This saves a
// round trip per connection setup on each side; the response is still sent and
// read, and a negative one fails the link. The request carries the RMB's rkeys on
// the group's other links too (others). done is closed once the response came
// (or the wait ended): responses are matched by rkey, so a reused RMB must not be
// announced again before (bufpool.go).
func (l *link) announceRKey(mr verbs.MR, others ...llc.RToken) (done <-chan struct{}, err error) {
	k := pendKey{t: llc.TypeConfirmRkey, key: uint64(mr.RKey())}
	ch := l.register(k)
	m := &llc.ConfirmRkey{RKey: mr.RKey(), Addr: mr.Addr(), NumOthers: uint8(len(others))}
	copy(m.Others[:], others)
	if err := l.sendLLC(m); err != nil {
		l.unregister(k)
		return nil, err
	}
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		t := newTimer(l.lg.e.cfg.Clock, l.lg.e.cfg.LLCTimeout)
		defer t.Stop()
		select {
		case b := <-ch:
			var r llc.ConfirmRkey
			if r.Decode(b[:]) != nil || r.Negative() {
				l.fail(errors.New("peer refused our rkey"))
			}
		case <-t.C:
			l.unregister(k)
			l.fail(fmt.Errorf("confirm rkey: %w", errLLCTimeout))
		case <-l.ctx.Done():
			l.unregister(k)
		}
	}()
	return answered, nil
}

// deleteRKey withdraws our RMB known as rkey on l from the peer (DELETE_RKEY).
func (l *link) deleteRKey(rkey uint32) {
	m := &llc.DeleteRkey{Count: 1}
	m.RKeys[0] = rkey
	key := pendKey{t: llc.TypeDeleteRkey, key: uint64(rkey)}
	if l.lg.key.v2 {
		// Linux's version-2 response zeroes the rkeys (smc_llc_rmt_delete_rkey):
		// one request at a time, answered under key 0 (deleteRkeyKey).
		select {
		case l.delRkey <- struct{}{}:
		case <-l.ctx.Done():
			return
		}
		defer func() { <-l.delRkey }()
		key.key = 0
	}
	b, err := l.request(l.ctx, key, m, l.lg.e.cfg.LLCTimeout)
	var r llc.DeleteRkey
	if err == nil {
		err = r.Decode(b[:])
	}
	switch {
	case err != nil:
		l.lg.e.log.Debug("smcr: delete rkey", "lg", l.lg.id, "link", l.num, "rkey", rkey, "err", err)
	case r.Negative():
		l.lg.e.log.Debug("smcr: delete rkey: the peer did not know it", "lg", l.lg.id, "link", l.num, "rkey", rkey)
	}
}

func (l *link) testLink() {
	if err := l.testOnce(l.ctx); err != nil {
		if l.ctx.Err() == nil {
			l.fail(fmt.Errorf("test link: %w", err))
		}
		return
	}
	l.armTestLink()
}

// testOnce sends one TEST_LINK and waits for the answer.
func (l *link) testOnce(ctx context.Context) error {
	l.pmu.Lock()
	l.testSeq++
	seq := l.testSeq
	l.pmu.Unlock()
	m := &llc.TestLink{}
	binary.BigEndian.PutUint64(m.Data[:], seq)
	start := l.lg.e.cfg.Clock.Now()
	_, err := l.request(ctx, pendKey{t: llc.TypeTestLink, key: seq}, m, l.lg.e.cfg.LLCTimeout)
	if err == nil {
		now := l.lg.e.cfg.Clock.Now()
		l.rtt.Store(int64(now.Sub(start)))
		l.testedAt.Store(now.UnixNano())
	}
	return err
}

func (l *link) sendDeleteLink() {
	if l.down.Load() {
		return
	}
	// Non-blocking: a dead peer must not hold up our teardown.
	select {
	case s := <-l.slots:
		select {
		case <-l.credits:
			l.useMu.RLock()
			if !l.freed {
				m := &llc.DeleteLink{Flags: llc.FlagDeleteLinkAll | llc.FlagDeleteOrderly, Reason: 0x00030000}
				l.encodeLLC(m, s)
				l.postSlot(s)
			} else {
				l.slots <- s
				l.credits <- struct{}{}
			}
			l.useMu.RUnlock()
		default:
			l.slots <- s
		}
	default:
	}
}

// answerConfirmRkey records the RMB a CONFIRM_RKEY request announces and turns
// the request into its response: negative when the group knows too many.
func (l *link) answerConfirmRkey(r *llc.ConfirmRkey) {
	if !l.lg.addPeerRKey(true, l.num, r.RKey, r.Addr, r.Entries()...) {
		l.lg.e.st.protoErrors.Add(1)
		l.lg.e.log.Debug("smcr: peer announced more RMBs than a link group holds; refused", "lg", l.lg.id, "max", maxPeerRMBs)
		r.Flags |= llc.FlagRkeyNegative
	}
	r.Flags |= llc.FlagResponse
}

// answerDeleteRkey forgets the peer RMBs a DELETE_RKEY request withdraws and
// turns the request into its response, flagging the rkeys we did not know.
func (l *link) answerDeleteRkey(r *llc.DeleteRkey) {
	for i, k := range r.Entries() {
		if !l.lg.delPeerRKey(l.num, k) {
			r.SetFailed(i)
			r.Flags |= llc.FlagRkeyNegative
		}
	}
	r.Flags |= llc.FlagResponse
}

// handleLLC runs in the worker: requests are answered, responses delivered.
func (l *link) handleLLC(b []byte) {
	lg := l.lg
	m, err := llc.Parse(b)
	if err != nil {
		lg.e.st.protoErrors.Add(1)
		lg.e.log.Debug("smcr: bad llc message", "lg", lg.id, "err", err)
		return
	}
	if ac, ok := m.(*llc.AddLinkCont); ok {
		select {
		case lg.addCont <- *ac:
		default:
			lg.e.st.protoErrors.Add(1)
		}
		return
	}
	if m.Response() {
		var key uint64
		switch r := m.(type) {
		case *llc.ConfirmRkey:
			key = uint64(r.RKey)
		case *llc.TestLink:
			key = binary.BigEndian.Uint64(r.Data[:])
		}
		l.deliver(pendKey{t: m.Type(), key: key}, b)
		return
	}
	switch r := m.(type) {
	case *llc.ConfirmLink:
		select {
		case l.clReq <- *r:
		default:
		}
	// (CONFIRM_RKEY and DELETE_RKEY requests never come here: earlyLLC.)
	case *llc.TestLink:
		r.Flags |= llc.FlagResponse
		l.sendLLC(r)
	case *llc.DeleteLink:
		err := fmt.Errorf("%w: peer deleted the link (%v)", ErrLinkDown, r.Reason)
		if r.All() {
			go lg.terminate(err, false)
			return
		}
		lg.e.st.deleteLinks.Add(1)
		if dl := lg.linkByNum(uint8(r.Link)); dl != nil {
			go lg.linkFailed(dl, err, false)
		} // else: gone already, we saw the failure too

	case *llc.AddLink:
		lg.onAddLink(l, r)
	}
}
