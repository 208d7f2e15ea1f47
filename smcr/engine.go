// Engine: one SMC-R endpoint — its devices, memory budget, link groups and
// connections; Dial, Listen and the handshake entry points for established TCP.
// RFC 7609 §3 (SMC-R endpoint resources), after Linux's smc_core.

package smcr

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/smcr-io/smcr/internal/tcpurg"
	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr/clc"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// ErrEngineClosed is the error of Read and Write on an SMC-R connection that
// Close ended and that could not continue over TCP. After Close, Dial, Client and
// Server return TCP connections declined with 0x03030002 (no SMC-R device), and a
// Listener closes the connections it accepts.
var ErrEngineClosed = errors.New("smcr: engine closed")

var noDeadline time.Time

// Engine is one SMC-R endpoint. Its methods are safe for concurrent use.
//
// Lock order (lockRank in lockrank.go, checked by make test-lockrank): setMu and
// lgCreate before any other mutex; mu after a Conn's txMu, rxMu and cdcMu and a
// link's, before a link group's mu and a Conn's mu.
type Engine struct {
	cfg    Config
	log    *slog.Logger
	peerID clc.PeerID
	st     stats

	mem     atomic.Int64
	memPeak atomic.Int64
	connSeq atomic.Uint64

	setMu mutex[engineSetRank] // serialises the setters
	set   atomic.Pointer[Settings]
	ueids atomic.Pointer[[]clc.EID] // Config.UEIDs, padded (v2.go)

	acceptSpin  spinBudget  // a client's poll for the Accept (awaitCLC)
	confirmSpin spinBudget  // a server's poll for the Confirm
	clcPolling  atomic.Bool // a handshake is in awaitCLC's poll

	lgCreate mutex[lgCreateRank] // serialises a server's search-or-create of link groups
	mu       mutex[engineRank]
	closed   bool
	lgs      []*linkGroup
	conns    map[uint64]*Conn
	tokens   map[uint32]*Conn
	lgSeq    uint32
	ctx      context.Context
	cancel   context.CancelFunc
	links    sync.WaitGroup // links not yet freed (trackLink): Close waits for them
	pooled   atomic.Int64   // bytes of mem in the link groups' buffer pools
	// lateFree holds declined connections whose RMB the client may still write
	// into (freeLater).
	lateFree map[*Conn]Timer
	releases chan struct{} // a connection was untracked, or a kept RMB settled (awaitClosedReleased)
	keeping  atomic.Int32  // keepWhenAnswered and dropWhenQuiet goroutines holding released RMBs

	// confirmHook lets tests play a hostile client that changes its Confirm
	// before it goes (clientConfirm).
	confirmHook atomic.Pointer[func(*clc.Confirm)]
	// addLinkTries counts serverAddLink's ends, added or not, so that tests
	// wait for a try rather than for time.
	addLinkTries atomic.Uint64
}

