// Link groups: the links (RC QPs) to one peer that its connections share, found for
// reuse by peer ID and provider, at most 255 connections each, freed when idle.
// RFC 7609 §3.3 (link groups) and §3.4 (first contact), after Linux's smc_core.

package smcr

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/smcr-io/smcr/llc"
	"github.com/smcr-io/smcr/smcr/clc"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// lgKey identifies the peer a link group reaches, from one side's role.
type lgKey struct {
	client   bool // our role: Linux keeps client and server link groups apart
	peer     [8]byte
	kind     verbs.Kind
	peerGID  [16]byte
	endpoint string
	v2       bool // SMC-R version 2: its LLC messages are of version 2 (llc.go)
}

// linkGroup is the set of links to one peer and the connections on them.
//
// Lock order (lockrank.go): addMu, then flow, before its links' mutexes; mu
// after the Engine's mu and before a Conn's mu.
type linkGroup struct {
	e   *Engine
	id  uint32
	key lgKey
	dev int

	ready     chan struct{} // closed when first contact ended; readyErr says how
	readyErr  error
	readyOnce sync.Once

	v2 clc.V2Terms // a version-2 group's terms, from its first contact

	firstConn *Conn      // the connection doing first contact, until ready
	peerAddr  netip.Addr // its peer's IP address, for smcrctl

	// addMu serialises ADD_LINK exchanges. flow serialises the part of one that
	// registers and exchanges the rkeys of every RMB and puts the new link in the
	// group (write lock) with the registration and announcement of new RMBs (read
	// lock: announcements go in parallel), so every RMB reaches the peer with its
	// rkey on every link. ADD_LINK itself and the new QP's connection stay out of
	// flow: a path that does not answer must not hold up connection setups.
	addMu      mutex[groupAddRank]
	addQueued  atomic.Int32 // a client's ADD_LINK exchanges running or waiting for addMu
	flow       rwMutex[groupFlowRank]
	peerOffers []offer              // the peer's devices, for the endpoint of a second link
	addCont    chan llc.AddLinkCont // ADD_LINK_CONT messages, for the ADD_LINK flow

	mu        rwMutex[groupRank]
	conns     map[uint32]*Conn // by our alert token
	reserved  int              // connections on it or setting up
	links     []*link
	mostLinks int              // the most links it has had at once (LinkGroupInfo)
	gone      linkTraffic      // what links taken out of it moved: the totals only grow
	rr        int              // round robin over the links for new connections
	peerRMBs  peerRMBTable     // the peer's RMBs we were told of, by rkey on each link
	rkeyAdded chan struct{}    // closed and replaced whenever peerRMBs grows
	pool      []*pooledBuf     // released connections' buffers (bufpool.go)
	slots     [linkSlots]*link // links that hold a slot: live, being added, or gone but with registrations left
	lastNum   uint8            // the link number last taken (multilink.go)
	readding  bool             // a readdLink loop runs
	idle      Timer
	dead      bool
	deadErr   error
}

// rkeyOn names a peer RMB by its rkey on one link (rkeys of two devices may clash).
type rkeyOn struct {
	link uint8
	rkey uint32
}

// rtoken is where one RMB of the peer is reached through one link.
type rtoken struct {
	rkey uint32
	addr uint64
	num  uint8 // the link's number, which with rkey is the entry's key
	ok   bool
}

// peerRTokens are one peer RMB's rtokens, indexed by link slot.
type peerRTokens [linkSlots]rtoken

// maxPeerRMBs bounds the peer RMBs a link group knows. A peer of ours holds at
// most maxConnsPerLGR in use and maxPooled pooled (Linux: 255 in all), and
// withdraws the others with DELETE_RKEY; twice that leaves room for
// withdrawals on their way, and a peer that announces more is refused.
const maxPeerRMBs = 2 * (maxConnsPerLGR + maxPooled)

// peerRMBTable holds the peer's RMBs, each under its rkey on every link it was
// announced on (a failed link's key stays while the link holds its slot; a
// connection that moves takes its new link's key), and counts the RMBs so that a
// peer cannot make it grow without bound.
type peerRMBTable struct {
	byKey map[rkeyOn]*peerRTokens
	keys  map[*peerRTokens]int // the keys naming each RMB
}

