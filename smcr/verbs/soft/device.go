// The soft device: a TCP listener standing in for an RDMA port, its protection
// domains and memory regions (the RoCE addressing RFC 7609 §3.1 expects: a GID
// derived from the IP address, a MAC, a path MTU).

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
	"sync/atomic"
	"time"

	"github.com/smcr-io/smcr/internal/lograte"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// Config configures a soft device.
type Config struct {
	// ListenAddr is the TCP address the device listens on for its peers' request
	// streams (default "127.0.0.1:0": loopback only). Name a specific IP for use
	// between hosts: the Endpoint and the GID carry it, and an unspecified IP
	// ("0.0.0.0", "::") gives a zero GID and an Endpoint only local peers can use.
	ListenAddr string
	// Listener, when set, is used instead of listening on ListenAddr (for example a
	// listener made inside a network namespace). The device closes it.
	Listener net.Listener
	// Dial opens the request streams of Connect (default: net.Dialer). Tests use it
	// to dial from inside a network namespace.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Netdev names the network interface whose MAC the port reports. Empty: the
	// interface holding the listen IP, if any.
	Netdev string
	// MTU is the path MTU the port reports (default verbs.MTU1024, as RoCE over a
	// 1500-byte Ethernet MTU). Soft frames are not cut to it.
	MTU verbs.MTU
	// RNRTimer is how long a requester waits after a receiver-not-ready NAK before
	// sending again (default 1 ms).
	RNRTimer time.Duration
	// Spin is how long CQ.Wait busy-polls before it sleeps (default 20 µs).
	Spin time.Duration
	// Logger receives state changes and peer misbehaviour (default: discarded).
	Logger *slog.Logger
}

// device implements verbs.Device.
type device struct {
	cfg      Config
	log      *slog.Logger
	ln       net.Listener
	endpoint []byte
	port     verbs.PortAttr

	mu       sync.RWMutex
	closed   bool
	qps      map[uint32]*qp // by QPN
	mrs      map[uint32]*mr // by rkey (= lkey)
	nextAddr uint64
	conns    map[net.Conn]struct{} // accepted, not yet attached to a QP
	cqs      map[*cq]struct{}
	wg       sync.WaitGroup
	done     chan struct{}   // closed by Close
	watch    *portWatch      // nil: the port counts as up
	refused  lograte.Limiter // lines for streams refused: anyone may connect
}

// Open starts a soft device listening as cfg says.
func Open(cfg Config) (verbs.Device, error) {
	if cfg.ListenAddr == "" {
		cfg.ListenAddr = "127.0.0.1:0"
	}
	if cfg.MTU == 0 {
		cfg.MTU = verbs.MTU1024
	}
	if !cfg.MTU.Valid() {
		return nil, fmt.Errorf("soft: %w: mtu code %d", verbs.ErrInvalid, cfg.MTU)
	}
	if cfg.RNRTimer <= 0 {
		cfg.RNRTimer = time.Millisecond
	}
	if cfg.Spin == 0 {
		cfg.Spin = 20 * time.Microsecond
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln := cfg.Listener
	if ln == nil {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		var err error
		if ln, err = lc.Listen(context.Background(), "tcp", cfg.ListenAddr); err != nil {
			return nil, fmt.Errorf("soft: listen: %w", err)
		}
	}
	ap, err := netip.ParseAddrPort(ln.Addr().String())
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("soft: listen address: %w", err)
	}
	d := &device{
		cfg:      cfg,
		ln:       ln,
		endpoint: []byte(ap.String()),
		qps:      map[uint32]*qp{},
		mrs:      map[uint32]*mr{},
		conns:    map[net.Conn]struct{}{},
		cqs:      map[*cq]struct{}{},
		done:     make(chan struct{}),
		nextAddr: 0x7f00_0000_0000 + uint64(rand.Uint32N(1<<16))<<16,
	}
	d.log = log.With("device", d.Name())
	d.port = verbs.PortAttr{MTU: cfg.MTU, LinkUp: true, GIDType: "soft"}
	if ip := ap.Addr(); !ip.IsUnspecified() {
		d.port.GID = ip.As16() // IPv4-mapped for IPv4, as RoCE v2 derives GIDs
	}
	d.port.Netdev, d.port.MAC = findNetdev(cfg.Netdev, ap.Addr())
	d.watch = openPortWatch(d.port.Netdev)
	d.wg.Add(1)
	go d.acceptLoop()
	return d, nil
}

