// The second link: with two devices configured the server adds a link after first
// contact (ADD_LINK, ADD_LINK_CONT with the rkeys of every RMB on the new link,
// CONFIRM_LINK on the new QP); new connections are spread over the links; when a
// link fails its connections move to the surviving one without losing or
// duplicating a byte, and DELETE_LINK tells the peer. RFC 7609 §3.3.2 (link groups
// with several links), §3.8 (ADD_LINK, DELETE_LINK), after Linux's
// smc_llc_srv_add_link, smc_llc_cli_add_link and smc_switch_conns.

package smcr

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/smcr-io/smcr/llc"
	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// secondDevice returns the index of a configured device of the group's kind that
// no link of lg uses, or -1.
func (lg *linkGroup) secondDevice() int {
	lg.mu.RLock()
	defer lg.mu.RUnlock()
	for i, d := range lg.e.cfg.Devices {
		if d.Kind() != lg.key.kind {
			continue
		}
		if !slices.ContainsFunc(lg.links, func(l *link) bool { return l.dev == d }) {
			return i
		}
	}
	return -1
}

// otherPeerOffer returns the peer device a second link beside l1 reaches: of the
// group's kind, not l1's peer, with gid when one is given.
func (lg *linkGroup) otherPeerOffer(gid *[16]byte, l1 *link) (offer, bool) {
	var alt *offer
	for i := range lg.peerOffers {
		o := &lg.peerOffers[i]
		if o.Kind != lg.key.kind || (o.GID == l1.peer.GID && string(o.Endpoint) == string(l1.peer.Endpoint)) {
			continue
		}
		if gid == nil || o.GID == *gid {
			return *o, true
		}
		if alt == nil {
			alt = o
		}
	}
	if alt != nil {
		return *alt, true
	}
	return offer{}, false
}

func canRegister(l *link) bool {
	_, ok := l.pd.(verbs.Registrar)
	return ok
}

// serverAddLink adds the second link after first contact when both ends have a
// second device of the group's provider (smc_llc_srv_add_link). Failure leaves the
// group with its one link. It returns errNoSecondLink when no second link is
// possible at all (so trying again is pointless), another error when this try
// failed.
func (lg *linkGroup) serverAddLink() error {
	e := lg.e
	defer e.addLinkTries.Add(1)
	if len(e.cfg.Devices) < 2 {
		return errNoSecondLink
	}
	lg.addMu.Lock()
	defer lg.addMu.Unlock()
	if lg.liveLinks() >= maxLinks {
		return nil
	}
	l1 := lg.primary()
	if l1 == nil || !canRegister(l1) {
		return errNoSecondLink
	}
	di := lg.secondDevice()
	po, ok := lg.otherPeerOffer(nil, l1)
	if di < 0 || !ok {
		return errNoSecondLink
	}
	if !portUp(e.cfg.Devices[di]) {
		return errPortDown
	}
	num := lg.freshLinkNum()
	if num == 0 {
		return errNoSecondLink
	}
	l2, err := newLink(lg, e.cfg.Devices[di], num)
	if err != nil {
		e.log.Warn("smcr: add link", "lg", lg.id, "err", err)
		return err
	}
	if err := lg.serverAddLinkOn(l1, l2, po); err != nil {
		e.log.Warn("smcr: add link failed", "lg", lg.id, "err", err)
		lg.dropLink(l2, err)
		return err
	}
	e.st.addLinks.Add(1)
	e.log.Info("smcr: second link up", "lg", lg.id, "link", l2.num, "device", l2.dev.Name())
	return nil
}

var (
	errNoSecondLink = errors.New("smcr: no second link possible")
	errPortDown     = errors.New("smcr: the second device's port is down")
	errLinkPortDown = errors.New("smcr: the link's port went down")
	errLinkGIDGone  = errors.New("smcr: the link's address went")
)

// portUp reports whether d's port is up now, for devices that can tell
// (verbs.PortStater); the others count as up.
func portUp(d verbs.Device) bool {
	ps, ok := d.(verbs.PortStater)
	return !ok || ps.PortUp()
}

// addSecondLink runs after first contact: the second link now, or, if that try
// failed but may succeed later (a port down, a peer not answering), on the
// readdLink timer.
func (lg *linkGroup) addSecondLink() {
	if err := lg.serverAddLink(); err != nil && !errors.Is(err, errNoSecondLink) {
		lg.readdLink()
	}
}

