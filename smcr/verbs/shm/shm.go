// The shm device: rendezvous socket, protection domains and memory regions in
// sealed memfds, rkey table. Stands in for the RNIC and its memory registration that
// RFC 7609 §2.1 and §4.2 (RMBs registered with rkeys) assume.

package shm

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/smcr-io/smcr/smcr/verbs"
	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/internal/scm"
)

var (
	// ErrNotSameHost is returned by Connect when the peer's Endpoint names another
	// host (boot ID) or a socket this process cannot see as the same file.
	ErrNotSameHost = errors.New("shm: peer is not on this host")

	errEndpoint    = errors.New("shm: bad endpoint")
	errPeer        = errors.New("shm: peer protocol violation")
	errInvalidSize = errors.New("shm: invalid size")
)

// Config configures a device.
type Config struct {
	// Dir is where the rendezvous socket is created; both peers must see it as the
	// same directory (a shared file system). Default: $TMPDIR/smcr-shm.
	Dir string
	// Name is the device name (default "shm0").
	Name string
	// MaxMsgSize is the largest SEND this device posts (default 8 KiB). It sizes the
	// slots of the request rings this device creates; the peer's rings have their own.
	MaxMsgSize int
	// SpinMax bounds the busy-poll phase of CQ.Wait (default 50µs; adaptive below it).
	SpinMax time.Duration
	// RNRTimer is the wait between receiver-not-ready retries (default 1ms).
	RNRTimer time.Duration
	// Logger receives debug and error events (default: discard).
	Logger *slog.Logger
}

