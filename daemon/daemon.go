// Package daemon is smcrd's logic: the transparent path that gives unmodified TCP
// applications SMC-R (RFC 7609) through eBPF redirection and steering.
//
//	client host                                    server host
//	app ─connect(S:P)─▶ redirect listener          steering listener (sk_lookup)
//	                     │ SO_ORIGINAL_DST               │ local address S:P
//	                     ▼                               ▼
//	                   dial S:P, SYN+option ────────▶ Engine.Server (CLC)
//	                   Engine.Client (CLC)               │ dial the app at S:P,
//	                     │                               │ showing it the client
//	app ◀──relay──▶ smcr.Conn ◀═══ RDMA / shm ═══▶ smcr.Conn ◀──relay──▶ app
//
// A peer whose SYN-ACK lacks the SMC option, or that declines, is carried as plain
// TCP (spliced) and put into the programs' negative cache, so the next connections
// to it do not come through smcrd at all. If smcrd stops, its liveness heartbeat
// lapses and the programs redirect and steer nothing: everything fails open.
//
// Files:
//
//	daemon.go     Daemon: setup, the listeners, liveness, shutdown and drain
//	redirect.go   client side: redirected connections
//	steer.go      server side: steered connections
//	relay.go      the byte carrier, splice or copy, half-close
//	owner.go      smcrd's connections as the application's user (firewall rules)
//	peers.go      the peer capability cache
//	policy.go     configuration into the programs' maps, at start and at runtime
//	backend.go    the control API's Backend (smcrctl)
//	providers.go  RDMA devices from the configuration
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/bpf"
	"github.com/smcr-io/smcr/config"
	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/internal/cgroupfs"
	"github.com/smcr-io/smcr/internal/lograte"
	"github.com/smcr-io/smcr/smcr"
	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/shm"
)

// Options configure a Daemon.
type Options struct {
	// Config is the configuration to run with; ConfigFile is where it came from
	// ("" for the embedded default) and where SetConfig with persist writes.
	Config     config.Config
	ConfigFile string
	// PinDir is the bpf filesystem directory of this smcrd's programs and maps
	// (default bpf.DefaultPinDir); one per network namespace.
	PinDir string
	// ShmDir is where the shm provider puts its rendezvous socket (default: the
	// provider's own, under $TMPDIR).
	ShmDir string
	// LivenessTTL is how long the programs keep redirecting after the last
	// heartbeat (default 3s, at least MinLivenessTTL): after a crash,
	// connections go direct this soon.
	LivenessTTL time.Duration
	// DrainTimeout bounds how long shutdown waits for the connections smcrd
	// holds, established or being set up (default 10s; negative: no wait);
	// those still open are then aborted.
	DrainTimeout time.Duration
	// Version is reported by the control API.
	Version string
	// NoSameHostBypass keeps the direct mode's libraries of one host from
	// writing into each other's rings over shm (directmeet.go): their bytes
	// go through smcrd and the engine, as between hosts.
	NoSameHostBypass bool
	// Logger receives everything (default: discard).
	Logger *slog.Logger
}

// MinLivenessTTL is the shortest LivenessTTL: the heartbeat comes every third
// of it, and one a little late (a GC pause, a busy CPU) makes connections go
// direct until the next.
const MinLivenessTTL = 100 * time.Millisecond