// readdLink restores a group's second link after one failed, as Linux does when
// a port comes back (smcr_port_add), here on a timer since a provider reports no
// port events: first after LinkRetry, then at twice the wait after each failed
// try, up to maxLinkRetry, while the group lives; while the device's port is
// down (verbs.PortStater) it looks again at the same pace without trying. Only
// the server adds links; one loop runs per group.
func (lg *linkGroup) readdLink() {
	e := lg.e
	wait := e.cfg.LinkRetry
	if wait < 0 || lg.key.client {
		return
	}
	lg.mu.Lock()
	if lg.readding || lg.dead {
		lg.mu.Unlock()
		return
	}
	lg.readding = true
	lg.mu.Unlock()
	defer func() {
		lg.mu.Lock()
		lg.readding = false
		lg.mu.Unlock()
	}()
	for {
		t := newTimer(e.cfg.Clock, wait)
		select {
		case <-t.C:
		case <-e.ctx.Done():
			t.Stop()
			return
		}
		lg.mu.RLock()
		dead := lg.dead
		lg.mu.RUnlock()
		if dead {
			return
		}
		err := lg.serverAddLink()
		switch {
		case err == nil || errors.Is(err, errNoSecondLink):
			return
		case !errors.Is(err, errPortDown):
			wait = min(2*wait, maxLinkRetry)
		}
	}
}

// liveLinks counts the group's links not known to be down.
func (lg *linkGroup) liveLinks() int {
	lg.mu.RLock()
	defer lg.mu.RUnlock()
	n := 0
	for _, l := range lg.links {
		if !l.down.Load() {
			n++
		}
	}
	return n
}

// Link numbers and slots. A link's number goes on the wire (ADD_LINK, rtokens,
// DELETE_LINK): the server takes the one after the last it took, cycling through
// 1–255 and skipping those of links the group still holds, as Linux's
// smcr_next_link_id, so a number names one link for a long while and a late
// message about a link that is gone is not taken for its successor's. A link's
// slot (ix) indexes the registrations of buffers and the peer's rtokens: newLink
// takes a free one, and the link gives it back once it is freed and the slot
// indexes nothing registered (release). Registrations made for a link that
// failed or never came up go with it (forgetLink). A buffer stays where it was
// allocated, in the PD of the link its connection started on, until the
// connection ends, but leaves that link's slot when the link fails: the PD
// lives on without a slot, and the slot takes a new link.

// freshLinkNum takes the next link number for a link the server adds, or
// returns 0 when the group holds every number (it cannot: linkSlots < 255).
func (lg *linkGroup) freshLinkNum() uint8 {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	for range 255 {
		lg.lastNum = lg.lastNum%255 + 1
		if lg.slotOfLocked(lg.lastNum) == nil {
			return lg.lastNum
		}
	}
	return 0
}

// numFree reports whether a link the peer adds may take number n: no link the
// group holds has it.
func (lg *linkGroup) numFree(n uint8) bool {
	lg.mu.RLock()
	defer lg.mu.RUnlock()
	return n != 0 && lg.slotOfLocked(n) == nil
}

// slotOfLocked returns the link numbered num that holds a slot, or nil. The
// caller holds lg.mu.
func (lg *linkGroup) slotOfLocked(num uint8) *link {
	for _, l := range lg.slots {
		if l != nil && l.num == num {
			return l
		}
	}
	return nil
}

var errNoLinkSlot = errors.New("smcr: every link slot of the group is held (connections on failed links have not ended)")

// takeSlot gives l a free slot of the group.
func (lg *linkGroup) takeSlot(l *link) error {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	for i, o := range lg.slots {
		if o == nil {
			lg.slots[i], l.ix = l, uint8(i)
			return nil
		}
	}
	return errNoLinkSlot
}

// leaveSlot gives l's slot back once l is freed and the slot indexes nothing
// of it (release), with the peer's rtokens on it.
func (lg *linkGroup) leaveSlot(l *link) {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	if lg.slots[l.ix] != l {
		return
	}
	lg.slots[l.ix] = nil
	for t := range lg.peerRMBs.keys {
		if tok := t[l.ix]; tok.ok {
			t[l.ix] = rtoken{}
			lg.peerRMBs.delIf(rkeyOn{tok.num, tok.rkey}, t)
		}
	}
}

