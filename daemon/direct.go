// Direct mode: smcrd's side of libsmcr-preload.so, the library that programs
// started with `smcrctl run` carry. The library hands smcrd the program's own TCP
// socket at connect, listen and accept (SCM_RIGHTS over the direct socket); smcrd
// marks it for the SMC-R option, runs CLC on it (RFC 7609 §3.7) and, once SMC-R
// is agreed, passes back a shared area whose rings the library copies the
// program's bytes into and out of. The ABI is rmb's (rmb/shared.go,
// rmb/directmsg.go); docs/direct.md tells the exchange:
//
//	library                          smcrd
//	CLIENT  + fd  ─────────────────▶ check it is TCP, tag it (SMC option on the SYN)
//	              ◀───────────────── REPLY 0 (or -errno: the library passes through)
//	connect()
//	CONNECTING    ─────────────────▶ wait for the connect; CLC as client
//	              ◀───────────────── DECIDED SMCR + memfd, efd_lib, efd_dtx, efd_drx
//	                                 | DECIDED TCP + bytes CLC read ahead | DECIDED FAILED
//
//	LISTENER + fd ─────────────────▶ tag it (echo the option), sk_lookup leaves its port alone
//	              ◀───────────────── REPLY 0; the channel stays open while it listens
//	ACCEPTED + fd ─────────────────▶ did its SYN carry the option? no: REPLY -EOPNOTSUPP
//	              ◀───────────────── REPLY 0, then CLC as server, then DECIDED as above
//
// Holding the socket is the capability: the direct socket is open to every local
// program, and a channel reaches only the connection whose socket it brought.

package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/bpf"
	"github.com/smcr-io/smcr/config"
	"github.com/smcr-io/smcr/internal/lograte"
	"github.com/smcr-io/smcr/internal/scm"
	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// directRing is the size of each ring of a direct connection's shared area.
const directRing = 256 << 10

// crossingWait bounds how long a fallback waits for a CLC message that may
// have crossed our Decline before it hands the socket back (smcr.Conn.DetachTCP).
const crossingWait = 20 * time.Millisecond

// carrier is what carries a direct connection's bytes: an *smcr.Conn, or in
// OverTCP mode the TCP connection itself.
type carrier interface {
	Read([]byte) (int, error)
	Write([]byte) (int, error)
	CloseWrite() error
	Close() error
}

// handshake is the outcome of CLC on a direct connection's socket.
type handshake struct {
	carrier    carrier // SMC-R: where the bytes go; nil: plain TCP
	prefix     []byte  // plain TCP: bytes CLC read that are the program's
	peerDirect []byte  // the peer is a library over shm too: its tlvDirect (directmeet.go)
}

// directHooks are what the direct server asks of the rest of smcrd (fakes in
// tests of the library: NewDirectServer).
type directHooks struct {
	enabled func() bool
	// tag marks a socket about to connect (listener false) or listen
	// (true) for the SMC-R option.
	tag func(fd int, listener bool) error
	// listen and unlisten follow the ports programs listen on.
	listen, unlisten func(port uint16) error
	// synOption reports whether an accepted socket's SYN carried the option.
	synOption func(fd int) (bool, error)
	// clc runs the handshake on a connected socket; direct, when set, is
	// this end's tlvDirect.
	clc func(ctx context.Context, tcp *net.TCPConn, client bool, direct []byte) (handshake, error)
	// clcTimeout bounds the meeting with the peer's smcrd.
	clcTimeout func() time.Duration
	// track and untrack follow the connections for smcrctl conns and drain.
	track   func(t *tracked)
	untrack func(t *tracked)
	// memory is what max_memory allows (0: unlimited) and what is held;
	// hold counts a connection's shared area in it (negative: gives it back).
	memory func() (used, limit int64)
	hold   func(n int64)
}

// DirectServer serves the direct socket.
type DirectServer struct {
	log  *slog.Logger
	path string
	ln   *net.UnixListener
	page *policyPage
	meet *meetPoint // nil: no same-host meeting (no shm)
	// ringFiles: the rings go in files of their own (DirectOptions.RingFiles)
	ringFiles bool
	hooks     directHooks
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup // Serve and the channels
	connWG    sync.WaitGroup // the connections' channels: Drain waits for them
	stop      chan struct{}  // closed when connections must end now

	mu    sync.Mutex
	conns map[*directConn]struct{}

	st directStats
}