// NewEngine checks cfg and returns an Engine.
func NewEngine(cfg Config) (*Engine, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	e := &Engine{cfg: c, log: c.Logger, peerID: c.PeerID, conns: map[uint64]*Conn{}, tokens: map[uint32]*Conn{}, releases: make(chan struct{}, 1)}
	e.set.Store(&Settings{MaxMemory: c.MaxMemory, RMBSize: c.RMBSize, CLCTimeout: c.CLCTimeout, ReadSpin: c.ReadSpin,
		TestLinkInterval: c.TestLinkInterval})
	ueids, _ := parseUEIDs(c.UEIDs) // checked by withDefaults
	e.ueids.Store(&ueids)
	if e.peerID == (clc.PeerID{}) {
		rand.Read(e.peerID[:2])
		if len(c.Devices) > 0 {
			mac := c.Devices[0].Port().MAC
			copy(e.peerID[2:], mac[:])
		} else {
			rand.Read(e.peerID[2:])
		}
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	if slices.ContainsFunc(c.Devices, func(d verbs.Device) bool {
		_, ports := d.(verbs.PortStater)
		_, gids := d.(verbs.GIDHolder)
		return ports || gids
	}) {
		go e.watchPorts()
	}
	return e, nil
}

// portPoll is how often the engine asks the devices that can tell
// (verbs.PortStater) whether their port is up (Config.portPoll in tests).
const portPoll = 200 * time.Millisecond

// watchPorts fails the links whose device's port went down, as Linux's
// smcr_port_err does on IB_EVENT_PORT_ERR, and those whose address went with an
// interface's (verbs.GIDHolder): at once, rather than when TEST_LINK or the
// transport's retries give up. Their connections move to the group's other
// link, or continue over TCP. It looks every portPoll, and as soon as a device
// that can tell (verbs.PortNotifier) says its port changed.
func (e *Engine) watchPorts() {
	poll := portPoll
	if e.cfg.portPoll > 0 {
		poll = e.cfg.portPoll
	}
	t := newTicker(e.cfg.Clock, poll)
	defer t.Stop()
	changed := make(chan struct{}, 1)
	for _, d := range e.cfg.Devices {
		if pn, ok := d.(verbs.PortNotifier); ok {
			go func() {
				for {
					select {
					case <-pn.PortChanged():
					case <-e.ctx.Done():
						return
					}
					select {
					case changed <- struct{}{}:
					default:
					}
				}
			}()
		}
	}
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		case <-changed:
		}
		var down []verbs.Device
		for _, d := range e.cfg.Devices {
			if !portUp(d) {
				down = append(down, d)
			}
		}
		e.mu.Lock()
		lgs := slices.Clone(e.lgs)
		e.mu.Unlock()
		for _, lg := range lgs {
			lg.mu.RLock()
			links := slices.Clone(lg.links)
			lg.mu.RUnlock()
			for _, l := range links {
				if l.down.Load() {
					continue
				}
				if slices.Contains(down, l.dev) {
					e.log.Warn("smcr: port down, failing its link", "lg", lg.id, "link", l.num, "device", l.dev.Name())
					l.fail(errLinkPortDown)
				} else if gid, ok := goneGID(l); ok {
					e.log.Warn("smcr: the link's address is gone, failing it", "lg", lg.id, "link", l.num,
						"device", l.dev.Name(), "gid", net.IP(gid[:]).String())
					l.fail(errLinkGIDGone)
				}
			}
		}
	}
}

// goneGID returns l's local GID when its device no longer has it
// (verbs.GIDHolder): an address of the interface went, and the peer can no
// longer reach l at it.
func goneGID(l *link) ([16]byte, bool) {
	gh, ok := l.dev.(verbs.GIDHolder)
	if !ok || l.qp == nil {
		return [16]byte{}, false
	}
	gid := l.qp.Attr().GID
	return gid, !gh.HasGID(gid)
}

// PeerID is the 8-byte identity this engine sends in CLC.
func (e *Engine) PeerID() clc.PeerID { return e.peerID }

// Close ends every link group (DELETE_LINK to the peers) and every SMC-R connection.
// Fallback connections, which are plain TCP, are left to their owners.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	lgs := slices.Clone(e.lgs)
	late := e.lateFree
	e.lateFree = nil
	e.mu.Unlock()
	// Each is freed here: a timer that fired after we took the map finds
	// nothing in it and leaves its connection to us; one that fired before
	// took its connection out of the map itself.
	for c, t := range late {
		t.Stop()
		c.freeResources()
	}
	// Connections the application closed usually finish closing within a
	// round trip (the peer closes in answer): let them, over SMC-R, rather than
	// end them with the link groups and continue each over TCP.
	grace := newTimer(e.cfg.Clock, closeGrace)
	e.awaitClosedReleased(grace.C)
	grace.Stop()
	for _, lg := range lgs {
		lg.terminate(ErrEngineClosed, true)
	}
	e.cancel()
	// The links free their QPs, CQs and buffers once their goroutines are gone;
	// a caller may close the devices next. Connection buffers the application
	// still holds stay registered until it closes those connections, or they
	// continue over TCP (shedBuffers).
	freed := make(chan struct{})
	go func() {
		e.links.Wait()
		close(freed)
	}()
	wait := newTimer(e.cfg.Clock, closeWait)
	defer wait.Stop()
	deadline := wait.C
	select {
	case <-freed:
	case <-deadline:
		e.log.Warn("smcr: engine closed with links not yet freed", "waited", closeWait)
	}
	// Connections the application closed release their buffers as their links
	// go (linkDown): wait for those too.
	if !e.awaitClosedReleased(deadline) {
		e.log.Warn("smcr: engine closed with closed connections not yet released", "conns", e.closedUnreleased())
	}
	return nil
}

