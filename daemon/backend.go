// Backend: the daemon's answers to the control API (smcrctl): status, configuration,
// statistics, link groups, connections, peers and devices. Not part of RFC 7609;
// the views follow Linux smc-tools (smcss, smcr stats, smcr linkgroup, smcr device).

package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr"
	"github.com/smcr-io/smcr/smcr/verbs"
)

var _ control.Backend = (*Daemon)(nil)

// Status reports smcrd's overall state.
func (d *Daemon) Status(context.Context) (control.Status, error) {
	s := d.engine.Stats()
	return control.Status{
		Version:       d.opts.Version,
		State:         *d.state.Load(),
		PID:           os.Getpid(),
		UptimeSeconds: time.Since(d.start).Seconds(),
		Enabled:       d.CurrentConfig().Enabled,
		Providers:     d.providerNames(),
		ConfigFile:    d.opts.ConfigFile,
		Connections:   int(s.Active),
		LinkGroups:    s.LinkGroups,
	}, nil
}

// Config lists every attribute with the value in effect and, for one read
// only at start and set since, the value the next start takes (pending).
func (d *Daemon) Config(context.Context) ([]control.Attribute, error) {
	return d.CurrentConfig().AttributesSince(d.opts.Config), nil
}

// Stats returns the counters since start or the last reset.
func (d *Daemon) Stats(context.Context) (control.Stats, error) {
	s := d.stats(d.engine.Stats(), false)
	s.Programs = d.programStats(false)
	return s, nil
}

// ResetStats zeroes the counters and returns their values just before, each
// taken with its reset: what is counted meanwhile goes into one or the other.
func (d *Daemon) ResetStats(context.Context) (control.Stats, error) {
	s := d.stats(d.engine.ResetStats(), true)
	s.Programs = d.programStats(true)
	d.st.resetAt.Store(time.Now().UnixNano())
	return s, nil
}

// programStats are the programs' counters since smcrd's start or the last
// reset, as the others. The programs' per-CPU counters cannot be zeroed with
// their reading, and their map is pinned (it holds what earlier smcrds'
// programs counted), so smcrd keeps the values it read at start and at each
// reset as the base of the next answer: what is counted after the read goes
// into the next. A counter below its base was recreated.
func (d *Daemon) programStats(reset bool) map[string]uint64 {
	if d.loader == nil {
		return nil
	}
	now, err := d.loader.Stats()
	if err != nil {
		if !errors.Is(err, net.ErrClosed) { // shutting down
			d.log.Warn("programs' counters", "err", err)
		}
		return nil
	}
	d.st.progMu.Lock()
	defer d.st.progMu.Unlock()
	out := make(map[string]uint64, len(now))
	for name, n := range now {
		if base := d.st.progBase[name]; n >= base {
			n -= base
		}
		out[name] = n
	}
	if reset {
		d.st.progBase = now
	}
	return out
}

// The fallbacks that never reached CLC (code 0), by whose doing.
const (
	reasonNoCLC   = "no SMC option from the peer (plain TCP, no CLC)"
	reasonNoSYNOp = "SMC option not sent on smcrd's SYN: smcrd outside the cgroup, or no TCP option space (plain TCP, no CLC)"
)