func newPeerRMBTable() peerRMBTable {
	return peerRMBTable{byKey: map[rkeyOn]*peerRTokens{}, keys: map[*peerRTokens]int{}}
}

func (t *peerRMBTable) get(k rkeyOn) *peerRTokens { return t.byKey[k] }

// rmbs counts the RMBs named by some key.
func (t *peerRMBTable) rmbs() int { return len(t.keys) }

func (t *peerRMBTable) set(k rkeyOn, e *peerRTokens) {
	if old := t.byKey[k]; old == e {
		return
	} else if old != nil {
		t.unref(old)
	}
	t.byKey[k] = e
	t.keys[e]++
}

func (t *peerRMBTable) del(k rkeyOn) {
	if old := t.byKey[k]; old != nil {
		delete(t.byKey, k)
		t.unref(old)
	}
}

// delIf removes key k if it names entry e (an RMB announced again since
// under the same key is another entry, which stays).
func (t *peerRMBTable) delIf(k rkeyOn, e *peerRTokens) {
	if t.byKey[k] == e {
		t.del(k)
	}
}

func (t *peerRMBTable) unref(e *peerRTokens) {
	if t.keys[e]--; t.keys[e] <= 0 {
		delete(t.keys, e)
	}
}

// LinkGroupInfo describes a link group for smcrctl.
type LinkGroupInfo struct {
	ID       uint32
	Role     string // "client" or "server"
	Peer     string // peer ID, hex
	Provider string
	PeerAddr netip.Addr // the peer's IP address of first contact
	Conns    int
	Links    []LinkInfo
	// MostLinks is the most links the group has had at once: fewer live
	// links than that is a path lost, which a failover restores.
	MostLinks int
	// The work requests and payload of every link the group has had, failed
	// ones included, so that they only grow (the links' own go with them).
	Sent, Received, TxBytes, RxBytes uint64
}

// linkTraffic sums links' counters.
type linkTraffic struct{ sent, received, txBytes, rxBytes uint64 }

func (t *linkTraffic) add(li LinkInfo) {
	t.sent += li.Sent
	t.received += li.Received
	t.txBytes += li.TxBytes
	t.rxBytes += li.RxBytes
}

// LinkInfo describes one link of a link group.
type LinkInfo struct {
	Num      uint8
	Conns    int // connections sending on this link
	Device   string
	Port     int // the device's port (verbs.PortAttr.Num, at least 1)
	QPN      uint32
	PeerQPN  uint32
	State    string // as Linux names smc_link states: active, activating, inactive
	QPState  string // the queue pair's: RTS, ERROR, …
	Sent     uint64 // work requests posted: RDMA WRITEs and SENDs (CDC, LLC)
	Received uint64 // messages received: the peer's SENDs, which its Sent counts with its WRITEs
	TxBytes  uint64 // payload RDMA-written to the peer
	RxBytes  uint64 // payload the peer RDMA-wrote to us, as its CDCs announced
	PeerGID  [16]byte
	Errors   uint64 // completions in error (flushes not counted) and malformed messages from the peer
	// ErrorsByKind splits Errors: a completion status's name ("remote
	// access error", ...), or "protocol error"; only the kinds seen.
	ErrorsByKind map[string]uint64
	RTT          time.Duration // the last TEST_LINK's round trip; 0 before the first
	Tested       time.Time     // when it was answered (a link that receives is not tested: as Linux)
}

// startFirstContact makes c the group's first contact.
func (lg *linkGroup) startFirstContact(c *Conn) {
	lg.firstConn = c
	if a, ok := c.tcp.RemoteAddr().(*net.TCPAddr); ok {
		lg.mu.Lock()
		lg.peerAddr = a.AddrPort().Addr().Unmap()
		lg.mu.Unlock()
	}
}

