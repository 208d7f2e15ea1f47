// Client side of the transparent path: an application's connection that connect4/6
// redirected to smcrd. smcrd connects to the original destination with the SMC
// option on its SYN (RFC 7609 §3.3), runs CLC as the client when the peer echoed
// it (§3.5), and carries the bytes; a peer without SMC-R is carried as plain TCP
// and goes into the negative cache (§4.3).

package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/smcr-io/smcr/bpf"
	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/internal/tcpurg"
	"github.com/smcr-io/smcr/smcr"
	"github.com/smcr-io/smcr/smcr/clc"
)

// dialTimeout bounds smcrd's TCP connect to the original destination; the kernel's
// own SYN retries would otherwise hold the application for minutes.
const dialTimeout = 30 * time.Second

// Reasons a connection is carried as plain TCP without CLC.
const (
	reasonNoEcho   = "peer did not echo the SMC option"
	reasonNoOption = "SMC option not seen on smcrd's SYN"
)

func (d *Daemon) serveRedirected(app *net.TCPConn) {
	resetIfLost(app)
	d.st.redirected.Add(1)
	t := &tracked{client: true}
	t.local = app.RemoteAddr().(*net.TCPAddr).AddrPort() // the application's own end
	wire, unfollow := d.follow(app)
	defer unfollow()
	o, err := d.original(app)
	orig := o.Dst
	if err != nil {
		// Not redirected by the programs: a local program connected to
		// the listener itself.
		d.redirectStrays.Log(d.log, slog.LevelWarn, "connection to the redirect listener not redirected by the programs: closed",
			"from", t.local, "err", err)
		abort(app)
		return
	}
	wire.since(o.Connected, d.log)
	t.remote = orig
	d.track(t)
	defer d.untrack(t)

	// smcrd's connection is the application's user's, so that the firewall
	// rules on the owner that would have applied to the application's own
	// connection apply to it (owner.go). Where that user cannot be known, no
	// connection is made for the application.
	uid, err := socketUID(t.local, unmapAP(app.LocalAddr().(*net.TCPAddr).AddrPort()))
	if err != nil {
		d.log.Debug("owner of the application's socket", "app", t.local, "err", err)
		abort(app)
		return
	}
	ctx, cancel := context.WithTimeout(d.ctx, dialTimeout)
	defer cancel()
	dl := net.Dialer{Control: urgentInline(sharedPort(ownedBy(uid, d.loader.Control(bpf.Tag{SMCOption: true}))))}
	dl.SetMultipathTCP(false)
	withOptions(&dl, o.Options, d.log)
	if len(o.Options) > 0 {
		d.log.Debug("application's socket options carried", "app", t.local, "dst", orig, "options", o.Options)
	}
	// From the address and port the application sees as its own (getsockname),
	// so that the server's application sees the client the client's does. Where
	// that is taken (a listener on the port, the 4-tuple in use), any port.
	if src, ok := d.loader.ShownSource(orig.Addr()); ok {
		dl.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, t.local.Port()))
	}
	c, err := dl.DialContext(ctx, "tcp", orig.String())
	if dl.LocalAddr != nil && (errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EADDRNOTAVAIL)) {
		d.log.Debug("connect from the application's port", "src", dl.LocalAddr, "dst", orig, "err", err)
		dl.LocalAddr = nil
		c, err = dl.DialContext(ctx, "tcp", orig.String())
	}
	if err != nil {
		// The application sees a reset where it would have seen a refusal
		// or a timeout. Its next connections see the kernel's own answer:
		// they go direct as long as the destination stays unreachable.
		switch {
		case errors.Is(err, errNotAsUser):
			d.ownerErrs.Log(d.log, slog.LevelError, "connection not made: the firewall's rules on its owner could not apply", "app", t.local, "dst", orig, "err", err)
		case unreachable(err) && d.ctx.Err() == nil:
			d.addUnreachable(orig, err)
		default:
			d.log.Debug("connect to original destination", "dst", orig, "err", err)
		}
		abort(app)
		return
	}
	tcp := c.(*net.TCPConn)
	wire.attach(tcp, d.log)
	d.connMu.Lock()
	t.local = unmapAP(tcp.LocalAddr().(*net.TCPAddr).AddrPort()) // the connection on the wire
	d.connMu.Unlock()
	ttl := d.CurrentConfig().PeerCacheTTL
	seen, err := d.loader.Seen(tcp.LocalAddr().(*net.TCPAddr).AddrPort(), tcp.RemoteAddr().(*net.TCPAddr).AddrPort())
	if errors.Is(err, bpf.ErrUnknown) {
		// sockops forgets a socket when it closes: a peer that reset the
		// connection at once (its smcrd found no application at orig,
		// steer.go) leaves no record. That is the reset of the handshake
		// below, come early, not a SYN that went without the option.
		if lost := endedEarly(tcp); lost != nil {
			d.st.setupErrors.Add(1)
			d.addUnreachable(orig, lost)
			abort(tcp)
			abort(app)
			return
		}
	}
	switch {
	case err != nil || seen&bpf.SeenSentSYNOption == 0:
		// sockops did not tag our SYN (smcrd outside the cgroup, or no option
		// space): the peer cannot have seen it, so CLC would only confuse it.
		// Not the peer's fault: no negative entry.
		d.carryPlain(t, app, tcp, reasonNoOption)
		return
	case !seen.PeerSupportsSMC():
		d.incapable(orig, reasonNoEcho, ttl)
		d.carryPlain(t, app, tcp, reasonNoEcho)
		return
	}
	// A server whose SYN-ACK lacks smcrd's SMCX option is another SMC-R
	// implementation (Linux, z/OS): propose only what it accepts.
	conn, err := d.engine.ClientWith(d.ctx, tcp, smcr.ClientOptions{Standard: seen&bpf.SeenPeerSMCX == 0})
	if err != nil {
		// Reset or closed during CLC: most often the peer's smcrd found no
		// application at orig (steer.go). That says nothing of its other
		// ports, so the peer is not cached as without SMC-R; orig is
		// unreachable, until a direct connection to it succeeds. The
		// engine counts the handshake error.
		if unreachable(err) && d.ctx.Err() == nil {
			d.addUnreachable(orig, err)
		} else {
			d.peerErrs.Log(d.log, slog.LevelInfo, "clc as client", "dst", orig, "err", err)
		}
		abort(tcp)
		abort(app)
		return
	}
	d.settle(t, conn, ttl)
	d.carry(t, app, conn)
}

