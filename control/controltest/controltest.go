// Package controltest provides a fake control.Backend with fixed, realistic data and
// a helper that serves it on a real Unix socket, for the tests of smcrctl, metrics
// and anything else that speaks the control API. Not part of RFC 7609.
package controltest

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/smcr-io/smcr/config"
	"github.com/smcr-io/smcr/control"
)

// Fake is a control.Backend holding fixed data that tests may change. Its
// configuration is a real config.Config, so SetConfig validates exactly like smcrd.
type Fake struct {
	mu          sync.Mutex
	cfg         config.Config
	file        string // where SetConfig with Persist writes; "" refuses
	St          control.Status
	S           control.Stats
	LGs         []control.LinkGroup
	Cs          []control.Conn
	Ps          []control.Peer
	Ds          []control.Device
	Ls          []control.Listener
	Hist        []control.ClosedConn
	Resets      int   // calls of ResetStats
	Err         error // when set, every call fails with it
	lastPersist bool
}

// NewFake returns a fake smcrd with two link groups (one client, one server), four
// connections (SMC-R and fallbacks both ways), two peers, two devices and
// three listeners. When file
// is not empty, persistent changes are written there.
func NewFake(file string) *Fake {
	f := &Fake{cfg: config.Default(), file: file}
	f.St = control.Status{
		Version: "0.1.0-test", State: control.StateServing, PID: 4242, UptimeSeconds: 3725, Enabled: true,
		Providers: []string{"shm", "soft"}, ConfigFile: file, Connections: 2, LinkGroups: 2,
	}
	f.S = FixedStats()
	f.LGs = []control.LinkGroup{
		// Group 1 lost its second link: its totals count what that link moved.
		{ID: 1, Role: "client", Peer: "2a3b02000a000002", PeerAddr: "198.18.0.2", Provider: "shm", State: "active", Conns: 1,
			MostLinks: 2, TX: control.LinkTraffic{Bytes: 1<<30 + 1<<20, WorkRequests: 16384 + 16}, RX: control.LinkTraffic{Bytes: 4<<20 + 4096, WorkRequests: 2048 + 1},
			Links: []control.Link{{
				Num: 1, State: "active", Interface: "veth-a", Device: "shm0", Port: 1,
				LocalGID: "fe80::200:aff:fe00:1", PeerGID: "fe80::200:aff:fe00:2", LocalQPN: 0x11, PeerQPN: 0x21, Conns: 1,
				TX: control.LinkTraffic{Bytes: 1 << 30, WorkRequests: 16384}, RX: control.LinkTraffic{Bytes: 4 << 20, WorkRequests: 2048},
				Errors: 0, RTTMicros: 41.5, TestLinkAgo: 12,
			}}},
		{ID: 2, Role: "server", Peer: "7c1d02000a000003", PeerAddr: "198.18.0.3", Provider: "soft", State: "active", Conns: 1,
			MostLinks: 2, TX: control.LinkTraffic{Bytes: 65536, WorkRequests: 3}, RX: control.LinkTraffic{Bytes: 987654321, WorkRequests: 15070},
			Links: []control.Link{
				{Num: 1, State: "active", Interface: "veth-b", Device: "soft0", Port: 1,
					LocalGID: "fe80::200:aff:fe00:1", PeerGID: "fe80::200:aff:fe00:3", LocalQPN: 0x12, PeerQPN: 0x31, Conns: 1,
					TX: control.LinkTraffic{Bytes: 65536, WorkRequests: 3}, RX: control.LinkTraffic{Bytes: 987654321, WorkRequests: 15070},
					Errors: 2, ErrorsByKind: map[string]uint64{"remote access error": 1, "protocol error": 1}, RTTMicros: 118.25, TestLinkAgo: 3},
				{Num: 2, State: "inactive", Interface: "veth-c", Device: "soft1", Port: 1,
					LocalGID: "fe80::200:aff:fe00:4", PeerGID: "fe80::200:aff:fe00:5", LocalQPN: 0x13, PeerQPN: 0x32, Conns: 0,
					Errors: 1, ErrorsByKind: map[string]uint64{"transport retry exceeded": 1}},
			}},
	}
	f.Cs = []control.Conn{
		{ID: 0x101, Local: "198.18.0.1:40312", Remote: "198.18.0.2:5201", Role: "client", State: "ACTIVE", Mode: control.ModeSMCR,
			LinkGroup: 1, PeerToken: 0x2a01, SndBufSize: 256 << 10, RMBSize: 256 << 10, PeerRMBSize: 512 << 10, TxBytes: 1 << 30, RxBytes: 4096,
			TxProd: control.Cursor{Wrap: 2048, Count: 0}, TxCons: control.Cursor{Wrap: 2047, Count: 393216},
			RxProd: control.Cursor{Wrap: 0, Count: 4096}, RxCons: control.Cursor{Wrap: 0, Count: 4096}},
		{ID: 0x102, Local: "198.18.0.1:6379", Remote: "198.18.0.3:51000", Role: "server", State: "APPCLOSEWAIT1", Mode: control.ModeSMCR,
			LinkGroup: 2, PeerToken: 0x7c05, SndBufSize: 64 << 10, RMBSize: 128 << 10, PeerRMBSize: 64 << 10, TxBytes: 65536, RxBytes: 987654321,
			TxProd: control.Cursor{Wrap: 1, Count: 0}, TxCons: control.Cursor{Wrap: 1, Count: 0},
			RxProd: control.Cursor{Wrap: 7535, Count: 51729}, RxCons: control.Cursor{Wrap: 7535, Count: 12000}},
		{ID: 0, Local: "198.18.0.1:40400", Remote: "198.18.0.9:5201", Role: "client", State: "ACTIVE", Mode: control.ModeTCP,
			DeclineSide: control.SideLocal, DeclineCode: 0x03010000, DeclineReason: "peer did not send the SMC option", TxBytes: 1000, RxBytes: 20},
		{ID: 0, Local: "[2001:db8::1]:443", Remote: "[2001:db8::7]:40022", Role: "server", State: "ACTIVE", Mode: control.ModeTCP,
			DeclineSide: control.SidePeer, DeclineCode: 0x03070000, DeclineReason: "IP subnet mismatch", TxBytes: 5, RxBytes: 6},
	}
	f.Ps = []control.Peer{
		{Addr: "198.18.0.2", Port: 5201, Capable: true, ExpiresInSeconds: 540, Hits: 12},
		{Addr: "198.18.0.9", Port: 6379, Capable: false, Reason: "peer did not send the SMC option", ExpiresInSeconds: 75.5, Hits: 3},
		{Addr: "198.18.0.7", Port: 5201, Capable: false, Reason: "unreachable when smcrd connected: direct until a connection succeeds", ExpiresInSeconds: 600},
	}
	f.Ds = []control.Device{
		{Name: "shm0", Provider: "shm", Port: 1, State: "active", Interface: "veth-a", GID: "fe80::200:aff:fe00:1", MAC: "02:00:0a:00:00:01", MTU: 4096, LinkGroups: 1, Links: 1},
		{Name: "soft0", Provider: "soft", Port: 1, State: "active", Interface: "veth-b", GID: "fe80::200:aff:fe00:1", MAC: "02:00:0a:00:00:01", MTU: 1024, LinkGroups: 1, Links: 2},
	}
	f.Ls = []control.Listener{
		{Addr: "0.0.0.0", Port: 5201, Steered: true},
		{Addr: "::", Port: 443, Reason: "port not in port_range_list"},
		{Addr: "127.0.0.1", Port: 6379, Reason: "loopback only: its connections do not arrive on the interfaces"},
	}
	ended := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	f.Hist = []control.ClosedConn{
		{ID: 7, Local: "198.18.0.1:40500", Remote: "198.18.0.2:5201", Role: "client", Mode: control.ModeSMCR, Ended: ended, Seconds: 12.5, TxBytes: 1 << 20, RxBytes: 4096},
		{ID: 6, Local: "198.18.0.1:40498", Remote: "198.18.0.9:5201", Role: "client", Mode: control.ModeTCP, Reason: "peer did not send the SMC option", Ended: ended.Add(-time.Minute), Seconds: 0.25, TxBytes: 100, RxBytes: 20},
		{ID: 5, Local: "198.18.0.1:40490", Remote: "198.18.0.7:5201", Role: "client", Mode: control.ModeFailed, Ended: ended.Add(-2 * time.Minute)},
	}
	return f
}