// Daemon is one running smcrd.
type Daemon struct {
	opts   Options
	log    *slog.Logger
	start  time.Time
	state  atomic.Pointer[string] // control.StateStarting, StateServing, StateDraining
	lock   *bpf.PinDirLock        // this smcrd's claim on opts.PinDir
	loader *bpf.Loader
	engine *smcr.Engine
	devs   []verbs.Device
	peers  *peerCache

	redirect []net.Listener // IPv4, IPv6 (loopback)
	steering []net.Listener
	direct   *DirectServer // the direct mode's socket; nil when direct_socket is empty

	cfgMu sync.Mutex // serialises configuration changes
	cfg   atomic.Pointer[config.Config]
	maps  policyMaps // the loader, for the policy (a fake in tests)
	// ifaces are the interfaces of the configuration in effect; ifacesOK says the
	// programs are attached to exactly those (false after a failed SetInterfaces,
	// which may have done part of its work).
	ifaces   []string
	ifacesOK bool
	// refreshErr: refreshInterfaces' last failure, logged once.
	refreshErr string
	netns      netns.NsHandle // the namespace smcrd serves (New's thread's)

	// ctx is what setups (dial, CLC) run under. Shutdown lets them finish, like
	// established connections: it is cancelled only when the drain time is up.
	ctx        context.Context
	cancel     context.CancelFunc
	stopCh     chan struct{} // closed when the drain time is up: relays abort
	abortCh    chan struct{} // closed by Abort: the drain time is up now
	abortOnce  sync.Once
	lastAccept atomic.Int64 // unix nanoseconds of the last accept

	connMu sync.Mutex
	conns  map[uint64]*tracked
	closed history        // the last connections that ended (smcrctl history)
	wg     sync.WaitGroup // accept loops and connection handlers

	optMu     sync.Mutex
	wire      map[sockConn]*wireOptions   // by smcrd's socket of the application's connection (sockopts.go)
	unclaimed map[sockConn][]unclaimedOpt // options for sockets not followed yet
	prunedAt  time.Time                   // when unclaimed last lost its old entries

	st daemonStats
	// Log lines that others cause, one limiter per kind: connections to the
	// listeners that the programs did not send (steerStrays, redirectStrays),
	// peers' failed handshakes (peerErrs), connections refused for want of
	// CAP_SETUID (ownerErrs).
	steerStrays, redirectStrays, peerErrs, ownerErrs lograte.Limiter
}

// daemonStats counts what the engine does not see: connections carried as plain
// TCP without any CLC, because the peer did not echo the option (noEcho) or
// smcrd's own SYN went without it (noOption).
type daemonStats struct {
	redirected, steered, noEcho, noOption, setupErrors atomic.Uint64
	resetAt                                            atomic.Int64 // unix nanoseconds

	progMu   sync.Mutex
	progBase map[string]uint64 // the programs' counters at start or the last reset (programStats)
}

// tracked is one connection the daemon carries, for drain and for smcrctl conns.
type tracked struct {
	id     uint64
	client bool
	direct bool           // a program's own socket, with the direct mode's library
	local  netip.AddrPort // as the application sees it
	remote netip.AddrPort
	conn   *smcr.Conn // nil while setting up and for connections without CLC
	reason string     // why a connection without CLC is plain TCP
	side   string     // whose doing that is: control.SidePeer or SideLocal
	bytes  byteCounts
	start  time.Time
}