// directStats counts what the direct server did, for smcrctl stats.
type directStats struct {
	smcr, tcp, failed, refused, bypass, released atomic.Uint64
}

// DirectOptions configure a DirectServer made by NewDirectServer.
type DirectOptions struct {
	Path   string            // the direct socket; its policy page is Path + ".policy"
	Ports  func(uint16) bool // ports the policy page lists (nil: all)
	Logger *slog.Logger
	// Addrs are the local addresses the policy page lists (none: any).
	Addrs []netip.Addr
	// Memory, when set, is what the policy page says of max_memory
	// (used, limit) at each Beat.
	Memory func() (used, limit int64)
	// SameHost decides every connection as the same-host bypass
	// (SMCR_MODE_SHM) of two ends that are both this server's: their
	// libraries write into each other's rings. A stand-in for CLC's TLV 3
	// runs on the TCP connection first, so both ends must be libraries.
	SameHost bool
	// RingFiles puts each connection's rings in a file of their own
	// (rmb.SharedRingFiles), as smcrd passes the engine's buffers.
	RingFiles bool
}

// NewDirectServer returns a direct server for tests of the library, without
// BPF or SMC-R: every socket a library brings is accepted, and every
// connection is decided SMC-R with its bytes carried over its own TCP
// connection, so that the library can be tested against any TCP peer. smcrd
// itself makes its direct server with New.
func NewDirectServer(opts DirectOptions) (*DirectServer, error) {
	hooks := directHooks{
		enabled:   func() bool { return true },
		tag:       func(int, bool) error { return nil },
		listen:    func(uint16) error { return nil },
		unlisten:  func(uint16) error { return nil },
		synOption: func(int) (bool, error) { return true, nil },
		clc: func(_ context.Context, tcp *net.TCPConn, _ bool, direct []byte) (handshake, error) {
			if !opts.SameHost {
				return handshake{carrier: tcp}, nil
			}
			peer, err := swapDirectValues(tcp, direct)
			if err != nil {
				return handshake{}, err
			}
			return handshake{carrier: tcp, peerDirect: peer}, nil
		},
		clcTimeout: func() time.Duration { return time.Second },
		track:      func(*tracked) {},
		untrack:    func(*tracked) {},
		memory:     opts.Memory,
		hold:       func(int64) {},
	}
	if hooks.memory == nil {
		hooks.memory = func() (int64, int64) { return 0, 0 }
	}
	ports := opts.Ports
	if ports == nil {
		ports = func(uint16) bool { return true }
	}
	s, err := newDirectServer(opts.Path, hooks, opts.Logger)
	if err != nil {
		return nil, err
	}
	s.ringFiles = opts.RingFiles
	s.page.set(true, ports, opts.Addrs)
	s.Beat()
	if opts.SameHost {
		if s.meet, err = newMeetPoint(filepath.Dir(opts.Path), s.log); err != nil {
			s.page.close()
			s.ln.Close()
			return nil, err
		}
	}
	go s.Serve()
	return s, nil
}

// swapDirectValues is NewDirectServer's stand-in for CLC's TLV 3: each end
// sends its value on the connection, length first, and reads the other's.
func swapDirectValues(tcp *net.TCPConn, mine []byte) ([]byte, error) {
	tcp.SetDeadline(time.Now().Add(5 * time.Second))
	defer tcp.SetDeadline(time.Time{})
	if _, err := tcp.Write(append([]byte{byte(len(mine))}, mine...)); err != nil {
		return nil, err
	}
	var n [1]byte
	if _, err := io.ReadFull(tcp, n[:]); err != nil {
		return nil, err
	}
	peer := make([]byte, n[0])
	if _, err := io.ReadFull(tcp, peer); err != nil {
		return nil, err
	}
	return peer, nil
}