// findNetdev returns the named interface's MAC, or that of the interface holding ip.
func findNetdev(name string, ip netip.Addr) (string, [6]byte) {
	var mac [6]byte
	if name != "" {
		if ifi, err := net.InterfaceByName(name); err == nil {
			copy(mac[:], ifi.HardwareAddr)
		}
		return name, mac
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return "", mac
	}
	for _, ifi := range ifs {
		addrs, _ := ifi.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr() == ip.Unmap() {
				copy(mac[:], ifi.HardwareAddr)
				return ifi.Name, mac
			}
		}
	}
	return "", mac
}

func (d *device) Kind() verbs.Kind     { return verbs.KindSoft }
func (d *device) Name() string         { return "soft:" + string(d.endpoint) }
func (d *device) Port() verbs.PortAttr { return d.port }
func (d *device) Endpoint() []byte     { return append([]byte(nil), d.endpoint...) }
func (d *device) AllocPD() (verbs.PD, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return nil, verbs.ErrClosed
	}
	return &pd{dev: d}, nil
}

func (d *device) CreateCQ(depth int) (verbs.CQ, error) {
	if depth <= 0 {
		return nil, fmt.Errorf("soft: %w: cq depth %d", verbs.ErrInvalid, depth)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, verbs.ErrClosed
	}
	c := newCQ(depth, d.cfg.Spin)
	d.cqs[c] = struct{}{}
	return c, nil
}

// Close closes the listener and every QP (flushing their work requests) and CQ.
func (d *device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	close(d.done)
	qps := make([]*qp, 0, len(d.qps))
	for _, q := range d.qps {
		qps = append(qps, q)
	}
	for c := range d.conns {
		c.Close()
	}
	cqs := d.cqs
	d.mu.Unlock()
	d.ln.Close()
	for _, q := range qps {
		q.Close()
	}
	for c := range cqs {
		c.Close()
	}
	d.wg.Wait()
	d.watch.close()
	return nil
}

// PortUp reports whether the device's interface is up with a carrier now
// (verbs.PortStater); a device closed, or without an interface, says so from
// what it knows.
func (d *device) PortUp() bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return false
	}
	return d.watch.up(d.port.Netdev)
}

// PortChanged is closed when the device's interface changes (verbs.PortNotifier).
func (d *device) PortChanged() <-chan struct{} { return d.watch.next() }

// acceptLoop takes the request streams of peer QPs.
func (d *device) acceptLoop() {
	defer d.wg.Done()
	var backoff time.Duration
	for {
		c, err := d.ln.Accept()
		if err != nil {
			d.mu.RLock()
			closed := d.closed
			d.mu.RUnlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, say: the device must go on accepting
			// once that passes, or no peer could connect to it again.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			d.log.Warn("soft: accept", "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-d.done:
				return
			}
			continue
		}
		backoff = 0
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			c.Close()
			return
		}
		d.conns[c] = struct{}{}
		d.wg.Add(1)
		d.mu.Unlock()
		go d.handshake(c)
	}
}

// helloTimeout bounds how long an accepted stream may take to name its QP.
const helloTimeout = 5 * time.Second