// New sets smcrd up: claims the pin directory (one smcrd per directory: see
// bpf.LockPinDir), loads and attaches the programs, opens the devices and the
// engine, and opens the listeners. Nothing is redirected before Run. Call it from
// a thread in the network namespace smcrd serves.
func New(opts Options) (*Daemon, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.PinDir == "" {
		opts.PinDir = bpf.DefaultPinDir
	}
	if opts.LivenessTTL == 0 {
		opts.LivenessTTL = 3 * time.Second
	}
	if opts.LivenessTTL < MinLivenessTTL {
		return nil, fmt.Errorf("daemon: liveness TTL %v: below the minimum, %v", opts.LivenessTTL, MinLivenessTTL)
	}
	switch {
	case opts.DrainTimeout == 0:
		opts.DrainTimeout = 10 * time.Second
	case opts.DrainTimeout < 0:
		opts.DrainTimeout = 0
	}
	d := &Daemon{opts: opts, log: opts.Logger, start: time.Now(), conns: map[uint64]*tracked{},
		wire: map[sockConn]*wireOptions{}, unclaimed: map[sockConn][]unclaimedOpt{},
		stopCh: make(chan struct{}), abortCh: make(chan struct{})}
	d.st.resetAt.Store(d.start.UnixNano())
	d.setState(control.StateStarting)
	d.ctx, d.cancel = context.WithCancel(context.Background())
	cfg := opts.Config
	d.cfg.Store(&cfg)
	ns, err := netns.Get() // followInterfaces watches this one
	if err != nil {
		return nil, fmt.Errorf("daemon: network namespace: %w", err)
	}
	d.netns = ns
	started := false
	defer func() {
		if !started {
			d.closeNetns()
		}
	}()

	ifaces, err := resolveInterfaces(cfg.Interfaces)
	if err != nil {
		return nil, err
	}
	cgroup, err := cgroupPath(cfg.Cgroup)
	var cgErr *cgroupError
	if errors.As(err, &cgErr) {
		return nil, config.AttrError(opts.ConfigFile, "cgroup", cgErr.Error())
	}
	if err != nil {
		return nil, err
	}
	// Before any BPF state is touched: a second smcrd loading into the same pin
	// directory would point the shared redirect address at its own listeners and
	// then, failing on the control socket, leave the first one's connections
	// redirected to a closed port.
	d.lock, err = bpf.LockPinDir(opts.PinDir)
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	d.loader, err = bpf.Load(bpf.Options{CgroupPath: cgroup, PinDir: opts.PinDir, Logger: d.log})
	if err != nil {
		d.lock.Release()
		return nil, fmt.Errorf("daemon: %w", err)
	}
	// Until Run, and again from shutdown on, the programs must not send anything here.
	if err := d.loader.SetAlive(0); err != nil {
		d.loader.Close()
		d.lock.Release()
		return nil, fmt.Errorf("daemon: %w", err)
	}
	d.maps = d.loader
	if base, err := d.loader.Stats(); err == nil { // programStats
		d.st.progBase = base
	}
	inCgroup(cgroup, d.log)
	d.peers = newPeerCache(time.Now, d.loader.AddNegative)
	// The negative cache is pinned: an earlier smcrd's entries still steer
	// connections, so smcrctl peers must show them.
	if neg, err := d.loader.Negatives(); err != nil {
		d.log.Warn("negative cache left by an earlier smcrd not shown", "err", err)
	} else if len(neg) > 0 {
		d.peers.restore(neg, reasonKept)
		d.log.Info("negative cache entries kept from an earlier smcrd", "peers", len(neg))
	}
	d.devs = openDevices(cfg.Providers, ifaces, cfg.RDMADevices, opts.ShmDir, d.loader.Control(bpf.Tag{}), d.log)
	d.engine, err = smcr.NewEngine(smcr.Config{
		Devices:          d.devs,
		MaxMemory:        cfg.MaxMemory,
		RMBSize:          cfg.RMBSize,
		SendBufSize:      cfg.SendBufSize,
		CLCTimeout:       cfg.CLCTimeout,
		ReadSpin:         readSpin(cfg.ReadSpin),
		TestLinkInterval: testLinkTime(cfg.TestLinkTime),
		UEIDs:            cfg.UserEIDs,
		Logger:           d.log,
	})
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("daemon: engine: %w", err)
	}
	if err := d.listen(); err != nil {
		d.Close()
		return nil, err
	}
	if cfg.DirectMode {
		d.direct, err = newDirectServer(cfg.DirectSocket(), d.directHooks(), d.log)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("daemon: %w", err)
		}
		if sameHostBypass && !opts.NoSameHostBypass && hasKind(d.devs, verbs.KindSHM) {
			dir := opts.ShmDir
			if dir == "" {
				dir = shm.DefaultDir()
			}
			if d.direct.meet, err = newMeetPoint(dir, d.log); err != nil {
				d.log.Warn("direct mode: no same-host meeting: libraries' bytes go through smcrd", "err", err)
			}
		}
	}
	if err := d.applyPolicy(cfg, ifaceNames(ifaces)); err != nil {
		d.Close()
		return nil, err
	}
	started = true
	return d, nil
}