// stats maps the engine's counters and the daemon's own to the control API's,
// zeroing the daemon's when reset is set.
func (d *Daemon) stats(s smcr.Stats, reset bool) control.Stats {
	get := func(c *atomic.Uint64) uint64 {
		if reset {
			return c.Swap(0)
		}
		return c.Load()
	}
	if reset {
		d.st.redirected.Store(0)
		d.st.steered.Store(0)
	}
	noEcho, noOption := get(&d.st.noEcho), get(&d.st.noOption)
	plain := noEcho + noOption
	out := control.Stats{
		SinceResetSeconds: time.Since(time.Unix(0, d.st.resetAt.Load())).Seconds(),
		Connections: control.ConnCounts{
			Handled:         s.Handled + plain,
			SMCR:            s.SMC,
			HandshakeErrors: get(&d.st.setupErrors) + s.HandshakeErrors,
			FirstContact:    s.FirstContact,
			Reused:          s.Reused,
			Active:          s.Active,
		},
		RX: control.Direction{Bytes: s.RxBytes, Requests: total(s.RxReqSizes), FallbackBytes: s.FallbackRx,
			BufferFull: s.RxFull, BufferTooSmall: s.RxTooSmall, Reuses: s.RxReuses, Downgrades: s.RxDowngrades,
			BufferSizes: histogram(s.RxBufSizes), RequestSizes: histogram(s.RxReqSizes)},
		TX: control.Direction{Bytes: s.TxBytes, Requests: total(s.TxReqSizes), FallbackBytes: s.FallbackTx,
			BufferFull: s.WriteBlocked, BufferTooSmall: s.TxTooSmall, Reuses: s.TxReuses,
			BufferSizes: histogram(s.TxBufSizes), RequestSizes: histogram(s.TxReqSizes)},
		MemoryInUse:    s.MemoryInUse,
		MemoryPooled:   s.MemoryPooled,
		MemoryPeak:     s.MemoryPeak,
		ProtocolErrors: s.ProtoErrors,
		Aborts:         s.Aborts,
		Links: control.LinkEvents{Added: s.AddLinks, Deleted: s.DeleteLinks,
			ConnsMoved: s.MovedConns, ConnsContinued: s.Continued},
	}
	if d.direct != nil {
		ds := &d.direct.st
		out.Direct = control.DirectCounts{SMCR: get(&ds.smcr), TCP: get(&ds.tcp), Failed: get(&ds.failed), Refused: get(&ds.refused), Bypass: get(&ds.bypass), Released: get(&ds.released)}
	}
	for k, n := range s.Fallback {
		out.Fallbacks = append(out.Fallbacks, control.FallbackCount{Code: uint32(k.Code), Reason: k.Code.String(), Side: k.Side.String(), Count: n})
		out.Connections.Fallback += n
		if k.Code.Class() == uint8(smcr.DeclineTimeoutCLC>>24) {
			out.Connections.HandshakeErrors += n
		}
	}
	if noEcho > 0 {
		out.Fallbacks = append(out.Fallbacks, control.FallbackCount{Reason: reasonNoCLC, Side: control.SidePeer, Count: noEcho})
	}
	if noOption > 0 {
		out.Fallbacks = append(out.Fallbacks, control.FallbackCount{Reason: reasonNoSYNOp, Side: control.SideLocal, Count: noOption})
	}
	out.Connections.Fallback += plain
	c := &out.Connections
	c.Server = control.RoleCounts{Handled: s.Server.Handled, SMCR: s.Server.SMC, Fallback: s.Server.Fallback}
	// The connections carried plain without CLC are all clients'.
	// (Saturated: a server connection counted between two of the engine's
	// loads may be in a role's count and not yet in the total.)
	less := func(a, b uint64) uint64 { return a - min(a, b) }
	c.Client = control.RoleCounts{Handled: less(c.Handled, c.Server.Handled), SMCR: less(c.SMCR, c.Server.SMCR), Fallback: less(c.Fallback, c.Server.Fallback)}
	c.V2 = min(s.SMCV2, c.SMCR)
	c.V1 = c.SMCR - c.V2
	slices.SortFunc(out.Fallbacks, func(a, b control.FallbackCount) int {
		if a.Count != b.Count {
			return int(b.Count) - int(a.Count)
		}
		if a.Code != b.Code {
			return int(a.Code) - int(b.Code)
		}
		return strings.Compare(a.Reason, b.Reason)
	})
	return out
}

// histogram maps an engine histogram to the control API's, bucket by bucket.
func histogram(h smcr.SizeHistogram) control.Histogram {
	out := control.NewHistogram(smcr.SizeBounds[:])
	for i := range out {
		out[i].Count = h[i]
	}
	return out
}