// FixedStats returns the counters NewFake starts with: every field non-zero, so a
// test comparing two views of them notices a field one view forgets.
func FixedStats() control.Stats {
	rx := control.Direction{Bytes: 991658417, Requests: 17118, FallbackBytes: 26, BufferFull: 7, BufferTooSmall: 1, Downgrades: 2, Reuses: 30,
		BufferSizes: control.NewHistogram(control.SizeBuckets), RequestSizes: control.NewHistogram(control.SizeBuckets)}
	tx := control.Direction{Bytes: 1073807360, Requests: 16387, FallbackBytes: 1005, BufferFull: 411, BufferTooSmall: 3, Downgrades: 2, Reuses: 29,
		BufferSizes: control.NewHistogram(control.SizeBuckets), RequestSizes: control.NewHistogram(control.SizeBuckets)}
	for i := range rx.RequestSizes {
		rx.RequestSizes[i].Count = uint64(1000 * (i + 1))
		tx.RequestSizes[i].Count = uint64(900*(i+1) + 7)
		rx.BufferSizes[i].Count = uint64(i * 3)
		tx.BufferSizes[i].Count = uint64(i*2 + 1)
	}
	return control.Stats{
		SinceResetSeconds: 3725,
		Connections: control.ConnCounts{Handled: 40, SMCR: 31, Fallback: 9, HandshakeErrors: 1, FirstContact: 4, Reused: 27, Active: 2,
			Client: control.RoleCounts{Handled: 25, SMCR: 18, Fallback: 7}, Server: control.RoleCounts{Handled: 15, SMCR: 13, Fallback: 2}},
		Fallbacks: []control.FallbackCount{
			{Code: 0x03010000, Reason: "peer did not send the SMC option", Side: control.SideLocal, Count: 6},
			{Code: 0x03070000, Reason: "IP subnet mismatch", Side: control.SidePeer, Count: 2},
			{Code: 0x01010000, Reason: "insufficient memory", Side: control.SideLocal, Count: 1},
		},
		RX: rx, TX: tx,
		MemoryInUse: 1 << 20, MemoryPooled: 512 << 10, MemoryPeak: 6 << 20, ProtocolErrors: 1, Aborts: 2,
		Links: control.LinkEvents{Added: 1, Deleted: 1, ConnsMoved: 3},
		Programs: map[string]uint64{"redirected": 25, "skip_negative": 7, "skip_unreachable": 1,
			"syn_marked": 15, "steered": 15},
	}
}