func newDirectServer(path string, hooks directHooks, log *slog.Logger) (*DirectServer, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("direct socket: %w", err)
	}
	ln, err := listenDirect(path)
	if err != nil {
		return nil, err
	}
	page, err := newPolicyPage(path + ".policy")
	if err != nil {
		ln.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &DirectServer{log: log, path: path, ln: ln, page: page, hooks: hooks, ctx: ctx, cancel: cancel,
		stop: make(chan struct{}), conns: map[*directConn]struct{}{}}, nil
}

// listenDirect opens the direct socket at path, taking the place of one a
// smcrd that is gone left there, never that of one that answers.
func listenDirect(path string) (*net.UnixListener, error) {
	addr := &net.UnixAddr{Name: path, Net: "unixpacket"}
	ln, err := net.ListenUnix("unixpacket", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		if c, derr := net.DialUnix("unixpacket", nil, addr); derr == nil {
			c.Close()
			return nil, fmt.Errorf("direct socket %s: another smcrd serves it", path)
		}
		os.Remove(path)
		ln, err = net.ListenUnix("unixpacket", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("direct socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	// Every local program may bring its own sockets (package doc).
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, fmt.Errorf("direct socket: %w", err)
	}
	return ln, nil
}

// Serve accepts the libraries' channels until Close.
func (s *DirectServer) Serve() {
	s.wg.Add(1)
	defer s.wg.Done()
	var refusals lograte.Limiter
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			refusals.Log(s.log, slog.LevelWarn, "direct socket: accept", "err", err)
			time.Sleep(10 * time.Millisecond) // out of descriptors, say
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveChannel(c)
		}()
	}
}

// Bypassed is how many connections went library to library (same host).
func (s *DirectServer) Bypassed() uint64 { return s.st.bypass.Load() }

// Released is how many connections were handed back to the program's socket
// mid-stream (SMCR_LIB_RELEASE).
func (s *DirectServer) Released() uint64 { return s.st.released.Load() }

// Path is the direct socket's path.
func (s *DirectServer) Path() string { return s.path }

// SetPolicy puts what the libraries decide by into the policy page: addrs
// are the local addresses of ip_addr_list's interfaces.
func (s *DirectServer) SetPolicy(cfg *config.Config, addrs []netip.Addr) {
	s.page.set(cfg.Enabled, cfg.PortRanges.Contains, addrs)
}

// Beat tells the libraries smcrd is alive.
func (s *DirectServer) Beat() {
	used, limit := s.hooks.memory()
	s.page.p.SetMemory(uint64(max(used, 0)), uint64(max(limit, 0)))
	s.page.beat()
}

// Quiesce stops new connections: the libraries see smcrd disabled, and the
// direct socket closes. Connections already direct go on.
func (s *DirectServer) Quiesce() {
	s.page.set(false, func(uint16) bool { return false }, nil)
	s.ln.Close()
}