// forgetLink drops what connections and pooled buffers registered on l, a link
// that failed or never came up, so that its slot frees with the link. A
// connection still on l keeps its registrations: it ends with the link.
func (lg *linkGroup) forgetLink(l *link) {
	lg.mu.RLock()
	conns := make([]*Conn, 0, len(lg.conns))
	for _, c := range lg.conns {
		conns = append(conns, c)
	}
	lg.mu.RUnlock()
	released, unslotted := 0, 0
	for _, c := range conns {
		r, u := c.forgetLink(l)
		released, unslotted = released+r, unslotted+u
	}
	var stale []*pooledBuf
	lg.mu.Lock()
	for i := 0; i < len(lg.pool); i++ {
		b := lg.pool[i]
		if b.link[l.ix] != l {
			continue
		}
		if b.on[l.ix] == b.own {
			stale = append(stale, b) // allocated on l: it goes
			lg.pool = slices.Delete(lg.pool, i, i+1)
			i--
			continue
		}
		b.on[l.ix].Close()
		b.on[l.ix], b.link[l.ix] = nil, nil
		released++
	}
	lg.mu.Unlock()
	for _, b := range stale {
		lg.free(b) // the peer hears DELETE_RKEY on a live link it is registered on
	}
	for range released {
		l.releasePD()
	}
	for range unslotted {
		l.unslot()
	}
}

// forgetLink takes c's registrations on l out of its slot unless c is still on
// l: it closes the second ones, and keeps a buffer allocated on l, which c goes
// on using on its other links, registered in l's PD until c ends. It returns
// how many holds on l's PD and slot it dropped, and how many on its slot only.
func (c *Conn) forgetLink(l *link) (released, unslotted int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing.released || c.lnk == l || c.move.regLink[l.ix] != l {
		return 0, 0
	}
	for _, m := range []*verbs.MR{&c.move.rmbOn[l.ix], &c.move.sndOn[l.ix]} {
		switch {
		case *m == nil:
		case *m == c.rmb || *m == c.snd:
			unslotted++
		default:
			(*m).Close()
			released++
		}
		*m = nil
	}
	c.move.regLink[l.ix] = nil
	return released, unslotted
}

func (lg *linkGroup) serverAddLinkOn(l1, l2 *link, po offer) error {
	cfg := lg.e.cfg
	ctx, cancel := context.WithTimeout(l1.ctx, cfg.CLCTimeout+4*cfg.LLCTimeout)
	defer cancel()
	drain(lg.addCont)
	qa := l2.qp.Attr()
	req := &llc.AddLink{MAC: qa.MAC, GID: qa.GID, QPN: llc.QPN(qa.QPN), Link: llc.LinkID(l2.num), MTU: llc.MTU(l2.mtu), PSN: llc.PSN(qa.PSN)}
	b, err := l1.request(ctx, pendKey{t: llc.TypeAddLink}, req, 2*cfg.LLCTimeout)
	if err != nil {
		return fmt.Errorf("add link: %w", err)
	}
	var resp llc.AddLink
	if err := resp.Decode(b[:]); err != nil {
		return fmt.Errorf("add link response: %w", err)
	}
	if resp.Rejected() {
		return fmt.Errorf("peer rejected the link: %v", resp.RejectReason)
	}
	peer := verbs.QPAttr{QPN: uint32(resp.QPN), PSN: uint32(resp.PSN), GID: resp.GID, MAC: resp.MAC, MTU: verbs.MTU(resp.MTU), Endpoint: po.Endpoint}
	if err := l2.connect(ctx, peer); err != nil {
		return err
	}
	// A path that connects but does not carry (a dead port behind a live one:
	// RC connects without the peer) would hold flow until CONFIRM_LINK timed
	// out, and with it every setup announcing an RMB: try it first. The
	// client's link answers a TEST_LINK from its poller, confirmed or not.
	if err := l2.testOnce(ctx); err != nil {
		return fmt.Errorf("test the new link: %w", err)
	}
	lg.flow.Lock()
	defer lg.flow.Unlock()
	if err := lg.sendRKeys(l1, l2, false); err != nil {
		return err
	}
	if err := lg.recvRKeys(ctx, l1, l2, true); err != nil {
		return err
	}
	if err := l2.confirmLinkServer(ctx); err != nil {
		return err
	}
	return lg.appendLink(l2)
}

