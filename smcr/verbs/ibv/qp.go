//go:build ibv

// RC queue pairs: creation, the INIT → RTR → RTS transitions from the attributes
// CLC and LLC exchange (RFC 7609 §3.3.1 and §3.3.2: QPN, PSN, GID, MTU), posting
// WRITE / WRITE WITH IMM / SEND / RECV without allocation, error state and flush.

package ibv

/*
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

static int smcr_to_init(struct ibv_qp *qp, int port) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = port;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int smcr_to_rtr(struct ibv_qp *qp, int port, int mtu, uint32_t dqpn, uint32_t rq_psn,
		const uint8_t *dgid, int sgid_index) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = dqpn;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12; // 0.64 ms
	a.ah_attr.is_global = 1;
	memcpy(a.ah_attr.grh.dgid.raw, dgid, 16);
	a.ah_attr.grh.sgid_index = sgid_index;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = port;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int smcr_to_rts(struct ibv_qp *qp, uint32_t sq_psn, int rnr_retry) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14; // 4.096 µs << 14 = 67 ms per try
	// 6, not 7: rxe treats a retry count of 7 as "retry forever", so a dead
	// peer would never fail the queue pair (hardware stops after 7).
	a.retry_cnt = 6;
	a.rnr_retry = rnr_retry;
	a.sq_psn = sq_psn;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
		IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static int smcr_to_err(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_ERR;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

static int smcr_state(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	int rc = ibv_query_qp(qp, &a, IBV_QP_STATE, &ia);
	return rc ? -rc : (int)a.qp_state;
}

enum { SMCR_MAX_SGE = 4, SMCR_MAX_CHAIN = 8 };

// A flat send request, so Go fills C memory and never builds ibv_send_wr's
// unions and pointers itself.
struct smcr_swr {
	uint64_t id;
	uint64_t raddr;
	uint32_t rkey;
	uint32_t imm;
	int opcode;
	int flags;
	int nsge;
	struct ibv_sge sg[SMCR_MAX_SGE];
};

// The send side's requests in C memory, and how many of the last chain went.
struct smcr_sq {
	int posted;
	struct smcr_swr w[SMCR_MAX_CHAIN];
};

// Posts sq->w[0..n) as one chain (one ibv_post_send: one doorbell).
static int smcr_post_send(struct ibv_qp *qp, struct smcr_sq *sq, int n) {
	struct ibv_send_wr wr[SMCR_MAX_CHAIN], *bad = NULL;
	memset(wr, 0, n * sizeof wr[0]);
	for (int i = 0; i < n; i++) {
		struct smcr_swr *w = &sq->w[i];
		wr[i].wr_id = w->id;
		wr[i].sg_list = w->sg;
		wr[i].num_sge = w->nsge;
		wr[i].opcode = w->opcode;
		wr[i].send_flags = w->flags;
		wr[i].wr.rdma.remote_addr = w->raddr;
		wr[i].wr.rdma.rkey = w->rkey;
		wr[i].imm_data = htonl(w->imm);
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	int rc = ibv_post_send(qp, wr, &bad);
	sq->posted = rc == 0 ? n : (bad >= wr && bad < wr + n ? (int)(bad - wr) : 0);
	return rc;
}

static int smcr_post_recv(struct ibv_qp *qp, struct ibv_sge *sg, int nsge, uint64_t id) {
	struct ibv_recv_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = id;
	wr.sg_list = sg;
	wr.num_sge = nsge;
	return ibv_post_recv(qp, &wr, &bad);
}
*/
import "C"

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// maxSGE bounds the scatter/gather list of one work request.
const maxSGE = C.SMCR_MAX_SGE

// maxChain is verbs.MaxChain, the requests one post carries: PostSend fills
// that many C requests at most, after verbs.CheckChain.
const maxChain = C.SMCR_MAX_CHAIN

// The build fails unless the C array holds exactly verbs.MaxChain requests.
var _ = [1]struct{}{}[maxChain-verbs.MaxChain]

