// Reliable-connected queue pairs: work queues, the state machine and connection
// set-up from the attributes CLC carries (RFC 7609 §3.1 QP number, PSN, MTU; §4.5
// link failure flushes outstanding work).

package soft

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// Limits of one QP.
const (
	defaultWR = 64
	maxWR     = 1 << 14
	maxSGE    = 16
	// drainTimeout bounds how long a failed responder keeps reading its stream so
	// that its NAK reaches the requester before the connection is reset.
	drainTimeout = 5 * time.Second
	bufSize      = 64 << 10
)

// sendSlot is a send work request held until its ACK (or error).
type sendSlot struct {
	id       uint64
	op       verbs.Opcode
	sg       []verbs.SGE // reused: no allocation per request
	length   uint32
	addr     uint64
	rkey     uint32
	imm      uint32
	signaled bool
	rnr      int // RNR NAKs met so far
}

// recvSlot is a posted receive.
type recvSlot struct {
	id     uint64
	sg     []verbs.SGE
	length int
}

// qp implements verbs.QP.
//
// State machine (verbs.QPState names, one transition function setStateLocked):
//
//	INIT ──Connect──▶ RTS ──error, peer gone, bad frame──▶ ERROR
//	  └───────────────────────Close / error─────────────────▲
//
// A QP is created in INIT (receives may be posted); Connect dials the peer device,
// sends a hello and moves to RTS (soft has no use for a separate RTR step).
// Three goroutines serve a connected QP: sendLoop writes requests to the outbound
// stream, ackLoop reads the ACK/NAKs coming back on it, and respond executes the
// peer's requests arriving on the inbound stream.
type qp struct {
	dev      *device
	pd       *pd
	scq, rcq *cq
	qpn, psn uint32
	rnrRetry int
	log      *slog.Logger

	mu         sync.Mutex
	state      verbs.QPState
	closed     bool
	connecting bool
	remote     verbs.QPAttr
	sq         []sendSlot
	sqHead     uint64 // oldest un-acked
	sqNext     uint64 // next to transmit (rewound on RNR)
	sqTail     uint64 // next free
	rnrUntil   time.Time
	rq         []recvSlot
	rqHead     uint64
	rqTail     uint64
	out        net.Conn              // our request stream to the peer
	in         net.Conn              // the peer's request stream to us, once verified
	pendingIn  map[net.Conn]struct{} // inbound streams before the peer is known (attachResponder)
	kick       chan struct{}         // wakes sendLoop
	connected  chan struct{}         // closed on entering RTS
	done       chan struct{}         // closed on entering ERROR
	execMu     sync.RWMutex          // held by place while it copies into memory
	execOff    bool                  // under execMu: the QP left RTS, place copies nothing more
	txMu       sync.Mutex            // held by sendLoop while it reads a request's memory
	txOff      bool                  // under txMu: the QP left RTS, sendLoop reads nothing more
}

func newQP(p *pd, cfg verbs.QPConfig) (*qp, error) {
	scq, ok1 := cfg.SendCQ.(*cq)
	rcq, ok2 := cfg.RecvCQ.(*cq)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("soft: %w: completion queues of another provider", verbs.ErrInvalid)
	}
	if scq.isClosed() || rcq.isClosed() {
		return nil, verbs.ErrClosed
	}
	if cfg.MaxSendWR == 0 {
		cfg.MaxSendWR = defaultWR
	}
	if cfg.MaxRecvWR == 0 {
		cfg.MaxRecvWR = defaultWR
	}
	if cfg.MaxSendWR < 0 || cfg.MaxSendWR > maxWR || cfg.MaxRecvWR < 0 || cfg.MaxRecvWR > maxWR ||
		cfg.RNRRetry < 0 || cfg.RNRRetry > 7 || cfg.MaxInline < 0 {
		return nil, fmt.Errorf("soft: %w: qp config %+v", verbs.ErrInvalid, cfg)
	}
	d := p.dev
	q := &qp{
		dev: d, pd: p, scq: scq, rcq: rcq,
		psn:       randPSN(),
		rnrRetry:  cfg.RNRRetry,
		state:     verbs.QPInit,
		sq:        make([]sendSlot, cfg.MaxSendWR),
		rq:        make([]recvSlot, cfg.MaxRecvWR),
		kick:      make(chan struct{}, 1),
		connected: make(chan struct{}),
		done:      make(chan struct{}),
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, verbs.ErrClosed
	}
	// Random, not in sequence: a QPN is what a stranger's hello must name to
	// take the QP's one inbound stream before its peer does, and a peer that
	// knows one of ours must not be able to tell the next.
	for {
		q.qpn = 1 + rand.Uint32N(psnMask)
		if _, taken := d.qps[q.qpn]; !taken {
			break
		}
	}
	d.qps[q.qpn] = q
	q.log = d.log.With("qpn", q.qpn)
	return q, nil
}