// releasePoll is the longest awaitClosedReleased sleeps between looks
// (Config.releasePoll in tests).
const releasePoll = time.Millisecond

// awaitClosedReleased waits until every connection the application closed has
// released its buffers, or until deadline; it reports whether they all did.
// A release wakes it (untrack); the timer, backing off to releasePoll, is for
// the paths that release without untracking. It starts short, since a release
// comes within a round trip, and a Close must not wait a whole poll for it.
func (e *Engine) awaitClosedReleased(deadline <-chan struct{}) bool {
	poll := releasePoll
	if e.cfg.releasePoll > 0 {
		poll = e.cfg.releasePoll
	}
	for wait := min(50*time.Microsecond, poll); e.closedUnreleased() > 0; wait = min(2*wait, poll) {
		t := newTimer(e.cfg.Clock, wait)
		select {
		case <-deadline:
			t.Stop()
			return false
		case <-e.releases:
		case <-t.C:
		}
		t.Stop()
	}
	return true
}

// kept ends a keepWhenAnswered, which holds a released connection's RMB.
func (e *Engine) kept() {
	e.keeping.Add(-1)
	wake(e.releases)
}

// closedUnreleased counts the connections the application closed whose buffers
// are not yet released (a connection is untracked once maybeRelease has freed
// them, after it marks it released), and the released RMBs waiting for the
// answer to their CONFIRM_RKEY before they are pooled or freed
// (keepWhenAnswered): a caller may close the devices once Close returns.
func (e *Engine) closedUnreleased() int {
	e.mu.Lock()
	cs := make([]*Conn, 0, len(e.conns))
	for _, c := range e.conns {
		cs = append(cs, c)
	}
	e.mu.Unlock()
	n := int(e.keeping.Load())
	for _, c := range cs {
		c.mu.Lock()
		if c.closing.appClosed {
			n++
		}
		c.mu.Unlock()
	}
	return n
}

// freeLater frees a declined connection's resources after a CLC timeout (at least
// lateFreeMin), or at Close, whichever comes first (abandonSetup).
func (e *Engine) freeLater(c *Conn) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		go c.freeResources()
		return
	}
	if e.lateFree == nil {
		e.lateFree = map[*Conn]Timer{}
	}
	e.lateFree[c] = e.cfg.Clock.AfterFunc(max(e.settings().CLCTimeout, lateFreeMin), func() {
		e.mu.Lock()
		_, ok := e.lateFree[c]
		delete(e.lateFree, c)
		e.mu.Unlock()
		if ok {
			c.freeResources()
		}
	})
}

// lateFreeMin is the least time a declined connection's RMB stays registered
// (freeLater): the client may send its Confirm, and write, up to its own CLC
// timeout after our Accept, which may be longer than ours.
const lateFreeMin = 10 * time.Second

// closeWait bounds Close's wait for the links' goroutines, which end within a
// CQ wake-up once the engine's context is cancelled.
const closeWait = 10 * time.Second

// closeGrace bounds how long Close lets closed connections finish their close
// handshake before it ends the link groups. A peer application that keeps its end
// open longer gets the rest of our bytes over TCP (the continuation).
const closeGrace = 100 * time.Millisecond

// trackLink counts a link being created, which Close then waits for; after
// Close no link is created.
func (e *Engine) trackLink() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrEngineClosed
	}
	e.links.Add(1)
	return nil
}

// linkFreed ends trackLink's count for one link.
func (e *Engine) linkFreed() { e.links.Done() }

// Stats returns a snapshot of the engine's counters.
func (e *Engine) Stats() Stats { return e.takeStats(false) }

// ResetStats zeroes the counters (not the gauges: active connections, memory in
// use and pooled) and returns them as they were just before, taken with the reset:
// what is counted meanwhile goes into one or the other. The memory peak starts
// again from the memory held, in use and pooled.
func (e *Engine) ResetStats() Stats {
	s := e.takeStats(true)
	e.memPeak.Store(e.mem.Load())
	e.raisePeak(e.mem.Load()) // a reserve between the two loads raised it before the Store
	return s
}