// Open creates a device with its rendezvous socket.
func Open(cfg Config) (verbs.Device, error) {
	if cfg.Dir == "" {
		cfg.Dir = DefaultDir()
	}
	if cfg.Name == "" {
		cfg.Name = "shm0"
	}
	if cfg.MaxMsgSize == 0 {
		cfg.MaxMsgSize = 8 << 10
	}
	if cfg.MaxMsgSize < 64 || cfg.MaxMsgSize > maxSlotSize-slotHdrLen {
		return nil, fmt.Errorf("shm: max message size %d out of range", cfg.MaxMsgSize)
	}
	if cfg.SpinMax == 0 {
		cfg.SpinMax = 50 * time.Microsecond
	}
	if cfg.RNRTimer == 0 {
		cfg.RNRTimer = time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	boot, err := bootID()
	if err != nil {
		return nil, fmt.Errorf("shm: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("shm: rendezvous dir: %w", err)
	}
	removeStale(cfg.Dir, cfg.Logger)
	var rnd [8]byte
	rand.Read(rnd[:])
	path := filepath.Join(cfg.Dir, fmt.Sprintf("%d-%x.sock", os.Getpid(), rnd))
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	if len(path) > maxPathLen {
		return nil, fmt.Errorf("shm: rendezvous path %q longer than %d bytes", path, maxPathLen)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("shm: listen: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		ln.Close()
		return nil, fmt.Errorf("shm: stat rendezvous socket: %w", err)
	}
	d := &device{
		cfg:     cfg,
		log:     cfg.Logger.With("dev", cfg.Name),
		ln:      ln,
		ep:      endpoint{boot: boot, ino: st.Ino, dev: st.Dev, path: path},
		mrs:     make(map[uint32]*mr),
		qps:     make(map[uint32]*qp),
		pending: make(map[uint32]chan *hello),
		done:    make(chan struct{}),
	}
	d.epBytes = d.ep.append(nil)
	d.nextKey = binary.LittleEndian.Uint32(rnd[:4])
	d.gid[0], d.gid[1] = 0xfe, 0x80
	binary.BigEndian.PutUint64(d.gid[8:], st.Ino^binary.BigEndian.Uint64(boot[:8]))
	d.wg.Add(1)
	go d.acceptLoop()
	return d, nil
}

// staleAge is how old a rendezvous socket nothing listens on must be to be
// taken for one left behind: a younger one may be bound by an owner that does
// not listen on it yet.
const staleAge = 5 * time.Second

// removeStale removes the rendezvous sockets in dir whose owner is gone
// (killed, crashed: a process that exits closes its listener and removes the
// file itself), which nothing would ever remove. Whether the owner is gone is
// asked of the socket, by a connect that is refused: the PID in the name may
// be another PID namespace's (a container's).
func removeStale(dir string, log *slog.Logger) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.Type()&os.ModeSocket == 0 || !rendezvousName.MatchString(e.Name()) {
			continue
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < staleAge {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if !listened(path) && os.Remove(path) == nil {
			log.Info("shm: removed a rendezvous socket its owner left", "path", path)
		}
	}
}

// rendezvousName matches the names Open gives rendezvous sockets:
// PID-RANDOM.sock.
var rendezvousName = regexp.MustCompile(`^[0-9]+-[0-9a-f]{16}\.sock$`)

// listened reports whether something may listen on the Unix socket at path:
// anything but a refused connect (a full backlog, say) counts as yes. The
// connect does not wait.
func listened(path string) bool {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return true
	}
	defer unix.Close(fd)
	return unix.Connect(fd, &unix.SockaddrUnix{Name: path}) != unix.ECONNREFUSED
}

type device struct {
	cfg     Config
	log     *slog.Logger
	ln      *net.UnixListener
	ep      endpoint
	epBytes []byte
	gid     [16]byte

	mu      sync.Mutex
	closed  bool
	nextKey uint32
	mrs     map[uint32]*mr
	qps     map[uint32]*qp
	pending map[uint32]chan *hello // hellos for QPs whose Connect has not taken them yet
	done    chan struct{}
	wg      sync.WaitGroup
}

// hello is an accepted connection and its first message, handed to the QP it names.
type hello struct {
	conn *net.UnixConn
	msg  ctl
	fd   int // the dialer's queue segment
}

func (d *device) Kind() verbs.Kind { return verbs.KindSHM }
func (d *device) Name() string     { return d.cfg.Name }
func (d *device) Endpoint() []byte { return append([]byte(nil), d.epBytes...) }

// Reachable reports whether a peer's Endpoint names a device on this host that
// this process can reach: the same boot ID, and the rendezvous path, seen from
// here, is the very socket the peer created. The engine asks before it chooses
// shm, so shm is never chosen for a peer on another host.
func (d *device) Reachable(endpoint []byte) bool {
	ep, err := parseEndpoint(endpoint)
	return err == nil && d.sameHost(ep) == nil
}

// sameHost checks that ep is a device on this host, reachable from here.
func (d *device) sameHost(ep endpoint) error {
	if ep.boot != d.ep.boot {
		return fmt.Errorf("boot id differs: %w", ErrNotSameHost)
	}
	var st unix.Stat_t
	if err := unix.Stat(ep.path, &st); err != nil || st.Ino != ep.ino || st.Dev != ep.dev {
		return fmt.Errorf("%s is not the peer's socket here: %w", ep.path, ErrNotSameHost)
	}
	return nil
}

func (d *device) Port() verbs.PortAttr {
	return verbs.PortAttr{GID: d.gid, MTU: verbs.MTU4096, LinkUp: true, GIDType: "shm"}
}

func (d *device) AllocPD() (verbs.PD, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, verbs.ErrClosed
	}
	return &pd{dev: d}, nil
}

func (d *device) CreateCQ(depth int) (verbs.CQ, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, verbs.ErrClosed
	}
	if depth <= 0 {
		depth = 256
	}
	return newCQ(d, depth), nil
}

// Close stops accepting connections and destroys every QP left, flushing their work.
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
	d.mu.Unlock()
	for _, q := range qps {
		q.Close()
	}
	err := d.ln.Close() // also removes the socket file
	d.wg.Wait()
	d.mu.Lock()
	for qpn, ch := range d.pending {
		drainHello(ch)
		delete(d.pending, qpn)
	}
	d.mu.Unlock()
	return err
}