func (f *Fake) lock() (unlock func(), err error) {
	f.mu.Lock()
	return f.mu.Unlock, f.Err
}

// Status implements control.Backend.
func (f *Fake) Status(context.Context) (control.Status, error) {
	unlock, err := f.lock()
	defer unlock()
	st := f.St
	st.Enabled = f.cfg.Enabled
	return st, err
}

// Config implements control.Backend.
func (f *Fake) Config(context.Context) ([]control.Attribute, error) {
	unlock, err := f.lock()
	defer unlock()
	return f.cfg.AttributesSince(config.Default()), err
}

// SetConfig implements control.Backend with config.Config.Set's all-or-nothing rule.
func (f *Fake) SetConfig(_ context.Context, req control.SetConfigRequest) (control.SetConfigResult, error) {
	unlock, err := f.lock()
	defer unlock()
	if err != nil {
		return control.SetConfigResult{}, err
	}
	n, err := f.cfg.Set(req.Assignments...)
	if err != nil {
		return control.SetConfigResult{}, err
	}
	if req.Persist && f.file == "" {
		return control.SetConfigResult{}, errors.New("nothing to persist to: smcrd runs on its embedded default configuration, without a file; to keep changes, start smcrd with -config FILE")
	}
	if req.Persist {
		if err := n.Save(f.file); err != nil {
			return control.SetConfigResult{}, err
		}
	}
	var res control.SetConfigResult
	old := f.cfg.Attributes()
	for i, a := range n.Attributes() {
		if a.Value != old[i].Value {
			res.Changed = append(res.Changed, a)
		}
	}
	for _, a := range res.Changed {
		if a.Name == "providers" { // as smcrd: the devices are opened at start
			note := "providers: applies when smcrd restarts (the RDMA devices are opened at start)"
			if !req.Persist {
				note += "; without -P a restart also forgets it: set it with -P"
			}
			res.Notes = append(res.Notes, note)
		}
	}
	f.cfg, f.lastPersist = n, req.Persist
	if req.Persist {
		res.Persisted, res.File = true, f.file
	}
	return res, nil
}

// SetEnabled implements control.Backend.
func (f *Fake) SetEnabled(ctx context.Context, on, persist bool) error {
	v := "enabled=no"
	if on {
		v = "enabled=yes"
	}
	_, err := f.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{v}, Persist: persist})
	return err
}

// Stats implements control.Backend.
func (f *Fake) Stats(context.Context) (control.Stats, error) {
	unlock, err := f.lock()
	defer unlock()
	return cloneStats(f.S), err
}

// ResetStats implements control.Backend: counters become zero, the histogram
// bounds stay, the gauges (active connections, memory in use) keep their value.
func (f *Fake) ResetStats(context.Context) (control.Stats, error) {
	unlock, err := f.lock()
	defer unlock()
	if err != nil {
		return control.Stats{}, err
	}
	old := cloneStats(f.S)
	f.Resets++
	zero := func() control.Direction {
		return control.Direction{BufferSizes: control.NewHistogram(control.SizeBuckets), RequestSizes: control.NewHistogram(control.SizeBuckets)}
	}
	f.S = control.Stats{
		Connections: control.ConnCounts{Active: old.Connections.Active},
		Fallbacks:   []control.FallbackCount{},
		RX:          zero(), TX: zero(),
		MemoryInUse: old.MemoryInUse, MemoryPooled: old.MemoryPooled, MemoryPeak: old.MemoryInUse + old.MemoryPooled,
	}
	return old, nil
}

