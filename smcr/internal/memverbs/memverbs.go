// Package memverbs is an in-process verbs provider for the engine's tests: queue
// pairs of one process connected through a registry, RDMA WRITE and SEND done by
// copying under a lock. It checks rkeys, bounds and permissions as hardware does, and
// lets tests fail a link (Fail) or inject raw SENDs as a hostile peer would.
// Not an RFC 7609 part: it stands in for the RoCE hardware of §2.
package memverbs

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/smcr-io/smcr/smcr/verbs"
)

var (
	regMu   sync.Mutex
	devices = map[string]*Device{}
	devSeq  atomic.Uint64
)

// Device is one in-process device. Its Endpoint names it in the registry.
type Device struct {
	name  string
	mu    sync.Mutex
	mrs   map[uint32]*mr
	qps   map[uint32]*qp
	next  uint32
	kind  verbs.Kind
	gid   [16]byte
	mac   [6]byte
	shut  bool
	Sends atomic.Uint64 // SEND work requests posted, for tests that count messages
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
	return verbs.PortAttr{GID: d.gid, MAC: d.mac, MTU: verbs.MTU4096, LinkUp: true, GIDType: "mem"}
}
func (d *Device) Endpoint() []byte { return []byte(d.name) }

func (d *Device) AllocPD() (verbs.PD, error) { return &pd{d: d}, nil }

func (d *Device) CreateCQ(depth int) (verbs.CQ, error) {
	return &cq{wake: make(chan struct{}, 1), done: make(chan struct{})}, nil
}

func (d *Device) Close() error {
	d.mu.Lock()
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

type pd struct{ d *Device }

func (p *pd) AllocMR(size int, access verbs.Access) (verbs.MR, error) {
	if size <= 0 {
		return nil, verbs.ErrInvalid
	}
	p.d.mu.Lock()
	defer p.d.mu.Unlock()
	k := p.d.id() << 8
	m := &mr{d: p.d, b: make([]byte, size), key: k, access: access, addr: uint64(k) << 20}
	p.d.mrs[k] = m
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
	m := &mr{d: p.d, b: o.b, key: k, access: access, addr: uint64(k) << 20}
	p.d.mrs[k] = m
	return m, nil
}

func (p *pd) CreateQP(cfg verbs.QPConfig) (verbs.QP, error) {
	p.d.mu.Lock()
	defer p.d.mu.Unlock()
	if p.d.shut {
		return nil, verbs.ErrClosed
	}
	q := &qp{d: p.d, qpn: p.d.id() & 0xffffff, scq: cfg.SendCQ.(*cq), rcq: cfg.RecvCQ.(*cq), state: verbs.QPInit}
	q.psn = q.qpn * 7 & 0xffffff
	p.d.qps[q.qpn] = q
	return q, nil
}

func (p *pd) Close() error { return nil }

type mr struct {
	d      *Device
	b      []byte
	key    uint32
	access verbs.Access
	addr   uint64
}

func (m *mr) Bytes() []byte        { return m.b }
func (m *mr) LKey() uint32         { return m.key }
func (m *mr) RKey() uint32         { return m.key }
func (m *mr) Addr() uint64         { return m.addr }
func (m *mr) Access() verbs.Access { return m.access }
func (m *mr) Close() error {
	m.d.mu.Lock()
	delete(m.d.mrs, m.key)
	m.d.mu.Unlock()
	return nil
}

type cq struct {
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
	c.once.Do(func() { close(c.done) })
	return nil
}

type qp struct {
	d        *Device
	qpn, psn uint32
	scq, rcq *cq
	mu       sync.Mutex
	state    verbs.QPState
	peer     *qp
	recvs    []verbs.RecvWR
	pending  [][]byte // SENDs that found no RECV posted (RNR retried forever)
}

func (q *qp) Attr() verbs.QPAttr {
	return verbs.QPAttr{QPN: q.qpn, PSN: q.psn, GID: q.d.gid, MAC: q.d.mac, MTU: verbs.MTU4096, Endpoint: q.d.Endpoint()}
}

func (q *qp) Connect(ctx context.Context, remote verbs.QPAttr) error {
	regMu.Lock()
	d := devices[string(remote.Endpoint)]
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

func (q *qp) deliver(r verbs.RecvWR, msg []byte) {
	n := 0
	for _, s := range r.SG {
		n += copy(s.MR.Bytes()[s.Offset:s.Offset+s.Length], msg[n:])
	}
	st := verbs.WCSuccess
	if n < len(msg) {
		st = verbs.WCLocLenErr
	}
	q.rcq.push(verbs.WorkCompletion{ID: r.ID, Status: st, Opcode: verbs.WCRecv, ByteLen: uint32(len(msg)), QPN: q.qpn})
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
	q.deliver(r, msg)
	return true
}

func (q *qp) PostSend(wr *verbs.SendWR) error {
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
		off += copy(m.b[off:], s.MR.Bytes()[s.Offset:s.Offset+s.Length])
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
	delete(q.d.qps, q.qpn)
	q.d.mu.Unlock()
	return nil
}