func (e *Engine) takeStats(reset bool) Stats {
	s := e.st.take(reset)
	// mem first: a buffer leaves the pool's count before it leaves mem, so
	// mem read first is never less than pooled read after.
	mem := e.mem.Load()
	s.MemoryPooled = e.pooled.Load()
	s.MemoryInUse = max(mem-s.MemoryPooled, 0)
	s.MemoryPeak = e.memPeak.Load()
	e.mu.Lock()
	s.LinkGroups = len(e.lgs)
	e.mu.Unlock()
	return s
}

// Settings are the Config fields an operator may change while the engine runs.
// A change applies to connections set up afterwards; established connections keep
// the buffers and memory they hold.
type Settings struct {
	MaxMemory  int64         // Config.MaxMemory: bytes of buffers at once, 0 unlimited
	RMBSize    int           // Config.RMBSize, rounded up to a power of two
	CLCTimeout time.Duration // Config.CLCTimeout
	ReadSpin   time.Duration // Config.ReadSpin; negative: off
	// TestLinkInterval is Config.TestLinkInterval; negative: off.
	TestLinkInterval time.Duration
}

// Settings returns the settings in effect.
func (e *Engine) Settings() Settings { return *e.set.Load() }

// settings is the snapshot a connection reads its settings from.
func (e *Engine) settings() *Settings { return e.set.Load() }

// update stores a modified copy of the settings.
func (e *Engine) update(f func(*Settings)) {
	e.setMu.Lock()
	defer e.setMu.Unlock()
	s := *e.set.Load()
	f(&s)
	e.set.Store(&s)
}

// SetMaxMemory bounds the bytes of RMBs and send buffers held at once, as
// Config.MaxMemory (0: unlimited). Buffers already held are kept even when they
// exceed the new bound; new connections take smaller RMBs, or fall back with
// "insufficient memory" when even those do not fit.
func (e *Engine) SetMaxMemory(n int64) error {
	if n < 0 {
		return fmt.Errorf("%w: negative max memory", ErrConfig)
	}
	e.update(func(s *Settings) { s.MaxMemory = n })
	e.log.Info("smcr: max memory set", "bytes", n)
	return nil
}

// SetRMBSize sets the RMBE size of new connections, as Config.RMBSize (0: the
// default; rounded up to a power of two within 16 KiB..512 KiB).
func (e *Engine) SetRMBSize(n int) error {
	size, err := rmbSize(n)
	if err != nil {
		return err
	}
	e.update(func(s *Settings) { s.RMBSize = size })
	e.log.Info("smcr: rmb size set", "bytes", size)
	return nil
}

// SetCLCTimeout sets the wait for each CLC message of new handshakes, as
// Config.CLCTimeout (0: the default).
func (e *Engine) SetCLCTimeout(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("%w: negative clc timeout", ErrConfig)
	}
	d = clcTimeout(d)
	e.update(func(s *Settings) { s.CLCTimeout = d })
	e.log.Info("smcr: clc timeout set", "timeout", d)
	return nil
}

// SetReadSpin changes, for Reads from now on, how long a Read waiting for bytes
// drives its link at most (Config.ReadSpin: 0 the default, negative off).
func (e *Engine) SetReadSpin(d time.Duration) error {
	d = readSpin(d)
	e.update(func(s *Settings) { s.ReadSpin = d })
	e.log.Info("smcr: read spin set", "spin", d)
	return nil
}

// SetTestLinkInterval changes how long a link may receive nothing before it is
// tested (Config.TestLinkInterval: 0 the default, negative off). Links take it
// at their next look, a quarter of the old interval on (a second when off).
func (e *Engine) SetTestLinkInterval(d time.Duration) error {
	d = testLinkInterval(d)
	e.update(func(s *Settings) { s.TestLinkInterval = d })
	e.log.Info("smcr: test link interval set", "interval", d)
	return nil
}