// Close ends everything: every direct connection is aborted (the programs read
// ECONNRESET), the socket and the policy page are removed.
func (s *DirectServer) Close() error {
	s.Quiesce()
	s.cancel()
	close(s.stop)
	s.mu.Lock()
	for c := range s.conns {
		c.abort()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if s.meet != nil {
		s.meet.close()
	}
	return s.page.close()
}

// Drained is closed once no connection of a library is left.
func (s *DirectServer) Drained() <-chan struct{} {
	ch := make(chan struct{})
	go func() { s.connWG.Wait(); close(ch) }()
	return ch
}

// serveChannel runs one channel: its first message says what it is for.
func (s *DirectServer) serveChannel(ch *net.UnixConn) {
	defer ch.Close()
	m, fds, _, err := recvDirect(ch)
	if err != nil {
		s.log.Debug("direct channel: first message", "err", err)
		return
	}
	if len(fds) == 0 {
		s.log.Debug("direct channel: no socket with the first message", "type", m.Type)
		return
	}
	fd := fds[0]
	f := os.NewFile(uintptr(fd), "program socket")
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	// A connection's offer brings the process's eventfd and wake page too.
	var wake *procWake
	if m.Type == rmb.MsgClient || m.Type == rmb.MsgAccepted {
		if len(fds) != 3 {
			for _, fd := range fds[1:] {
				unix.Close(fd)
			}
			err = fmt.Errorf("%d descriptors with the socket, want 2", len(fds)-1)
		} else {
			wake, err = openProcWake(fds[1], fds[2])
		}
		if err != nil {
			s.reply(ch, -int32(unix.EINVAL))
			s.st.refused.Add(1)
			s.log.Debug("direct channel: no process eventfd and wake page with the offer", "type", m.Type, "err", err)
			return
		}
		defer wake.close()
	} else {
		for _, fd := range fds[1:] {
			unix.Close(fd)
		}
	}
	if err := checkTCPSocket(fd); err != nil {
		s.reply(ch, -int32(unix.EINVAL))
		s.st.refused.Add(1)
		s.log.Debug("direct channel: not a TCP socket", "err", err)
		return
	}
	if m.Type == rmb.MsgClient || m.Type == rmb.MsgAccepted {
		s.connWG.Add(1)
		defer s.connWG.Done()
	}
	switch m.Type {
	case rmb.MsgClient:
		s.serveClient(ch, f, wake)
	case rmb.MsgListener:
		s.serveListener(ch, fd)
	case rmb.MsgAccepted:
		s.serveAccepted(ch, f, wake)
	default:
		s.log.Debug("direct channel: unexpected first message", "type", m.Type)
	}
}

// refuse answers that the socket stays the program's alone: plain TCP.
func (s *DirectServer) refuse(ch *net.UnixConn, errno syscall.Errno) {
	s.st.refused.Add(1)
	s.reply(ch, -int32(errno))
}

func (s *DirectServer) reply(ch *net.UnixConn, status int32) error {
	return sendDirect(ch, rmb.Msg{Type: rmb.MsgReply, Status: status}, nil, nil)
}

func (s *DirectServer) serveClient(ch *net.UnixConn, f *os.File, wake *procWake) {
	fd := int(f.Fd())
	if !s.hooks.enabled() {
		s.refuse(ch, unix.EOPNOTSUPP)
		return
	}
	if err := s.hooks.tag(fd, false); err != nil {
		s.log.Warn("direct: tag socket", "err", err)
		s.refuse(ch, unix.EOPNOTSUPP)
		return
	}
	if s.reply(ch, 0) != nil {
		return
	}
	m, _, _, err := recvDirect(ch)
	if err != nil || m.Type != rmb.MsgConnecting {
		return // the program closed the socket, or its connect failed at once
	}
	tcp, errno := s.connected(ch, f)
	if tcp == nil {
		s.st.failed.Add(1)
		sendDirect(ch, rmb.Msg{Type: rmb.MsgDecided, Mode: rmb.ModeFailed, Status: -int32(errno)}, nil, nil)
		return
	}
	s.decide(ch, tcp, wake, true)
}

func (s *DirectServer) serveAccepted(ch *net.UnixConn, f *os.File, wake *procWake) {
	fd := int(f.Fd())
	ok, err := s.hooks.synOption(fd)
	if err != nil {
		s.log.Warn("direct: accepted socket's tag", "err", err)
	}
	if !ok || !s.hooks.enabled() {
		s.refuse(ch, unix.EOPNOTSUPP)
		return
	}
	c, err := net.FileConn(f)
	if err != nil {
		s.refuse(ch, unix.EINVAL)
		return
	}
	tcp, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		s.refuse(ch, unix.EINVAL)
		return
	}
	if s.reply(ch, 0) != nil {
		tcp.Close()
		return
	}
	s.decide(ch, tcp, wake, false)
}

func (s *DirectServer) serveListener(ch *net.UnixConn, fd int) {
	sa, err := unix.Getsockname(fd)
	port := sockaddrPort(sa)
	if err != nil || port == 0 || !s.hooks.enabled() {
		// A listener without bind gets its port at listen(): too late for
		// the option's echo to be set up.
		s.refuse(ch, unix.EOPNOTSUPP)
		return
	}
	if err := s.hooks.tag(fd, true); err != nil {
		s.log.Warn("direct: tag listener", "err", err)
		s.refuse(ch, unix.EOPNOTSUPP)
		return
	}
	if err := s.hooks.listen(port); err != nil {
		s.log.Warn("direct: listener port", "port", port, "err", err)
		s.refuse(ch, unix.EOPNOTSUPP)
		return
	}
	defer func() {
		if err := s.hooks.unlisten(port); err != nil {
			s.log.Warn("direct: listener port", "port", port, "err", err)
		}
	}()
	if s.reply(ch, 0) != nil {
		return
	}
	s.log.Debug("direct: program listens", "port", port)
	// The registration lasts as long as the channel: the library closes it
	// with the listener, the kernel when the program ends. Shutdown ends it
	// too (the channel's reads fail once it is closed).
	stop := context.AfterFunc(s.ctx, func() { ch.Close() })
	defer stop()
	for {
		if _, _, _, err := recvDirect(ch); err != nil {
			return
		}
	}
}