// LinkGroups lists the engine's link groups.
func (e *Engine) LinkGroups() []LinkGroupInfo {
	e.mu.Lock()
	lgs := slices.Clone(e.lgs)
	e.mu.Unlock()
	out := make([]LinkGroupInfo, 0, len(lgs))
	for _, lg := range lgs {
		role := "server"
		if lg.key.client {
			role = "client"
		}
		lg.mu.RLock()
		info := LinkGroupInfo{ID: lg.id, Role: role, Peer: fmt.Sprintf("%x", lg.key.peer[:]),
			Provider: lg.key.kind.String(), PeerAddr: lg.peerAddr, Conns: len(lg.conns), MostLinks: lg.mostLinks}
		total := lg.gone
		perLink := map[*link]int{}
		for _, c := range lg.conns {
			c.mu.Lock()
			perLink[c.lnk]++
			c.mu.Unlock()
		}
		for _, l := range lg.links {
			li := l.info()
			li.Conns = perLink[l]
			total.add(li)
			info.Links = append(info.Links, li)
		}
		lg.mu.RUnlock()
		info.Sent, info.Received, info.TxBytes, info.RxBytes = total.sent, total.received, total.txBytes, total.rxBytes
		out = append(out, info)
	}
	return out
}

// info describes l, but for its connections.
func (l *link) info() LinkInfo {
	li := LinkInfo{Num: l.num, Device: l.dev.Name(), Port: max(l.dev.Port().Num, 1), QPN: l.qp.Attr().QPN,
		PeerQPN: l.peer.QPN, State: l.state(), QPState: l.qp.State().String(), Sent: l.posted.Load(), Received: l.received.Load(),
		TxBytes: l.txBytes.Load(), RxBytes: l.rxBytes.Load(), PeerGID: l.peer.GID, Errors: l.errs.Load(), ErrorsByKind: l.errorsByKind(),
		RTT: time.Duration(l.rtt.Load())}
	if at := l.testedAt.Load(); at != 0 {
		li.Tested = time.Unix(0, at)
	}
	return li
}

// state names the link's state as Linux's smc_link does: active once its queue
// pair is ready to send and the link is not failed, activating before that.
func (l *link) state() string {
	switch {
	case l.down.Load() || l.qp.State() == verbs.QPError:
		return "inactive"
	case l.qp.State() == verbs.QPRTS:
		return "active"
	}
	return "activating"
}

// newLinkGroup creates a link group with one link on device di and registers it.
func (e *Engine) newLinkGroup(key lgKey, di int) (*linkGroup, error) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, ErrEngineClosed
	}
	e.lgSeq++
	lg := &linkGroup{e: e, id: e.lgSeq, key: key, dev: di, ready: make(chan struct{}),
		conns: map[uint32]*Conn{}, peerRMBs: newPeerRMBTable(), rkeyAdded: make(chan struct{}),
		addCont: make(chan llc.AddLinkCont, maxConnsPerLGR), lastNum: 1, mostLinks: 1}
	e.mu.Unlock()
	l, err := newLink(lg, e.cfg.Devices[di], 1)
	if err != nil {
		return nil, fmt.Errorf("smcr: new link group: %w", err)
	}
	// Under lg.mu: the link's poller may already fail it (linkFailed).
	lg.mu.Lock()
	lg.links = []*link{l}
	lg.mu.Unlock()
	e.mu.Lock()
	if e.closed {
		// Close began while the link was made and ends the groups listed
		// then: this one would be left running, its link never freed.
		e.mu.Unlock()
		l.close()
		return nil, ErrEngineClosed
	}
	e.lgs = append(e.lgs, lg)
	e.mu.Unlock()
	e.st.firstContact.Add(1)
	e.log.Info("smcr: link group created", "lg", lg.id, "role", key.client, "peer", fmt.Sprintf("%x", key.peer[:]), "provider", key.kind)
	return lg, nil
}

// serverLinkGroup finds a link group to the client for reuse, or creates one (first
// contact). Concurrent proposals from one peer wait for its first contact.
func (e *Engine) serverLinkGroup(ctx context.Context, key lgKey, di int) (*linkGroup, bool, error) {
	for {
		// One search-or-create at a time: a group is listed only once its link
		// exists, and concurrent Proposals from one peer must find it then rather
		// than each start a first contact of its own.
		e.lgCreate.Lock()
		e.mu.Lock()
		var found *linkGroup
		for _, lg := range e.lgs {
			if lg.key == key && lg.tryReserve() {
				found = lg
				break
			}
		}
		e.mu.Unlock()
		if found == nil {
			lg, err := e.newLinkGroup(key, di)
			if err == nil {
				lg.reserve()
			}
			e.lgCreate.Unlock()
			if err != nil {
				return nil, false, err
			}
			return lg, true, nil
		}
		e.lgCreate.Unlock()
		if err := found.waitReady(ctx); err != nil {
			found.unreserve()
			if ctx.Err() != nil {
				return nil, false, ctx.Err()
			}
			continue // that first contact failed: try again, maybe as first contact
		}
		return found, false, nil
	}
}