// onAddLink answers an ADD_LINK request in the link worker: the client builds the
// link off the worker, whose LLC messages the exchange needs. A server runs one
// exchange at a time, and may begin the next while ours of the one it gave up on
// still runs: a third at once is a peer flooding requests, refused here rather
// than given a goroutine that waits for the others.
func (lg *linkGroup) onAddLink(l *link, r *llc.AddLink) {
	reject := &llc.AddLink{Flags: llc.FlagResponse | llc.FlagAddLinkRejected, RejectReason: llc.RejectNoAltPath, Link: r.Link}
	if !lg.key.client || lg.key.v2 {
		// Only the server adds links (RFC 7609 §3.8, asymmetric roles); a
		// version-2 group keeps its one link, as a Linux client with one
		// device does: it rejects in 44 bytes (encodeLLC).
		l.sendLLC(reject)
		return
	}
	if lg.addQueued.Add(1) > 2 {
		lg.addQueued.Add(-1)
		lg.e.st.protoErrors.Add(1)
		l.sendLLC(reject)
		return
	}
	go func() {
		defer lg.addQueued.Add(-1)
		lg.clientAddLink(l, *r)
	}()
}

// offerNoLink ends a standard client's wait for a second link after first
// contact: Linux's client waits 2 s for the server's ADD_LINK, then 1 s more for
// a Decline, before its connect returns (smcr_clnt_conf_first_link; a 2.1
// client skips it when max links is 1). A version-2 group adds no link, so it
// sends an empty ADD_LINK (QP MTU 0), which Linux's client rejects at once
// without looking further (smc_llc_cli_add_link), as it treats its own empty
// ADD_LINK, the invitation. The answer is read and dropped.
func (l *link) offerNoLink() {
	qa := l.qp.Attr()
	m := &llc.AddLink{MAC: qa.MAC, GID: qa.GID, Link: llc.LinkID(l.num + 1)}
	b, err := l.request(l.ctx, pendKey{t: llc.TypeAddLink}, m, l.lg.e.cfg.LLCTimeout)
	var r llc.AddLink
	if err == nil {
		err = r.Decode(b[:])
	}
	l.lg.e.log.Debug("smcr: empty add link answered", "lg", l.lg.id, "rejected", err == nil && r.Flags&llc.FlagAddLinkRejected != 0, "err", err)
}

// clientAddLink is the client's side of ADD_LINK (smc_llc_cli_add_link).
func (lg *linkGroup) clientAddLink(l1 *link, req llc.AddLink) {
	e := lg.e
	lg.addMu.Lock()
	defer lg.addMu.Unlock()
	reject := func() {
		l1.sendLLC(&llc.AddLink{Flags: llc.FlagResponse | llc.FlagAddLinkRejected, RejectReason: llc.RejectNoAltPath, Link: req.Link})
	}
	di := lg.secondDevice()
	po, ok := lg.otherPeerOffer((*[16]byte)(&req.GID), l1)
	num := uint8(req.Link)
	if di < 0 || !ok || !canRegister(l1) || !req.MTU.Valid() || lg.liveLinks() >= maxLinks ||
		!portUp(e.cfg.Devices[di]) || !lg.numFree(num) {
		reject()
		return
	}
	drain(lg.addCont)
	l2, err := newLink(lg, e.cfg.Devices[di], num)
	if err != nil {
		e.log.Warn("smcr: add link", "lg", lg.id, "err", err)
		reject()
		return
	}
	if err := lg.clientAddLinkOn(l1, l2, req, po); err != nil {
		e.log.Warn("smcr: add link failed", "lg", lg.id, "err", err)
		lg.dropLink(l2, err)
		return
	}
	e.st.addLinks.Add(1)
	e.log.Info("smcr: second link up", "lg", lg.id, "link", l2.num, "device", l2.dev.Name())
}