// connected waits until the program's connect on f completes, and returns the
// connection, or the errno it failed with.
func (s *DirectServer) connected(ch *net.UnixConn, f *os.File) (*net.TCPConn, syscall.Errno) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, unix.EINVAL
	}
	// The library closes the channel when the program gives up (close).
	gone := make(chan struct{})
	go func() {
		recvDirect(ch)
		close(gone)
		f.SetWriteDeadline(time.Now())
	}()
	stop := context.AfterFunc(s.ctx, func() { f.SetWriteDeadline(time.Now()) })
	defer stop()
	var errno syscall.Errno
	werr := rc.Write(func(fd uintptr) bool {
		v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		switch {
		case err != nil:
			errno = unix.EINVAL
			return true
		case v != 0:
			errno = syscall.Errno(v)
			return true
		}
		if _, err := unix.Getpeername(int(fd)); err == nil {
			return true
		}
		return false // still connecting
	})
	if werr != nil {
		return nil, unix.ECONNABORTED
	}
	if errno != 0 {
		return nil, errno
	}
	select {
	case <-gone:
		return nil, unix.ECONNABORTED
	default:
	}
	c, err := net.FileConn(f)
	if err != nil {
		return nil, unix.EINVAL
	}
	tcp, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return nil, unix.EINVAL
	}
	return tcp, 0
}