// Close releases what New set up (listeners, engine, devices, the programs'
// handles, the pin directory) for a Daemon that is not to Run: the caller
// failed after New. Run releases it all itself.
func (d *Daemon) Close() error {
	for _, ln := range append(d.redirect, d.steering...) {
		ln.Close()
	}
	if d.direct != nil {
		d.direct.Close()
	}
	if d.engine != nil {
		d.engine.Close()
	}
	err := errors.Join(closeDevices(d.devs), d.loader.Close())
	d.closeNetns()
	return errors.Join(err, d.lock.Release())
}

// listen opens the redirect listeners (loopback, where connect4/6 send the
// applications) and the steering listeners (in the SOCKMAP sk_lookup assigns from).
// All are smcrd's own sockets; the steering ones echo the SMC option. MPTCP is off:
// a SOCKMAP refuses MPTCP sockets.
func (d *Daemon) listen() error {
	var v4, v6 netip.AddrPort
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		lc := net.ListenConfig{Control: urgentInline(d.loader.Control(bpf.Tag{}))}
		lc.SetMultipathTCP(false)
		ln, err := lc.Listen(context.Background(), "tcp", addr)
		if err != nil {
			d.log.Warn("redirect listener not available", "addr", addr, "err", err)
			continue
		}
		d.redirect = append(d.redirect, ln)
		ap := ln.Addr().(*net.TCPAddr).AddrPort()
		if ap.Addr().Unmap().Is4() {
			v4 = ap
		} else {
			v6 = ap
		}
	}
	if len(d.redirect) == 0 {
		return errors.New("daemon: no redirect listener")
	}
	if err := d.loader.SetRedirect(v4, v6); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		// No keepalive of Go's own on steered connections: the server
		// application's, if it asks for it, comes to them (sockopts.go).
		lc := net.ListenConfig{Control: urgentInline(d.loader.Control(bpf.Tag{SMCOption: true})), KeepAlive: -1}
		lc.SetMultipathTCP(false)
		ln, err := lc.Listen(context.Background(), "tcp", addr)
		if err != nil {
			d.log.Warn("steering listener not available", "addr", addr, "err", err)
			continue
		}
		if err := d.loader.RegisterSteering(ln.(*net.TCPListener)); err != nil {
			ln.Close()
			return fmt.Errorf("daemon: %w", err)
		}
		d.steering = append(d.steering, ln)
	}
	if len(d.steering) == 0 {
		return errors.New("daemon: no steering listener")
	}
	// Neither program can use an IPv6 listener for IPv4: connect4 rewrites to an
	// IPv4 address, and sk_lookup's fallback to the IPv6 steering listener
	// takes only a dual-stack one, which loopback's ::1 is not.
	steer4 := d.steering[0].Addr().(*net.TCPAddr).AddrPort().Addr().Unmap().Is4()
	if !v4.IsValid() || !steer4 {
		d.log.Warn("IPv4 connections are not accelerated: no IPv4 listener on loopback (127.0.0.1); they go as plain TCP",
			"applications_connects", v4.IsValid(), "peers_connects", steer4)
	}
	steer := make([]string, len(d.steering))
	for i, ln := range d.steering {
		steer[i] = ln.Addr().String()
	}
	d.log.Info("listening", "redirect4", v4, "redirect6", v6, "steering", steer)
	return nil
}

// acceptQuiet is how long the listeners must have accepted nothing, once the
// programs send nothing more here, before shutdown closes them. Closing a
// listener resets what is still in its queue; what the programs sent before
// arrives within a loopback connect or, steered, one round trip on the subnet
// (RFC 7609 version 1 peers share it).
const acceptQuiet = 200 * time.Millisecond