func (lg *linkGroup) clientAddLinkOn(l1, l2 *link, req llc.AddLink, po offer) error {
	cfg := lg.e.cfg
	ctx, cancel := context.WithTimeout(l1.ctx, cfg.CLCTimeout+4*cfg.LLCTimeout)
	defer cancel()
	l2.startConnect(verbs.QPAttr{QPN: uint32(req.QPN), PSN: uint32(req.PSN), GID: req.GID, MAC: req.MAC, MTU: verbs.MTU(req.MTU), Endpoint: po.Endpoint})
	qa := l2.qp.Attr()
	resp := &llc.AddLink{Flags: llc.FlagResponse, MAC: qa.MAC, GID: qa.GID, QPN: llc.QPN(qa.QPN), Link: req.Link, MTU: llc.MTU(l2.mtu), PSN: llc.PSN(qa.PSN)}
	if err := l1.sendLLC(resp); err != nil {
		return err
	}
	if err := lg.recvRKeys(ctx, l1, l2, false); err != nil {
		return err
	}
	// The server connected its QP before it sent its rkeys.
	if err := l2.waitConnected(ctx); err != nil {
		return err
	}
	if err := lg.sendRKeysAndAppend(l1, l2); err != nil {
		return err
	}
	return l2.confirmLinkClient(ctx)
}

// sendRKeysAndAppend is the client's part under flow: our rkeys on l2, then l2 in
// the group. In the group before the answer to CONFIRM_LINK: the server places
// connections on the link as soon as it has the answer, and our CLC finds the
// link by its peer QP.
func (lg *linkGroup) sendRKeysAndAppend(l1, l2 *link) error {
	lg.flow.Lock()
	defer lg.flow.Unlock()
	if err := lg.sendRKeys(l1, l2, true); err != nil {
		return err
	}
	return lg.appendLink(l2)
}

func (lg *linkGroup) appendLink(l *link) error {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	if lg.dead {
		return ErrLinkDown
	}
	lg.links = append(lg.links, l)
	lg.mostLinks = max(lg.mostLinks, len(lg.links))
	return nil
}

// dropLink undoes a link that did not come up.
func (lg *linkGroup) dropLink(l *link, err error) {
	lg.mu.RLock()
	in := slices.Contains(lg.links, l)
	lg.mu.RUnlock()
	if in {
		lg.linkFailed(l, err, true)
		return
	}
	l.close()
	lg.forgetLink(l)
}

func drain(ch chan llc.AddLinkCont) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// sendRKeys registers every RMB of the group on l2 and sends the rkeys in
// ADD_LINK_CONT messages on l1: requests from the server, responses from the
// client. At least one message goes, with Remaining 0 when there is no RMB.
func (lg *linkGroup) sendRKeys(l1, l2 *link, resp bool) error {
	lg.mu.RLock()
	conns := make([]*Conn, 0, len(lg.conns))
	for _, c := range lg.conns {
		conns = append(conns, c)
	}
	lg.mu.RUnlock()
	var pairs []llc.RkeyPair
	for _, c := range conns {
		old, nw, err := c.registerRMB(l1, l2)
		if err != nil {
			return err
		}
		if old != nil && nw != nil {
			pairs = append(pairs, llc.RkeyPair{RKey: old.RKey(), NewRKey: nw.RKey(), NewAddr: nw.Addr()})
		}
	}
	for first := true; first || len(pairs) > 0; first = false {
		m := &llc.AddLinkCont{Link: llc.LinkID(l2.num), Remaining: uint8(len(pairs))}
		if resp {
			m.Flags |= llc.FlagResponse
		}
		n := copy(m.Pairs[:], pairs)
		pairs = pairs[n:]
		if err := l1.sendLLC(m); err != nil {
			return err
		}
	}
	return nil
}

// recvRKeys takes the peer's ADD_LINK_CONT messages until the last one.
func (lg *linkGroup) recvRKeys(ctx context.Context, l1, l2 *link, resp bool) error {
	t := newTimer(lg.e.cfg.Clock, 2*lg.e.cfg.LLCTimeout)
	defer t.Stop()
	for {
		select {
		case m := <-lg.addCont:
			if m.Response() != resp || uint8(m.Link) != l2.num {
				return fmt.Errorf("%w: unexpected add link cont for link %d", ErrProtocol, m.Link)
			}
			for _, p := range m.Entries() {
				lg.addPeerRKey(false, l1.num, p.RKey, 0, llc.RToken{Link: llc.LinkID(l2.num), RKey: p.NewRKey, Addr: p.NewAddr})
			}
			if m.Remaining <= llc.AddLinkContPairs {
				return nil
			}
		case <-t.C:
			return fmt.Errorf("add link cont: %w", errLLCTimeout)
		case <-ctx.Done():
			return fmt.Errorf("add link cont: %w", ctx.Err())
		}
	}
}

