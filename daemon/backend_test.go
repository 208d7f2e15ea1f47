package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/smcr-io/smcr/config"
	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/smcr"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// TestStatsPlainFallbacks: connections carried as plain TCP without CLC are
// counted against whoever caused it, and a reset returns them once.
func TestStatsPlainFallbacks(t *testing.T) {
	d := &Daemon{}
	d.st.noEcho.Store(3)
	d.st.noOption.Store(2)
	d.st.setupErrors.Store(1)
	want := map[string]uint64{control.SidePeer: 3, control.SideLocal: 2}
	check := func(st control.Stats, scale uint64) {
		t.Helper()
		got := map[string]uint64{}
		for _, f := range st.Fallbacks {
			got[f.Side] += f.Count
		}
		if got[control.SidePeer] != want[control.SidePeer]*scale || got[control.SideLocal] != want[control.SideLocal]*scale ||
			st.Connections.Fallback != 5*scale || st.Connections.Handled != 5*scale || st.Connections.HandshakeErrors != scale {
			t.Errorf("fallbacks by side %v, connections %+v; want %v times %d", got, st.Connections, want, scale)
		}
	}
	check(d.stats(smcr.Stats{}, false), 1)
	check(d.stats(smcr.Stats{}, true), 1)
	check(d.stats(smcr.Stats{}, false), 0)
}

// TestStatsBufferEvents: each direction's buffer events come from the engine's
// counter of that name (the downgrade row was never filled once).
func TestStatsBufferEvents(t *testing.T) {
	d := &Daemon{}
	st := d.stats(smcr.Stats{RxFull: 1, RxTooSmall: 2, RxReuses: 3, RxDowngrades: 4, WriteBlocked: 5, TxTooSmall: 6, TxReuses: 7}, false)
	type events struct{ full, tooSmall, reuses, downgrades uint64 }
	pick := func(d control.Direction) events {
		return events{d.BufferFull, d.BufferTooSmall, d.Reuses, d.Downgrades}
	}
	if got, want := pick(st.RX), (events{1, 2, 3, 4}); got != want {
		t.Errorf("rx buffer events %+v, want %+v", got, want)
	}
	if got, want := pick(st.TX), (events{5, 6, 7, 0}); got != want {
		t.Errorf("tx buffer events %+v, want %+v", got, want)
	}
}

// TestLogStateWhateverTheLevel: the SIGUSR1 dump is written under
// log_level=warn too; the operator asked for it.
func TestLogStateWhateverTheLevel(t *testing.T) {
	d, _ := policyDaemon(t, config.Default(), nil)
	var buf bytes.Buffer
	d.log = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	d.peers = newPeerCache(nil, nil)
	d.LogState()
	if !strings.Contains(buf.String(), "msg=state") {
		t.Errorf("SIGUSR1 under log_level=warn wrote %q", buf.String())
	}
	d.log.Info("not asked for")
	if strings.Contains(buf.String(), "not asked for") {
		t.Error("the daemon's own Info went out under log_level=warn")
	}
}

// TestLogStateQPNsInHex: the SIGUSR1 dump prints QPNs as smcrctl links
// does. It printed them in decimal.
func TestLogStateQPNsInHex(t *testing.T) {
	newEngine, engines, _ := shmEngines(t)
	smcrPair(t, newEngine)
	d, _ := policyDaemon(t, config.Default(), nil)
	d.engine = (*engines)[0]
	d.peers = newPeerCache(nil, nil)
	var buf bytes.Buffer
	d.log = slog.New(slog.NewTextHandler(&buf, nil))
	d.LogState()
	lgs, err := d.LinkGroups(context.Background())
	if err != nil || len(lgs) != 1 || len(lgs[0].Links) == 0 {
		t.Fatalf("link groups %+v, %v; want one with a link", lgs, err)
	}
	l := lgs[0].Links[0]
	if want := fmt.Sprintf("qpn=%s peer_qpn=%s", control.QPN(l.LocalQPN), control.QPN(l.PeerQPN)); !strings.Contains(buf.String(), want) {
		t.Errorf("SIGUSR1 dump %q, want %q", buf.String(), want)
	}
}

