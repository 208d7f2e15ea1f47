// Package memverbs is an in-process verbs provider for the engine's tests: queue
// pairs of one process connected through a registry, RDMA WRITE and SEND done by
// copying under a lock. It checks rkeys, bounds and permissions as hardware does, and
// lets tests fail a link (Fail) or inject raw SENDs as a hostile peer would. Like
// ibverbs it refuses to free a PD that still holds MRs or QPs; Live and Misuse let
// tests check that the engine frees everything, in an order hardware accepts.
// Not an RFC 7609 part: it stands in for the RoCE hardware of §2.
package memverbs

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/smcr/verbs"
)

var (
	regMu   sync.Mutex
	devices = map[string]*Device{}
	devSeq  atomic.Uint64
)

// Device is one in-process device. Its Endpoint names it in the registry.
type Device struct {
	name string
	mu   sync.Mutex
	mrs  map[uint32]*mr
	qps  map[uint32]*qp
	next uint32
	kind verbs.Kind
	gid  [16]byte // under mu (ChangeGID)
	mac  [6]byte
	shut bool
	down atomic.Bool // SetPortUp(false)
	// changes is closed by SetPortUp (verbs.PortNotifier) unless quiet.
	changes verbs.PortChanges
	quiet   atomic.Bool
	mute    atomic.Bool  // SetCarry(false)
	failAt  atomic.Int32 // FailChainAt
	pds     int          // PDs not yet freed
	cqs     int          // CQs not yet closed
	bad     []string
	Sends   atomic.Uint64 // SEND work requests posted, for tests that count messages
}

// New returns a device that reports kind (any Kind; the engine only compares them).
func New(kind verbs.Kind) *Device {
	n := devSeq.Add(1)
	d := &Device{name: fmt.Sprintf("mem%d", n), mrs: map[uint32]*mr{}, qps: map[uint32]*qp{}, next: 1, kind: kind}
	d.gid[0], d.gid[15] = 0xfe, byte(n)
	d.mac = [6]byte{2, 0, 0, 0, byte(n >> 8), byte(n)}
	regMu.Lock()
	devices[d.name] = d
	regMu.Unlock()
	return d
}

func (d *Device) Kind() verbs.Kind { return d.kind }
func (d *Device) Name() string     { return d.name }
func (d *Device) Port() verbs.PortAttr {
	d.mu.Lock()
	defer d.mu.Unlock()
	return verbs.PortAttr{GID: d.gid, MAC: d.mac, MTU: verbs.MTU4096, LinkUp: true, GIDType: "mem"}
}

// ChangeGID gives the device a new address, as a change of an interface's
// address gives its RDMA port a new GID: queue pairs made from now on carry
// it, those made before keep theirs, which is gone (verbs.GIDHolder; the
// queue pairs still work, unlike real RDMA's), and watchers of PortChanged
// hear of it.
func (d *Device) ChangeGID(gid [16]byte) {
	d.mu.Lock()
	d.gid = gid
	d.mu.Unlock()
	d.changes.Notify()
}

// HasGID reports whether gid is the device's address now (verbs.GIDHolder).
func (d *Device) HasGID(gid [16]byte) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return gid == d.gid
}
func (d *Device) Endpoint() []byte { return []byte(d.name) }

// PortUp reports the state SetPortUp set (verbs.PortStater).
func (d *Device) PortUp() bool { return !d.down.Load() }

// SetPortUp takes the port down or brings it back, as a cable would; it only
// changes what PortUp reports (Fail breaks the queue pairs), and tells the
// watchers of PortChanged unless SetPortEvents(false).
func (d *Device) SetPortUp(up bool) {
	d.down.Store(!up)
	if !d.quiet.Load() {
		d.changes.Notify()
	}
}

// PortChanged is closed by SetPortUp (verbs.PortNotifier).
func (d *Device) PortChanged() <-chan struct{} { return d.changes.Next() }

// SetPortEvents(false) makes SetPortUp silent, as a device whose events are
// lost: only polling PortUp sees the change.
func (d *Device) SetPortEvents(on bool) { d.quiet.Store(!on) }