// registerRMB registers c's RMB on l2 unless it is already, and returns its
// registrations on l1 and l2 (nil once c is released).
func (c *Conn) registerRMB(l1, l2 *link) (old, nw verbs.MR, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing.released || c.rmb == nil {
		return nil, nil, nil
	}
	if c.move.rmbOn[l2.ix] == nil {
		r, ok := l2.pd.(verbs.Registrar)
		if !ok {
			return nil, nil, fmt.Errorf("smcr: device %s cannot register an rmb twice", l2.dev.Name())
		}
		mr, err := r.RegisterMR(c.rmb, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		if err != nil {
			return nil, nil, fmt.Errorf("smcr: register rmb on link %d: %w", l2.num, err)
		}
		c.move.rmbOn[l2.ix] = mr
		c.move.regLink[l2.ix] = l2
		l2.holdPD()
	}
	return c.move.rmbOn[l1.ix], c.move.rmbOn[l2.ix], nil
}

// registerSnd registers c's send buffer on l, the source of WRITEs on it.
func (c *Conn) registerSnd(l *link) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing.released || c.snd == nil || c.move.sndOn[l.ix] != nil {
		return nil
	}
	r, ok := l.pd.(verbs.Registrar)
	if !ok {
		return fmt.Errorf("smcr: device %s cannot register a send buffer twice", l.dev.Name())
	}
	mr, err := r.RegisterMR(c.snd, verbs.AccessLocalWrite)
	if err != nil {
		return fmt.Errorf("smcr: register send buffer on link %d: %w", l.num, err)
	}
	c.move.sndOn[l.ix] = mr
	c.move.regLink[l.ix] = l
	l.holdPD()
	return nil
}

// announceRMB registers a new connection's RMB on the group's other links and
// sends CONFIRM_RKEY on its own link with those rkeys too. A pooled RMB
// registered on every live link is known to the peer under all its rkeys
// already (it keeps an RMB until our DELETE_RKEY): it goes unannounced, as
// Linux's is_conf_rkey, and its connection's setup takes no LLC round trip.
func (c *Conn) announceRMB() error {
	lg := c.lg
	lg.flow.RLock()
	defer lg.flow.RUnlock()
	lg.mu.RLock()
	links := slices.Clone(lg.links)
	lg.mu.RUnlock()
	if c.rmbPooled && c.rmbOnEvery(links) {
		return nil
	}
	var others []llc.RToken
	for _, l := range links {
		if l == c.lnk || l.down.Load() || len(others) == llc.ConfirmRkeyOthers {
			continue
		}
		_, mr, err := c.registerRMB(c.lnk, l)
		if err != nil {
			return err
		}
		if mr != nil {
			others = append(others, llc.RToken{Link: llc.LinkID(l.num), RKey: mr.RKey(), Addr: mr.Addr()})
		}
	}
	done, err := c.lnk.announceRKey(c.rmb, others...)
	c.mu.Lock()
	c.rkeyAnnounced = done
	c.mu.Unlock()
	return err
}

// rmbOnEvery reports whether c's RMB is registered on every live link of links.
func (c *Conn) rmbOnEvery(links []*link) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range links {
		if !l.down.Load() && c.move.rmbOn[l.ix] == nil {
			return false
		}
	}
	return true
}

// cdcDone records that a CDC numbered seq announcing prod completed, and whether
// it carried our closed or abnormal-close flag; it runs in the poller.
func (c *Conn) cdcDone(prod uint64, seq uint16, term bool) {
	// A failover validation repeats an older number: keep the newest.
	if old := uint16(c.move.seqAcked.Load()); !rmb.SeqBefore(seq, old) {
		c.move.seqAcked.Store(uint32(seq))
	}
	for {
		old := c.move.txAcked.Load()
		if prod <= old || c.move.txAcked.CompareAndSwap(old, prod) {
			break
		}
	}
	if term {
		c.mu.Lock()
		c.closing.termAcked = true
		c.queueReleaseIfDueLocked()
		c.mu.Unlock()
	}
}