// total is the number of values a histogram counted.
func total(h smcr.SizeHistogram) uint64 {
	var n uint64
	for _, c := range h {
		n += c
	}
	return n
}

// LinkGroups lists the link groups with their links.
func (d *Daemon) LinkGroups(context.Context) ([]control.LinkGroup, error) {
	var out []control.LinkGroup
	for _, g := range d.engine.LinkGroups() {
		lg := control.LinkGroup{ID: g.ID, Role: g.Role, Peer: g.Peer, Provider: g.Provider, State: "active", Conns: g.Conns,
			MostLinks: g.MostLinks,
			TX:        control.LinkTraffic{Bytes: g.TxBytes, WorkRequests: g.Sent},
			RX:        control.LinkTraffic{Bytes: g.RxBytes, WorkRequests: g.Received}}
		if g.PeerAddr.IsValid() {
			lg.PeerAddr = g.PeerAddr.String()
		}
		for _, l := range g.Links {
			lk := control.Link{LinkGroup: g.ID, Num: l.Num, Role: g.Role, Peer: g.Peer, State: l.State,
				Device: l.Device, Port: l.Port, LocalQPN: l.QPN, PeerQPN: l.PeerQPN, Conns: l.Conns,
				TX:     control.LinkTraffic{Bytes: l.TxBytes, WorkRequests: l.Sent},
				RX:     control.LinkTraffic{Bytes: l.RxBytes, WorkRequests: l.Received},
				Errors: l.Errors, ErrorsByKind: l.ErrorsByKind, RTTMicros: float64(l.RTT.Nanoseconds()) / 1e3}
			if l.PeerGID != ([16]byte{}) {
				lk.PeerGID = netip.AddrFrom16(l.PeerGID).String()
			}
			if !l.Tested.IsZero() {
				lk.TestLinkAgo = time.Since(l.Tested).Seconds()
			}
			if dev := d.device(l.Device, l.Port); dev != nil {
				p := dev.Port()
				lk.Interface = p.Netdev
				lk.LocalGID = netip.AddrFrom16(p.GID).String()
			}
			lg.Links = append(lg.Links, lk)
		}
		out = append(out, lg)
	}
	return out, nil
}

// device finds a device by name and port: the two ports of a dual-port
// adapter are two devices of one name.
func (d *Daemon) device(name string, port int) verbs.Device {
	for _, dev := range d.devs {
		if dev.Name() == name && portNum(dev) == port {
			return dev
		}
	}
	return nil
}

// portNum is dev's port number, 1 for devices without ports.
func portNum(dev verbs.Device) int { return max(dev.Port().Num, 1) }