// drainTimeout bounds how long Close waits for the flush of its marker requests.
const drainTimeout = time.Second

type qp struct {
	pd             *pd
	dev            *device
	qp             *C.struct_ibv_qp
	sendCQ, recvCQ *cq
	attr           verbs.QPAttr
	gidIndex       int // the source GID entry attr.GID came from
	rnrRetry       int
	maxInline      int // inline space the device granted, in bytes

	state  atomic.Uint32 // verbs.QPState this side moved it to
	closed atomic.Bool
	// life keeps q.qp and the SGE arrays alive: every call into the QP holds
	// it for reading and checks closed under it; Close holds it to destroy
	// them. A post that passed the closed check could otherwise run on a freed
	// QP (an adapter's doorbell written into unmapped memory).
	life   sync.RWMutex
	drains atomic.Int32 // drain markers seen while closing
	smu    sync.Mutex
	sq     *C.struct_smcr_sq // guarded by smu
	rmu    sync.Mutex
	rsge   *C.struct_ibv_sge // maxSGE entries, guarded by rmu
}

func (p *pd) createQP(cfg verbs.QPConfig) (*qp, error) {
	scq, ok1 := cfg.SendCQ.(*cq)
	rcq, ok2 := cfg.RecvCQ.(*cq)
	if !ok1 || !ok2 || scq.dev != p.dev || rcq.dev != p.dev {
		return nil, fmt.Errorf("ibv: create qp: %w: completion queues of another device", verbs.ErrInvalid)
	}
	if cfg.MaxSendWR <= 0 {
		cfg.MaxSendWR = 64
	}
	if cfg.MaxRecvWR <= 0 {
		cfg.MaxRecvWR = 64
	}
	if cfg.RNRRetry < 0 || cfg.RNRRetry > 7 {
		return nil, fmt.Errorf("ibv: create qp: %w: rnr retry %d", verbs.ErrInvalid, cfg.RNRRetry)
	}
	if cfg.MaxInline < 0 {
		return nil, fmt.Errorf("ibv: create qp: %w: inline space %d", verbs.ErrInvalid, cfg.MaxInline)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, verbs.ErrClosed
	}
	// Held before the QP exists, so neither CQ is destroyed under it.
	if !scq.attach() {
		return nil, verbs.ErrClosed
	}
	if !rcq.attach() {
		scq.detach()
		return nil, verbs.ErrClosed
	}
	var ia C.struct_ibv_qp_init_attr
	ia.send_cq = scq.cq
	ia.recv_cq = rcq.cq
	ia.qp_type = C.IBV_QPT_RC
	// One more of each for the drain markers Close posts.
	ia.cap.max_send_wr = C.uint32_t(cfg.MaxSendWR + 1)
	ia.cap.max_recv_wr = C.uint32_t(cfg.MaxRecvWR + 1)
	ia.cap.max_send_sge = maxSGE
	ia.cap.max_recv_sge = maxSGE
	ia.cap.max_inline_data = C.uint32_t(cfg.MaxInline)
	h, err := C.ibv_create_qp(p.pd, &ia)
	if h == nil && cfg.MaxInline > 0 {
		// Inline space is an optimisation: a device without it (or with
		// less) still gets a queue pair.
		p.dev.log.Debug("ibv: create qp without inline space", "asked", cfg.MaxInline, "err", errnoOr(err))
		ia.cap.max_inline_data = 0
		h, err = C.ibv_create_qp(p.pd, &ia)
	}
	if h == nil {
		scq.detach()
		rcq.detach()
		return nil, fmt.Errorf("ibv: create qp: %w", errnoOr(err))
	}
	// ibv_create_qp writes the granted capacities back into ia.cap.
	q := &qp{pd: p, dev: p.dev, qp: h, sendCQ: scq, recvCQ: rcq, rnrRetry: cfg.RNRRetry,
		maxInline: int(ia.cap.max_inline_data)}
	// Straight to INIT: RECVs may be posted before the peer's attributes arrive.
	if rc := C.smcr_to_init(h, C.int(p.dev.port)); rc != 0 {
		C.ibv_destroy_qp(h)
		scq.detach()
		rcq.detach()
		return nil, fmt.Errorf("ibv: qp to INIT: %w", syscall.Errno(rc))
	}
	p.live++ // under p.mu
	q.state.Store(uint32(verbs.QPInit))
	q.sq = (*C.struct_smcr_sq)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_smcr_sq{}))))
	q.rsge = (*C.struct_ibv_sge)(C.calloc(maxSGE, C.size_t(unsafe.Sizeof(C.struct_ibv_sge{}))))
	src := p.dev.src.Load() // the queue pair keeps the source GID it names
	q.gidIndex = src.index
	q.attr = verbs.QPAttr{
		QPN: uint32(h.qp_num),
		PSN: rand.Uint32() & 0xffffff,
		GID: src.attr.GID,
		MAC: src.attr.MAC,
		MTU: src.attr.MTU,
	}
	p.dev.mu.Lock()
	p.dev.qps[q.attr.QPN] = q
	p.dev.mu.Unlock()
	return q, nil
}