// TestLinkRXWorkRequests: a link's RX-WR counts the messages it received,
// so it is at most the peer's TX-WR (the peer's SENDs among its WRITEs), in
// both directions, after bytes went one way. It counted every completion
// polled, its own sends' included, and the two ends never matched.
func TestLinkRXWorkRequests(t *testing.T) {
	newEngine, engines, _ := shmEngines(t)
	conn, peer, _ := smcrPair(t, newEngine)
	go io.Copy(io.Discard, peer)
	if _, err := conn.Write(make([]byte, 4<<20)); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	time.Sleep(100 * time.Millisecond) // the last CDCs complete
	link := func(e *smcr.Engine) smcr.LinkInfo {
		lgs := e.LinkGroups()
		if len(lgs) != 1 || len(lgs[0].Links) != 1 {
			t.Fatalf("link groups %+v, want one with one link", lgs)
		}
		return lgs[0].Links[0]
	}
	c, s := link((*engines)[0]), link((*engines)[1])
	if c.Received == 0 || s.Received == 0 || c.Received > s.Sent || s.Received > c.Sent {
		t.Errorf("client sent %d and received %d, server sent %d and received %d: each receives at most what the other sends, and some",
			c.Sent, c.Received, s.Sent, s.Received)
	}
}

// portDev is a device of a dual-port adapter: its name is the adapter's.
type portDev struct {
	name string
	port verbs.PortAttr
}

func (d portDev) Kind() verbs.Kind               { return verbs.KindRDMA }
func (d portDev) Name() string                   { return d.name }
func (d portDev) Port() verbs.PortAttr           { return d.port }
func (d portDev) Endpoint() []byte               { return nil }
func (d portDev) AllocPD() (verbs.PD, error)     { return nil, verbs.ErrUnsupported }
func (d portDev) CreateCQ(int) (verbs.CQ, error) { return nil, verbs.ErrUnsupported }
func (d portDev) Close() error                   { return nil }

// TestDualPortDevices: the two ports of one adapter, opened for two
// interfaces, are told apart by their port (they were both port 1, and a link
// on the second showed the first's interface and GID).
func TestDualPortDevices(t *testing.T) {
	d, _ := policyDaemon(t, config.Default(), nil)
	p1 := portDev{"mlx5_0", verbs.PortAttr{Num: 1, Netdev: "eth0", LinkUp: true}}
	p2 := portDev{"mlx5_0", verbs.PortAttr{Num: 2, Netdev: "eth1", LinkUp: true}}
	d.devs = []verbs.Device{p1, p2}
	devs, err := d.Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 || devs[0].Port != 1 || devs[1].Port != 2 || devs[1].Interface != "eth1" {
		t.Fatalf("devices %+v, want mlx5_0 port 1 on eth0 and port 2 on eth1", devs)
	}
	if got := d.device("mlx5_0", 2); got == nil || got.Port().Netdev != "eth1" {
		t.Fatalf("device(mlx5_0, 2) = %v, want the one on eth1", got)
	}
}

// TestConnIDsUnique: the connections smcrctl lists have distinct IDs. Those
// the engine ran and fell back, and those smcrd carried as plain TCP without
// CLC, took theirs from two sequences: the first of each was connection 1.
func TestConnIDsUnique(t *testing.T) {
	d, _ := policyDaemon(t, config.Default(), nil)
	d.conns = map[uint64]*tracked{}
	a, b := net.Pipe()
	defer b.Close()
	go io.Copy(io.Discard, b)                          // the Decline a client without a device sends
	c, err := d.engine.Client(context.Background(), a) // no device: a fallback at once
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	plain := &tracked{local: netip.MustParseAddrPort("10.0.0.1:1000"), remote: netip.MustParseAddrPort("10.0.0.2:2000"),
		reason: "peer did not echo the option", side: control.SidePeer}
	d.track(plain)
	defer d.untrack(plain)
	cs, err := d.Conns(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 || cs[0].ID == cs[1].ID {
		t.Fatalf("connections %+v; want two with distinct IDs", cs)
	}
}