// handshake reads a stream's hello and attaches it to the QP it names.
func (d *device) handshake(c net.Conn) {
	defer d.wg.Done()
	attached := false
	defer func() {
		d.mu.Lock()
		delete(d.conns, c)
		d.mu.Unlock()
		if !attached {
			c.Close()
		}
	}()
	var b [headerLen]byte
	var h header
	c.SetDeadline(time.Now().Add(helloTimeout))
	if _, err := readFull(c, b[:]); err != nil {
		return
	}
	if err := parseHeader(b[:], &h); err != nil || h.typ != frameHello {
		d.refused.Log(d.log, slog.LevelWarn, "soft: refused stream", "peer", c.RemoteAddr(), "err", err, "type", h.typ)
		return
	}
	src, dst := uint32(h.addr>>32), uint32(h.addr)
	d.mu.RLock()
	q := d.qps[dst]
	d.mu.RUnlock()
	if q == nil {
		d.refused.Log(d.log, slog.LevelWarn, "soft: stream for unknown qp", "peer", c.RemoteAddr(), "qpn", dst)
		return
	}
	// Attach before answering: a refused stream gets no hello reply, so the
	// peer's Connect fails instead of its first request.
	c.SetDeadline(time.Time{})
	reply := header{typ: frameHelloOK, psn: h.psn}
	reply.put(b[:])
	if attached = q.attachResponder(c, src, h.psn); !attached {
		d.refused.Log(d.log, slog.LevelWarn, "soft: stream refused by qp", "peer", c.RemoteAddr(), "qpn", dst)
		return
	}
	// The responder reads only; it writes nothing before the first request, which
	// cannot come before this reply.
	c.Write(b[:])
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := c.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// pd implements verbs.PD.
type pd struct {
	dev    *device
	closed atomic.Bool
}

const pageSize = 4096

func (p *pd) AllocMR(size int, access verbs.Access) (verbs.MR, error) {
	if size <= 0 || size > maxMessage {
		return nil, fmt.Errorf("soft: %w: region size %d", verbs.ErrInvalid, size)
	}
	if p.closed.Load() {
		return nil, verbs.ErrClosed
	}
	return p.register(make([]byte, size), access)
}

// RegisterMR registers the bytes of another soft device's region on this PD
// (verbs.Registrar): both MRs alias one buffer, each with its own key and address.
func (p *pd) RegisterMR(other verbs.MR, access verbs.Access) (verbs.MR, error) {
	o, ok := other.(*mr)
	if !ok {
		return nil, fmt.Errorf("soft: %w: region of another provider", verbs.ErrInvalid)
	}
	if o.closed.Load() {
		return nil, verbs.ErrClosed
	}
	if p.closed.Load() {
		return nil, verbs.ErrClosed
	}
	return p.register(o.buf, access)
}

// register gives buf a key and an address on p's device.
func (p *pd) register(buf []byte, access verbs.Access) (verbs.MR, error) {
	size := len(buf)
	d := p.dev
	m := &mr{pd: p, buf: buf, access: access}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, verbs.ErrClosed
	}
	for {
		m.key = rand.Uint32()
		if _, taken := d.mrs[m.key]; m.key != 0 && !taken {
			break
		}
	}
	// Regions get disjoint addresses with a guard page between them.
	m.addr = d.nextAddr
	d.nextAddr += (uint64(size) + 2*pageSize - 1) &^ (pageSize - 1)
	d.mrs[m.key] = m
	return m, nil
}

func (p *pd) CreateQP(cfg verbs.QPConfig) (verbs.QP, error) {
	if p.closed.Load() {
		return nil, verbs.ErrClosed
	}
	return newQP(p, cfg)
}

func (p *pd) Close() error {
	p.closed.Store(true)
	return nil
}

// lookup returns the bytes a peer may write at [addr, addr+n) under rkey through a
// QP of pd p: the rkey must exist in p and allow remote write, and the range must
// lie inside the region. This is the responder's access check.
func (p *pd) lookup(rkey uint32, addr uint64, n uint32) ([]byte, bool) {
	d := p.dev
	d.mu.RLock()
	m := d.mrs[rkey]
	d.mu.RUnlock()
	if m == nil || m.pd != p || m.access&verbs.AccessRemoteWrite == 0 || addr < m.addr {
		return nil, false
	}
	off, size := addr-m.addr, uint64(len(m.buf))
	if off > size || uint64(n) > size-off {
		return nil, false
	}
	return m.buf[off : off+uint64(n)], true
}

// mr implements verbs.MR.
type mr struct {
	pd     *pd
	buf    []byte
	key    uint32
	addr   uint64
	access verbs.Access
	closed atomic.Bool
}

func (m *mr) Bytes() []byte        { return m.buf }
func (m *mr) LKey() uint32         { return m.key }
func (m *mr) RKey() uint32         { return m.key }
func (m *mr) Addr() uint64         { return m.addr }
func (m *mr) Access() verbs.Access { return m.access }

func (m *mr) Close() error {
	if m.closed.Swap(true) {
		return nil
	}
	d := m.pd.dev
	d.mu.Lock()
	delete(d.mrs, m.key)
	d.mu.Unlock()
	return nil
}