func (q *qp) Attr() verbs.QPAttr { return q.attr }

func (q *qp) Connect(ctx context.Context, remote verbs.QPAttr) error {
	q.life.RLock()
	defer q.life.RUnlock()
	if q.closed.Load() {
		return verbs.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if !remote.MTU.Valid() || remote.QPN > 0xffffff || remote.QPN == 0 || remote.PSN > 0xffffff {
		return fmt.Errorf("ibv: connect: %w: remote qpn %#x psn %#x mtu %d", verbs.ErrInvalid, remote.QPN, remote.PSN, remote.MTU)
	}
	if s := verbs.QPState(q.state.Load()); s != verbs.QPInit {
		return fmt.Errorf("ibv: connect from %v: %w", s, verbs.ErrQPState)
	}
	mtu := min(q.attr.MTU, remote.MTU)
	if rc := C.smcr_to_rtr(q.qp, C.int(q.dev.port), C.int(mtu), C.uint32_t(remote.QPN), C.uint32_t(remote.PSN),
		(*C.uint8_t)(unsafe.Pointer(&remote.GID[0])), C.int(q.gidIndex)); rc != 0 {
		return fmt.Errorf("ibv: qp %#x to RTR: %w", q.attr.QPN, syscall.Errno(rc))
	}
	q.state.Store(uint32(verbs.QPRTR))
	if rc := C.smcr_to_rts(q.qp, C.uint32_t(q.attr.PSN), C.int(q.rnrRetry)); rc != 0 {
		return fmt.Errorf("ibv: qp %#x to RTS: %w", q.attr.QPN, syscall.Errno(rc))
	}
	q.state.Store(uint32(verbs.QPRTS))
	q.dev.log.Debug("ibv: qp connected", "qpn", q.attr.QPN, "remote_qpn", remote.QPN, "mtu", mtu.Bytes())
	return nil
}

// fillSGE checks a scatter/gather list and copies it into the C array, leaving
// out empty elements (a zero length means 2 GiB to some adapters). It returns
// how many entries it used and their total length.
func fillSGE(dst *C.struct_ibv_sge, sg []verbs.SGE) (n, total int, err error) {
	if len(sg) > maxSGE {
		return 0, 0, fmt.Errorf("ibv: %w: %d sges, at most %d", verbs.ErrInvalid, len(sg), maxSGE)
	}
	out := unsafe.Slice(dst, maxSGE)
	for _, s := range sg {
		if err := verbs.CheckSGE(s); err != nil {
			return 0, 0, err
		}
		m, ok := s.MR.(*mr)
		if !ok {
			return 0, 0, fmt.Errorf("ibv: %w: sge region of another provider", verbs.ErrInvalid)
		}
		if m.gone.Load() {
			return 0, 0, fmt.Errorf("ibv: %w: sge region closed", verbs.ErrInvalid)
		}
		if s.Length == 0 {
			continue
		}
		// The wire's lengths are 32 bits, and 2^31 is a message's limit.
		if s.Length > math.MaxInt32 || total+s.Length > math.MaxInt32 {
			return 0, 0, fmt.Errorf("ibv: %w: %d bytes in one work request", verbs.ErrInvalid, total+s.Length)
		}
		out[n].addr = C.uint64_t(m.addr + uint64(s.Offset))
		out[n].length = C.uint32_t(s.Length)
		out[n].lkey = C.uint32_t(m.lkey)
		n++
		total += s.Length
	}
	return n, total, nil
}

// PostSend fills a C request for each of the chain's and posts them in one call.
// A request found invalid is not posted, nor those after it; those before it
// are (ibv_post_send's semantics, which PostError reports).
func (q *qp) PostSend(wr *verbs.SendWR) error {
	if err := verbs.CheckChain(wr); err != nil {
		return err
	}
	q.life.RLock()
	defer q.life.RUnlock()
	if q.closed.Load() {
		return verbs.ErrClosed
	}
	if s := verbs.QPState(q.state.Load()); s != verbs.QPRTS {
		return fmt.Errorf("ibv: post send in %v: %w", s, verbs.ErrQPState)
	}
	q.smu.Lock()
	defer q.smu.Unlock()
	ws := unsafe.Slice(&q.sq.w[0], maxChain)
	n := 0
	var bad error // the invalid request's error, if one stopped the chain
	for ; wr != nil; wr = wr.Next {
		if bad = q.fillSend(&ws[n], wr); bad != nil {
			break
		}
		n++
	}
	if n == 0 {
		return bad
	}
	rc := C.smcr_post_send(q.qp, q.sq, C.int(n))
	posted := int(q.sq.posted)
	err := postErr("send", rc)
	if err == nil {
		err = bad
	}
	if err != nil && posted > 0 {
		return &verbs.PostError{Posted: posted, Err: err}
	}
	return err
}

// fillSend checks wr and copies it into w.
func (q *qp) fillSend(w *C.struct_smcr_swr, wr *verbs.SendWR) error {
	var op C.int
	switch wr.Opcode {
	case verbs.OpWrite:
		op = C.IBV_WR_RDMA_WRITE
	case verbs.OpWriteImm:
		op = C.IBV_WR_RDMA_WRITE_WITH_IMM
	case verbs.OpSend:
		op = C.IBV_WR_SEND
	default:
		return fmt.Errorf("ibv: post send: %w: opcode %d", verbs.ErrInvalid, wr.Opcode)
	}
	n, total, err := fillSGE(&w.sg[0], wr.SG)
	if err != nil {
		return err
	}
	var flags C.int
	if wr.Signaled {
		flags = C.IBV_SEND_SIGNALED
	}
	if wr.Inline && total <= q.maxInline {
		flags |= C.IBV_SEND_INLINE
	}
	w.id, w.raddr, w.rkey, w.imm = C.uint64_t(wr.ID), C.uint64_t(wr.RemoteAddr), C.uint32_t(wr.RKey), C.uint32_t(wr.Imm)
	w.opcode, w.flags, w.nsge = op, flags, C.int(n)
	return nil
}

func (q *qp) PostRecv(wr *verbs.RecvWR) error {
	q.life.RLock()
	defer q.life.RUnlock()
	if q.closed.Load() {
		return verbs.ErrClosed
	}
	if s := verbs.QPState(q.state.Load()); s == verbs.QPReset {
		return fmt.Errorf("ibv: post recv in %v: %w", s, verbs.ErrQPState)
	}
	q.rmu.Lock()
	n, _, err := fillSGE(q.rsge, wr.SG)
	if err != nil {
		q.rmu.Unlock()
		return err
	}
	rc := C.smcr_post_recv(q.qp, q.rsge, C.int(n), C.uint64_t(wr.ID))
	q.rmu.Unlock()
	return postErr("recv", rc)
}

func postErr(what string, rc C.int) error {
	switch syscall.Errno(rc) {
	case 0:
		return nil
	case syscall.ENOMEM:
		return verbs.ErrQueueFull
	case syscall.EINVAL:
		return fmt.Errorf("ibv: post %s: %w", what, verbs.ErrInvalid)
	}
	return fmt.Errorf("ibv: post %s: %w", what, syscall.Errno(rc))
}

// State asks the device, so it shows the error state the adapter entered on its
// own (retry exceeded, remote access error).
func (q *qp) State() verbs.QPState {
	q.life.RLock()
	defer q.life.RUnlock()
	if q.closed.Load() {
		return verbs.QPError
	}
	s := C.smcr_state(q.qp)
	switch s {
	case C.IBV_QPS_RESET:
		return verbs.QPReset
	case C.IBV_QPS_INIT:
		return verbs.QPInit
	case C.IBV_QPS_RTR:
		return verbs.QPRTR
	case C.IBV_QPS_RTS:
		return verbs.QPRTS
	}
	return verbs.QPError
}

// Close moves the QP to the error state, so the adapter flushes every outstanding
// request with WCWRFlushErr, waits for a marker request posted behind them to be
// flushed too (the kernel's ib_drain_qp), then destroys it. The flushed
// completions wait in the CQs for the owner's next Poll.
func (q *qp) Close() error {
	if q.closed.Swap(true) {
		return nil
	}
	// Calls already past their closed check finish first (life); the ones
	// after it see closed. The flush and drain run outside: posts that come
	// meanwhile are flushed too.
	q.life.RLock()
	if rc := C.smcr_to_err(q.qp); rc == 0 {
		q.state.Store(uint32(verbs.QPError))
		q.drain()
	}
	q.life.RUnlock()
	q.dev.mu.Lock()
	delete(q.dev.qps, q.attr.QPN)
	q.dev.mu.Unlock()
	q.life.Lock()
	defer q.life.Unlock()
	if rc := C.ibv_destroy_qp(q.qp); rc != 0 {
		return fmt.Errorf("ibv: destroy qp %#x: %w", q.attr.QPN, syscall.Errno(rc))
	}
	C.free(unsafe.Pointer(q.sq))
	C.free(unsafe.Pointer(q.rsge))
	q.sendCQ.detach()
	q.recvCQ.detach()
	q.pd.release()
	return nil
}

func (q *qp) drain() {
	want := int32(0)
	q.smu.Lock()
	q.sq.w[0] = C.struct_smcr_swr{id: drainWRID, opcode: C.IBV_WR_SEND, flags: C.IBV_SEND_SIGNALED}
	if C.smcr_post_send(q.qp, q.sq, 1) == 0 {
		want++
	}
	q.smu.Unlock()
	q.rmu.Lock()
	if C.smcr_post_recv(q.qp, nil, 0, drainWRID) == 0 {
		want++
	}
	q.rmu.Unlock()
	deadline := time.Now().Add(drainTimeout)
	for q.drains.Load() < want {
		_, err1 := q.sendCQ.stashAll()
		_, err2 := q.recvCQ.stashAll()
		if err1 != nil || err2 != nil || time.Now().After(deadline) {
			q.dev.log.Debug("ibv: qp flush incomplete", "qpn", q.attr.QPN, "markers", q.drains.Load(), "want", want)
			return
		}
		if q.drains.Load() < want {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// stashAll moves every completion the device has into the stash (growing it).
func (c *cq) stashAll() (int, error) {
	if c.closed.Load() {
		return 0, verbs.ErrClosed
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	total := 0
	for {
		n, err := c.pollLocked(c.put, pollBatch)
		total += n
		if n == 0 || err != nil {
			return total, err
		}
	}
}

// drained records a flushed drain marker of queue pair qpn.
func (d *device) drained(qpn uint32) {
	d.mu.Lock()
	q := d.qps[qpn]
	d.mu.Unlock()
	if q != nil {
		q.drains.Add(1)
	}
}