// SetCarry(false) makes the device's QPs lose what they send, with no completion,
// as on a path that connects but does not carry: RC retries until the QP closes.
func (d *Device) SetCarry(carry bool) { d.mute.Store(!carry) }

func (d *Device) AllocPD() (verbs.PD, error) {
	d.mu.Lock()
	d.pds++
	d.mu.Unlock()
	return &pd{d: d}, nil
}

func (d *Device) CreateCQ(depth int) (verbs.CQ, error) {
	d.mu.Lock()
	d.cqs++
	d.mu.Unlock()
	return &cq{d: d, wake: make(chan struct{}, 1), done: make(chan struct{})}, nil
}

// Resources counts what a device has not yet freed.
type Resources struct{ PDs, MRs, QPs, CQs int }

// Live returns what is allocated on d and not yet freed.
func (d *Device) Live() Resources {
	d.mu.Lock()
	defer d.mu.Unlock()
	return Resources{PDs: d.pds, MRs: len(d.mrs), QPs: len(d.qps), CQs: d.cqs}
}

// Misuse lists the lifecycle errors seen (a PD freed before its MRs, an MR
// closed after its PD, a device closed with resources live): what a real verbs
// library refuses or crashes on.
func (d *Device) Misuse() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.bad...)
}

func (d *Device) misuse(format string, args ...any) {
	d.bad = append(d.bad, fmt.Sprintf(format, args...))
}

func (d *Device) Close() error {
	d.mu.Lock()
	if d.pds > 0 || len(d.mrs) > 0 || d.cqs > 0 {
		d.misuse("device closed with %d PDs, %d MRs, %d CQs live", d.pds, len(d.mrs), d.cqs)
	}
	qps := make([]*qp, 0, len(d.qps))
	for _, q := range d.qps {
		qps = append(qps, q)
	}
	d.shut = true
	d.mu.Unlock()
	for _, q := range qps {
		q.Close()
	}
	regMu.Lock()
	delete(devices, d.name)
	regMu.Unlock()
	return nil
}

// Fail moves every QP of the device to the error state, as a cable pull would.
func (d *Device) Fail() {
	d.mu.Lock()
	qps := make([]*qp, 0, len(d.qps))
	for _, q := range d.qps {
		qps = append(qps, q)
	}
	d.mu.Unlock()
	for _, q := range qps {
		q.fail(verbs.WCRetryExcErr)
	}
}

func (d *Device) id() uint32 {
	d.next++
	return d.next
}

type pd struct {
	d        *Device
	mrs, qps int // live children, under d.mu
	freed    bool
}

func (p *pd) AllocMR(size int, access verbs.Access) (verbs.MR, error) {
	if size <= 0 {
		return nil, verbs.ErrInvalid
	}
	p.d.mu.Lock()
	defer p.d.mu.Unlock()
	// Outside the Go heap, as an adapter's memory is: its writes are DMA, not
	// Go code (the race detector would take the peer's identical rewrite of
	// bytes a reader holds, after a failover, for a race).
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("memverbs: alloc mr: %w", err)
	}
	k := p.d.id() << 8
	m := &mr{d: p.d, pd: p, b: b, mem: &region{refs: 1}, key: k, access: access, addr: uint64(k) << 20}
	p.d.mrs[k] = m
	p.mrs++
	return m, nil
}

// RegisterMR registers another memverbs region's bytes on this device (verbs.Registrar).
func (p *pd) RegisterMR(other verbs.MR, access verbs.Access) (verbs.MR, error) {
	o, ok := other.(*mr)
	if !ok {
		return nil, verbs.ErrInvalid
	}
	p.d.mu.Lock()
	defer p.d.mu.Unlock()
	k := p.d.id() << 8
	o.mem.mu.Lock()
	o.mem.refs++
	o.mem.mu.Unlock()
	m := &mr{d: p.d, pd: p, b: o.b, mem: o.mem, key: k, access: access, addr: uint64(k) << 20}
	p.d.mrs[k] = m
	p.mrs++
	return m, nil
}