// acceptLoop takes connections from peers that dial this device, reads their hello
// and hands it to the QP it names.
func (d *device) acceptLoop() {
	defer d.wg.Done()
	for {
		c, err := d.ln.AcceptUnix()
		if err != nil {
			select {
			case <-d.done:
				return
			default:
			}
			d.log.Error("shm: accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.takeHello(c)
		}()
	}
}

func (d *device) takeHello(c *net.UnixConn) {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, maxCtlLen)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	fds := scm.Rights(oob[:oobn])
	var m ctl
	if err == nil {
		m, err = parseCtl(buf[:n])
	}
	if err == nil && (m.typ != ctlHello || len(fds) != 1) {
		err = fmt.Errorf("%w: first message type %d with %d descriptors", errPeer, m.typ, len(fds))
	}
	if err != nil {
		d.log.Debug("shm: reject connection", "err", err)
		closeFDs(fds)
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	h := &hello{conn: c, msg: m, fd: fds[0]}
	d.mu.Lock()
	ch := d.pending[m.dstQPN]
	q := d.qps[m.dstQPN]
	if ch == nil && q != nil && !d.closed {
		ch = make(chan *hello, maxPendingHellos)
		d.pending[m.dstQPN] = ch
	}
	d.mu.Unlock()
	if ch != nil {
		select {
		case ch <- h:
			return
		default:
		}
	}
	d.log.Debug("shm: hello for unknown or busy qp", "qpn", m.dstQPN)
	h.close()
}

func (h *hello) close() {
	closeFDs([]int{h.fd})
	h.conn.Close()
}

func drainHello(ch chan *hello) {
	for {
		select {
		case h := <-ch:
			h.close()
		default:
			return
		}
	}
}

// maxPendingHellos is how many hellos wait for a QP's Connect: a stranger's
// hello naming it first must not keep its peer's out (accept picks the peer's).
const maxPendingHellos = 4

// helloChan returns the channel where the hellos for qpn arrive.
func (d *device) helloChan(qpn uint32) chan *hello {
	d.mu.Lock()
	defer d.mu.Unlock()
	ch := d.pending[qpn]
	if ch == nil {
		ch = make(chan *hello, maxPendingHellos)
		d.pending[qpn] = ch
	}
	return ch
}

// registerQP assigns a fresh QPN.
func (d *device) registerQP(q *qp) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return verbs.ErrClosed
	}
	// Random, not in sequence: a stranger's hello must name the QPN to take
	// the QP's hello slot before its peer does (takeHello).
	for {
		q.qpn = 1 + mrand.Uint32N(maxQPN)
		if d.qps[q.qpn] == nil {
			break
		}
	}
	d.qps[q.qpn] = q
	return nil
}

func (d *device) unregisterQP(q *qp) {
	d.mu.Lock()
	if d.qps[q.qpn] == q {
		delete(d.qps, q.qpn)
	}
	ch := d.pending[q.qpn]
	delete(d.pending, q.qpn)
	d.mu.Unlock()
	if ch != nil {
		drainHello(ch)
	}
}

// lookupMR finds a region by key for a remote request.
func (d *device) lookupMR(key uint32) *mr {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mrs[key]
}

// dial connects to a peer's rendezvous socket.
func dialPeer(ctx context.Context, path string) (*net.UnixConn, error) {
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

type pd struct {
	dev    *device
	mu     sync.Mutex
	closed bool
}

// AllocMR allocates size bytes in a sealed memfd and registers them.
func (p *pd) AllocMR(size int, access verbs.Access) (verbs.MR, error) {
	if size <= 0 || size > math.MaxInt32 {
		return nil, fmt.Errorf("%w: region size %d", verbs.ErrInvalid, size)
	}
	if access&^(verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead) != 0 {
		return nil, fmt.Errorf("%w: access flags %#x", verbs.ErrInvalid, access)
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, verbs.ErrClosed
	}
	r, err := newRegion("smcr-mr", size)
	if err != nil {
		return nil, fmt.Errorf("shm: alloc mr: %w", err)
	}
	refs := new(atomic.Int32)
	refs.Store(1)
	m, err := p.register(r, refs, size, access)
	if err != nil {
		r.close()
		return nil, err
	}
	return m, nil
}

// RegisterMR registers the memfd region of another shm device's MR on this PD
// (verbs.Registrar): both MRs map the same pages, each with its own key; the
// region is freed when the last of them closes.
func (p *pd) RegisterMR(other verbs.MR, access verbs.Access) (verbs.MR, error) {
	o, ok := other.(*mr)
	if !ok {
		return nil, fmt.Errorf("%w: region of another provider", verbs.ErrInvalid)
	}
	if access&^(verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead) != 0 {
		return nil, fmt.Errorf("%w: access flags %#x", verbs.ErrInvalid, access)
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, verbs.ErrClosed
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, verbs.ErrClosed
	}
	o.refs.Add(1)
	m, err := p.register(o.reg, o.refs, o.size, access)
	if err != nil {
		o.refs.Add(-1)
		return nil, err
	}
	return m, nil
}

// register makes an MR of region r (shared by refs MRs, counting this one) on p.
func (p *pd) register(r *region, refs *atomic.Int32, size int, access verbs.Access) (*mr, error) {
	m := &mr{pd: p, reg: r, refs: refs, size: size, access: access}
	m.addr = uint64(uintptr(unsafe.Pointer(&r.mem[0])))
	d := p.dev
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, verbs.ErrClosed
	}
	for {
		d.nextKey++
		if d.nextKey != 0 && d.mrs[d.nextKey] == nil {
			break
		}
	}
	m.key = d.nextKey
	d.mrs[m.key] = m
	d.mu.Unlock()
	return m, nil
}