// Run serves until ctx is done, then shuts down: it declares smcrd dead to the
// programs (new connections go direct), accepts what they sent here before
// until the listeners are quiet, closes them, and waits up to DrainTimeout
// (counted from ctx's end) for the connections it holds, those still being set
// up included. When the time is up it aborts the rest, and releases everything.
// ready, when set, is called once smcrd serves (sd_notify READY=1). Run that
// cannot start (the programs' liveness cannot be set) releases it all too.
func (d *Daemon) Run(ctx context.Context, ready func()) error {
	// Alive before the accept loops run: what the programs send meanwhile
	// waits in the listeners' queues, and a failure has nothing to stop.
	hbStop, hbDone := make(chan struct{}), make(chan struct{})
	if len(d.devs) > 0 {
		if err := d.loader.SetAlive(d.opts.LivenessTTL); err != nil {
			return errors.Join(fmt.Errorf("daemon: %w", err), d.Close())
		}
		go d.heartbeat(hbStop, hbDone)
		d.log.Info("smcrd serving", "providers", d.providerNames(), "liveness_ttl", d.opts.LivenessTTL)
	} else {
		// Every connection it carried would fall back, through a relay that
		// costs a third of TCP's throughput: the programs are left to see
		// smcrd as dead, and connections go direct, as without smcrd.
		close(hbDone)
		d.log.Warn("smcrd serving with no device: it redirects and steers nothing, connections go direct; set providers and restart smcrd")
	}
	sockopts, sockoptsDone := d.followSockopts()
	ifStop := make(chan struct{})
	ifDone := d.followInterfaces(ifStop)
	for _, ln := range d.redirect {
		d.wg.Add(1)
		go d.acceptLoop(ln, d.serveRedirected)
	}
	for _, ln := range d.steering {
		d.wg.Add(1)
		go d.acceptLoop(ln, d.serveSteered)
	}
	if d.direct != nil && len(d.devs) > 0 {
		go d.direct.Serve()
	}
	d.setState(control.StateServing)
	if ready != nil {
		ready()
	}
	<-ctx.Done()
	d.setState(control.StateDraining)
	d.log.Info("shutting down: new connections go direct, draining the others", "conns", d.connCount(), "timeout", d.opts.DrainTimeout)
	deadline := time.Now().Add(d.opts.DrainTimeout)
	close(hbStop)
	<-hbDone
	err := d.loader.SetAlive(0)
	if d.direct != nil {
		d.direct.Quiesce()
	}
	d.quiesce(deadline)
	for _, ln := range append(d.redirect, d.steering...) {
		ln.Close()
	}
	drained := make(chan struct{})
	go func() {
		d.wg.Wait()
		if d.direct != nil {
			<-d.direct.Drained()
		}
		close(drained)
	}()
	drainEnd := time.NewTimer(time.Until(deadline))
	defer drainEnd.Stop()
	select {
	case <-drained:
	case <-drainEnd.C:
		if n := d.connCount(); n > 0 {
			d.log.Warn("drain timed out: aborting connections still open", "conns", n)
		}
	case <-d.abortCh:
		if n := d.connCount(); n > 0 {
			d.log.Warn("drain cut short: aborting connections still open", "conns", n)
		}
	}
	d.cancel()
	close(d.stopCh)
	if d.direct != nil {
		d.direct.Close() // aborts what is left
	}
	<-drained
	if sockopts != nil {
		sockopts.Close()
		<-sockoptsDone
	}
	close(ifStop)
	<-ifDone
	d.closeNetns()
	d.engine.Close()
	err = errors.Join(err, closeDevices(d.devs), d.loader.Close())
	// Only now may another smcrd take the pin directory over.
	return errors.Join(err, d.lock.Release())
}

// closeNetns releases New's handle on the namespace smcrd serves.
func (d *Daemon) closeNetns() {
	if d.netns > 0 { // a Daemon not made by New has none
		d.netns.Close()
	}
}

// setState records what Status reports; s is one of control's State constants.
func (d *Daemon) setState(s string) { d.state.Store(&s) }