// HoldMemory counts n bytes held outside the engine (smcrd's direct-mode
// rings) against MaxMemory, whatever the limit: the engine's next buffers fit
// only in what is left. A negative n gives them back.
func (e *Engine) HoldMemory(n int64) {
	if m := e.mem.Add(n); n > 0 {
		e.raisePeak(m)
	}
}

// MemoryHeld is the bytes counted against MaxMemory that the engine cannot
// free on demand: buffers connections hold, and those of HoldMemory (pooled
// buffers, which it frees when it needs room, are not among them).
func (e *Engine) MemoryHeld() int64 { return e.mem.Load() - e.pooled.Load() }

// reserve accounts n bytes against MaxMemory; false when they do not fit.
func (e *Engine) reserve(n int64) bool {
	limit := e.settings().MaxMemory
	for {
		cur := e.mem.Load()
		if limit > 0 && cur+n > limit {
			return false
		}
		if e.mem.CompareAndSwap(cur, cur+n) {
			e.raisePeak(cur + n)
			return true
		}
	}
}

// raisePeak makes the memory peak at least m.
func (e *Engine) raisePeak(m int64) {
	for {
		p := e.memPeak.Load()
		if m <= p || e.memPeak.CompareAndSwap(p, m) {
			return
		}
	}
}

func (e *Engine) unreserve(n int64) { e.mem.Add(-n) }

// newToken returns an alert token unique in this engine, its top bit set: a
// connection's ID in listings (smcrd's) is its token over SMC-R and a sequence
// number (ConnInfo.ID) otherwise, and the two must not meet.
func (e *Engine) newToken(c *Conn) uint32 {
	e.mu.Lock()
	defer e.mu.Unlock()
	for {
		var b [4]byte
		rand.Read(b[:])
		t := tokenBit | uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
		if _, dup := e.tokens[t]; !dup {
			e.tokens[t] = c
			return t
		}
	}
}

// tokenBit is set in every alert token of ours.
const tokenBit = 1 << 31

func (e *Engine) freeToken(t uint32) {
	e.mu.Lock()
	delete(e.tokens, t)
	e.mu.Unlock()
}

func (e *Engine) newConn(tcp net.Conn, client bool) *Conn {
	if t, ok := tcp.(*net.TCPConn); ok {
		// Urgent bytes stay in the stream, where a fallback or a continuation
		// finds them (urgent.go).
		tcpurg.SetInline(t)
	}
	c := &Conn{
		e: e, tcp: tcp, client: client, id: e.connSeq.Add(1),
		rxWake: make(chan struct{}, 1), txWake: make(chan struct{}, 1), done: make(chan struct{}),
		cont: contState{foDone: make(chan struct{}), peerResync: make(chan resyncResult, 1)},
	}
	e.mu.Lock()
	e.conns[c.id] = c
	e.mu.Unlock()
	e.st.handled.Add(1)
	if !client {
		e.st.srvHandled.Add(1)
	}
	return c
}

// NewConnID returns an ID no connection of the engine has or will have
// (ConnInfo.ID), for connections an application lists beside the engine's.
func (e *Engine) NewConnID() uint64 { return e.connSeq.Add(1) }

func (e *Engine) untrack(c *Conn) {
	e.mu.Lock()
	delete(e.conns, c.id)
	e.mu.Unlock()
	wake(e.releases)
}

// trackFallback keeps fallen-back connections visible to Conns until closed.
func (e *Engine) trackFallback(c *Conn) {
	e.mu.Lock()
	e.conns[c.id] = c
	e.mu.Unlock()
}

// ConnInfo describes one connection for smcrctl.
type ConnInfo struct {
	ID        uint64
	Mode      Mode
	Client    bool
	Local     net.Addr
	Remote    net.Addr
	State     string
	Decline   *Decline
	LinkGroup uint32 // 0 for fallback connections
	Token     uint32 // our alert token: the peer's CDCs carry it
	PeerToken uint32 // the peer's alert token: our CDCs carry it
	RMBSize   int    // our RMBE
	PeerRMB   int    // the peer's RMBE, which our send buffer mirrors
	Stats     ConnStats

	// Cursors (RFC 7609 §4.4.2) as wrap:count in their ring; zero for fallbacks.
	TxProd rmb.Cursor // how far we wrote into the peer's RMBE
	TxCons rmb.Cursor // how far the peer says it consumed there
	RxProd rmb.Cursor // how far the peer says it wrote into ours
	RxCons rmb.Cursor // how far we consumed
}

