// Buffer reuse: a link group keeps the RMBs and send buffers of connections that
// ended in order and hands them to its next connections, as Linux does
// (smc_buf_get_slot). A pooled buffer stays registered on the group's links (an
// RMB under the rkeys the peer was told) and keeps its share of max_memory, so a
// reusing connection skips allocation and registration, and, as Linux's
// is_conf_rkey, the CONFIRM_RKEY exchange: the peer keeps an RMB it was told of
// until a DELETE_RKEY withdraws it, which we send when we deregister one.

package smcr

import (
	"slices"

	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// maxPooled bounds a link group's pool per kind: 16 × 512 KiB at most.
const maxPooled = 16

// pooledBuf is one buffer in a link group's pool.
type pooledBuf struct {
	rmb  bool // an RMB; else a send buffer
	size uint64
	own  verbs.MR            // the allocation, made in home's PD
	home *link               // whose PD holds own; nil when own is
	on   [linkSlots]verbs.MR // registrations by link slot, own among them unless home failed
	link [linkSlots]*link
	// used is how much of own, from its start, may hold the connection's
	// bytes: the stream's length, up to the size once it wrapped. Only that
	// much is cleared before the next connection takes it; clearing the
	// whole of a 512 KiB RMB and send buffer took a setup-and-close loop's
	// CPU a tenth of its time (~80 µs a connection) when most connections
	// carry a few bytes. Bytes a peer wrote past its producer cursor are its
	// own, and an orderly close leaves none of an honest peer's there.
	used uint64
}

// deregister closes b's registrations, second ones before the memory they map,
// and drops their holds on the links' protection domains and slots.
func (b *pooledBuf) deregister() {
	slotted := false // own is among on, held by home's slot too
	for n, m := range b.on {
		switch {
		case m == nil:
		case m == b.own:
			slotted = true
		default:
			m.Close()
			if b.link[n] != nil {
				b.link[n].releasePD()
			}
		}
	}
	if b.own == nil {
		return
	}
	b.own.Close()
	if slotted {
		b.home.releasePD()
	} else {
		b.home.releaseUnslotted()
	}
}

// free drops a pooled buffer and gives its memory back to max_memory.
func (lg *linkGroup) free(b *pooledBuf) {
	lg.drop(b)
	lg.e.pooled.Add(-int64(b.size))
	lg.e.unreserve(int64(b.size))
}

// dropHeld drops a buffer that is not in the pool (a released connection's, or
// one taken out of a connection) and gives its memory back to max_memory.
func (lg *linkGroup) dropHeld(b *pooledBuf) {
	lg.drop(b)
	lg.e.unreserve(int64(b.size))
}

// drop deregisters b. An RMB the peer may know is withdrawn first while the
// group lives (DELETE_RKEY, as Linux's smc_llc_do_delete_rkey): the peer keeps
// the RMBs it was told of until then. lg may be nil (a setup that got no group).
func (lg *linkGroup) drop(b *pooledBuf) {
	if lg != nil && b.rmb {
		lg.withdraw(b)
	}
	b.deregister()
}

// withdraw sends DELETE_RKEY for b on a live link of the group it is registered
// on, naming its rkey there; the peer forgets the RMB under all its rkeys. The
// link it was allocated on comes first: a new RMB that gets the same rkey from
// that device is announced on that link too, after the withdrawal. The answer
// is awaited in the background: a negative one (the peer never learnt of an RMB
// whose setup failed) or none changes nothing here.
func (lg *linkGroup) withdraw(b *pooledBuf) {
	select {
	case <-lg.ready:
	default:
		return // first contact has not ended: the peer knows no RMB of ours yet
	}
	lg.mu.RLock()
	defer lg.mu.RUnlock()
	if lg.dead || lg.readyErr != nil {
		return
	}
	var to *link
	for _, l := range lg.links {
		if m := b.on[l.ix]; m != nil && b.link[l.ix] == l && !l.down.Load() && (to == nil || m == b.own) {
			to = l
		}
	}
	if to != nil {
		go to.deleteRKey(b.on[to.ix].RKey())
	}
}

// usable reports whether every link b is registered on is still up, its home
// among them.
func (b *pooledBuf) usable() bool {
	if b.home == nil || b.home.down.Load() {
		return false
	}
	for n, m := range b.on {
		if m != nil && (b.link[n] == nil || b.link[n].down.Load()) {
			return false
		}
	}
	return true
}

// keep pools b unless the group is ending, holds enough of the kind, or one of
// b's links is down; it reports whether it did.
func (lg *linkGroup) keep(b *pooledBuf) bool {
	if !b.usable() {
		return false
	}
	lg.mu.Lock()
	defer lg.mu.Unlock()
	if lg.dead {
		return false
	}
	n := 0
	for _, p := range lg.pool {
		if p.rmb == b.rmb {
			n++
		}
	}
	if n >= maxPooled {
		return false
	}
	lg.pool = append(lg.pool, b)
	lg.e.pooled.Add(int64(b.size))
	return true
}

// take removes from the pool a buffer of the kind and size allocated on l, or
// returns nil. Buffers found on a link that went down are freed on the way.
func (lg *linkGroup) take(rmb bool, size uint64, l *link) *pooledBuf {
	var stale []*pooledBuf
	defer func() {
		for _, b := range stale {
			lg.free(b)
		}
	}()
	lg.mu.Lock()
	defer lg.mu.Unlock()
	for i := 0; i < len(lg.pool); i++ {
		b := lg.pool[i]
		if !b.usable() {
			stale = append(stale, b)
			lg.pool = slices.Delete(lg.pool, i, i+1)
			i--
			continue
		}
		if b.rmb == rmb && b.size == size && b.home == l {
			lg.pool = slices.Delete(lg.pool, i, i+1)
			lg.e.pooled.Add(-int64(b.size))
			return b
		}
	}
	return nil
}

// drainPool frees every pooled buffer: the group ends, or memory is short.
func (lg *linkGroup) drainPool() {
	lg.mu.Lock()
	pool := lg.pool
	lg.pool = nil
	lg.mu.Unlock()
	for _, b := range pool {
		lg.free(b)
	}
}

// reserveOrTrim reserves n bytes of max_memory, freeing the pools first when
// they hold what is missing.
func (e *Engine) reserveOrTrim(n int64) bool {
	if e.reserve(n) {
		return true
	}
	e.trimPools()
	return e.reserve(n)
}

// trimPools frees every link group's pool, for memory that is short.
func (e *Engine) trimPools() {
	e.mu.Lock()
	lgs := slices.Clone(e.lgs)
	e.mu.Unlock()
	for _, lg := range lgs {
		lg.drainPool()
	}
}

// fitsWithoutPools reports whether n more bytes would fit in max_memory were
// the pools freed.
func (e *Engine) fitsWithoutPools(n int64) bool {
	limit := e.settings().MaxMemory
	return limit == 0 || e.mem.Load()-e.pooled.Load()+n <= limit
}

// pooledHas reports whether the pool holds a buffer take would hand out.
func (lg *linkGroup) pooledHas(rmb bool, size uint64, l *link) bool {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	for _, b := range lg.pool {
		if b.rmb == rmb && b.size == size && b.home == l && b.usable() {
			return true
		}
	}
	return false
}

// takePooled takes a pooled buffer for c on its link, unless memory is over
// max_memory (lowered at run time): then the connection must account anew.
func (c *Conn) takePooled(rmb bool, size uint64) *pooledBuf {
	if c.cursors {
		return nil // its application may hold the memory past the release
	}
	if limit := c.e.settings().MaxMemory; limit > 0 && c.e.mem.Load() > limit {
		return nil
	}
	return c.lg.take(rmb, size, c.lnk)
}

// adopt makes b c's RMB or send buffer, with its registrations and memory.
func (c *Conn) adopt(b *pooledBuf) {
	c.mu.Lock()
	for n, m := range b.on {
		if m == nil {
			continue
		}
		if b.rmb {
			c.move.rmbOn[n] = m
		} else {
			c.move.sndOn[n] = m
		}
		c.move.regLink[n] = b.link[n]
	}
	if b.rmb {
		c.rmb, c.rx, c.move.rmbHome = b.own, rmb.NewConsumer(uint32(b.size)), b.home
	} else {
		c.snd, c.move.sndHome = b.own, b.home
	}
	c.mu.Unlock()
	c.memHeld += int64(b.size)
}

// releaseBuffers takes the RMB and send buffer out of a released connection and
// pools them when it ended in order: both ends closed, no WRITE of ours
// outstanding (and the peer's all landed before its closing CDC), the link up.
// An RMB whose CONFIRM_RKEY is still unanswered (a short connection: the answer
// takes a few wake-ups) joins the pool once answered, since its next user
// announces the same rkey and responses match by rkey. The rest is deregistered.
// It returns the bytes of max_memory the pool took over, or holds until then.
func (c *Conn) releaseBuffers() (kept int64) {
	c.mu.Lock()
	orderly := c.lg != nil && !c.cursors && c.closing.localTerm && c.closing.peerClosed && !c.closing.peerAbort && !c.closing.localAbort &&
		!c.lnkErr && !c.cont.fo && c.wrOut.Load() == 0
	announcing := c.rkeyAnnounced
	if announcing != nil && isClosed(announcing) {
		announcing = nil
	}
	lateRoom := c.closing.peerLateRoom && c.lg != nil
	bufs := c.detachBufsLocked()
	c.mu.Unlock()
	for _, b := range bufs {
		if orderly && b.own != nil {
			// The next connection must not find this one's bytes: a peer
			// could announce a producer cursor past what it wrote.
			mem := b.own.Bytes()
			clear(mem[:min(b.used, uint64(len(mem)))])
		}
		switch {
		case b.rmb && lateRoom:
			kept += int64(b.size)
			c.e.keeping.Add(1)
			go c.lg.dropWhenQuiet(b)
		case !orderly || b.own == nil:
			c.lg.drop(b)
		case b.rmb && announcing != nil:
			kept += int64(b.size)
			c.e.keeping.Add(1)
			go c.lg.keepWhenAnswered(b, announcing)
		case c.lg.keep(b):
			kept += int64(b.size)
		default:
			c.lg.drop(b)
		}
	}
	return kept
}

// dropWhenQuiet frees the RMB of a connection whose standard peer may still
// write into it (lateWrites in cdc.go) after lateFreeMin, or as the engine
// closes: pooled, a late WRITE would land in the next connection's bytes, and
// freed at once it would fail the link with every connection on it.
func (lg *linkGroup) dropWhenQuiet(b *pooledBuf) {
	defer lg.e.kept()
	t := newTimer(lg.e.cfg.Clock, lateFreeMin)
	defer t.Stop()
	select {
	case <-t.C:
	case <-lg.e.ctx.Done():
	}
	lg.dropHeld(b)
}

// keepWhenAnswered pools b once its CONFIRM_RKEY is answered (or failed, which
// takes the link down, so b is freed), or frees it with the memory it holds.
func (lg *linkGroup) keepWhenAnswered(b *pooledBuf, answered <-chan struct{}) {
	defer lg.e.kept()
	<-answered
	if !lg.keep(b) {
		lg.dropHeld(b)
	}
}

// detachBufsLocked takes c's RMB and send buffer, with their registrations on
// every link, out of c. The caller holds c.mu.
func (c *Conn) detachBufsLocked() []*pooledBuf {
	var bufs []*pooledBuf
	for _, rmb := range []bool{true, false} {
		if b := c.detachBufLocked(rmb); b != nil {
			bufs = append(bufs, b)
		}
	}
	c.move.regLink = [linkSlots]*link{}
	return bufs
}

// detachBufLocked takes c's RMB (rmb) or send buffer, with its registrations,
// out of c; nil when c holds none. The caller holds c.mu.
func (c *Conn) detachBufLocked(rmb bool) *pooledBuf {
	own, home, on, size := c.snd, c.move.sndHome, &c.move.sndOn, uint64(c.tx.Size())
	if rmb {
		own, home, on, size = c.rmb, c.move.rmbHome, &c.move.rmbOn, uint64(c.rx.Size())
	}
	used := c.tx.Pos()
	if rmb {
		used = c.rx.PeerProducerPos()
	}
	b := &pooledBuf{rmb: rmb, size: size, own: own, home: home, used: min(used, size)}
	held := own != nil
	for n, m := range on {
		if m != nil {
			b.on[n], b.link[n] = m, c.move.regLink[n]
			on[n] = nil
			held = true
		}
	}
	if !held {
		return nil
	}
	return b
}