// quiesce returns once the listeners have accepted nothing for acceptQuiet,
// counted from now at the earliest, at deadline, or on Abort.
func (d *Daemon) quiesce(deadline time.Time) {
	last := time.Now()
	for {
		if a := time.Unix(0, d.lastAccept.Load()); a.After(last) {
			last = a
		}
		quiet := last.Add(acceptQuiet)
		if !quiet.Before(deadline) {
			quiet = deadline
		}
		if !time.Now().Before(quiet) {
			return
		}
		t := time.NewTimer(time.Until(quiet))
		select {
		case <-t.C:
		case <-d.abortCh:
			t.Stop()
			return
		}
	}
}

// Abort ends the drain of Run's shutdown now, or makes it end at once when it
// has not begun: the connections still open are aborted (a second SIGTERM).
func (d *Daemon) Abort() {
	d.abortOnce.Do(func() { close(d.abortCh) })
}

// heartbeat keeps the programs' liveness ahead of the clock until stop is
// closed; a crashed or hung smcrd stops moving it, and the programs then fail
// open within LivenessTTL.
//
// A running smcrd that no longer accepts (out of file descriptors, say) is as
// good as dead to the applications the programs send to it: their connect
// succeeds and they wait. So the heartbeat stops while connections have waited
// in a listener's queue for LivenessTTL with nothing accepted, and resumes with
// the next accept.
func (d *Daemon) heartbeat(stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(d.opts.LivenessTTL / 3)
	defer t.Stop()
	var stall acceptStall
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			waiting := d.waitingToAccept()
			switch stalled, changed := stall.update(now, waiting, time.Unix(0, d.lastAccept.Load()), d.opts.LivenessTTL); {
			case stalled && changed:
				d.log.Error("not accepting: connections wait in the listeners' queues; new connections go direct until smcrd accepts again",
					"waiting", waiting, "since", stall.since)
			case stalled:
			default:
				if changed {
					d.log.Info("accepting again: new connections come to smcrd")
				}
				if err := d.loader.SetAlive(d.opts.LivenessTTL); err != nil {
					d.log.Error("liveness heartbeat", "err", err)
				}
				if d.direct != nil {
					d.direct.Beat()
				}
			}
		}
	}
}

// acceptStall follows whether the listeners have stopped accepting.
type acceptStall struct {
	since   time.Time // when connections were first seen waiting with no accept after them
	stalled bool
}

// update takes one look: waiting connections in the queues, and the time of the
// last accept. It reports whether accepting has stalled for ttl, and whether that
// changed with this look.
func (s *acceptStall) update(now time.Time, waiting int, lastAccept time.Time, ttl time.Duration) (stalled, changed bool) {
	// An accept after since (any, when nothing waited before) restarts the
	// wait from this look.
	if waiting == 0 || lastAccept.After(s.since) {
		s.since = time.Time{}
		if waiting > 0 {
			s.since = now
		}
	}
	was := s.stalled
	s.stalled = !s.since.IsZero() && now.Sub(s.since) >= ttl
	return s.stalled, s.stalled != was
}

// waitingToAccept is how many connections wait in the listeners' accept queues
// (TCP_INFO's unacked, for a listening socket).
func (d *Daemon) waitingToAccept() int {
	n := 0
	for _, ln := range append(d.redirect[:len(d.redirect):len(d.redirect)], d.steering...) {
		n += acceptQueue(ln)
	}
	return n
}

func acceptQueue(ln net.Listener) int {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return 0
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	rc.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.SOL_TCP, unix.TCP_INFO); err == nil {
			n = int(info.Unacked)
		}
	})
	return n
}

func (d *Daemon) acceptLoop(ln net.Listener, serve func(*net.TCPConn)) {
	defer d.wg.Done()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				// EMFILE and the like: retry, backing off (5 ms to 1 s) so as
				// neither to spin nor to flood the log.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				d.log.Error("accept", "addr", ln.Addr(), "err", err, "retry_in", backoff)
				time.Sleep(backoff)
				continue
			}
			return
		}
		backoff = 0
		d.lastAccept.Store(time.Now().UnixNano())
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			serve(c.(*net.TCPConn))
		}()
	}
}

