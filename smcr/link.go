// Links: one RC queue pair of a link group with its buffers, and its lifetime:
// created with its poller and worker, connected, failed (its connections move to
// another link), closed and freed with its protection domain.
// RFC 7609 §3.3 (links of a link group), after Linux's smcr_link_init and
// smcr_link_clear (smc_core).

package smcr

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/smcr-io/smcr/llc"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// link is one RC queue pair of a link group.
//
// Lock order (lockrank.go): pollMu, creditMu, useMu, postMu, after a Conn's
// cdcMu and before the Engine's mu; pmu and pdMu last of all.
type link struct {
	lg  *linkGroup
	dev verbs.Device
	num uint8 // on the wire
	ix  uint8 // slot in the group and in its buffers' registrations (linkSlots)
	uid llc.LinkUID
	mtu verbs.MTU

	pd     verbs.PD
	cq     verbs.CQ
	qp     verbs.QP
	recvMR verbs.MR
	sendMR verbs.MR
	rslot  int // bytes per receive slot: slotSize, or recvSlotV2 in a version-2 group
	// delRkey holds the one DELETE_RKEY request of a version-2 group in
	// flight (deleteRKey).
	delRkey chan struct{}
	peer    verbs.QPAttr // written under lg.mu (setPeer)

	slots   chan uint16
	credits chan struct{}
	// LLC slots (nSendSlots and above, each with its own WR): for responses and
	// for requests
	llcSlots, reqSlots chan uint16
	rwr                [nRecv]verbs.RecvWR // one per receive slot, reposted without allocating
	rsge               [nRecv][1]verbs.SGE

	// The requests of one post (a chunk's WRITEs and its CDC: postData), under
	// postMu. creditMu serializes takers of several credits (takeCredits).
	postMu   mutex[linkPostRank]
	wr       [3]verbs.SendWR
	sge      [3][1]verbs.SGE
	creditMu mutex[linkCreditRank]

	// The connection and producer cursor of the CDC in each send slot: a CDC
	// completed means the peer holds the bytes before it (multilink.go).
	slotConn [nSendSlots]*Conn
	slotProd [nSendSlots]uint64
	slotSeq  [nSendSlots]uint16
	slotTerm [nSendSlots]bool // the CDC in the slot says closed or abnormal close

	llcIn     chan [llc.MsgLen]byte
	lateResps atomic.Int32 // CONFIRM_RKEY, DELETE_RKEY responses waiting for a slot (respondLate)
	ctl       chan *Conn
	clReq     chan llc.ConfirmLink // CONFIRM_LINK requests, for the client
	testDue   chan struct{}
	testsDue  atomic.Uint64                   // intervals watchIdle found idle, each a TEST_LINK due
	received  atomic.Uint64                   // receive completions: TEST_LINK only after an interval without one
	rtt       atomic.Int64                    // the last TEST_LINK's round trip, ns
	testedAt  atomic.Int64                    // when it was answered, Unix ns (0: never)
	errs      atomic.Uint64                   // completions in error (not flushed) and malformed messages
	errKinds  [protoErrKind + 1]atomic.Uint64 // errs by kind: a completion's status, or protoErrKind

	connected chan struct{}
	connErr   error

	pmu     mutex[linkPendingRank]
	pending map[pendKey]chan [llc.MsgLen]byte
	testSeq uint64

	ctx       context.Context
	cancel    context.CancelFunc
	down      atomic.Bool
	closeOnce sync.Once
	failOnce  sync.Once
	wg        sync.WaitGroup

	posted, polled atomic.Uint64
	driven         atomic.Uint64 // of polled, completions readers handled (Conn.drive)

	// sendSeen and sendSince are sendStalled's: the send completions at its
	// last look, and since when that count has stood still.
	sendSeen  int64
	sendSince time.Time

	// Completions are handled by one goroutine at a time, holding pollMu: the
	// poller, or a reader waiting for its own bytes (Conn.drive). While a reader
	// drives, the poller steps aside until it leaves (resume), so the CDC a
	// reader awaits is handled where it is awaited, with no hand-off. One reader
	// drives at a time: the others sleep, as they do behind the poller, so a
	// link never has more than one goroutine spinning on it.
	pollMu  mutex[linkPollRank]
	pollOff bool // set by free under pollMu: the CQ and slots are gone
	driving atomic.Bool
	resume  chan struct{}

	// useMu keeps the send slots mapped while a sender encodes into one: free
	// takes it exclusively, after which acquire fails.
	useMu rwMutex[linkUseRank]
	freed bool
	// pdRefs counts the link's own hold on pd plus the connection buffers
	// registered in it. Buffers outlive their link (a reader drains its RMB after
	// the link is gone), so pd closes with the last of them (holdPD). slotRefs
	// counts the link's own hold on its slot plus the registrations indexed by
	// it; the two differ by the buffers allocated on a failed link that live on
	// with connections moved elsewhere (unslot), whose memory is the PD's but
	// which the slot no longer indexes, so a new link can take the slot.
	pdMu             mutex[linkPDRank]
	pdRefs, slotRefs int
	txBytes, rxBytes atomic.Uint64 // payload RDMA-written by us, and announced by the peer's CDCs
}