// clientLinkGroup finds the link group the server's Accept refers to.
func (e *Engine) clientLinkGroup(ctx context.Context, key lgKey, qpn uint32) (*linkGroup, error) {
	e.mu.Lock()
	var found *linkGroup
	for _, lg := range e.lgs {
		// The Accept names the GID and QP of the link the server picked, which
		// may be the second one: match the peer by any of its links.
		k := lg.key
		k.peerGID = key.peerGID
		// The server counts the group's connections and chose it: our own count
		// may run ahead (connections it released still releasing here), so the
		// 255 limit is not ours to apply.
		if k == key && lg.hasPeer(key.peerGID, qpn) && lg.tryReserveUpTo(math.MaxInt) {
			found = lg
			break
		}
	}
	e.mu.Unlock()
	if found == nil {
		return nil, fmt.Errorf("smcr: no link group with peer qp %d", qpn)
	}
	if err := found.waitReady(ctx); err != nil {
		found.unreserve()
		return nil, err
	}
	return found, nil
}

func (lg *linkGroup) hasPeer(gid [16]byte, qpn uint32) bool {
	lg.mu.RLock()
	defer lg.mu.RUnlock()
	for _, l := range lg.links {
		if l.peer.QPN == qpn && l.peer.GID == gid {
			return true
		}
	}
	return false
}

func (lg *linkGroup) primary() *link {
	lg.mu.RLock()
	defer lg.mu.RUnlock()
	for _, l := range lg.links {
		if !l.down.Load() {
			return l
		}
	}
	return nil
}

// pick chooses the link for a new connection: round robin over the live links,
// which spreads the connections (load balancing, as Linux's smc_llc_usable_link).
func (lg *linkGroup) pick() *link {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	for range lg.links {
		lg.rr++
		if l := lg.links[lg.rr%len(lg.links)]; !l.down.Load() {
			return l
		}
	}
	return nil
}

// linkByPeer returns the live link whose peer end is QP qpn on the device gid.
func (lg *linkGroup) linkByPeer(gid [16]byte, qpn uint32) *link {
	lg.mu.RLock()
	defer lg.mu.RUnlock()
	for _, l := range lg.links {
		if l.peer.QPN == qpn && l.peer.GID == gid && !l.down.Load() {
			return l
		}
	}
	return nil
}

// linkByNum returns the link numbered num, live or not.
func (lg *linkGroup) linkByNum(num uint8) *link {
	lg.mu.RLock()
	defer lg.mu.RUnlock()
	for _, l := range lg.links {
		if l.num == num {
			return l
		}
	}
	return nil
}

// tryReserve takes a connection slot unless the group is dead or full: 255
// connections, or in a version-2 group of release 2.1 the max conns agreed.
func (lg *linkGroup) tryReserve() bool { return lg.tryReserveUpTo(-1) }

// setTerms records a version-2 group's terms, from its first contact.
func (lg *linkGroup) setTerms(t clc.V2Terms) {
	lg.mu.Lock()
	lg.v2 = t
	lg.mu.Unlock()
}

// tryReserveUpTo takes a connection slot unless the group is dead or holds max
// (-1: the group's own limit, tryReserve's).
func (lg *linkGroup) tryReserveUpTo(max int) bool {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	if max < 0 {
		max = maxConnsPerLGR
		if lg.key.v2 && lg.v2.Release >= clc.Release21 && lg.v2.MaxConns > 0 {
			max = min(max, int(lg.v2.MaxConns))
		}
	}
	if lg.dead || lg.reserved >= max {
		return false
	}
	lg.reserved++
	if lg.idle != nil {
		lg.idle.Stop()
		lg.idle = nil
	}
	return true
}