func (d *Daemon) track(t *tracked) {
	// From the engine's sequence: the engine's fallbacks are listed beside
	// these, and two sequences gave the first of each ID 1.
	t.id = d.engine.NewConnID()
	t.start = time.Now()
	d.connMu.Lock()
	d.conns[t.id] = t
	d.connMu.Unlock()
}

func (d *Daemon) untrack(t *tracked) {
	d.connMu.Lock()
	delete(d.conns, t.id)
	d.closed.add(t.ended())
	d.connMu.Unlock()
}

func (d *Daemon) connCount() int {
	d.connMu.Lock()
	defer d.connMu.Unlock()
	return len(d.conns)
}

func (d *Daemon) providerNames() []string {
	out := make([]string, 0, len(d.devs))
	for _, dev := range d.devs {
		out = append(out, dev.Kind().String())
	}
	return out
}

// CurrentConfig returns the configuration in effect.
func (d *Daemon) CurrentConfig() config.Config { return *d.cfg.Load() }

// Engine is the SMC-R engine the daemon runs (for metrics and tests).
func (d *Daemon) Engine() *smcr.Engine { return d.engine }

// Loader is the daemon's eBPF loader.
func (d *Daemon) Loader() *bpf.Loader { return d.loader }

// resolveInterfaces maps ip_addr_list to this namespace's interfaces.
func resolveInterfaces(list []string) ([]config.Interface, error) {
	host, err := config.HostInterfaces()
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	ifs, err := config.ResolveInterfaces(list, host)
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	return ifs, nil
}

func ifaceNames(ifs []config.Interface) []string {
	out := make([]string, len(ifs))
	for i, f := range ifs {
		out[i] = f.Name
	}
	return out
}

// cgroupPath is the configured cgroup under the cgroup2 mount found in /proc/mounts.
func cgroupPath(rel string) (string, error) {
	mnt, err := cgroupfs.Mount()
	if err != nil {
		return "", fmt.Errorf("daemon: %w", err)
	}
	p := filepath.Join(mnt, rel)
	if st, err := os.Stat(p); err != nil || !st.IsDir() {
		return "", &cgroupError{rel: rel, dir: p, mount: mnt}
	}
	return p, nil
}

// cgroupError is a cgroup attribute that names no cgroup.
type cgroupError struct{ rel, dir, mount string }

// Error shows the cgroup as /proc/PID/cgroup does, with its leading slash
// (config drops it), and where it was looked for: an absolute path given
// where one relative to the mount was meant shows as such.
func (e *cgroupError) Error() string {
	return fmt.Sprintf("%q is not a cgroup: no directory %s (the path is relative to the cgroup2 mount, %s)", "/"+e.rel, e.dir, e.mount)
}

// inCgroup warns when smcrd itself runs outside the cgroup its programs serve:
// sockops then never sees smcrd's sockets, so its SYNs carry no SMC option and
// every connection is carried as plain TCP.
func inCgroup(cgroup string, log *slog.Logger) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return
	}
	mnt, err := cgroupfs.Mount()
	if err != nil {
		return
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			self := filepath.Join(mnt, rest)
			if rel, err := filepath.Rel(cgroup, self); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
				return
			}
			log.Warn("smcrd runs outside the cgroup it serves: its connections cannot carry the SMC option",
				"smcrd_cgroup", self, "cgroup", cgroup)
		}
	}
}

// testLinkTime is the engine's TestLinkInterval for the test_link_time
// attribute, whose 0 means never (the engine's 0 is its default).
func testLinkTime(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// readSpin is the engine's ReadSpin for the read_spin attribute, whose 0 means
// off (the engine's 0 is its default).
func readSpin(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// sameHostBypass turns on the libraries' writing into each other's rings
// (directmeet.go).
const sameHostBypass = true

// hasKind reports whether a device of kind k is among devs.
func hasKind(devs []verbs.Device, k verbs.Kind) bool {
	for _, d := range devs {
		if d.Kind() == k {
			return true
		}
	}
	return false
}