// newLink creates the QP and its buffers, posts the receive slots and starts the
// poller and the worker.
func newLink(lg *linkGroup, dev verbs.Device, num uint8) (_ *link, err error) {
	l := &link{
		lg: lg, dev: dev, num: num, mtu: dev.Port().MTU,
		slots: make(chan uint16, nSendSlots), credits: make(chan struct{}, maxSendWR),
		llcSlots: make(chan uint16, nLLCSlots/2), reqSlots: make(chan uint16, nLLCSlots/2),
		llcIn: make(chan [llc.MsgLen]byte, llcQueue), ctl: make(chan *Conn, 2*maxConnsPerLGR),
		clReq: make(chan llc.ConfirmLink, 1), testDue: make(chan struct{}, 1),
		connected: make(chan struct{}), pending: map[pendKey]chan [llc.MsgLen]byte{},
		resume: make(chan struct{}, 1), delRkey: make(chan struct{}, 1),
	}
	if !l.mtu.Valid() {
		l.mtu = verbs.MTU1024
	}
	binary.BigEndian.PutUint32(l.uid[:], lg.id<<8|uint32(num))
	if err := lg.takeSlot(l); err != nil {
		return nil, err
	}
	if err := lg.e.trackLink(); err != nil {
		lg.leaveSlot(l)
		return nil, err
	}
	defer func() {
		if err != nil {
			l.free()
		}
	}()
	if l.pd, err = dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("alloc pd: %w", err)
	}
	l.pdRefs, l.slotRefs = 1, 1
	if l.cq, err = dev.CreateCQ(nRecv + maxSendWR + nLLCSlots); err != nil {
		return nil, fmt.Errorf("create cq: %w", err)
	}
	if l.qp, err = l.pd.CreateQP(verbs.QPConfig{SendCQ: l.cq, RecvCQ: l.cq, MaxSendWR: maxSendWR + nLLCSlots, MaxRecvWR: nRecv, RNRRetry: 7, MaxInline: maxInline}); err != nil {
		return nil, fmt.Errorf("create qp: %w", err)
	}
	l.rslot = slotSize
	if lg.key.v2 {
		l.rslot = recvSlotV2
	}
	if l.recvMR, err = l.pd.AllocMR(nRecv*l.rslot, verbs.AccessLocalWrite); err != nil {
		return nil, fmt.Errorf("alloc receive slots: %w", err)
	}
	if l.sendMR, err = l.pd.AllocMR((nSendSlots+nLLCSlots)*slotSize, verbs.AccessLocalWrite); err != nil {
		return nil, fmt.Errorf("alloc send slots: %w", err)
	}
	for i := range nSendSlots {
		l.slots <- uint16(i)
	}
	for i := range nLLCSlots {
		l.llcPool(uint16(nSendSlots + i)) <- uint16(nSendSlots + i)
	}
	for range maxSendWR {
		l.credits <- struct{}{}
	}
	for i := range nRecv {
		if err := l.postRecv(uint64(i)); err != nil {
			return nil, fmt.Errorf("post receive: %w", err)
		}
	}
	l.ctx, l.cancel = context.WithCancel(lg.e.ctx)
	l.wg.Add(2)
	go l.poll()
	go l.work()
	return l, nil
}

// connect moves the QP to RTS towards the peer.
func (l *link) connect(ctx context.Context, peer verbs.QPAttr) error {
	l.setPeer(peer)
	return l.connectQP(ctx, peer)
}