// linkFailed takes a failed link out of the group: its connections move to the
// surviving link and the peer hears DELETE_LINK (when notify); with no link left
// the group terminates and its connections continue over TCP (resync.go).
func (lg *linkGroup) linkFailed(l *link, err error, notify bool) {
	lg.mu.Lock()
	i := slices.Index(lg.links, l)
	if lg.dead || i < 0 {
		lg.mu.Unlock()
		l.close() // gone already, or a link still being added
		return
	}
	var alive *link
	for _, o := range lg.links {
		if o != l && !o.down.Load() {
			alive = o
			break
		}
	}
	if alive == nil {
		lg.mu.Unlock()
		lg.terminate(err, false)
		return
	}
	defer func() { go lg.readdLink() }()
	lg.links = slices.Delete(lg.links, i, i+1)
	lg.gone.add(l.info())
	conns := make([]*Conn, 0, len(lg.conns))
	for _, c := range lg.conns {
		conns = append(conns, c)
	}
	lg.mu.Unlock()
	lg.e.log.Warn("smcr: link removed, moving its connections", "lg", lg.id, "link", l.num, "to", alive.num, "err", err)
	// Writers wait while their connection moves: mark them before the link's
	// context ends, which wakes those blocked on it.
	var mine []*Conn
	for _, c := range conns {
		c.mu.Lock()
		if c.lnk == l && !c.closing.released {
			c.move.moving = true
			mine = append(mine, c)
		}
		c.mu.Unlock()
	}
	l.close()
	l.wg.Wait() // its poller is gone: writes it did not complete never will
	for _, c := range mine {
		c.settleWrites(l)
	}
	if notify {
		alive.sendLLC(&llc.DeleteLink{Link: llc.LinkID(l.num), Reason: llc.ReasonLostPath})
	}
	for _, c := range mine {
		c.moveTo(l, alive)
	}
	lg.forgetLink(l)
}

// settleWrites completes c's WRITEs still counted on l, whose poller is gone:
// they complete never (postData's failure path knows they may be taken).
func (c *Conn) settleWrites(l *link) {
	for n := c.move.wrOutOn[l.ix].Swap(0); n > 0; n-- {
		c.writeDone()
	}
}

// awaitResend holds moveTo, and so the writers, until the WRITEs it resent on
// nw completed (nothing else of c's is on nw yet): the peer may consume those
// bytes as the old link delivered them before the resend reads them, and a
// writer must not refill a region a WRITE still reads. A failure of nw settles
// them; a group that ends leaves the send buffer to the continuation.
func (c *Conn) awaitResend(nw *link) {
	for c.move.wrOutOn[nw.ix].Load() > 0 {
		c.mu.Lock()
		gone := c.lnkErr || c.closing.released
		c.mu.Unlock()
		if gone {
			return
		}
		pause()
	}
}

// resendValidate posts, as one chain on nw, the WRITEs of [from, to) of the send
// buffer (rmb.AppendSpans) and the failover validation behind them: one post where a post per request cost a system call
// each on rxe, for every connection a failover moves. The caller holds cdcMu.
func (c *Conn) resendValidate(nw *link, from, to uint64) error {
	c.mu.Lock()
	m, ok, err := c.nextCDCLocked(rmb.FlagFailoverValidation, cdcState)
	prod := c.tx.Pos()
	c.mu.Unlock()
	if !ok {
		return err
	}
	var w [2]rmb.Span
	return nw.postData(c, rmb.AppendSpans(w[:0], from, uint32(to-from), c.tx.Size()), &m, prod)
}

// fenceMovedFrom runs in l's poller when the peer validates c on l: the peer
// moved c there from the link c is on for us, which failed on the peer's side
// though perhaps not yet on ours. That link must land nothing more in our RMB
// before we take the cursors that follow (the validation comes first, on l): a
// WRITE late over it would land on bytes the peer rewrites over l, after we
// read them and the peer reuses the region. Closing its QP stops it (an RNIC
// executes nothing once its QP leaves RTS; soft's Close waits for a WRITE it is
// copying), and linkFailed then moves our side, as a DELETE_LINK would.
func (c *Conn) fenceMovedFrom(l *link) {
	c.mu.Lock()
	old := c.lnk
	c.mu.Unlock()
	if old == nil || old == l || old.lg != l.lg || l.down.Load() {
		return // (a validation drained from a link we found failed too fences nothing)
	}
	wasDown := old.down.Load() // then linkFailed runs already
	old.close()
	if !wasDown {
		c.e.log.Info("smcr: peer moved a connection off a link; closing it", "lg", l.lg.id, "link", old.num, "to", l.num, "conn", c.id)
		go l.lg.linkFailed(old, fmt.Errorf("%w: the peer moved connection %d to link %d", ErrLinkDown, c.id, l.num), true)
	}
}