// decide runs CLC on tcp, smcrd's duplicate of the program's socket, and tells
// the library the outcome.
func (s *DirectServer) decide(ch *net.UnixConn, tcp *net.TCPConn, wake *procWake, client bool) {
	t := &tracked{client: client, direct: true,
		local: unmapAP(tcp.LocalAddr().(*net.TCPAddr).AddrPort()), remote: unmapAP(tcp.RemoteAddr().(*net.TCPAddr).AddrPort())}
	s.hooks.track(t)
	defer s.hooks.untrack(t)
	var nonce [nonceLen]byte
	var value []byte
	if s.meet != nil {
		nonce, value = s.meet.value()
	}
	h, err := s.hooks.clc(s.ctx, tcp, client, value)
	if err != nil {
		// CLC failed with the TCP connection (a reset, say): the program
		// finds out from its socket.
		s.log.Debug("direct: clc", "local", t.local, "remote", t.remote, "err", err)
		h = handshake{}
	}
	if h.carrier == nil {
		s.st.tcp.Add(1)
		tcp.Close() // smcrd's duplicate: the program's socket stays open
		if len(h.prefix) > rmb.MsgMaxPayload {
			// CLC reads ahead at most a few KiB: never here.
			s.log.Error("direct: read-ahead too long to hand back", "bytes", len(h.prefix))
			h.prefix = nil
		}
		sendDirect(ch, rmb.Msg{Type: rmb.MsgDecided, Mode: rmb.ModeTCP}, h.prefix, nil)
		return
	}
	abortAll := func() {
		abort(tcp)
		if cc, ok := h.carrier.(interface{ Abort() error }); ok {
			cc.Abort()
		}
	}
	// The same-host bypass maps the peer's area, rings included. Else the
	// library's rings are the engine's buffers where they are in files
	// (shm); the pumps carry the rest.
	var files *ringFiles
	conn, _ := h.carrier.(*smcr.Conn)
	if h.peerDirect == nil || s.meet == nil {
		switch {
		case conn != nil:
			files, err = engineRingFiles(conn)
			if errors.Is(err, errors.ErrUnsupported) || errors.Is(err, smcr.ErrNotCursorDriven) {
				files, err = nil, nil
			}
		case s.ringFiles:
			files, err = ownRingFiles(directRing, directRing)
		}
	}
	var c *directConn
	if err == nil {
		c, err = newDirectConn(h.carrier, directRing, directRing, wake, files, s.log)
	}
	if err != nil {
		s.log.Error("direct: shared area", "err", err)
		abortAll()
		return
	}
	c.sock = tcp
	c.releases = &s.st.released
	if files != nil && conn != nil {
		c.engine = conn
	}
	// The shared area counts against max_memory while the connection lives.
	s.hooks.hold(int64(c.size()))
	defer s.hooks.hold(-int64(c.size()))
	mode, fds := rmb.ModeSMCR, c.libraryFds()
	var peer []int // the same-host peer library's area, eventfd and wake page
	if h.peerDirect != nil && s.meet != nil {
		mine := append([]int{c.memfd}, c.wake.fds()...)
		if client {
			peer, err = meet(nonce, h.peerDirect, mine, s.hooks.clcTimeout())
		} else {
			peer, err = s.meet.swapServer(nonce, h.peerDirect, mine, s.hooks.clcTimeout())
		}
		if err != nil {
			// The other end may have given up too, or may wait for
			// memory that never comes: the connection ends.
			s.log.Info("direct: same-host meeting failed: connection reset", "local", t.local, "remote", t.remote, "err", err)
			abortAll()
			c.release()
			sendDirect(ch, rmb.Msg{Type: rmb.MsgDecided, Mode: rmb.ModeTCP}, nil, nil)
			return
		}
		mode, fds, c.bypass = rmb.ModeSHM, append(fds, peer...), true
		if c.peerMem, c.peerSh, err = mapPeerArea(peer[0]); err != nil {
			// The connection goes on; a release of it is refused.
			s.log.Info("direct: the peer library's area", "err", err)
		}
	}
	err = sendDirect(ch, rmb.Msg{Type: rmb.MsgDecided, Mode: mode}, nil, fds)
	c.closeLibraryFds()
	// Passed (or not): the connection's life needs none of them here.
	for _, fd := range peer {
		unix.Close(fd)
	}
	wake.closePage()
	if err != nil {
		s.log.Debug("direct: decided", "err", err)
		c.abort()
		c.run(nil)
		c.release()
		return
	}
	s.st.smcr.Add(1)
	if mode == rmb.ModeSHM {
		s.st.bypass.Add(1)
	}
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	c.run(ch)
	// Out of the table first: Close aborts what is in it, in the area.
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.release()
}

// checkTCPSocket makes sure fd is what a library may bring: a TCP socket.
func checkTCPSocket(fd int) error {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return err
	}
	proto, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if err != nil {
		return err
	}
	dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return err
	}
	if typ != unix.SOCK_STREAM || proto != unix.IPPROTO_TCP || (dom != unix.AF_INET && dom != unix.AF_INET6) {
		return fmt.Errorf("type %d, protocol %d, domain %d", typ, proto, dom)
	}
	return nil
}

func sockaddrPort(sa unix.Sockaddr) uint16 {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return uint16(a.Port)
	case *unix.SockaddrInet6:
		return uint16(a.Port)
	}
	return 0
}

// recvDirect reads one message, and the file descriptors that may come with
// it: at most three (a socket, the process's eventfd and wake page); any more
// are closed.
func recvDirect(ch *net.UnixConn) (rmb.Msg, []int, []byte, error) {
	// A library's messages carry no payload: a longer packet is truncated,
	// and refused.
	buf := make([]byte, rmb.MsgHeaderLen)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := ch.ReadMsgUnix(buf, oob)
	if err != nil {
		return rmb.Msg{}, nil, nil, err
	}
	var fds []int
	if oobn > 0 {
		for i, f := range scm.Rights(oob[:oobn]) {
			if i < 3 {
				fds = append(fds, f)
			} else {
				unix.Close(f)
			}
		}
	}
	bad := func(err error) (rmb.Msg, []int, []byte, error) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return rmb.Msg{}, nil, nil, err
	}
	if n == 0 {
		return bad(net.ErrClosed) // EOF: the library closed its end
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		return bad(errors.New("direct: message truncated"))
	}
	m, p, err := rmb.ParseMsg(buf[:n])
	if err != nil {
		return bad(err)
	}
	return m, fds, p, nil
}