// LinkGroups implements control.Backend.
func (f *Fake) LinkGroups(context.Context) ([]control.LinkGroup, error) {
	unlock, err := f.lock()
	defer unlock()
	out := make([]control.LinkGroup, len(f.LGs))
	for i, lg := range f.LGs {
		lg.Links = append([]control.Link(nil), lg.Links...)
		out[i] = lg
	}
	return out, err
}

// Conns implements control.Backend.
func (f *Fake) Conns(context.Context) ([]control.Conn, error) {
	unlock, err := f.lock()
	defer unlock()
	return append([]control.Conn(nil), f.Cs...), err
}

// Peers implements control.Backend.
func (f *Fake) Peers(context.Context) ([]control.Peer, error) {
	unlock, err := f.lock()
	defer unlock()
	return append([]control.Peer(nil), f.Ps...), err
}

// ForgetPeers implements control.Backend: the named entries go from Ps (all
// when none is named; every port of an address named with port 0).
func (f *Fake) ForgetPeers(_ context.Context, peers []netip.AddrPort) (int, error) {
	unlock, err := f.lock()
	defer unlock()
	if err != nil {
		return 0, err
	}
	n := len(f.Ps)
	f.Ps = slices.DeleteFunc(f.Ps, func(p control.Peer) bool {
		a, _ := netip.ParseAddr(p.Addr)
		return control.PeerNamed(peers, netip.AddrPortFrom(a, p.Port))
	})
	return n - len(f.Ps), nil
}

// Devices implements control.Backend.
func (f *Fake) Devices(context.Context) ([]control.Device, error) {
	unlock, err := f.lock()
	defer unlock()
	return append([]control.Device(nil), f.Ds...), err
}

// Listeners implements control.Backend.
func (f *Fake) Listeners(context.Context) ([]control.Listener, error) {
	unlock, err := f.lock()
	defer unlock()
	return append([]control.Listener(nil), f.Ls...), err
}

// History implements control.Backend.
func (f *Fake) History(context.Context) ([]control.ClosedConn, error) {
	unlock, err := f.lock()
	defer unlock()
	return append([]control.ClosedConn(nil), f.Hist...), err
}

// Probe implements control.Backend: 198.18.0.2 goes SMC-R, other
// addresses are in the negative cache.
func (f *Fake) Probe(_ context.Context, dst netip.AddrPort) (control.Probe, error) {
	unlock, err := f.lock()
	defer unlock()
	p := control.Probe{Dst: dst.String(), Cgroup: "apps.slice", Checks: []control.ProbeCheck{
		{Check: "enabled", OK: true, Detail: "enabled = yes"},
		{Check: "port", OK: true, Detail: "in port_range_list 1024-65535"},
		{Check: "device", OK: true, Detail: "providers shm, soft"},
		{Check: "route", OK: true, Detail: "through a listed interface, from 198.18.0.1"},
		{Check: "peer cache", OK: true, Detail: "capable, for 540s"},
		{Check: "reachable", OK: true, Detail: "no failed connect on record"},
	}}
	if dst.Addr() != netip.MustParseAddr("198.18.0.2") {
		p.Checks[4] = control.ProbeCheck{Check: "peer cache", Detail: "without SMC-R (peer did not send the SMC option), for 75s: plain TCP"}
	}
	p.SMCR = p.Checks[4].OK
	return p, err
}

// Persisted reports whether the last configuration change asked to persist.
func (f *Fake) Persisted() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastPersist
}

func cloneStats(s control.Stats) control.Stats {
	s.Fallbacks = append([]control.FallbackCount(nil), s.Fallbacks...)
	for _, d := range []*control.Direction{&s.RX, &s.TX} {
		d.BufferSizes = append(control.Histogram(nil), d.BufferSizes...)
		d.RequestSizes = append(control.Histogram(nil), d.RequestSizes...)
	}
	return s
}

// Serve serves b on a fresh socket in a temporary directory for the test's life and
// returns the socket's path. group is passed to control.NewServer.
func Serve(t testing.TB, b control.Backend, group string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "smcrd.sock")
	srv, err := control.NewServer(path, group, "", b, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Close(ctx)
		if err := <-done; err != nil {
			t.Errorf("control server: %v", err)
		}
	})
	return path
}