func (p *pd) CreateQP(cfg verbs.QPConfig) (verbs.QP, error) {
	p.d.mu.Lock()
	defer p.d.mu.Unlock()
	if p.d.shut {
		return nil, verbs.ErrClosed
	}
	q := &qp{d: p.d, pd: p, qpn: p.d.id() & 0xffffff, gid: p.d.gid, scq: cfg.SendCQ.(*cq), rcq: cfg.RecvCQ.(*cq), state: verbs.QPInit}
	q.psn = q.qpn * 7 & 0xffffff
	p.d.qps[q.qpn] = q
	p.qps++
	return q, nil
}

// Close frees the PD unless MRs or QPs still use it: ibv_dealloc_pd's EBUSY.
func (p *pd) Close() error {
	p.d.mu.Lock()
	defer p.d.mu.Unlock()
	if p.freed {
		return nil
	}
	if p.mrs > 0 || p.qps > 0 {
		p.d.misuse("pd freed with %d MRs and %d QPs in it", p.mrs, p.qps)
		return fmt.Errorf("memverbs: dealloc pd: %d MRs, %d QPs in use", p.mrs, p.qps)
	}
	p.freed = true
	p.d.pds--
	return nil
}

type mr struct {
	d      *Device
	pd     *pd
	closed bool // under d.mu
	b      []byte
	mem    *region // b's, shared by its registrations
	key    uint32
	access verbs.Access
	addr   uint64
}

// region is the memory registrations share. An adapter stops its DMA into a
// region before deregistration completes; here a delivery copies under mu's
// read lock and the last Close unmaps under its write lock, so a region
// closed while a SEND or WRITE lands is never written after it is unmapped.
type region struct {
	mu       sync.RWMutex
	refs     int // registrations of b; the last Close unmaps it
	unmapped bool
}

// copyIn copies src to m's bytes at off, unless m's memory is gone; it
// reports how much it copied.
func (m *mr) copyIn(off int, src []byte) (int, bool) {
	m.mem.mu.RLock()
	defer m.mem.mu.RUnlock()
	if m.mem.unmapped {
		return 0, false
	}
	return copy(m.b[off:], src), true
}

func (m *mr) Bytes() []byte        { return m.b }
func (m *mr) LKey() uint32         { return m.key }
func (m *mr) RKey() uint32         { return m.key }
func (m *mr) Addr() uint64         { return m.addr }
func (m *mr) Access() verbs.Access { return m.access }
func (m *mr) Close() error {
	m.d.mu.Lock()
	defer m.d.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	if m.pd.freed {
		m.d.misuse("mr %#x closed after its pd", m.key)
	}
	delete(m.d.mrs, m.key)
	m.pd.mrs--
	m.mem.mu.Lock()
	defer m.mem.mu.Unlock()
	if m.mem.refs--; m.mem.refs == 0 {
		m.mem.unmapped = true
		return unix.Munmap(m.b)
	}
	return nil
}

type cq struct {
	d    *Device
	mu   sync.Mutex
	q    []verbs.WorkCompletion
	wake chan struct{}
	done chan struct{}
	once sync.Once
}

func (c *cq) push(wc verbs.WorkCompletion) {
	c.mu.Lock()
	c.q = append(c.q, wc)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *cq) Poll(wc []verbs.WorkCompletion) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := copy(wc, c.q)
	c.q = c.q[:copy(c.q, c.q[n:])]
	return n, nil
}