func (q *qp) Attr() verbs.QPAttr {
	port := q.dev.port
	return verbs.QPAttr{QPN: q.qpn, PSN: q.psn, GID: port.GID, MAC: port.MAC, MTU: port.MTU, Endpoint: q.dev.Endpoint()}
}

func (q *qp) State() verbs.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

// setStateLocked is the one place the state changes.
func (q *qp) setStateLocked(to verbs.QPState, why error) {
	if why != nil {
		q.log.Debug("soft: qp state", "from", q.state, "to", to, "why", why)
	} else {
		q.log.Debug("soft: qp state", "from", q.state, "to", to)
	}
	q.state = to
	switch to {
	case verbs.QPRTS:
		close(q.connected)
	case verbs.QPError:
		close(q.done)
	}
}

// Connect dials the peer device named in remote.Endpoint and attaches our request
// stream to the remote QP.
func (q *qp) Connect(ctx context.Context, remote verbs.QPAttr) error {
	if remote.QPN == 0 || remote.QPN > psnMask || remote.PSN > psnMask || !remote.MTU.Valid() || len(remote.Endpoint) == 0 {
		return fmt.Errorf("soft: connect: %w: remote qpn %#x psn %#x mtu %d endpoint %q",
			verbs.ErrInvalid, remote.QPN, remote.PSN, remote.MTU, remote.Endpoint)
	}
	q.mu.Lock()
	switch {
	case q.closed:
		q.mu.Unlock()
		return verbs.ErrClosed
	case q.state != verbs.QPInit || q.connecting:
		q.mu.Unlock()
		return fmt.Errorf("soft: connect: %w: %v", verbs.ErrQPState, q.state)
	}
	q.connecting = true
	q.mu.Unlock()

	c, err := q.dial(ctx, remote)
	q.mu.Lock()
	defer q.mu.Unlock()
	q.connecting = false
	if err == nil && (q.closed || q.state != verbs.QPInit) {
		c.Close()
		err = fmt.Errorf("%w: closed while connecting", verbs.ErrClosed)
	}
	if err != nil {
		return fmt.Errorf("soft: connect to qp %#x at %s: %w", remote.QPN, remote.Endpoint, err)
	}
	q.remote = remote
	q.remote.Endpoint = append([]byte(nil), remote.Endpoint...)
	q.out = c
	q.setStateLocked(verbs.QPRTS, nil)
	go q.sendLoop(c)
	go q.ackLoop(c)
	return nil
}

// dial opens the request stream and exchanges the hello.
func (q *qp) dial(ctx context.Context, remote verbs.QPAttr) (net.Conn, error) {
	// The endpoint is the peer's word (CLC, LLC): a soft device's is its
	// listener's address. Nothing else is dialled: no name is looked up, no
	// unspecified or multicast address tried.
	ep, err := netip.ParseAddrPort(string(remote.Endpoint))
	if err != nil || ep.Addr().IsUnspecified() || ep.Addr().IsMulticast() || ep.Port() == 0 {
		return nil, fmt.Errorf("%w: endpoint %q is not an address and port", verbs.ErrInvalid, remote.Endpoint)
	}
	c, err := q.dev.cfg.Dial(ctx, "tcp", ep.String())
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var b [headerLen]byte
	hello := header{typ: frameHello, psn: q.psn, addr: uint64(q.qpn)<<32 | uint64(remote.QPN),
		rkey: helloMagic, imm: helloVersion}
	hello.put(b[:])
	if _, err := c.Write(b[:]); err != nil {
		c.Close()
		return nil, fmt.Errorf("send hello: %w", err)
	}
	var h header
	if _, err := readFull(c, b[:]); err != nil {
		c.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("hello refused: %w", err)
	}
	if err := parseHeader(b[:], &h); err != nil || h.typ != frameHelloOK || h.psn != q.psn {
		c.Close()
		return nil, fmt.Errorf("bad hello reply (type %d): %v", h.typ, err)
	}
	if !stop() {
		c.Close()
		return nil, ctx.Err()
	}
	return c, nil
}