func (lg *linkGroup) reserve() {
	lg.mu.Lock()
	lg.reserved++
	lg.mu.Unlock()
}

// unreserve gives a slot back; the last one starts the idle timer.
func (lg *linkGroup) unreserve() {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	lg.reserved--
	if lg.reserved == 0 && !lg.dead {
		delay := lg.e.cfg.LinkGroupIdle
		if lg.key.client {
			// The server frees an idle group first, as Linux's
			// SMC_LGR_FREE_DELAY_CLNT: a client that did could receive an
			// Accept reusing it (its Proposal crossed our timer) and decline.
			delay += clientIdleMargin
		}
		lg.idle = lg.e.cfg.Clock.AfterFunc(delay, lg.idleExpired)
	}
}

// clientIdleMargin is how much longer a client keeps an idle link group than
// the server.
const clientIdleMargin = 10 * time.Second

func (lg *linkGroup) idleExpired() {
	idle := func() bool { return lg.reserved == 0 }
	if lg.terminateIf(idle, errors.New("smcr: link group idle"), true) {
		lg.e.log.Info("smcr: link group idle, freed", "lg", lg.id)
	}
}

func (lg *linkGroup) setReady(err error) {
	if lg.markReady(err) && err != nil {
		lg.terminate(err, false)
	}
}

// markReady ends the first-contact wait once; it reports whether this call did.
func (lg *linkGroup) markReady(err error) bool {
	done := false
	lg.readyOnce.Do(func() {
		lg.readyErr = err
		close(lg.ready)
		done = true
	})
	return done
}