// Conns lists the connections: those the engine runs (SMC-R or fallen back after
// CLC) and those carried as plain TCP without CLC.
func (d *Daemon) Conns(context.Context) ([]control.Conn, error) {
	var out []control.Conn
	inEngine := map[string]bool{}
	// A program's own socket is tracked as direct from before its CLC.
	direct := map[string]bool{}
	d.connMu.Lock()
	for _, t := range d.conns {
		if t.direct {
			direct[t.local.String()+" "+t.remote.String()] = true
		}
	}
	d.connMu.Unlock()
	for _, c := range d.engine.Conns() {
		cc := control.Conn{ID: c.Token, Local: addrString(c.Local), Remote: addrString(c.Remote),
			Role: role(c.Client), State: trimSMC(c.State), Mode: control.ModeSMCR,
			LinkGroup: c.LinkGroup, PeerToken: c.PeerToken, RMBSize: c.RMBSize, PeerRMBSize: c.PeerRMB, SndBufSize: c.PeerRMB,
			TxBytes: c.Stats.TxBytes, RxBytes: c.Stats.RxBytes,
			TxProd: cursor(c.TxProd), TxCons: cursor(c.TxCons), RxProd: cursor(c.RxProd), RxCons: cursor(c.RxCons)}
		if cc.ID == 0 {
			cc.ID = uint32(c.ID)
		}
		cc.Path = control.PathRelay
		if direct[cc.Local+" "+cc.Remote] {
			cc.Path = control.PathDirect
		}
		if c.Mode != smcr.ModeSMCR {
			cc.Mode, cc.State = control.ModeTCP, "ACTIVE"
			if dc := c.Decline; dc != nil {
				cc.DeclineSide, cc.DeclineCode, cc.DeclineReason = dc.Side.String(), uint32(dc.Code), dc.Code.String()
			}
		}
		inEngine[cc.Local+" "+cc.Remote] = true
		out = append(out, cc)
	}
	d.connMu.Lock()
	for _, t := range d.conns {
		if t.reason == "" || inEngine[t.local.String()+" "+t.remote.String()] {
			continue
		}
		out = append(out, control.Conn{ID: uint32(t.id), Local: t.local.String(), Remote: t.remote.String(),
			Role: role(t.client), State: "ACTIVE", Mode: control.ModeTCP, Path: control.PathRelay, DeclineSide: t.side,
			DeclineReason: t.reason, TxBytes: t.bytes.tx.Load(), RxBytes: t.bytes.rx.Load()})
	}
	d.connMu.Unlock()
	return out, nil
}

func cursor(c rmb.Cursor) control.Cursor { return control.Cursor{Wrap: c.Wrap, Count: c.Count} }

func role(client bool) string {
	if client {
		return "client"
	}
	return "server"
}

func trimSMC(s string) string {
	if len(s) > 4 && s[:4] == "SMC_" {
		return s[4:]
	}
	return s
}

func addrString(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return unmapAP(t.AddrPort()).String()
	}
	if a == nil {
		return ""
	}
	return a.String()
}

// reasonUnreachable is the reason shown for a destination smcrd could not reach.
const reasonUnreachable = "unreachable when smcrd connected: direct until a connection succeeds"

// Peers lists the peer capability cache, then the destinations smcrd could not
// reach, each with its port.
func (d *Daemon) Peers(context.Context) ([]control.Peer, error) {
	out := d.peers.list()
	un, err := d.loader.Unreachables()
	if err != nil {
		return nil, fmt.Errorf("daemon: peers: %w", err)
	}
	dsts := slices.SortedFunc(maps.Keys(un), netip.AddrPort.Compare)
	for _, ap := range dsts {
		out = append(out, control.Peer{Addr: ap.Addr().String(), Port: ap.Port(), Reason: reasonUnreachable,
			ExpiresInSeconds: un[ap].Seconds()})
	}
	return out, nil
}

// ForgetPeers takes the entries peers name (control.PeerNamed: all when none
// is named) out of the peer cache, the programs' negative cache and their
// unreachable destinations, so the next connections to them are redirected and
// try SMC-R again. It returns how many entries it took out.
func (d *Daemon) ForgetPeers(_ context.Context, peers []netip.AddrPort) (int, error) {
	neg, err := d.loader.Negatives()
	if err != nil {
		return 0, fmt.Errorf("daemon: forget peers: %w", err)
	}
	un, err := d.loader.Unreachables()
	if err != nil {
		return 0, fmt.Errorf("daemon: forget peers: %w", err)
	}
	named := func(ap netip.AddrPort) bool { return control.PeerNamed(peers, ap) }
	gone := map[netip.AddrPort]bool{}
	for _, ap := range d.peers.forget(peers) {
		gone[ap] = true
	}
	for ap := range neg {
		if !named(ap) {
			continue
		}
		if err := d.loader.RemoveNegative(ap); err != nil {
			return len(gone), fmt.Errorf("daemon: forget peers: %w", err)
		}
		gone[ap] = true
	}
	// An unreachable destination may also be a peer cache entry (the same
	// address and port): two entries, each counted.
	n := len(gone)
	for ap := range un {
		if !named(ap) {
			continue
		}
		if err := d.loader.RemoveUnreachable(ap); err != nil {
			return n, fmt.Errorf("daemon: forget peers: %w", err)
		}
		n++
	}
	return n, nil
}