func (c *cq) Wait(ctx context.Context) error {
	c.mu.Lock()
	ready := len(c.q) > 0
	c.mu.Unlock()
	if ready {
		return nil
	}
	select {
	case <-c.wake:
		return nil
	case <-c.done:
		return verbs.ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *cq) Close() error {
	c.once.Do(func() {
		close(c.done)
		c.d.mu.Lock()
		c.d.cqs--
		c.d.mu.Unlock()
	})
	return nil
}

type qp struct {
	d        *Device
	pd       *pd
	closed   bool // under d.mu
	qpn, psn uint32
	gid      [16]byte // the device's when the QP was made
	scq, rcq *cq
	mu       sync.Mutex
	state    verbs.QPState
	peer     *qp
	recvs    []verbs.RecvWR
	pending  [][]byte // SENDs that found no RECV posted (RNR retried forever)
}

func (q *qp) Attr() verbs.QPAttr {
	return verbs.QPAttr{QPN: q.qpn, PSN: q.psn, GID: q.gid, MAC: q.d.mac, MTU: verbs.MTU4096, Endpoint: q.d.Endpoint()}
}

func (q *qp) Connect(ctx context.Context, remote verbs.QPAttr) error {
	regMu.Lock()
	d := devices[string(remote.Endpoint)]
	if len(remote.Endpoint) == 0 {
		// No endpoint (a standard peer's CLC carries none): found by its GID,
		// as RoCE finds it.
		for _, x := range devices {
			if x.Port().GID == remote.GID {
				d = x
			}
		}
	}
	regMu.Unlock()
	if d == nil {
		return fmt.Errorf("memverbs: no device %q", remote.Endpoint)
	}
	d.mu.Lock()
	p := d.qps[remote.QPN]
	d.mu.Unlock()
	if p == nil {
		return fmt.Errorf("memverbs: no qp %d on %s", remote.QPN, d.name)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.state != verbs.QPInit {
		return verbs.ErrQPState
	}
	q.peer, q.state = p, verbs.QPRTS
	for len(q.pending) > 0 && len(q.recvs) > 0 {
		msg, r := q.pending[0], q.recvs[0]
		q.pending, q.recvs = q.pending[1:], q.recvs[1:]
		q.mu.Unlock()
		q.deliver(r, msg)
		q.mu.Lock()
	}
	return nil
}

func (q *qp) State() verbs.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

func (q *qp) PostRecv(wr *verbs.RecvWR) error {
	q.mu.Lock()
	if q.state == verbs.QPError || q.state == verbs.QPReset {
		q.mu.Unlock()
		return verbs.ErrQPState
	}
	r := verbs.RecvWR{ID: wr.ID, SG: append([]verbs.SGE(nil), wr.SG...)}
	if len(q.pending) > 0 && q.state == verbs.QPRTS {
		msg := q.pending[0]
		q.pending = q.pending[1:]
		q.mu.Unlock()
		q.deliver(r, msg)
		return nil
	}
	q.recvs = append(q.recvs, r)
	q.mu.Unlock()
	return nil
}

// deliver completes r with msg; it reports whether msg landed.
func (q *qp) deliver(r verbs.RecvWR, msg []byte) bool {
	n := 0
	st := verbs.WCSuccess
	for _, s := range r.SG {
		c, ok := s.MR.(*mr).copyIn(s.Offset, msg[n:min(len(msg), n+s.Length)])
		if !ok {
			st = verbs.WCLocProtErr // the buffer was deregistered under the RECV
			break
		}
		n += c
	}
	if st == verbs.WCSuccess && n < len(msg) {
		st = verbs.WCLocLenErr
	}
	q.rcq.push(verbs.WorkCompletion{ID: r.ID, Status: st, Opcode: verbs.WCRecv, ByteLen: uint32(len(msg)), QPN: q.qpn})
	return st == verbs.WCSuccess
}

// receive takes a SEND from the peer.
func (q *qp) receive(msg []byte) bool {
	q.mu.Lock()
	if q.state == verbs.QPError {
		q.mu.Unlock()
		return false
	}
	// A QP not yet in RTS drops the packet and the sender retries, as RC does;
	// holding it until then has the same effect.
	if len(q.recvs) == 0 || q.state != verbs.QPRTS {
		q.pending = append(q.pending, msg)
		q.mu.Unlock()
		return true
	}
	r := q.recvs[0]
	q.recvs = q.recvs[1:]
	q.mu.Unlock()
	// A SEND that did not land (its RECV's buffer deregistered under it) does
	// not complete well at the sender either.
	return q.deliver(r, msg)
}

// FailChainAt has the next chain of more than k requests (k ≥ 1) posted on
// the device fail at its request k with ErrQueueFull, as a full send queue
// fails ibv_post_send part way: the requests before it go.
func (d *Device) FailChainAt(k int) { d.failAt.Store(int32(k)) }

// PostSend posts wr's chain one request at a time.
func (q *qp) PostSend(wr *verbs.SendWR) error {
	i := 0
	return verbs.PostChain(wr, func(w *verbs.SendWR) error {
		i++
		if k := q.d.failAt.Load(); k > 0 && i == int(k)+1 && q.d.failAt.CompareAndSwap(k, 0) {
			return verbs.ErrQueueFull
		}
		return q.postSend(w)
	})
}

func (q *qp) postSend(wr *verbs.SendWR) error {
	q.mu.Lock()
	st, p := q.state, q.peer
	q.mu.Unlock()
	if st != verbs.QPRTS {
		return verbs.ErrQPState
	}
	for _, s := range wr.SG {
		if err := verbs.CheckSGE(s); err != nil {
			return err
		}
	}
	if q.d.mute.Load() {
		return nil
	}
	status := verbs.WCSuccess
	op := verbs.WCWrite
	switch wr.Opcode {
	case verbs.OpSend:
		op = verbs.WCSend
		q.d.Sends.Add(1)
		var msg []byte
		for _, s := range wr.SG {
			msg = append(msg, s.MR.Bytes()[s.Offset:s.Offset+s.Length]...)
		}
		if !p.receive(msg) {
			status = verbs.WCRetryExcErr
		}
	case verbs.OpWrite:
		status = p.write(wr)
	default:
		return verbs.ErrInvalid
	}
	if status != verbs.WCSuccess {
		q.scq.push(verbs.WorkCompletion{ID: wr.ID, Status: status, Opcode: op, QPN: q.qpn})
		q.fail(verbs.WCWRFlushErr)
		p.fail(verbs.WCWRFlushErr)
		return nil
	}
	if wr.Signaled {
		q.scq.push(verbs.WorkCompletion{ID: wr.ID, Status: status, Opcode: op, QPN: q.qpn})
	}
	return nil
}

// write performs an RDMA WRITE into this QP's device, checked like hardware.
func (q *qp) write(wr *verbs.SendWR) verbs.WCStatus {
	q.d.mu.Lock()
	m := q.d.mrs[wr.RKey]
	q.d.mu.Unlock()
	n := verbs.SGLen(wr.SG)
	if m == nil || m.access&verbs.AccessRemoteWrite == 0 || wr.RemoteAddr < m.addr ||
		wr.RemoteAddr-m.addr > uint64(len(m.b)) || uint64(len(m.b))-(wr.RemoteAddr-m.addr) < uint64(n) {
		return verbs.WCRemAccessErr
	}
	off := int(wr.RemoteAddr - m.addr)
	for _, s := range wr.SG {
		n, ok := m.copyIn(off, s.MR.Bytes()[s.Offset:s.Offset+s.Length])
		if !ok {
			return verbs.WCRemAccessErr // deregistered as the WRITE landed
		}
		off += n
	}
	return verbs.WCSuccess
}

func (q *qp) fail(status verbs.WCStatus) {
	q.mu.Lock()
	if q.state == verbs.QPError {
		q.mu.Unlock()
		return
	}
	q.state = verbs.QPError
	recvs := q.recvs
	q.recvs, q.pending = nil, nil
	q.mu.Unlock()
	for _, r := range recvs {
		q.rcq.push(verbs.WorkCompletion{ID: r.ID, Status: verbs.WCWRFlushErr, Opcode: verbs.WCRecv, QPN: q.qpn})
	}
	// A completion with an error status tells the owner the link is gone even when
	// no receive was posted.
	q.scq.push(verbs.WorkCompletion{ID: ^uint64(0), Status: status, Opcode: verbs.WCSend, QPN: q.qpn})
}

func (q *qp) Close() error {
	q.fail(verbs.WCWRFlushErr)
	q.mu.Lock()
	p := q.peer
	q.mu.Unlock()
	if p != nil {
		p.fail(verbs.WCRetryExcErr)
	}
	q.d.mu.Lock()
	if !q.closed {
		q.closed = true
		delete(q.d.qps, q.qpn)
		q.pd.qps--
	}
	q.d.mu.Unlock()
	return nil
}