func (lg *linkGroup) waitReady(ctx context.Context) error {
	select {
	case <-lg.ready:
		return lg.readyErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// addConn lists c in the group, unless the group is ending: its connections
// were taken for the end already, and c would not be among them.
func (lg *linkGroup) addConn(c *Conn) bool {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	if lg.dead {
		return false
	}
	lg.conns[c.token] = c
	return true
}

func (lg *linkGroup) removeConn(c *Conn) {
	lg.mu.Lock()
	delete(lg.conns, c.token)
	lg.mu.Unlock()
}

func (lg *linkGroup) conn(token uint32) *Conn {
	lg.mu.RLock()
	c := lg.conns[token]
	lg.mu.RUnlock()
	return c
}

// addPeerRKey records a peer RMB known by rkey on link num and its rtokens on other
// links, and reports whether it could. ADD_LINK_CONT merges into the entry (every
// rkey names the same set); CONFIRM_RKEY (fresh) replaces the entry it names, if
// any, with a new one: the peer announces an RMB anew once it is registered on a
// link since, or a new RMB that got a withdrawn one's rkey. Each entry is known
// under exactly the rkeys it holds, so a peer cannot make the table grow by
// announcing rkeys again; a new entry is refused once it holds maxPeerRMBs.
func (lg *linkGroup) addPeerRKey(fresh bool, num uint8, rkey uint32, addr uint64, others ...llc.RToken) bool {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	t := lg.peerRMBs.get(rkeyOn{num, rkey})
	if t != nil && fresh {
		lg.forgetLocked(t)
		t = nil
	}
	if t == nil {
		if lg.peerRMBs.rmbs() >= maxPeerRMBs {
			return false
		}
		t = new(peerRTokens)
	}
	set := func(l *link, rkey uint32, addr uint64) {
		if old := t[l.ix]; old.ok && (old.rkey != rkey || old.num != l.num) {
			lg.peerRMBs.delIf(rkeyOn{old.num, old.rkey}, t)
		}
		t[l.ix] = rtoken{rkey: rkey, addr: addr, num: l.num, ok: true}
		lg.peerRMBs.set(rkeyOn{l.num, rkey}, t)
	}
	// Links we do not hold (any more, or numbered 0) are left out.
	if l := lg.slotOfLocked(num); l != nil && (!t[l.ix].ok || addr != 0) {
		set(l, rkey, addr) // ADD_LINK_CONT names no address
	}
	for _, o := range others {
		if l := lg.slotOfLocked(uint8(o.Link)); l != nil {
			set(l, o.RKey, o.Addr)
		}
	}
	close(lg.rkeyAdded)
	lg.rkeyAdded = make(chan struct{})
	return true
}

// forgetLocked removes the keys of entry t. The caller holds lg.mu.
func (lg *linkGroup) forgetLocked(t *peerRTokens) {
	for _, tok := range t {
		if tok.ok {
			lg.peerRMBs.delIf(rkeyOn{tok.num, tok.rkey}, t)
		}
	}
}

// delPeerRKey forgets the peer RMB known as rkey on link num under all its rkeys
// (DELETE_RKEY), and reports whether it knew it.
func (lg *linkGroup) delPeerRKey(num uint8, rkey uint32) bool {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	t := lg.peerRMBs.get(rkeyOn{num, rkey})
	if t == nil {
		return false
	}
	lg.forgetLocked(t)
	return true
}

// notePeerRMB records the peer RMB a CLC message names, which no CONFIRM_RKEY
// announced when it is first contact's.
func (lg *linkGroup) notePeerRMB(l *link, rkey uint32, addr uint64) {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	k := rkeyOn{l.num, rkey}
	if t := lg.peerRMBs.get(k); t == nil && lg.slots[l.ix] == l {
		t = new(peerRTokens)
		t[l.ix] = rtoken{rkey: rkey, addr: addr, num: l.num, ok: true}
		lg.peerRMBs.set(k, t)
	}
}

// peerToken returns the rtoken on link to of the peer RMB known as rkey on link
// number from.
func (lg *linkGroup) peerToken(from uint8, rkey uint32, to *link) (rtoken, bool) {
	lg.mu.RLock()
	defer lg.mu.RUnlock()
	t := lg.peerRMBs.get(rkeyOn{from, rkey})
	if t == nil || !t[to.ix].ok || t[to.ix].num != to.num {
		return rtoken{}, false
	}
	return t[to.ix], true
}

// waitPeerRKey waits until the peer has confirmed rkey on link l over LLC. The
// CONFIRM_RKEY request travels on the link, the CLC message naming the rkey on TCP:
// either may arrive first. It gives up at once when l fails: the request is lost
// with it, though the group may live on over another link.
func (lg *linkGroup) waitPeerRKey(ctx context.Context, l *link, rkey uint32) bool {
	t := newTimer(lg.e.cfg.Clock, lg.e.cfg.LLCTimeout)
	defer t.Stop()
	for {
		lg.mu.RLock()
		known, ch, dead := lg.peerRMBs.get(rkeyOn{l.num, rkey}) != nil, lg.rkeyAdded, lg.dead
		lg.mu.RUnlock()
		if known {
			return true
		}
		if dead || l.down.Load() {
			return false
		}
		select {
		case <-ch:
		case <-l.ctx.Done():
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// terminate ends the link group: every connection on it fails with err, the links
// are torn down (with an orderly DELETE_LINK to the peer when orderly is set).
func (lg *linkGroup) terminate(err error, orderly bool) { lg.terminateIf(nil, err, orderly) }

// terminateIf is terminate when cond, taken under lg.mu with the decision (nil:
// always), holds; it reports whether it ended the group.
func (lg *linkGroup) terminateIf(cond func() bool, err error, orderly bool) bool {
	lg.mu.Lock()
	if lg.dead || cond != nil && !cond() {
		lg.mu.Unlock()
		return false
	}
	lg.dead, lg.deadErr = true, err
	close(lg.rkeyAdded) // wake waitPeerRKey
	lg.rkeyAdded = make(chan struct{})
	if lg.idle != nil {
		lg.idle.Stop()
	}
	conns := make([]*Conn, 0, len(lg.conns))
	for _, c := range lg.conns {
		conns = append(conns, c)
	}
	links := slices.Clone(lg.links)
	lg.mu.Unlock()
	e := lg.e
	e.mu.Lock()
	if i := slices.Index(e.lgs, lg); i >= 0 {
		e.lgs = slices.Delete(e.lgs, i, i+1)
	}
	e.mu.Unlock()
	lg.markReady(err)
	lg.drainPool()
	for _, c := range conns {
		c.linkDown(err)
	}
	for _, l := range links {
		if orderly {
			l.sendDeleteLink()
		}
		l.close()
	}
	e.log.Info("smcr: link group terminated", "lg", lg.id, "reason", err)
	return true
}