func (p *pd) CreateQP(cfg verbs.QPConfig) (verbs.QP, error) {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, verbs.ErrClosed
	}
	return newQP(p, cfg)
}

func (p *pd) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

type mr struct {
	pd     *pd
	reg    *region
	refs   *atomic.Int32 // MRs sharing reg (RegisterMR): the last Close frees it
	size   int
	access verbs.Access
	addr   uint64
	key    uint32

	mu      sync.Mutex
	closed  bool
	granted map[*qp]struct{} // QPs whose peer was handed this region
}

func (m *mr) Bytes() []byte {
	if m.reg.mem == nil {
		return nil
	}
	return m.reg.mem[:m.size:m.size]
}
func (m *mr) LKey() uint32         { return m.key }
func (m *mr) RKey() uint32         { return m.key }
func (m *mr) Addr() uint64         { return m.addr }
func (m *mr) Access() verbs.Access { return m.access }

// Close deregisters the region, tells every peer it was handed to (which then drops
// its mapping, so later WRITEs fail with a remote access error) and frees it.
func (m *mr) Close() error {
	d := m.pd.dev
	d.mu.Lock()
	if d.mrs[m.key] == m {
		delete(d.mrs, m.key)
	}
	d.mu.Unlock()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	granted := m.granted
	m.granted = nil
	if m.refs.Add(-1) == 0 {
		m.reg.close()
	}
	m.mu.Unlock()
	for q := range granted {
		q.sendCtl(&ctl{typ: ctlRevoke, rkey: m.key}, -1)
	}
	return nil
}

// DupFile implements verbs.Mappable: the region's sealed memfd, from offset 0.
func (m *mr) DupFile() (int, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.reg.fd < 0 {
		return -1, 0, verbs.ErrClosed
	}
	fd, err := unix.FcntlInt(uintptr(m.reg.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("shm: dup region: %w", err)
	}
	return fd, 0, nil
}

// grant returns a descriptor of the region for q's peer: read-write only when the
// region allows remote write. ok is false when the peer may not map it at all;
// first is true the first time q is granted it.
func (m *mr) grant(q *qp) (fd int, ok, first bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.pd != q.pd || m.access&(verbs.AccessRemoteWrite|verbs.AccessRemoteRead) == 0 {
		return -1, false, false, nil
	}
	if m.access&verbs.AccessRemoteWrite != 0 {
		fd, err = unix.Dup(m.reg.fd)
	} else {
		fd, err = m.reg.readOnlyFD()
	}
	if err != nil {
		return -1, false, false, err
	}
	if m.granted == nil {
		m.granted = make(map[*qp]struct{})
	}
	_, had := m.granted[q]
	m.granted[q] = struct{}{}
	return fd, true, !had, nil
}

func (m *mr) ungrant(q *qp) {
	m.mu.Lock()
	delete(m.granted, q)
	m.mu.Unlock()
}

// DefaultDir is where peers meet when Config.Dir is empty.
func DefaultDir() string { return filepath.Join(os.TempDir(), "smcr-shm") }