// attachResponder takes the peer's request stream, named by its hello; it reports
// whether the QP took it (one inbound stream per QP, never in ERROR).
func (q *qp) attachResponder(c net.Conn, srcQPN, psn uint32) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed || q.state == verbs.QPError || q.in != nil:
		return false
	case q.state == verbs.QPRTS:
		// Connected: only the peer's stream.
		if srcQPN != q.remote.QPN || psn != q.remote.PSN {
			return false
		}
		q.in = c
	default:
		// The peer is not known yet: a stranger's hello naming this QP must not
		// keep the peer's out, so a few wait, and Connect picks (respond).
		if len(q.pendingIn) >= maxPendingIn {
			return false
		}
		if q.pendingIn == nil {
			q.pendingIn = map[net.Conn]struct{}{}
		}
		q.pendingIn[c] = struct{}{}
	}
	go q.respond(c, srcQPN, psn)
	return true
}

// maxPendingIn bounds the inbound streams a QP holds before it knows its peer.
const maxPendingIn = 4

// validSGL checks a work request's scatter/gather list against our PD.
func (q *qp) validSGL(sg []verbs.SGE) (int, error) {
	if len(sg) > maxSGE {
		return 0, fmt.Errorf("soft: %w: %d SGEs, at most %d", verbs.ErrInvalid, len(sg), maxSGE)
	}
	n := 0
	for _, s := range sg {
		if err := verbs.CheckSGE(s); err != nil {
			return 0, fmt.Errorf("soft: %w", err)
		}
		m, ok := s.MR.(*mr)
		if !ok || m.pd != q.pd || m.closed.Load() {
			return 0, fmt.Errorf("soft: %w: sge region not registered in this protection domain", verbs.ErrInvalid)
		}
		n += s.Length
	}
	if n > maxMessage {
		return 0, fmt.Errorf("soft: %w: message of %d bytes", verbs.ErrInvalid, n)
	}
	return n, nil
}

// PostSend posts wr's chain one request at a time.
func (q *qp) PostSend(wr *verbs.SendWR) error { return verbs.PostChain(wr, q.postSend) }

func (q *qp) postSend(wr *verbs.SendWR) error {
	if wr.Opcode < verbs.OpWrite || wr.Opcode > verbs.OpSend {
		return fmt.Errorf("soft: %w: opcode %d", verbs.ErrInvalid, wr.Opcode)
	}
	n, err := q.validSGL(wr.SG)
	if err != nil {
		return err
	}
	q.mu.Lock()
	switch {
	case q.closed:
		q.mu.Unlock()
		return verbs.ErrClosed
	case q.state == verbs.QPError:
		// As ibverbs: accepted, and completed at once as flushed.
		q.scq.push(verbs.WorkCompletion{ID: wr.ID, Status: verbs.WCWRFlushErr, QPN: q.qpn})
		q.mu.Unlock()
		return nil
	case q.state != verbs.QPRTS:
		q.mu.Unlock()
		return fmt.Errorf("soft: post send: %w: %v", verbs.ErrQPState, q.state)
	case q.sqTail-q.sqHead >= uint64(len(q.sq)):
		q.mu.Unlock()
		return verbs.ErrQueueFull
	}
	s := &q.sq[q.sqTail%uint64(len(q.sq))]
	*s = sendSlot{id: wr.ID, op: wr.Opcode, sg: append(s.sg[:0], wr.SG...), length: uint32(n),
		addr: wr.RemoteAddr, rkey: wr.RKey, imm: wr.Imm, signaled: wr.Signaled}
	q.sqTail++
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
	return nil
}

