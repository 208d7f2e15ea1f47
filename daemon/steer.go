// Server side of the transparent path: a connection whose SYN carried the SMC
// option, steered by sk_lookup to smcrd instead of the application (RFC 7609 §3.3).
// smcrd connects to the application at the address the client asked for, showing
// it the real client address, runs CLC as the server (§3.7) and carries the bytes.

package daemon

import (
	"context"
	"net"

	"github.com/smcr-io/smcr/bpf"
)

func (d *Daemon) serveSteered(peer *net.TCPConn) {
	d.st.steered.Add(1)
	t := &tracked{
		local:  unmapAP(peer.LocalAddr().(*net.TCPAddr).AddrPort()), // S:P, the application's address
		remote: unmapAP(peer.RemoteAddr().(*net.TCPAddr).AddrPort()),
	}
	d.track(t)
	defer d.untrack(t)

	// The application first: if nothing listens at S:P the client gets a reset
	// before any CLC, as it would have without smcrd.
	ctx, cancel := context.WithTimeout(d.ctx, dialTimeout)
	defer cancel()
	dl := net.Dialer{Control: urgentInline(sharedPort(d.loader.Control(bpf.Tag{ShowPeer: t.remote})))}
	dl.SetMultipathTCP(false)
	start := bpf.Monotonic()
	c, err := dl.DialContext(ctx, "tcp", t.local.String())
	if err != nil {
		d.log.Debug("connect to local application", "addr", t.local, "err", err)
		abort(peer)
		return
	}
	app := c.(*net.TCPConn)
	// The application's options on its end go onto the steered connection.
	wire, unfollow := d.follow(app)
	defer unfollow()
	wire.since(start, d.log)
	wire.attach(peer, d.log)
	conn, err := d.engine.Server(d.ctx, peer)
	if err != nil { // counted by the engine (handshake errors)
		d.log.Info("clc as server", "peer", t.remote, "err", err)
		abort(peer)
		abort(app)
		return
	}
	d.settle(t, conn, d.CurrentConfig().PeerCacheTTL)
	d.carry(t, app, conn)
}