// Conns lists the engine's open connections.
func (e *Engine) Conns() []ConnInfo {
	e.mu.Lock()
	cs := make([]*Conn, 0, len(e.conns))
	for _, c := range e.conns {
		cs = append(cs, c)
	}
	e.mu.Unlock()
	slices.SortFunc(cs, func(a, b *Conn) int { return int(a.id - b.id) })
	out := make([]ConnInfo, 0, len(cs))
	for _, c := range cs {
		// Under c.mu: a connection is listed while it sets up, and CLC sets
		// its mode, decline and TCP connection under c.mu.
		c.mu.Lock()
		ci := ConnInfo{ID: c.id, Mode: c.mode, Client: c.client, Local: c.tcp.LocalAddr(),
			Remote: c.tcp.RemoteAddr(), Decline: c.decline, Stats: c.Stats(), State: c.st.String()}
		if c.mode == ModeSMCR {
			ci.LinkGroup, ci.Token, ci.PeerToken = c.lg.id, c.token, c.peerToken
			ci.RMBSize, ci.PeerRMB = int(c.rx.Size()), int(c.tx.Size())
			if c.tx.Size() > 0 && c.rx.Size() > 0 {
				ci.TxProd, ci.TxCons = c.tx.Cursor(), c.tx.PeerConsumer()
				ci.RxProd, ci.RxCons = c.rx.PeerProducer(), c.rx.Cursor()
			}
		}
		c.mu.Unlock()
		out = append(out, ci)
	}
	return out
}

// Dial connects to addr over TCP and runs CLC as the client. The result is an SMC-R
// connection or, when SMC-R could not be agreed, a TCP one; err is set when network
// is not tcp, tcp4 or tcp6, when the TCP connection failed or ended during CLC
// (reset, or closed by the server: nothing to fall back onto), and when ctx
// ended during CLC. Dial is for smcr servers (Listen, Server): its CLC Proposal is the
// connection's first bytes, which a plain TCP server reads as data; the connection
// then falls back at the server's first bytes (0x03010000), or after the CLC
// timeout, sending a Decline as well (0x02000000). It proposes every device: to a
// server that may be another implementation, use ClientWith. With no device (or
// a closed Engine) it sends a Decline in place of the Proposal, which tells an
// smcr server to fall back at once.
func (e *Engine) Dial(ctx context.Context, network, addr string) (*Conn, error) {
	if err := tcpNetwork(network); err != nil {
		return nil, fmt.Errorf("smcr: dial: %w", err)
	}
	var d net.Dialer
	d.SetMultipathTCP(false)
	tcp, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("smcr: dial: %w", err)
	}
	// Look the subnet up now, on the dialing thread: in a test the thread may be
	// inside a network namespace that later goroutines are not.
	pfx := e.localPrefix(tcp, nil)
	c, err := e.client(ctx, tcp, pfx, ClientOptions{})
	if err != nil {
		tcp.Close()
	}
	return c, err
}

// tcpNetwork refuses networks other than TCP's: SMC-R rides on a TCP connection
// (RFC 7609), and a UDP or Unix socket would carry the CLC exchange into
// nonsense.
func tcpNetwork(network string) error {
	switch network {
	case "tcp", "tcp4", "tcp6":
		return nil
	}
	return net.UnknownNetworkError(network + " (SMC-R needs tcp, tcp4 or tcp6)")
}

// Client runs CLC as the client on an established TCP connection, to a server
// known to be smcr.
func (e *Engine) Client(ctx context.Context, tcp net.Conn) (*Conn, error) {
	return e.ClientWith(ctx, tcp, ClientOptions{})
}

// ClientOptions is what the caller knows of the server before CLC.
type ClientOptions struct {
	// Standard: the server may be another SMC-R implementation (Linux's AF_SMC,
	// z/OS, AIX) rather than smcr, which smcrd learns from the SYN-ACK (the SMC
	// option without smcrd's SMCX one). The Proposal is then one such a server
	// accepts — Linux closes the connection on one it refuses (docs/protocol.md,
	// "Linux peers"): the first rdma device alone; with none, a Decline.
	Standard bool
	// Direct, when set, says this end is direct (tlvDirect) and is sent to
	// an smcr server; Conn.PeerDirect is the server's answer.
	Direct []byte
	// Cursors makes the Conn cursor-driven (cursors.go): its application
	// side fills the send buffer and empties the RMB itself.
	Cursors bool
}