// Devices lists the devices the engine uses.
func (d *Daemon) Devices(context.Context) ([]control.Device, error) {
	lgs := d.engine.LinkGroups()
	out := make([]control.Device, 0, len(d.devs))
	for _, dev := range d.devs {
		p := dev.Port()
		cd := control.Device{Name: dev.Name(), Provider: dev.Kind().String(), Port: portNum(dev), State: "down",
			Interface: p.Netdev, GID: netip.AddrFrom16(p.GID).String(), MAC: net.HardwareAddr(p.MAC[:]).String(),
			MTU: p.MTU.Bytes()}
		up := p.LinkUp
		if ps, ok := dev.(verbs.PortStater); ok {
			up = ps.PortUp() // now, not as at open
		}
		if up {
			cd.State = "active"
		}
		for _, g := range lgs {
			used := false
			for _, l := range g.Links {
				if l.Device == dev.Name() && l.Port == cd.Port {
					cd.Links++
					used = true
				}
			}
			if used {
				cd.LinkGroups++
			}
		}
		out = append(out, cd)
	}
	return out, nil
}

// LogState writes the link groups, links and connections to the log (SIGUSR1),
// whatever log_level says: the operator asked for them.
func (d *Daemon) LogState() {
	log := slog.New(asked{d.log.Handler()})
	ctx := context.Background()
	lgs, _ := d.LinkGroups(ctx)
	conns, _ := d.Conns(ctx)
	st, _ := d.Stats(ctx)
	log.Info("state", "link_groups", len(lgs), "connections", len(conns), "handled", st.Connections.Handled,
		"smcr", st.Connections.SMCR, "fallback", st.Connections.Fallback)
	for _, g := range lgs {
		log.Info("link group", "id", g.ID, "role", g.Role, "peer", g.Peer, "peer_addr", g.PeerAddr, "provider", g.Provider, "conns", g.Conns,
			"links", len(g.Links), "most_links", g.MostLinks)
		for _, l := range g.Links {
			log.Info("link", "group", g.ID, "num", l.Num, "state", l.State, "device", l.Device,
				"qpn", control.QPN(l.LocalQPN), "peer_qpn", control.QPN(l.PeerQPN), "tx_bytes", l.TX.Bytes, "rx_bytes", l.RX.Bytes,
				"tx_wr", l.TX.WorkRequests, "rx_wr", l.RX.WorkRequests, "errors", l.Errors, "rtt_us", l.RTTMicros)
		}
	}
	for _, c := range conns {
		attrs := []any{"id", c.ID, "mode", c.Mode, "role", c.Role, "local", c.Local, "remote", c.Remote,
			"state", c.State, "tx_bytes", c.TxBytes, "rx_bytes", c.RxBytes}
		if c.Mode == control.ModeTCP {
			attrs = append(attrs, "reason", c.DeclineReason)
		} else {
			attrs = append(attrs, "tx_prod", c.TxProd, "tx_cons", c.TxCons, "rx_prod", c.RxProd, "rx_cons", c.RxCons)
		}
		log.Info("connection", attrs...)
	}
}

// asked is a handler that takes every record: the dump an operator asks for
// must not be dropped by a log level set for the daemon's own messages.
type asked struct{ slog.Handler }

func (asked) Enabled(context.Context, slog.Level) bool { return true }
func (h asked) WithAttrs(as []slog.Attr) slog.Handler  { return asked{h.Handler.WithAttrs(as)} }
func (h asked) WithGroup(name string) slog.Handler     { return asked{h.Handler.WithGroup(name)} }