// endedEarly is the error of a connection that closed before smcrd used it
// (ECONNRESET where a system call took the socket's own), nil for one still open
// or with bytes still to read: a server that wrote and reset at once is carried
// as the application would have read it, bytes then reset.
func endedEarly(tcp *net.TCPConn) error {
	closed, soerr, err := closedState(tcp)
	if err != nil || !closed || queued(tcp) {
		return nil
	}
	if soerr == 0 {
		soerr = syscall.ECONNRESET
	}
	return readError(tcp, soerr)
}

// queued reports whether tcp has received bytes not yet read, which a reset
// leaves readable.
func queued(tcp *net.TCPConn) bool {
	rc, err := tcp.SyscallConn()
	if err != nil {
		return false
	}
	var q bool
	rc.Control(func(fd uintptr) { q = tcpurg.Queued(fd) })
	return q
}

// sharedPort adds SO_REUSEADDR to control, for smcrd's outbound sockets (to
// the original destination, to the local application, the soft provider's): a
// port connect() gave one of them (to a local server, say) stays open to
// another that binds it to show a server the application's port (connect
// shares a port among destinations; bind refuses one in use unless every
// holder allows it). The kernel still refuses a 4-tuple in use.
func sharedPort(control dialControl) dialControl { return withFlag(control, syscall.SO_REUSEADDR) }

// urgentInline adds SO_OOBINLINE to control, for the sockets smcrd carries an
// application's bytes on (those it dials, and its listeners, whose accepted
// sockets inherit it): inline from the start, so that no urgent byte comes
// while it is not (urgent.go, splice.go). The kernel drops an urgent byte from
// the stream of a socket without it when the next urgent byte arrives while
// the first is the next to read, which, before the relay begins (smcrd still
// connecting, or in CLC), is an application's first byte.
func urgentInline(control dialControl) dialControl { return withFlag(control, syscall.SO_OOBINLINE) }

// dialControl is a net.Dialer's or net.ListenConfig's Control.
type dialControl = func(network, address string, c syscall.RawConn) error

// withFlag adds the socket option opt (SOL_SOCKET), turned on, to control.
func withFlag(control dialControl, opt int) dialControl {
	return func(network, address string, c syscall.RawConn) error {
		if err := control(network, address, c); err != nil {
			return err
		}
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, opt, 1)
		}); err != nil {
			return err
		}
		return serr
	}
}

