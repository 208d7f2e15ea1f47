//go:build ibv

// Completion queues with a completion channel: polling without allocation, and
// event-driven waits through the Go netpoller (RFC 7609 §2.1, completions of the
// RDMA WRITEs and SENDs that carry RMB data and CDC/LLC messages).

package ibv

/*
#include <stdint.h>
#include <stdlib.h>
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>

// A flat completion, so Go never touches the unions of struct ibv_wc.
struct smcr_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t byte_len;
	uint32_t imm;
	uint32_t qp_num;
	uint32_t has_imm;
};

enum { SMCR_POLL_BATCH = 32, SMCR_WC_NO_OPCODE = 0xffff };

static int smcr_poll(struct ibv_cq *cq, int n, struct smcr_wc *out) {
	struct ibv_wc wc[SMCR_POLL_BATCH];
	if (n > SMCR_POLL_BATCH)
		n = SMCR_POLL_BATCH;
	int got = ibv_poll_cq(cq, n, wc);
	for (int i = 0; i < got; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].qp_num = wc[i].qp_num;
		if (wc[i].status != IBV_WC_SUCCESS) {
			// Only wr_id, status, qp_num and vendor_err are defined for a
			// failed completion: the rest is whatever the array held before.
			out[i].opcode = SMCR_WC_NO_OPCODE;
			out[i].byte_len = 0;
			out[i].has_imm = 0;
			out[i].imm = 0;
			continue;
		}
		out[i].opcode = wc[i].opcode;
		out[i].byte_len = wc[i].byte_len;
		out[i].has_imm = (wc[i].wc_flags & IBV_WC_WITH_IMM) != 0;
		out[i].imm = out[i].has_imm ? ntohl(wc[i].imm_data) : 0;
	}
	return got;
}

static int smcr_arm(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }

// Returns 1 when an event was consumed, 0 when none is pending (EAGAIN), or
// -errno.
static int smcr_get_event(struct ibv_comp_channel *ch, struct ibv_cq *want) {
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(ch, &cq, &ctx) != 0)
		return errno == EAGAIN ? 0 : -errno;
	ibv_ack_cq_events(cq, 1);
	return 1;
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/smcr/verbs"
)

const pollBatch = C.SMCR_POLL_BATCH

// drainWRID marks the work requests QP.Close posts to flush a queue pair; Poll
// never hands their completions out.
const drainWRID = 0xd4a1_5d4a_15d4_a15d

type cq struct {
	dev   *device
	cq    *C.struct_ibv_cq
	ch    *C.struct_ibv_comp_channel
	file  *os.File // a dup of ch's fd, non-blocking, registered with the netpoller
	raw   syscall.RawConn
	spin  time.Duration
	depth int

	mu    sync.Mutex
	wcs   *C.struct_smcr_wc // pollBatch entries in C memory
	stash []verbs.WorkCompletion
	head  int    // stash[head:] are pending
	polls uint64 // calls into ibv_poll_cq, for the tests

	closed  atomic.Bool
	waitErr error // set by the Read callback
	users   int   // queue pairs still attached, guarded by mu
	gone    bool  // destroyed, guarded by mu
}

var aLongTimeAgo = time.Unix(1, 0)

func (d *device) createCQ(depth int) (*cq, error) {
	if depth <= 0 {
		return nil, fmt.Errorf("ibv: create cq: %w: depth %d", verbs.ErrInvalid, depth)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, verbs.ErrClosed
	}
	ch, err := C.ibv_create_comp_channel(d.ctx)
	if ch == nil {
		return nil, fmt.Errorf("ibv: create completion channel: %w", errnoOr(err))
	}
	c := &cq{dev: d, ch: ch, spin: d.cfg.Spin, depth: depth}
	fail := func(err error) (*cq, error) {
		if c.file != nil {
			c.file.Close()
		}
		if c.cq != nil {
			C.ibv_destroy_cq(c.cq)
		}
		C.ibv_destroy_comp_channel(ch)
		return nil, err
	}
	c.cq, err = C.ibv_create_cq(d.ctx, C.int(depth), nil, ch, 0)
	if c.cq == nil {
		return fail(fmt.Errorf("ibv: create cq of %d: %w", depth, errnoOr(err)))
	}
	// O_NONBLOCK belongs to the open file description, so ibv_get_cq_event on
	// the original fd never blocks either.
	fd, err := unix.Dup(int(ch.fd))
	if err != nil {
		return fail(fmt.Errorf("ibv: dup channel fd: %w", err))
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return fail(fmt.Errorf("ibv: channel fd non-blocking: %w", err))
	}
	c.file = os.NewFile(uintptr(fd), "ibv-comp-channel")
	if c.raw, err = c.file.SyscallConn(); err != nil {
		return fail(fmt.Errorf("ibv: channel fd: %w", err))
	}
	c.wcs = (*C.struct_smcr_wc)(C.calloc(pollBatch, C.size_t(unsafe.Sizeof(C.struct_smcr_wc{}))))
	c.stash = make([]verbs.WorkCompletion, 0, pollBatch)
	d.live++ // under d.mu
	return c, nil
}

// Poll hands out stashed completions first (taken by Wait or a QP's Close), then
// polls the device.
func (c *cq) Poll(wc []verbs.WorkCompletion) (int, error) {
	if c.closed.Load() {
		return 0, verbs.ErrClosed
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := copy(wc, c.stash[c.head:])
	c.head += n
	if c.head == len(c.stash) {
		c.stash, c.head = c.stash[:0], 0
	}
	for n < len(wc) {
		want := len(wc) - n
		got, err := c.pollLocked(func(w verbs.WorkCompletion) { wc[n] = w; n++ }, want)
		if err != nil || got < want {
			// Fewer than asked: the CQ is empty. Asking again would cost a
			// call into the library (and a cgo crossing) for nothing.
			return n, err
		}
	}
	return n, nil
}

// pollLocked polls up to max completions from the device and passes each, drain
// markers left out, to put. It returns how many it polled. A CQ destroyed since
// the caller's closed check (Close won the lock) is not touched.
func (c *cq) pollLocked(put func(verbs.WorkCompletion), max int) (int, error) {
	if c.gone {
		return 0, verbs.ErrClosed
	}
	c.polls++
	got := int(C.smcr_poll(c.cq, C.int(max), c.wcs))
	if got < 0 {
		return 0, fmt.Errorf("ibv: poll cq: %w", syscall.Errno(-got))
	}
	for _, w := range unsafe.Slice(c.wcs, got) {
		if uint64(w.wr_id) == drainWRID {
			c.dev.drained(uint32(w.qp_num))
			continue
		}
		put(verbs.WorkCompletion{
			ID:      uint64(w.wr_id),
			Status:  wcStatus(w.status),
			Opcode:  wcOpcode(w.opcode),
			ByteLen: uint32(w.byte_len),
			Imm:     uint32(w.imm),
			HasImm:  w.has_imm != 0,
			QPN:     uint32(w.qp_num),
		})
	}
	return got, nil
}

// stashSome moves completions from the device into the stash and reports whether
// any is pending.
func (c *cq) stashSome() (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.head < len(c.stash) {
		return true, nil
	}
	_, err := c.pollLocked(c.put, pollBatch)
	return c.head < len(c.stash), err
}

func (c *cq) put(w verbs.WorkCompletion) { c.stash = append(c.stash, w) }

// Wait spins on the CQ for the configured time, then arms it and sleeps on the
// completion channel until an event, ctx's end or Close.
func (c *cq) Wait(ctx context.Context) error {
	if c.closed.Load() {
		return verbs.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if c.spin > 0 {
		start := time.Now()
		for {
			if ok, err := c.stashSome(); ok || err != nil {
				return err
			}
			if time.Since(start) >= c.spin {
				break
			}
		}
	}
	c.mu.Lock()
	rc := C.int(0)
	if !c.gone {
		rc = C.smcr_arm(c.cq)
	}
	gone := c.gone
	c.mu.Unlock()
	if gone {
		return verbs.ErrClosed
	}
	if rc != 0 {
		return fmt.Errorf("ibv: arm cq: %w", syscall.Errno(rc))
	}
	// A completion that arrived before the arm raises no event: look once more.
	if ok, err := c.stashSome(); ok || err != nil {
		return err
	}
	if err := c.file.SetReadDeadline(time.Time{}); err != nil {
		return c.fileErr(ctx, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		if err := c.file.SetReadDeadline(dl); err != nil {
			return c.fileErr(ctx, err)
		}
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { _ = c.file.SetReadDeadline(aLongTimeAgo) })
		defer stop()
	}
	c.waitErr = nil
	err := c.raw.Read(c.readEvent)
	if err != nil {
		return c.fileErr(ctx, err)
	}
	return c.waitErr
}

// readEvent consumes one completion event; it returns false to wait for the fd.
// The netpoller serializes it with Close.
func (c *cq) readEvent(uintptr) bool {
	switch rc := C.smcr_get_event(c.ch, c.cq); {
	case rc > 0:
		return true
	case rc == 0:
		return false
	default:
		c.waitErr = fmt.Errorf("ibv: get cq event: %w", syscall.Errno(-rc))
		return true
	}
}

func (c *cq) fileErr(ctx context.Context, err error) error {
	switch {
	case c.closed.Load() || errors.Is(err, os.ErrClosed):
		return verbs.ErrClosed
	case errors.Is(err, os.ErrDeadlineExceeded):
		if e := ctx.Err(); e != nil {
			return e
		}
		return context.DeadlineExceeded
	}
	return fmt.Errorf("ibv: wait cq: %w", err)
}

// Close makes Wait and Poll fail with ErrClosed at once; libibverbs refuses to
// destroy a CQ that queue pairs still use, so the last of them destroys it.
func (c *cq) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	// Close returns once no Wait is inside readEvent.
	c.file.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.users > 0 {
		return nil
	}
	return c.destroyLocked()
}

func (c *cq) destroyLocked() error {
	if c.gone {
		return nil
	}
	c.gone = true
	if rc := C.ibv_destroy_cq(c.cq); rc != 0 {
		return fmt.Errorf("ibv: destroy cq: %w", syscall.Errno(rc))
	}
	C.ibv_destroy_comp_channel(c.ch)
	C.free(unsafe.Pointer(c.wcs))
	c.dev.release()
	return nil
}

// attach and detach count the queue pairs using c.
// attach fails on a CQ closed already: a QP must not be made on it.
func (c *cq) attach() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() || c.gone {
		return false
	}
	c.users++
	return true
}

func (c *cq) detach() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.users--
	if c.users == 0 && c.closed.Load() {
		if err := c.destroyLocked(); err != nil {
			c.dev.log.Warn("ibv: deferred cq destroy", "err", err)
		}
	}
}

func wcStatus(s C.uint32_t) verbs.WCStatus {
	switch s {
	case C.IBV_WC_SUCCESS:
		return verbs.WCSuccess
	case C.IBV_WC_LOC_LEN_ERR:
		return verbs.WCLocLenErr
	case C.IBV_WC_LOC_QP_OP_ERR:
		// rxe reports a SEND longer than its RECV buffer as a malformed
		// receive WQE; hardware as a length error. This provider never posts
		// a malformed WQE otherwise (SGE count and sizes are checked first).
		return verbs.WCLocLenErr
	case C.IBV_WC_LOC_PROT_ERR:
		return verbs.WCLocProtErr
	case C.IBV_WC_WR_FLUSH_ERR:
		return verbs.WCWRFlushErr
	case C.IBV_WC_REM_ACCESS_ERR:
		return verbs.WCRemAccessErr
	case C.IBV_WC_REM_OP_ERR:
		return verbs.WCRemOpErr
	case C.IBV_WC_REM_INV_REQ_ERR:
		return verbs.WCRemInvReqErr
	case C.IBV_WC_RETRY_EXC_ERR:
		return verbs.WCRetryExcErr
	case C.IBV_WC_RNR_RETRY_EXC_ERR:
		return verbs.WCRNRRetryExcErr
	}
	return verbs.WCGeneralErr
}

func wcOpcode(o C.uint32_t) verbs.WCOpcode {
	switch o {
	case C.IBV_WC_SEND:
		return verbs.WCSend
	case C.IBV_WC_RDMA_WRITE:
		return verbs.WCWrite
	case C.IBV_WC_RECV:
		return verbs.WCRecv
	case C.IBV_WC_RECV_RDMA_WITH_IMM:
		return verbs.WCRecvRDMAImm
	}
	return 0
}
