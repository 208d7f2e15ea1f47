// Server side of the transparent path: a connection whose SYN carried the SMC
// option, steered by sk_lookup to smcrd instead of the application (RFC 7609 §3.3).
// smcrd connects to the application at the address the client asked for, showing
// it the real client address, runs CLC as the server (§3.7) and carries the bytes.

package daemon

import (
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/smcr-io/smcr/bpf"
)

// appDialGrace is how long a steered connection's CLC waits for smcrd's connect
// to the application. On loopback a connect completes or is refused within
// microseconds; one that takes longer met a full accept queue (the kernel
// drops the SYN and sends it again after 1 s, then 2 s more, ...), and the
// client's smcrd, waiting for the CLC Accept meanwhile, would reach
// clc_timeout, fall back and put this destination in its negative cache. So
// CLC goes on beside the connect, and the client's bytes wait in the RMB until
// the application has accepted.
const appDialGrace = 50 * time.Millisecond

func (d *Daemon) serveSteered(peer *net.TCPConn) {
	if atListener(peer, d.steering) {
		// Not steered: connected to the listener's own address, by a local
		// program (or by smcrd itself, which would connect to that address
		// again for each one, and again).
		d.steerStrays.Log(d.log, slog.LevelWarn, "connection to the steering listener not steered by the programs: closed",
			"from", peer.RemoteAddr(), "to", peer.LocalAddr())
		abort(peer)
		return
	}
	d.st.steered.Add(1)
	t := &tracked{
		local:  unmapAP(peer.LocalAddr().(*net.TCPAddr).AddrPort()), // S:P, the application's address
		remote: unmapAP(peer.RemoteAddr().(*net.TCPAddr).AddrPort()),
	}
	d.track(t)
	defer d.untrack(t)

	// The application first: if nothing listens at S:P the client gets a reset
	// before any CLC, as it would have without smcrd. One slow to accept
	// gets its CLC meanwhile (appDialGrace).
	ctx, cancel := context.WithTimeout(d.ctx, dialTimeout)
	defer cancel()
	start := bpf.Monotonic()
	dialed := make(chan appDial, 1)
	go func() { dialed <- d.dialApp(ctx, t) }()
	var app *net.TCPConn
	grace := time.NewTimer(appDialGrace)
	select {
	case r := <-dialed:
		grace.Stop()
		if r.err != nil {
			abort(peer)
			return
		}
		app = r.app
		defer d.onWire(app, peer, start)()
	case <-grace.C:
		d.log.Debug("application slow to accept: clc goes on meanwhile", "addr", t.local, "peer", t.remote)
	}
	conn, err := d.engine.Server(d.ctx, peer)
	if err != nil { // counted by the engine (handshake errors)
		d.peerErrs.Log(d.log, slog.LevelInfo, "clc as server", "peer", t.remote, "err", err)
		abort(peer)
		if app == nil {
			cancel()
			app = (<-dialed).app
		}
		if app != nil {
			abort(app)
		}
		return
	}
	if app == nil {
		r := <-dialed
		if r.err != nil {
			abort(conn)
			return
		}
		app = r.app
		defer d.onWire(app, peer, start)()
	}
	d.settle(t, conn, d.CurrentConfig().PeerCacheTTL)
	d.carry(t, app, conn)
}

// atListener reports whether c came to one of lns at that listener's own
// address: connected to it directly rather than steered there by sk_lookup,
// which hands a listener connections for other addresses (the applications').
func atListener(c *net.TCPConn, lns []net.Listener) bool {
	local := unmapAP(c.LocalAddr().(*net.TCPAddr).AddrPort())
	for _, ln := range lns {
		if unmapAP(ln.Addr().(*net.TCPAddr).AddrPort()) == local {
			return true
		}
	}
	return false
}

// appDial is the outcome of smcrd's connect to a steered connection's application.
type appDial struct {
	app *net.TCPConn
	err error
}

// dialApp connects to the application at t.local, where the steered
// connection was headed, showing it the client's address.
func (d *Daemon) dialApp(ctx context.Context, t *tracked) appDial {
	dl := net.Dialer{Control: urgentInline(sharedPort(d.loader.Control(bpf.Tag{ShowPeer: t.remote})))}
	dl.SetMultipathTCP(false)
	c, err := dl.DialContext(ctx, "tcp", t.local.String())
	if err != nil {
		d.log.Debug("connect to local application", "addr", t.local, "err", err)
		return appDial{err: err}
	}
	app := c.(*net.TCPConn)
	resetIfLost(app)
	return appDial{app: app}
}

// onWire puts the options of app, smcrd's connection to the application, onto
// peer, the steered connection, and follows the ones app takes later; the
// function it returns stops following. start is from before the connect to
// app: options older than that were another connection's (sockopts.go).
func (d *Daemon) onWire(app, peer *net.TCPConn, start time.Duration) func() {
	wire, unfollow := d.follow(app)
	wire.since(start, d.log)
	wire.attach(peer, d.log)
	return unfollow
}