func (q *qp) PostRecv(wr *verbs.RecvWR) error {
	n, err := q.validSGL(wr.SG)
	if err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed:
		return verbs.ErrClosed
	case q.state == verbs.QPError:
		q.rcq.push(verbs.WorkCompletion{ID: wr.ID, Status: verbs.WCWRFlushErr, Opcode: verbs.WCRecv, QPN: q.qpn})
		return nil
	case q.rqTail-q.rqHead >= uint64(len(q.rq)):
		return verbs.ErrQueueFull
	}
	s := &q.rq[q.rqTail%uint64(len(q.rq))]
	*s = recvSlot{id: wr.ID, sg: append(s.sg[:0], wr.SG...), length: n}
	q.rqTail++
	return nil
}

// fail moves the QP to ERROR: the oldest send and receive complete with sendSt and
// recvSt (WCWRFlushErr for "no particular cause"), everything else outstanding is
// flushed, and the streams close. A responder that failed keeps draining its
// inbound stream (fromResponder) so its NAK is read before the connection resets.
func (q *qp) fail(sendSt, recvSt verbs.WCStatus, why error, fromResponder bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.failLocked(sendSt, recvSt, why, fromResponder)
}

func (q *qp) failLocked(sendSt, recvSt verbs.WCStatus, why error, fromResponder bool) {
	if q.state == verbs.QPError {
		return
	}
	if sendSt != verbs.WCWRFlushErr && recvSt != verbs.WCWRFlushErr && !errors.Is(why, verbs.ErrClosed) {
		q.log.Warn("soft: qp error", "err", why)
	}
	q.setStateLocked(verbs.QPError, why)
	// After this no WRITE lands: a piece being copied ends first (place).
	q.execMu.Lock()
	q.execOff = true
	q.execMu.Unlock()
	// Nor is a request's memory read after its completion, from which on the
	// user may reuse it, as after an adapter's: sendLoop ends the read it is
	// in first, which closing the stream cuts short if the write blocks.
	if q.out != nil {
		q.out.Close()
	}
	q.txMu.Lock()
	q.txOff = true
	q.txMu.Unlock()
	for i := q.sqHead; i < q.sqTail; i++ {
		s := &q.sq[i%uint64(len(q.sq))]
		st := verbs.WCWRFlushErr
		if i == q.sqHead {
			st = sendSt
		}
		q.scq.push(verbs.WorkCompletion{ID: s.id, Status: st, Opcode: wcOpcode(s.op), QPN: q.qpn})
	}
	q.sqHead, q.sqNext = q.sqTail, q.sqTail
	for i := q.rqHead; i < q.rqTail; i++ {
		st := verbs.WCWRFlushErr
		if i == q.rqHead {
			st = recvSt
		}
		q.rcq.push(verbs.WorkCompletion{ID: q.rq[i%uint64(len(q.rq))].id, Status: st, Opcode: verbs.WCRecv, QPN: q.qpn})
	}
	q.rqHead = q.rqTail
	if q.in != nil {
		if fromResponder {
			q.in.SetReadDeadline(time.Now().Add(drainTimeout))
		} else {
			q.in.Close()
		}
	}
}

func wcOpcode(op verbs.Opcode) verbs.WCOpcode {
	if op == verbs.OpSend {
		return verbs.WCSend
	}
	return verbs.WCWrite
}

// Close destroys the QP: outstanding work requests complete with WCWRFlushErr.
func (q *qp) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	q.failLocked(verbs.WCWRFlushErr, verbs.WCWRFlushErr, verbs.ErrClosed, false)
	q.closed = true
	if q.in != nil {
		q.in.Close()
	}
	q.mu.Unlock()
	d := q.dev
	d.mu.Lock()
	delete(d.qps, q.qpn)
	d.mu.Unlock()
	return nil
}