// ServerOptions is what the caller knows of its own end before CLC.
type ServerOptions struct {
	// Direct, when set, is answered (tlvDirect) to a client whose Proposal
	// says it is direct, when the chosen provider is shm.
	Direct []byte
	// Cursors makes the Conn cursor-driven (cursors.go): its application
	// side fills the send buffer and empties the RMB itself.
	Cursors bool
}

// ClientWith is Client with what the caller knows of the server.
func (e *Engine) ClientWith(ctx context.Context, tcp net.Conn, opts ClientOptions) (*Conn, error) {
	return e.client(ctx, tcp, e.localPrefix(tcp, nil), opts)
}

// Server runs CLC as the server on an accepted TCP connection.
func (e *Engine) Server(ctx context.Context, tcp net.Conn) (*Conn, error) {
	return e.server(ctx, tcp, nil, ServerOptions{})
}

// ServerWith is Server with what the caller knows of its own end.
func (e *Engine) ServerWith(ctx context.Context, tcp net.Conn, opts ServerOptions) (*Conn, error) {
	return e.server(ctx, tcp, nil, opts)
}

// Listener accepts TCP connections and runs CLC as the server on each, in parallel.
type Listener struct {
	e      *Engine
	ln     net.Listener
	addrs  []net.Addr
	ch     chan *Conn
	done   chan struct{}
	once   sync.Once
	ctx    context.Context
	cancel context.CancelFunc
}

// Listen opens a TCP listener whose accepted connections run CLC as the server.
// The interface addresses for the same-subnet check are read now, so a Listen
// made inside a network namespace checks that namespace's subnets.
func (e *Engine) Listen(network, addr string) (*Listener, error) {
	if err := tcpNetwork(network); err != nil {
		return nil, fmt.Errorf("smcr: listen: %w", err)
	}
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), network, addr)
	if err != nil {
		return nil, fmt.Errorf("smcr: listen: %w", err)
	}
	return e.NewListener(ln), nil
}

// NewListener runs CLC as the server on every connection ln accepts.
func (e *Engine) NewListener(ln net.Listener) *Listener {
	addrs, _ := net.InterfaceAddrs()
	l := &Listener{e: e, ln: ln, addrs: addrs, ch: make(chan *Conn), done: make(chan struct{})}
	l.ctx, l.cancel = context.WithCancel(e.ctx)
	go l.loop()
	return l
}

func (l *Listener) loop() {
	var backoff time.Duration
	for {
		tcp, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				l.Close()
				return
			}
			// Out of file descriptors, say (EMFILE): the connection waits in
			// the kernel's queue, and the listener must live on, as
			// net/http's does, not close under its application.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			l.e.log.Warn("smcr: accept failed; retrying", "addr", l.ln.Addr(), "in", backoff, "err", err)
			t := newTimer(l.e.cfg.Clock, backoff)
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
				return
			}
			continue
		}
		backoff = 0
		go func() {
			c, err := l.e.server(l.ctx, tcp, l.addrs, ServerOptions{})
			if err != nil {
				tcp.Close()
				return
			}
			select {
			case l.ch <- c:
			case <-l.done:
				c.Close()
			}
		}()
	}
}

// Accept returns the next connection whose CLC exchange has ended (SMC-R or TCP).
func (l *Listener) Accept() (net.Conn, error) { return l.AcceptSMC() }

// AcceptSMC is Accept returning the concrete type.
func (l *Listener) AcceptSMC() (*Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, fmt.Errorf("smcr: accept: %w", net.ErrClosed)
	}
}

// Close stops accepting; connections already returned stay open.
func (l *Listener) Close() error {
	var err error
	l.once.Do(func() {
		err = l.ln.Close()
		l.cancel()
		close(l.done)
	})
	return err
}

// Addr is the TCP listener's address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }
