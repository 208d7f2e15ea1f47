// Queue pairs: connection through the rendezvous socket, the shared request rings,
// RDMA WRITE as a memcpy into the peer's region, SEND and WRITE WITH IMMEDIATE
// through the ring into a posted RECV, RNR, flush. Emulates the RC queue pairs of
// RFC 7609 §2.1 and the work-request semantics SMC-R relies on (§4.2: WRITE, then a
// CDC SEND that the peer receives after the data).

package shm

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/smcr-io/smcr/smcr/verbs"
	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/internal/scm"
)

// Queue segment layout (see the package doc). Every field the peer writes sits on
// its own cache line, so the two processes do not bounce lines they both write.
const (
	segMagic       = 0x534d5132 // "SMQ2": a ringer clears the sleeping flag it rings
	segOffMagic    = 0
	segOffSlots    = 4
	segOffSlotSize = 8
	segOffHead     = 64  // owner: requests produced
	segOffSleep    = 128 // owner: nonzero = ring my doorbell
	segOffTail     = 192 // peer: requests consumed
	segOffNakSeq   = 200 // peer: the request that failed
	segOffNakCode  = 208 // peer: its WCStatus, 0 = none
	segHdrLen      = 256

	maxSGE = 8
	// grace is how long after the last Poll the doorbell stays disarmed, so a
	// busy-polling peer costs no syscalls; after it the doorbell goroutine re-arms.
	grace = 2 * time.Millisecond
	// mapTimeout bounds the round trip that fetches a peer region on first use.
	mapTimeout = 2 * time.Second
)

type sqe struct {
	id       uint64
	op       verbs.WCOpcode
	signaled bool
	msg      bool   // went through the ring: done when the peer consumed it
	seq      uint64 // ring sequence number when msg
	done     bool
	status   verbs.WCStatus
}

type rqe struct {
	id  uint64
	n   int
	sg  [maxSGE]verbs.SGE
	len int
}

type remoteMR struct {
	reg      *region
	addr     uint64
	size     uint64
	writable bool
}

type mapResult struct {
	msg ctl
	fd  int
}

type qp struct {
	pd       *pd
	dev      *device
	qpn      uint32
	psn      uint32
	sendCQ   *cq
	recvCQ   *cq
	maxSend  int
	maxRecv  int
	rnrRetry int
	state    atomic.Uint32
	closed   atomic.Bool
	connMu   sync.Mutex

	seg      *region // our request ring; the peer writes tail and nak in it
	slots    int
	slotSize int
	pseg     *region // the peer's request ring
	pslots   int
	pslotSz  int
	peerRNR  int

	conn       *net.UnixConn
	bellMu     sync.RWMutex
	bellFD     int
	bell       [ctlBellLen]byte
	rung       atomic.Uint64 // doorbells sent
	readerDone chan struct{}
	gone       chan struct{} // closed when the peer's socket or the QP closes
	goneOnce   sync.Once
	mapReply   chan mapResult

	// Send side, under sqMu.
	sqMu    sync.Mutex
	sq      []sqe
	sqHead  int
	sqN     int
	msgHead uint64 // requests produced
	msgTail uint64 // requests the peer consumed (validated)
	remote  map[uint32]*remoteMR
	ackKick atomic.Uint64
	ackDone atomic.Uint64

	revMu   sync.Mutex
	revoked []uint32
	hasRev  atomic.Bool

	// Receive side, under rqMu.
	rqMu     sync.Mutex
	rq       []rqe
	rqHead   int
	rqN      int
	inTail   uint64 // peer requests consumed
	rnrSince time.Time
	discard  bool // after an RNR NAK the peer's requester is in error: drop the rest
	reqKick  atomic.Uint64
	reqDone  atomic.Uint64

	// Doorbell arming. flagMu (never held while waiting) keeps seg mapped while
	// the sleeping flag is written: the QP goroutine must never wait for sqMu,
	// which PostSend holds while the goroutine fetches a region for it.
	flagMu  sync.Mutex
	armed   atomic.Bool
	polls   atomic.Uint32
	dlMu    sync.Mutex
	rnrDL   time.Time
	lastPol uint32

	grantMu sync.Mutex
	granted []*mr
}

func newQP(p *pd, cfg verbs.QPConfig) (*qp, error) {
	sc, ok1 := cfg.SendCQ.(*cq)
	rc, ok2 := cfg.RecvCQ.(*cq)
	if !ok1 || !ok2 || sc.dev != p.dev || rc.dev != p.dev {
		return nil, fmt.Errorf("%w: completion queues of another device", verbs.ErrInvalid)
	}
	if sc.isClosed() || rc.isClosed() {
		return nil, verbs.ErrClosed
	}
	if cfg.MaxSendWR == 0 {
		cfg.MaxSendWR = 64
	}
	if cfg.MaxRecvWR == 0 {
		cfg.MaxRecvWR = 64
	}
	if cfg.MaxSendWR < 0 || cfg.MaxSendWR > maxSlots || cfg.MaxRecvWR < 0 || cfg.MaxRecvWR > maxSlots {
		return nil, fmt.Errorf("%w: queue sizes %d/%d", verbs.ErrInvalid, cfg.MaxSendWR, cfg.MaxRecvWR)
	}
	if cfg.RNRRetry < 0 || cfg.RNRRetry > 7 {
		return nil, fmt.Errorf("%w: rnr retry %d", verbs.ErrInvalid, cfg.RNRRetry)
	}
	if cfg.MaxInline < 0 {
		// Inline is a hint here: every request is copied as it is posted.
		return nil, fmt.Errorf("%w: inline space %d", verbs.ErrInvalid, cfg.MaxInline)
	}
	var rnd [4]byte
	rand.Read(rnd[:])
	q := &qp{
		pd: p, dev: p.dev, sendCQ: sc, recvCQ: rc,
		psn:        binary.BigEndian.Uint32(rnd[:]) & maxQPN,
		maxSend:    cfg.MaxSendWR,
		maxRecv:    cfg.MaxRecvWR,
		rnrRetry:   cfg.RNRRetry,
		sq:         make([]sqe, cfg.MaxSendWR),
		rq:         make([]rqe, cfg.MaxRecvWR),
		remote:     make(map[uint32]*remoteMR),
		bellFD:     -1,
		readerDone: make(chan struct{}),
		gone:       make(chan struct{}),
		mapReply:   make(chan mapResult, 1),
	}
	q.bell[0] = ctlDoorbell
	q.state.Store(uint32(verbs.QPInit))
	if err := p.dev.registerQP(q); err != nil {
		return nil, err
	}
	sc.attach(q)
	rc.attach(q)
	return q, nil
}

func (q *qp) Attr() verbs.QPAttr {
	return verbs.QPAttr{QPN: q.qpn, PSN: q.psn, GID: q.dev.gid, MTU: verbs.MTU4096, Endpoint: q.dev.Endpoint()}
}

func (q *qp) State() verbs.QPState { return verbs.QPState(q.state.Load()) }

// transition is the one place the QP state changes. ERROR is final.
//
//	INIT ──Connect──▶ RTR ──▶ RTS ──(peer gone, bad peer data, failed WR, Close)──▶ ERROR
func (q *qp) transition(to verbs.QPState, why string) bool {
	for {
		from := verbs.QPState(q.state.Load())
		if from == verbs.QPError || from == to {
			return false
		}
		if q.state.CompareAndSwap(uint32(from), uint32(to)) {
			q.dev.log.Debug("shm: qp state", "qpn", q.qpn, "from", from, "to", to, "why", why)
			return true
		}
	}
}

// fail moves the QP to ERROR, tells the peer (its end of the socket reads EOF and
// flushes), and flushes our work requests.
func (q *qp) fail(why string) {
	if !q.transition(verbs.QPError, why) {
		return
	}
	if q.conn != nil {
		q.conn.CloseWrite()
	}
	q.kickAcks()
	q.kickReqs()
}

// Connect joins the remote QP over the peer device's rendezvous socket: the end
// with the smaller (device, QPN) dials, the other accepts; each hands the other
// its request-ring segment.
func (q *qp) Connect(ctx context.Context, remote verbs.QPAttr) error {
	q.connMu.Lock()
	defer q.connMu.Unlock()
	if q.State() != verbs.QPInit || q.closed.Load() {
		return fmt.Errorf("shm: connect in state %v: %w", q.State(), verbs.ErrQPState)
	}
	ep, err := parseEndpoint(remote.Endpoint)
	if err != nil {
		return fmt.Errorf("shm: connect: %w", err)
	}
	if err := q.dev.sameHost(ep); err != nil {
		return fmt.Errorf("shm: connect: %w", err)
	}
	if remote.QPN == 0 || remote.QPN > maxQPN {
		return fmt.Errorf("shm: connect: remote qpn %d: %w", remote.QPN, verbs.ErrInvalid)
	}
	q.slots = q.maxSend
	q.slotSize = (slotHdrLen + q.dev.cfg.MaxMsgSize + 63) &^ 63
	seg, err := newRegion("smcr-qp", segHdrLen+q.slots*q.slotSize)
	if err != nil {
		return fmt.Errorf("shm: connect: %w", err)
	}
	u32(seg.mem, segOffMagic).Store(segMagic)
	u32(seg.mem, segOffSlots).Store(uint32(q.slots))
	u32(seg.mem, segOffSlotSize).Store(uint32(q.slotSize))
	u32(seg.mem, segOffSleep).Store(1)
	q.armed.Store(true)
	mine := ctl{srcQPN: q.qpn, dstQPN: remote.QPN, ino: q.dev.ep.ino, segSize: uint32(len(seg.mem)), rnr: uint8(q.rnrRetry)}

	dialer := q.dev.ep.dev < ep.dev || (q.dev.ep.dev == ep.dev && (q.dev.ep.ino < ep.ino || (q.dev.ep.ino == ep.ino && q.qpn < remote.QPN)))
	var conn *net.UnixConn
	var peer ctl
	var pfd int
	if dialer {
		conn, peer, pfd, err = q.dial(ctx, ep, mine, seg.fd)
	} else {
		conn, peer, pfd, err = q.accept(ctx, ep, remote.QPN, mine, seg.fd)
	}
	if err != nil {
		seg.close()
		return fmt.Errorf("shm: connect qp %d to %d: %w", q.qpn, remote.QPN, err)
	}
	q.transition(verbs.QPRTR, "connected")
	pseg, err := mapPeer(pfd, int(peer.segSize), true)
	if err == nil {
		err = q.checkPeerSeg(pseg)
		if err != nil {
			pseg.close()
		}
	}
	if err != nil {
		seg.close()
		conn.Close()
		q.transition(verbs.QPError, "bad peer segment")
		return fmt.Errorf("shm: connect qp %d: %w", q.qpn, err)
	}
	var bell int
	rc, err := conn.SyscallConn()
	if err == nil {
		cerr := rc.Control(func(fd uintptr) { bell, err = unix.Dup(int(fd)) })
		if err == nil {
			err = cerr
		}
	}
	if err != nil {
		pseg.close()
		seg.close()
		conn.Close()
		q.transition(verbs.QPError, "dup socket")
		return fmt.Errorf("shm: connect: dup socket: %w", err)
	}
	q.sqMu.Lock()
	q.rqMu.Lock()
	q.flagMu.Lock()
	q.bellMu.Lock()
	q.seg, q.pseg, q.conn, q.bellFD, q.peerRNR = seg, pseg, conn, bell, int(peer.rnr)
	q.bellMu.Unlock()
	q.flagMu.Unlock()
	q.rqMu.Unlock()
	q.sqMu.Unlock()
	if q.closed.Load() || !q.transition(verbs.QPRTS, "ready") {
		close(q.readerDone)
		return fmt.Errorf("shm: connect: %w", verbs.ErrClosed)
	}
	go q.reader()
	q.kickReqs() // the peer may already have posted
	return nil
}

func (q *qp) dial(ctx context.Context, ep endpoint, mine ctl, segFD int) (*net.UnixConn, ctl, int, error) {
	conn, err := dialPeer(ctx, ep.path)
	if err != nil {
		return nil, ctl{}, -1, err
	}
	stop := watchCtx(ctx, conn)
	defer stop()
	mine.typ = ctlHello
	if _, _, err := conn.WriteMsgUnix(mine.append(nil), unix.UnixRights(segFD), nil); err != nil {
		conn.Close()
		return nil, ctl{}, -1, fmt.Errorf("send hello: %w", err)
	}
	peer, fd, err := readHello(conn, ctlHelloAck)
	if err == nil && (peer.dstQPN != mine.srcQPN || peer.srcQPN != mine.dstQPN || peer.ino != ep.ino) {
		closeFDs([]int{fd})
		err = fmt.Errorf("%w: hello ack from qp %d for %d", errPeer, peer.srcQPN, peer.dstQPN)
	}
	if err != nil {
		conn.Close()
		return nil, ctl{}, -1, err
	}
	conn.SetDeadline(time.Time{})
	return conn, peer, fd, nil
}

func (q *qp) accept(ctx context.Context, ep endpoint, rqpn uint32, mine ctl, segFD int) (*net.UnixConn, ctl, int, error) {
	ch := q.dev.helloChan(q.qpn)
	for {
		var h *hello
		select {
		case h = <-ch:
		case <-ctx.Done():
			return nil, ctl{}, -1, ctx.Err()
		case <-q.gone:
			return nil, ctl{}, -1, verbs.ErrClosed
		}
		if h.msg.srcQPN != rqpn || h.msg.ino != ep.ino {
			q.dev.log.Debug("shm: hello from an unexpected peer", "qpn", q.qpn, "from", h.msg.srcQPN)
			h.close()
			continue
		}
		mine.typ = ctlHelloAck
		stop := watchCtx(ctx, h.conn)
		_, _, err := h.conn.WriteMsgUnix(mine.append(nil), unix.UnixRights(segFD), nil)
		stop()
		if err != nil {
			h.close()
			return nil, ctl{}, -1, fmt.Errorf("send hello ack: %w", err)
		}
		h.conn.SetDeadline(time.Time{})
		return h.conn, h.msg, h.fd, nil
	}
}

// watchCtx makes blocking socket calls return when ctx ends.
func watchCtx(ctx context.Context, c *net.UnixConn) (stop func()) {
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	s := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	return func() { s() }
}

func readHello(c *net.UnixConn, typ uint8) (ctl, int, error) {
	buf := make([]byte, maxCtlLen)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	fds := scm.Rights(oob[:oobn])
	if err != nil {
		closeFDs(fds)
		return ctl{}, -1, fmt.Errorf("read hello: %w", err)
	}
	m, err := parseCtl(buf[:n])
	if err == nil && (m.typ != typ || len(fds) != 1) {
		err = fmt.Errorf("%w: message type %d with %d descriptors, want hello", errPeer, m.typ, len(fds))
	}
	if err != nil {
		closeFDs(fds)
		return ctl{}, -1, err
	}
	return m, fds[0], nil
}

// checkPeerSeg validates the peer's segment header once and copies its geometry.
func (q *qp) checkPeerSeg(r *region) error {
	magic := u32(r.mem, segOffMagic).Load()
	slots := int(u32(r.mem, segOffSlots).Load())
	size := int(u32(r.mem, segOffSlotSize).Load())
	if magic != segMagic || slots < 1 || slots > maxSlots || size < slotHdrLen+8 || size > maxSlotSize || size%8 != 0 ||
		segHdrLen+slots*size > len(r.mem) {
		return fmt.Errorf("%w: segment magic %#x slots %d of %d bytes in %d", errPeer, magic, slots, size, len(r.mem))
	}
	q.pslots, q.pslotSz = slots, size
	return nil
}

// ringPeer sends a doorbell when the peer said it sleeps, clearing its flag, so
// the posts that follow before the peer took the doorbell (rearm) send none: one
// doorbell per sleep, not one per post. A doorbell that cannot be sent
// (MSG_DONTWAIT, full socket buffer) sets the flag back for the next post.
func (q *qp) ringPeer() {
	flag := u32(q.pseg.mem, segOffSleep)
	v := flag.Load()
	if v == 0 || !flag.CompareAndSwap(v, 0) {
		return
	}
	q.bellMu.RLock()
	if q.bellFD >= 0 {
		if unix.Sendto(q.bellFD, q.bell[:], unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, nil) != nil {
			flag.CompareAndSwap(0, v)
		} else {
			q.rung.Add(1)
		}
	}
	q.bellMu.RUnlock()
}

// sendCtl sends a control message (fd ≥ 0 attached), retrying briefly when the
// peer's buffer is full.
func (q *qp) sendCtl(m *ctl, fd int) error {
	var b [maxCtlLen]byte
	msg := m.append(b[:0])
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	q.bellMu.RLock()
	defer q.bellMu.RUnlock()
	if q.bellFD < 0 {
		return verbs.ErrClosed
	}
	for i := 0; ; i++ {
		err := unix.Sendmsg(q.bellFD, msg, oob, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		if err != unix.EAGAIN || i == 1000 {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

// PostSend posts wr's chain one request at a time.
func (q *qp) PostSend(wr *verbs.SendWR) error { return verbs.PostChain(wr, q.postSend) }

// postSend validates and executes or queues one work request. A WRITE is copied
// into the peer's region here; SEND and WRITE WITH IMMEDIATE go through the ring.
func (q *qp) postSend(wr *verbs.SendWR) error {
	if len(wr.SG) > maxSGE {
		return fmt.Errorf("%w: send work request", verbs.ErrInvalid)
	}
	q.sqMu.Lock()
	defer q.unlockSQ()
	st := q.State()
	if q.closed.Load() {
		return verbs.ErrClosed
	}
	if st != verbs.QPRTS && st != verbs.QPError {
		return fmt.Errorf("shm: post send in state %v: %w", st, verbs.ErrQPState)
	}
	if q.sqN == len(q.sq) {
		q.processAcks() // completions may be waiting to free slots
		if q.sqN == len(q.sq) {
			return verbs.ErrQueueFull
		}
	}
	total := 0
	for _, s := range wr.SG {
		if err := q.checkLocal(s); err != nil {
			return err
		}
		total += s.Length
	}
	e := sqe{id: wr.ID, signaled: wr.Signaled}
	switch wr.Opcode {
	case verbs.OpSend:
		e.op = verbs.WCSend
		if total > q.slotSize-slotHdrLen {
			return fmt.Errorf("%w: send of %d bytes, at most %d", verbs.ErrInvalid, total, q.slotSize-slotHdrLen)
		}
	case verbs.OpWrite, verbs.OpWriteImm:
		e.op = verbs.WCWrite
	default:
		return fmt.Errorf("%w: opcode %d", verbs.ErrInvalid, wr.Opcode)
	}
	if st == verbs.QPError {
		e.done, e.status = true, verbs.WCWRFlushErr
		q.pushSQ(e)
		q.deliverSQ()
		return nil
	}
	switch wr.Opcode {
	case verbs.OpSend:
		slot := q.slot(q.msgHead)
		off := slotHdrLen
		for _, s := range wr.SG {
			off += copy(slot[off:], s.MR.Bytes()[s.Offset:s.Offset+s.Length])
		}
		putSlot(slot, slotHdr{op: slotOpSend, len: uint32(total)})
		e.msg, e.seq = true, q.msgHead
	default:
		if st := q.write(wr, total); st != verbs.WCSuccess {
			e.done, e.status = true, st
			q.pushSQ(e)
			q.deliverSQ()
			q.fail("remote access error")
			return nil
		}
		if wr.Opcode == verbs.OpWrite {
			e.done, e.status = true, verbs.WCSuccess
			q.pushSQ(e)
			q.deliverSQ()
			return nil
		}
		slot := q.slot(q.msgHead)
		putSlot(slot, slotHdr{op: slotOpImm, len: uint32(total), imm: wr.Imm})
		e.msg, e.seq = true, q.msgHead
	}
	q.pushSQ(e)
	q.msgHead++
	u64(q.seg.mem, segOffHead).Store(q.msgHead)
	q.ringPeer()
	return nil
}

func (q *qp) slot(seq uint64) []byte {
	off := segHdrLen + int(seq%uint64(q.slots))*q.slotSize
	return q.seg.mem[off : off+q.slotSize]
}

// checkLocal validates an SGE: inside its region, and the region of this PD.
func (q *qp) checkLocal(s verbs.SGE) error {
	if err := verbs.CheckSGE(s); err != nil {
		return err
	}
	if m, ok := s.MR.(*mr); !ok || m.pd != q.pd {
		return fmt.Errorf("%w: sge region of another protection domain", verbs.ErrInvalid)
	}
	return nil
}

// write copies the gather list into the peer region named by rkey and address,
// with the checks an RNIC's responder makes: a failure writes nothing.
func (q *qp) write(wr *verbs.SendWR, total int) verbs.WCStatus {
	r := q.remote[wr.RKey]
	if r == nil {
		var st verbs.WCStatus
		if r, st = q.mapRemote(wr.RKey); r == nil {
			return st
		}
	}
	if !r.writable || wr.RemoteAddr < r.addr {
		return verbs.WCRemAccessErr
	}
	off := wr.RemoteAddr - r.addr
	if off > r.size || uint64(total) > r.size-off {
		return verbs.WCRemAccessErr
	}
	dst := r.reg.mem[off : off+uint64(total)]
	for _, s := range wr.SG {
		n := copy(dst, s.MR.Bytes()[s.Offset:s.Offset+s.Length])
		dst = dst[n:]
	}
	return verbs.WCSuccess
}

// mapRemote asks the peer for the region of rkey (the first WRITE to it).
func (q *qp) mapRemote(rkey uint32) (*remoteMR, verbs.WCStatus) {
	for {
		select {
		case old := <-q.mapReply: // a reply that came after its request timed out
			closeFDs([]int{old.fd})
			continue
		default:
		}
		break
	}
	q.dev.log.Debug("shm: send map request", "qpn", q.qpn, "rkey", rkey)
	if err := q.sendCtl(&ctl{typ: ctlMapReq, rkey: rkey}, -1); err != nil {
		return nil, verbs.WCRetryExcErr
	}
	t := time.NewTimer(mapTimeout)
	defer t.Stop()
	for {
		select {
		case rep := <-q.mapReply:
			if rep.msg.rkey != rkey {
				closeFDs([]int{rep.fd})
				continue
			}
			if rep.msg.status != mapOK {
				return nil, verbs.WCRemAccessErr
			}
			writable := rep.msg.access&verbs.AccessRemoteWrite != 0
			if rep.msg.size > maxRegion {
				closeFDs([]int{rep.fd})
				return nil, verbs.WCRemAccessErr
			}
			reg, err := mapPeer(rep.fd, int(rep.msg.size), writable)
			if err != nil {
				q.dev.log.Debug("shm: map peer region", "qpn", q.qpn, "rkey", rkey, "err", err)
				return nil, verbs.WCRemAccessErr
			}
			r := &remoteMR{reg: reg, addr: rep.msg.addr, size: rep.msg.size, writable: writable}
			q.remote[rkey] = r
			return r, verbs.WCSuccess
		case <-t.C:
			return nil, verbs.WCRetryExcErr
		case <-q.gone:
			return nil, verbs.WCRetryExcErr
		}
	}
}

func (q *qp) pushSQ(e sqe) {
	q.sq[(q.sqHead+q.sqN)%len(q.sq)] = e
	q.sqN++
}

// deliverSQ completes send work requests in order: a request behind one still in
// the peer's ring waits for it, as completions on an RC send queue do.
func (q *qp) deliverSQ() {
	for q.sqN > 0 {
		e := &q.sq[q.sqHead]
		if !e.done {
			switch {
			case e.msg && e.seq < q.msgTail:
				e.done, e.status = true, verbs.WCSuccess
			case q.State() == verbs.QPError:
				e.done, e.status = true, verbs.WCWRFlushErr // behind a failure, or the QP is gone
			default:
				return
			}
		} else if e.status == verbs.WCSuccess && !e.msg && q.State() == verbs.QPError {
			// A WRITE queued behind a request that failed or was flushed: hardware
			// would not have executed it. Its bytes did land (it was copied when
			// posted), which only a responder reading memory unprompted could see.
			e.status = verbs.WCWRFlushErr
		}
		if e.signaled || e.status != verbs.WCSuccess {
			q.sendCQ.push(verbs.WorkCompletion{ID: e.id, Status: e.status, Opcode: e.op, QPN: q.qpn})
		}
		q.sqHead = (q.sqHead + 1) % len(q.sq)
		q.sqN--
	}
}

// processAcks reads what the peer consumed from our ring (tail, and a NAK for the
// request at tail) and completes send work requests. Under sqMu.
func (q *qp) processAcks() {
	if q.seg == nil {
		return
	}
	if q.hasRev.Load() {
		q.reapRevoked()
	}
	tail := u64(q.seg.mem, segOffTail).Load()
	if tail < q.msgTail || tail > q.msgHead {
		q.fail("peer wrote a bad tail")
	} else {
		q.msgTail = tail
	}
	if code := verbs.WCStatus(u32(q.seg.mem, segOffNakCode).Load()); code != 0 {
		seq := u64(q.seg.mem, segOffNakSeq).Load()
		switch {
		case seq != q.msgTail || seq >= q.msgHead:
			q.fail("peer wrote a bad nak")
		case code == verbs.WCRNRRetryExcErr || code == verbs.WCRemInvReqErr || code == verbs.WCRemOpErr || code == verbs.WCRemAccessErr:
			for i := 0; i < q.sqN; i++ {
				e := &q.sq[(q.sqHead+i)%len(q.sq)]
				if e.msg && e.seq == seq && !e.done {
					e.done, e.status = true, code
				}
			}
			q.fail("peer nak: " + code.String())
		default:
			q.fail("peer wrote a bad nak code")
		}
	}
	q.deliverSQ()
}

func (q *qp) reapRevoked() {
	q.revMu.Lock()
	keys := q.revoked
	q.revoked = nil
	q.hasRev.Store(false)
	q.revMu.Unlock()
	for _, k := range keys {
		if r := q.remote[k]; r != nil {
			r.reg.close()
			delete(q.remote, k)
		}
	}
}

// PostRecv queues a receive buffer.
func (q *qp) PostRecv(wr *verbs.RecvWR) error {
	if wr == nil || len(wr.SG) > maxSGE {
		return fmt.Errorf("%w: receive work request", verbs.ErrInvalid)
	}
	total := 0
	for _, s := range wr.SG {
		if err := q.checkLocal(s); err != nil {
			return err
		}
		total += s.Length
	}
	q.rqMu.Lock()
	if q.closed.Load() {
		q.rqMu.Unlock()
		return verbs.ErrClosed
	}
	if q.rqN == len(q.rq) {
		q.rqMu.Unlock()
		return verbs.ErrQueueFull
	}
	e := &q.rq[(q.rqHead+q.rqN)%len(q.rq)]
	e.id, e.n, e.len = wr.ID, copy(e.sg[:], wr.SG), total
	q.rqN++
	q.processReqs() // a request may be waiting for this buffer (RNR)
	q.unlockRQ()
	return nil
}

// processReqs consumes the peer's requests into posted receives. Under rqMu.
func (q *qp) processReqs() {
	if q.State() == verbs.QPError {
		q.flushRQ()
		return
	}
	if q.pseg == nil || q.discard {
		return
	}
	head := u64(q.pseg.mem, segOffHead).Load()
	if head < q.inTail || head-q.inTail > uint64(q.pslots) {
		q.nak(verbs.WCRemInvReqErr)
		q.fail("peer wrote a bad head")
		q.flushRQ()
		return
	}
	start := q.inTail
	for q.inTail < head {
		off := segHdrLen + int(q.inTail%uint64(q.pslots))*q.pslotSz
		slot := q.pseg.mem[off : off+q.pslotSz]
		h, err := parseSlot(slot, q.pslotSz)
		if err != nil {
			q.nak(verbs.WCRemInvReqErr)
			q.fail(err.Error())
			break
		}
		if q.rqN == 0 {
			q.rnr()
			break
		}
		q.rnrSince = time.Time{}
		e := &q.rq[q.rqHead]
		wc := verbs.WorkCompletion{ID: e.id, QPN: q.qpn, ByteLen: h.len, Status: verbs.WCSuccess}
		if h.op == slotOpSend {
			wc.Opcode = verbs.WCRecv
			if int(h.len) > e.len {
				wc.Status, wc.ByteLen = verbs.WCLocLenErr, 0
			} else {
				src := slot[slotHdrLen : slotHdrLen+int(h.len)]
				for _, s := range e.sg[:e.n] {
					n := copy(s.MR.Bytes()[s.Offset:s.Offset+s.Length], src)
					src = src[n:]
				}
			}
		} else {
			wc.Opcode, wc.Imm, wc.HasImm = verbs.WCRecvRDMAImm, h.imm, true
		}
		e.sg = [maxSGE]verbs.SGE{} // drop references to the caller's regions
		q.rqHead = (q.rqHead + 1) % len(q.rq)
		q.rqN--
		q.recvCQ.push(wc)
		if wc.Status != verbs.WCSuccess {
			q.nak(verbs.WCRemInvReqErr)
			q.fail("receive buffer too small")
			break
		}
		q.inTail++
	}
	if q.inTail != start {
		u64(q.pseg.mem, segOffTail).Store(q.inTail)
		q.ringPeer()
	}
	if q.State() == verbs.QPError {
		q.flushRQ()
	}
}

// rnr handles a request with no receive posted: wait (RNR retry 7), or NAK it with
// "RNR retry exceeded" once the requester's retries have run out.
func (q *qp) rnr() {
	if q.peerRNR == 7 {
		return
	}
	now := time.Now()
	if q.rnrSince.IsZero() {
		q.rnrSince = now
	}
	deadline := q.rnrSince.Add(time.Duration(q.peerRNR+1) * q.dev.cfg.RNRTimer)
	if now.Before(deadline) {
		q.dlMu.Lock()
		q.rnrDL = deadline
		q.conn.SetReadDeadline(deadline)
		q.dlMu.Unlock()
		return
	}
	q.rnrSince = time.Time{}
	q.discard = true
	q.nak(verbs.WCRNRRetryExcErr)
}

// nak reports the failure of the request at inTail to the requester.
func (q *qp) nak(code verbs.WCStatus) {
	if q.pseg == nil {
		return
	}
	u64(q.pseg.mem, segOffNakSeq).Store(q.inTail)
	u32(q.pseg.mem, segOffNakCode).Store(uint32(code))
	q.ringPeer()
}

func (q *qp) flushRQ() {
	for q.rqN > 0 {
		e := &q.rq[q.rqHead]
		q.recvCQ.push(verbs.WorkCompletion{ID: e.id, Status: verbs.WCWRFlushErr, Opcode: verbs.WCRecv, QPN: q.qpn})
		e.sg = [maxSGE]verbs.SGE{}
		q.rqHead = (q.rqHead + 1) % len(q.rq)
		q.rqN--
	}
}

// The two sides are driven by whoever gets there: the caller's Poll/Wait, PostRecv,
// or the doorbell goroutine. A kick that finds the lock taken is left for the
// holder, which rechecks the kick count after unlocking.

func (q *qp) kickAcks() {
	q.ackKick.Add(1)
	if q.sqMu.TryLock() {
		q.ackDone.Store(q.ackKick.Load())
		q.processAcks()
		q.unlockSQ()
	}
}

func (q *qp) unlockSQ() {
	for {
		q.sqMu.Unlock()
		if q.ackKick.Load() == q.ackDone.Load() || !q.sqMu.TryLock() {
			return
		}
		q.ackDone.Store(q.ackKick.Load())
		q.processAcks()
	}
}

func (q *qp) kickReqs() {
	q.reqKick.Add(1)
	if q.rqMu.TryLock() {
		q.reqDone.Store(q.reqKick.Load())
		q.processReqs()
		q.unlockRQ()
	}
}

func (q *qp) unlockRQ() {
	for {
		q.rqMu.Unlock()
		if q.reqKick.Load() == q.reqDone.Load() || !q.rqMu.TryLock() {
			return
		}
		q.reqDone.Store(q.reqKick.Load())
		q.processReqs()
	}
}

// poll is the busy-poll step of Wait: it disarms our doorbell (a poller is here,
// the peer need not ring) and drives both sides.
func (q *qp) poll() { q.drive(true) }

// drive moves both sides' shared queues along, after disarming our doorbell. From
// Poll (spinning false) it leaves the doorbell armed while a Wait sleeps on one of
// our CQs: that Wait relies on it to wake. (A reader polling beside a sleeping
// poller disarmed it, and the next completion waited for the doorbell reader's
// 2 ms grace.) Wait counts itself a sleeper before it arms, both under flagMu's
// order, so a Poll racing with it either sees the sleeper or is re-armed after.
func (q *qp) drive(spinning bool) {
	q.polls.Add(1)
	if q.armed.Load() && q.State() == verbs.QPRTS {
		q.flagMu.Lock()
		keep := !spinning && (q.sendCQ.sleepers.Load() > 0 || q.recvCQ.sleepers.Load() > 0)
		if q.seg != nil && !keep && q.armed.Swap(false) {
			u32(q.seg.mem, segOffSleep).Store(0)
			q.dlMu.Lock()
			q.conn.SetReadDeadline(time.Now().Add(grace))
			q.dlMu.Unlock()
		}
		q.flagMu.Unlock()
	}
	q.kickAcks()
	q.kickReqs()
}

// arm asks the peer to ring our doorbell, then looks once more (the peer may have
// produced before it saw the flag).
func (q *qp) arm() {
	if !q.armed.Load() {
		q.flagMu.Lock()
		if q.seg != nil && !q.armed.Swap(true) {
			u32(q.seg.mem, segOffSleep).Store(1)
		}
		q.flagMu.Unlock()
	}
	q.kickAcks()
	q.kickReqs()
}

// rearm sets our sleeping flag again after a doorbell, which the peer cleared when
// it rang, if we are still armed; before the look that follows, so a post after
// it rings and one before it is seen.
func (q *qp) rearm() {
	if !q.armed.Load() {
		return
	}
	q.flagMu.Lock()
	if q.seg != nil && q.armed.Load() {
		u32(q.seg.mem, segOffSleep).Store(1)
	}
	q.flagMu.Unlock()
}

// reader is the QP's doorbell goroutine: it reads control messages and doorbells
// from the peer, drives the queues when nobody polls, runs the RNR timer, and
// re-arms the doorbell when polling stopped. EOF means the peer is gone.
func (q *qp) reader() {
	defer close(q.readerDone)
	rc, err := q.conn.SyscallConn()
	if err != nil {
		q.peerGone()
		return
	}
	r := newRx()
	expired := time.Unix(1, 0)
	cur := expired
	for {
		q.dlMu.Lock()
		var dl time.Time
		if !q.rnrDL.IsZero() {
			dl = q.rnrDL
		}
		if !q.armed.Load() {
			if g := time.Now().Add(grace); dl.IsZero() || g.Before(dl) {
				dl = g
			}
		}
		if !dl.Equal(cur) {
			q.conn.SetReadDeadline(dl)
			cur = dl
		}
		q.lastPol = q.polls.Load()
		q.dlMu.Unlock()

		err := rc.Read(r.fn)
		if err == nil {
			err = r.err
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				cur = expired // the socket keeps the passed deadline until reset
				q.timer()
				continue
			}
			q.peerGone()
			return
		}
		if r.n == 0 && r.oobn == 0 {
			q.peerGone() // orderly shutdown
			return
		}
		fds := scm.Rights(r.oob[:r.oobn])
		m, err := parseCtl(r.buf[:r.n])
		if err == nil && r.flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			err = fmt.Errorf("%w: truncated control message", errPeer)
		}
		if err != nil {
			closeFDs(fds)
			q.fail(err.Error())
			continue
		}
		q.dispatch(m, fds)
	}
}

func (q *qp) dispatch(m ctl, fds []int) {
	switch m.typ {
	case ctlDoorbell:
		closeFDs(fds)
		q.rearm()
		q.kickAcks()
		q.kickReqs()
	case ctlMapReq:
		closeFDs(fds)
		q.serveMap(m.rkey)
	case ctlMapRep:
		if (m.status == mapOK) != (len(fds) == 1) {
			closeFDs(fds)
			q.fail("map reply with wrong descriptors")
			return
		}
		fd := -1
		if len(fds) == 1 {
			fd = fds[0]
		}
		select {
		case q.mapReply <- mapResult{msg: m, fd: fd}:
		default:
			closeFDs(fds)
		}
	case ctlRevoke:
		closeFDs(fds)
		q.revMu.Lock()
		q.revoked = append(q.revoked, m.rkey)
		q.hasRev.Store(true)
		q.revMu.Unlock()
		q.kickAcks()
	default:
		closeFDs(fds)
		q.fail("unexpected control message")
	}
}

// rx receives one control message with recvmsg(2) into buffers it owns, so that a
// doorbell costs no allocation (net.UnixConn.ReadMsgUnix allocates an address).
type rx struct {
	buf   [maxCtlLen + 1]byte // one more than the largest message: longer ones are truncated
	oob   [64]byte
	iov   unix.Iovec
	hdr   unix.Msghdr
	n     int
	oobn  int
	flags int
	err   error
	fn    func(fd uintptr) bool
}

func newRx() *rx {
	r := &rx{}
	r.iov.Base = &r.buf[0]
	r.iov.SetLen(len(r.buf))
	r.hdr.Iov = &r.iov
	r.hdr.Iovlen = 1
	r.hdr.Control = &r.oob[0]
	r.fn = func(fd uintptr) bool {
		r.hdr.SetControllen(len(r.oob))
		r.hdr.Flags = 0
		n, _, e := unix.Syscall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&r.hdr)), unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
		if e == unix.EAGAIN {
			return false // wait in the netpoller
		}
		r.err = nil
		if e != 0 {
			r.err = e
		}
		r.n, r.oobn, r.flags = int(n), int(r.hdr.Controllen), int(r.hdr.Flags)
		return true
	}
	return r
}

// timer runs when the read deadline passed: RNR retries, and re-arming the doorbell
// when nobody polled during the grace period.
func (q *qp) timer() {
	q.dlMu.Lock()
	if !q.rnrDL.IsZero() && !time.Now().Before(q.rnrDL) {
		q.rnrDL = time.Time{}
	}
	idle := q.polls.Load() == q.lastPol
	q.dlMu.Unlock()
	if idle {
		q.arm()
	} else {
		q.kickReqs()
	}
}

// peerGone: the socket closed. Take what the peer completed, then flush the rest.
func (q *qp) peerGone() {
	q.goneOnce.Do(func() { close(q.gone) })
	q.kickAcks()
	q.kickReqs()
	q.fail("peer closed")
	q.kickAcks()
	q.kickReqs()
}

// serveMap answers a peer's request for a region: only one of this QP's PD with
// remote access, and writable only with remote write.
func (q *qp) serveMap(rkey uint32) {
	q.dev.log.Debug("shm: map request", "qpn", q.qpn, "rkey", rkey)
	rep := ctl{typ: ctlMapRep, rkey: rkey, status: mapNoAccess}
	fd := -1
	if m := q.dev.lookupMR(rkey); m != nil {
		var ok, first bool
		var err error
		fd, ok, first, err = m.grant(q)
		if err != nil {
			q.dev.log.Error("shm: grant region", "rkey", rkey, "err", err)
		}
		if ok {
			rep.status, rep.access, rep.addr, rep.size = mapOK, m.access, m.addr, uint64(m.size)
		}
		if first {
			q.grantMu.Lock()
			q.granted = append(q.granted, m) // once: repeated requests must not grow it
			q.grantMu.Unlock()
		}
	}
	if err := q.sendCtl(&rep, fd); err != nil {
		q.dev.log.Debug("shm: send map reply", "err", err)
	}
	if fd >= 0 {
		unix.Close(fd)
	}
}

// Close destroys the QP: outstanding work requests complete with WCWRFlushErr and
// the peer sees the socket close.
func (q *qp) Close() error {
	if q.closed.Swap(true) {
		return nil
	}
	q.transition(verbs.QPError, "closed")
	q.goneOnce.Do(func() { close(q.gone) })
	q.connMu.Lock() // wait for a Connect in progress
	conn := q.conn
	q.connMu.Unlock()
	if conn != nil {
		conn.Close()
		<-q.readerDone
	}
	q.dev.unregisterQP(q)
	q.sqMu.Lock()
	q.processAcks()
	q.deliverSQ()
	q.rqMu.Lock()
	q.flushRQ()
	q.bellMu.Lock()
	if q.bellFD >= 0 {
		unix.Close(q.bellFD)
		q.bellFD = -1
	}
	q.bellMu.Unlock()
	for k, r := range q.remote {
		r.reg.close()
		delete(q.remote, k)
	}
	q.flagMu.Lock()
	if q.seg != nil {
		q.seg.close()
		q.seg = nil
	}
	q.flagMu.Unlock()
	if q.pseg != nil {
		q.pseg.close()
		q.pseg = nil
	}
	q.rqMu.Unlock()
	q.sqMu.Unlock()
	q.sendCQ.detach(q)
	q.recvCQ.detach(q)
	q.grantMu.Lock()
	for _, m := range q.granted {
		m.ungrant(q)
	}
	q.granted = nil
	q.grantMu.Unlock()
	return nil
}