func sendDirect(ch *net.UnixConn, m rmb.Msg, payload []byte, fds []int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err := ch.WriteMsgUnix(m.Append(make([]byte, 0, rmb.MsgHeaderLen+len(payload)), payload), oob, nil)
	return err
}

// directHooks binds the direct server to this smcrd.
func (d *Daemon) directHooks() directHooks {
	return directHooks{
		enabled: func() bool { return d.CurrentConfig().Enabled && len(d.devs) > 0 },
		tag: func(fd int, _ bool) error {
			return d.loader.TagSocket(fd, bpf.Tag{SMCOption: true})
		},
		listen:     d.loader.AddDirectPort,
		unlisten:   d.loader.RemoveDirectPort,
		synOption:  d.loader.SYNHadOption,
		clc:        d.directCLC,
		clcTimeout: func() time.Duration { return d.CurrentConfig().CLCTimeout },
		track:      d.track,
		untrack:    d.untrack,
		memory: func() (int64, int64) {
			return d.engine.MemoryHeld(), d.engine.Settings().MaxMemory
		},
		hold: d.engine.HoldMemory,
	}
}

// directCLC runs CLC on a program's socket as the relay's two sides do on
// smcrd's own (redirect.go, steer.go): as client only with a peer that echoed
// the option.
func (d *Daemon) directCLC(ctx context.Context, tcp *net.TCPConn, client bool, direct []byte) (handshake, error) {
	var conn *smcr.Conn
	var err error
	// The engine's buffers can be the library's rings only where they are in
	// files (shm); elsewhere the pumps carry the bytes and the buffers pool.
	cursors := hasKind(d.devs, verbs.KindSHM)
	if client {
		local, remote := tcp.LocalAddr().(*net.TCPAddr).AddrPort(), tcp.RemoteAddr().(*net.TCPAddr).AddrPort()
		ttl := d.CurrentConfig().PeerCacheTTL
		seen, serr := d.loader.Seen(local, remote)
		switch {
		case serr != nil || seen&bpf.SeenSentSYNOption == 0:
			d.st.noOption.Add(1)
			return handshake{}, nil
		case !seen.PeerSupportsSMC():
			d.st.noEcho.Add(1)
			d.incapable(unmapAP(remote), reasonNoEcho, ttl)
			return handshake{}, nil
		}
		conn, err = d.engine.ClientWith(ctx, tcp, smcr.ClientOptions{Standard: seen&bpf.SeenPeerSMCX == 0, Direct: direct, Cursors: cursors})
		if err != nil {
			return handshake{}, err
		}
		d.settle(&tracked{client: true, remote: unmapAP(remote)}, conn, ttl)
	} else {
		conn, err = d.engine.ServerWith(ctx, tcp, smcr.ServerOptions{Direct: direct, Cursors: cursors})
		if err != nil {
			return handshake{}, err
		}
	}
	if conn.Mode() == smcr.ModeSMCR {
		return handshake{carrier: conn, peerDirect: conn.PeerDirect()}, nil
	}
	prefix, err := conn.DetachTCP(crossingWait)
	if err != nil {
		abort(tcp)
		return handshake{}, err
	}
	return handshake{prefix: prefix}, nil
}

// mapPeerArea maps a same-host peer library's shared area (its memfd), which
// smcrd reads at a release (directrelease.go).
func mapPeerArea(fd int) ([]byte, *rmb.Shared, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, nil, fmt.Errorf("peer area: %w", err)
	}
	if st.Size < rmb.SharedPageSize || st.Size > 1<<30 {
		return nil, nil, fmt.Errorf("peer area of %d bytes", st.Size)
	}
	mem, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("peer area: mmap: %w", err)
	}
	sh, err := rmb.ViewShared(mem)
	if err != nil {
		unix.Munmap(mem)
		return nil, nil, fmt.Errorf("peer area: %w", err)
	}
	return mem, sh, nil
}