// moveTo moves c from the failed link old to nw (smc_switch_conns): it resends
// every byte the peer has not confirmed consuming, [peer consumer, producer) of tx, from the send
// buffer, which mirrors the peer's RMBE, to the same offsets through nw, then a
// failover-validation CDC and a CDC with the cursors. Bytes the peer already
// holds are overwritten with themselves; the regions it consumed but we do not
// know of are not reused before its next consumer cursor. The peer answers the
// validation with its cursors, so nothing waits on a CDC lost with old.
func (c *Conn) moveTo(old, nw *link) {
	tok, ok := c.lg.peerToken(c.move.peerKey.link, c.move.peerKey.rkey, nw)
	regErr := c.registerSnd(nw)
	// No CDC of c's may go on nw ahead of the resend's WRITEs: it would announce
	// bytes the peer does not hold yet, and the peer would read what its RMB held
	// before (a Read's consumer update carries our producer cursor too). CDCs
	// wait for cdcMu, which the move holds until its own are posted.
	c.cdcMu.Lock()
	c.mu.Lock()
	if c.closing.released || c.lnk != old || c.cont.fo {
		// Gone, moved already, or continuing over TCP with frozen cursors.
		c.move.moving = false
		closed := c.closing.appClosed && !c.closing.released
		c.mu.Unlock()
		c.cdcMu.Unlock()
		if closed {
			c.maybeRelease()
		}
		wake(c.txWake)
		return
	}
	if c.st == stateInit || c.tx.Size() == 0 {
		// Still in CLC on the failed link: it falls back, or continues over TCP
		// once active, as with a group's last link (linkDown).
		c.move.moving = false
		c.mu.Unlock()
		c.cdcMu.Unlock()
		c.linkDown(fmt.Errorf("%w: link %d failed during setup", ErrLinkDown, old.num))
		return
	}
	if !ok || regErr != nil {
		c.move.moving = false
		c.mu.Unlock()
		c.cdcMu.Unlock()
		c.e.log.Warn("smcr: cannot move connection", "conn", c.id, "link", nw.num, "rkey_known", ok, "err", regErr)
		c.linkDown(fmt.Errorf("%w: cannot move to link %d", ErrLinkDown, nw.num))
		return
	}
	c.awaitPostersLocked(false)
	c.lnk = nw
	c.peerRKey, c.peerAddr = tok.rkey, tok.addr
	c.move.peerKey = rkeyOn{nw.num, tok.rkey} // old's key goes with its slot
	// The peer holds every byte before the cursor of our last completed CDC (RC
	// order: the WRITEs went before it), and may be reading them: resend after it.
	from, to := max(c.tx.PeerConsumerPos(), c.move.txAcked.Load()), c.tx.Pos()
	pend := c.ctlPending &^ ctlQueued // a queue entry on old died with its worker
	c.ctlPending = 0
	c.mu.Unlock()
	// A writer that was posting on old as it failed (txBusy, waited for above)
	// may have counted WRITEs after linkFailed settled old's: settle again.
	// Nothing posts on old any more (c.lnk is nw).
	c.settleWrites(old)
	if h := testHookCopy.Load(); h != nil {
		(*h)(c, false)
	}
	resent := to - from
	err := c.resendValidate(nw, from, to)
	if err == nil {
		err = c.sendCDCHeld(0, cdcState) // the cursors: the peer takes none from a validation
	}
	c.cdcMu.Unlock()
	c.awaitResend(nw)
	c.mu.Lock()
	c.move.moving = false
	if pend != 0 {
		c.queueCtlLocked(pend)
	}
	closed := c.closing.appClosed // during the move: the release waited for it
	c.mu.Unlock()
	if closed {
		c.maybeRelease()
	}
	c.wakeApp()
	if err != nil && !errors.Is(err, ErrLinkDown) {
		c.e.log.Warn("smcr: moving connection", "conn", c.id, "err", err)
	}
	c.e.st.movedConns.Add(1)
	c.e.log.Debug("smcr: connection moved", "conn", c.id, "from", old.num, "to", nw.num, "resent", resent)
}