// addUnreachable has the programs leave the connections to dst direct, so that
// applications see the kernel's own refusal or timeout, as long as those fail.
func (d *Daemon) addUnreachable(dst netip.AddrPort, why error) {
	d.log.Info("destination unreachable: connections to it go direct until one succeeds", "dst", dst, "err", why)
	if err := d.loader.AddUnreachable(dst, d.CurrentConfig().PeerCacheTTL); err != nil {
		d.log.Warn("unreachable destinations", "dst", dst, "err", err)
	}
}

// unreachable tells the errors of a connect or a CLC handshake that say the
// destination cannot be reached now from those of smcrd itself (out of ports
// or files, say). A reset, or the connection's end, is the server's smcrd
// finding nothing listening (steer.go), come before the connect was seen done
// or during CLC (the engine fails a handshake whose TCP connection ended).
func unreachable(err error) bool {
	for _, e := range []error{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EPIPE, io.EOF, syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ETIMEDOUT, context.DeadlineExceeded} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// settle records how the handshake went: the connection in the table and, on
// the client side, the destination in the peer cache (one that declined is
// tried again only after the TTL). The server side has no say there: the cache
// decides which connections the programs redirect, and a client's port is
// nobody's destination.
func (d *Daemon) settle(t *tracked, conn *smcr.Conn, ttl time.Duration) {
	d.connMu.Lock()
	t.conn = conn
	d.connMu.Unlock()
	if !t.client {
		return
	}
	peer := t.remote
	if conn.Mode() == smcr.ModeSMCR {
		d.peers.capable(peer, ttl)
		return
	}
	reason := "fallback"
	dc := conn.Decline()
	if dc != nil {
		reason = dc.Code.String()
	}
	// Memory short on either side is no reason to stop trying the peer: max_memory
	// may be raised (smcrctl set) or freed at any time, and applies at once.
	if dc == nil || dc.Code != clc.DeclineNoMemory {
		d.incapable(peer, reason, ttl)
	}
}

// incapable puts peer in the negative cache and says so: from now on the
// programs leave connections to it direct, and smcrd sees none of them.
func (d *Daemon) incapable(peer netip.AddrPort, reason string, ttl time.Duration) {
	ttl, err := d.peers.incapable(peer, reason, ttl)
	if err != nil {
		d.log.Warn("negative cache", "peer", peer, "err", err)
		return
	}
	d.log.Info("peer without SMC-R: connections to it go direct", "peer", peer, "reason", reason, "for", ttl)
}

// carryPlain carries a connection as plain TCP without any CLC: both ends are
// *net.TCPConn, so the relay splices.
func (d *Daemon) carryPlain(t *tracked, app, tcp *net.TCPConn, reason string) {
	side := control.SidePeer
	if reason == reasonNoOption {
		side = control.SideLocal // our SYN went without the option: not the peer's doing
		d.st.noOption.Add(1)
	} else {
		d.st.noEcho.Add(1)
	}
	d.connMu.Lock()
	t.reason, t.side = reason, side
	d.connMu.Unlock()
	d.log.Debug("plain tcp", "dst", t.remote, "reason", reason)
	resetIfLost(tcp) // the peer's application reads it straight
	d.carry(t, app, tcp)
}

func (d *Daemon) carry(t *tracked, app, peer net.Conn) {
	res := relay(app, peer, d.stopCh, &t.bytes)
	if res.Err != nil && !errors.Is(res.Err, net.ErrClosed) {
		d.log.Debug("connection ended abnormally", "local", t.local, "remote", t.remote, "err", res.Err)
	}
}

// original is what the application connected to, and the options its socket
// had, from the map the programs fill (the getsockopt program answers
// SO_ORIGINAL_DST from it too). Read once, the entry is deleted: it outlives the
// application's socket.
func (d *Daemon) original(app *net.TCPConn) (bpf.Original, error) {
	local, remote := app.LocalAddr().(*net.TCPAddr).AddrPort(), app.RemoteAddr().(*net.TCPAddr).AddrPort()
	o, err := d.loader.OriginalOf(local, remote)
	if err != nil {
		return bpf.Original{}, err
	}
	if err := d.loader.ForgetOriginalDst(local, remote); err != nil {
		d.log.Warn("original destination", "app", remote, "err", err)
	}
	o.Dst = unmapAP(o.Dst)
	return o, nil
}

func unmapAP(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