// startConnect connects in the background, for the client, which must send its
// Confirm while a provider may still be waiting for both ends to meet.
func (l *link) startConnect(peer verbs.QPAttr) {
	l.setPeer(peer)
	go func() {
		ctx, cancel := context.WithTimeout(l.ctx, l.lg.e.settings().CLCTimeout)
		defer cancel()
		l.connErr = l.connectQP(ctx, peer)
		close(l.connected)
	}()
}

// setPeer names the link's peer QP. Under lg.mu: the link is listed already,
// and other connections' setups look for their peer's QP among the group's
// links (hasPeer), as LinkGroups does.
func (l *link) setPeer(peer verbs.QPAttr) {
	l.lg.mu.Lock()
	l.peer = peer
	l.lg.mu.Unlock()
}

func (l *link) connectQP(ctx context.Context, peer verbs.QPAttr) error {
	if err := l.qp.Connect(ctx, peer); err != nil {
		return fmt.Errorf("smcr: connect qp: %w", err)
	}
	return nil
}

func (l *link) waitConnected(ctx context.Context) error {
	select {
	case <-l.connected:
		return l.connErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// fail marks the link down after an error: its connections move to the other
// link, or with none left the group goes too (multilink.go).
func (l *link) fail(err error) {
	l.failOnce.Do(func() {
		l.down.Store(true)
		if l.ctx != nil && l.ctx.Err() != nil {
			return // we are closing: flushes are expected
		}
		l.lg.e.log.Warn("smcr: link failed", "lg", l.lg.id, "link", l.num, "err", err)
		go l.lg.linkFailed(l, fmt.Errorf("%w: %v", ErrLinkDown, err), true)
	})
}

// close tears the link down; the goroutines exit and the buffers are freed after.
func (l *link) close() {
	l.closeOnce.Do(func() {
		l.down.Store(true)
		if l.cancel != nil {
			l.cancel()
		}
		if l.qp != nil {
			l.qp.Close()
		}
		go func() {
			l.wg.Wait()
			l.free()
		}()
	})
}

// free closes the link's verbs resources, once its goroutines are gone; the
// engine's Close waits for it.
func (l *link) free() {
	defer l.lg.e.linkFreed()
	// Readers may still drive (Conn.drive): wait out the one handling
	// completions, and turn the rest away.
	l.pollMu.Lock()
	l.pollOff = true
	l.pollMu.Unlock()
	l.useMu.Lock()
	l.freed = true
	l.useMu.Unlock()
	if l.qp != nil {
		l.qp.Close() // destroyed before the CQ it completes on
	}
	if l.recvMR != nil {
		l.recvMR.Close()
	}
	if l.sendMR != nil {
		l.sendMR.Close()
	}
	if l.cq != nil {
		l.cq.Close()
	}
	if l.pd != nil {
		l.releasePD()
	} else {
		l.lg.leaveSlot(l)
	}
}

// holdPD counts a connection buffer registered in l's protection domain and
// indexed by its slot.
func (l *link) holdPD() {
	l.pdMu.Lock()
	l.pdRefs++
	l.slotRefs++
	l.pdMu.Unlock()
}

// releasePD drops a hold on pd and the slot (a buffer's, or the link's own in
// free): pd closes with the last hold on it, since a PD must outlive the MRs
// registered in it, and the slot is given back with the last hold on it.
func (l *link) releasePD() { l.release(1, 1) }

// unslot drops the slot's hold of a buffer allocated in l's PD that stays
// registered there, with a connection that moved to another link (forgetLink).
func (l *link) unslot() { l.release(0, 1) }

// releaseUnslotted drops the PD's hold of such a buffer when it is closed.
func (l *link) releaseUnslotted() { l.release(1, 0) }

func (l *link) release(pd, slot int) {
	l.pdMu.Lock()
	l.pdRefs -= pd
	l.slotRefs -= slot
	closePD := pd > 0 && l.pdRefs == 0
	leave := slot > 0 && l.slotRefs == 0
	l.pdMu.Unlock()
	if closePD {
		if err := l.pd.Close(); err != nil {
			l.lg.e.log.Warn("smcr: close protection domain", "lg", l.lg.id, "link", l.num, "err", err)
		}
	}
	if leave {
		l.lg.leaveSlot(l)
	}
}
