// Tests of SetConfig: which attributes reach the engine at once, which say they
// apply at restart, the refusal to persist without a file, and the policy maps
// when interfaces go away or fail to attach.

package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/smcr-io/smcr/bpf"
	"github.com/smcr-io/smcr/config"
	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/internal/nstest"
	"github.com/smcr-io/smcr/smcr"
)

// atOnce are the attributes that apply to new connections without a restart.
var atOnce = []string{"enabled", "port_range_list", "ip_addr_list", "max_memory", "rmb_size", "clc_timeout", "read_spin", "test_link_time", "peer_cache_ttl", "ueid_list"}

// TestEveryAttributeClassified: a new attribute must be decided on (at once, at
// restart, or no effect), or SetConfig would silently pretend it applies.
func TestEveryAttributeClassified(t *testing.T) {
	for _, a := range config.Default().Attributes() {
		n := 0
		for _, name := range atOnce {
			if name == a.Name {
				n++
			}
		}
		if config.AtRestart(a.Name) != "" {
			n++
		}
		if _, ok := noEffect[a.Name]; ok {
			n++
		}
		if n != 1 {
			t.Errorf("attribute %s is in %d of: applies at once, at restart, no effect; want exactly 1", a.Name, n)
		}
	}
}

func TestApplyEngine(t *testing.T) {
	e, err := smcr.NewEngine(smcr.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	old := config.Default()
	n, err := old.Set("max_memory=3", "rmb_size=32K", "clc_timeout=1500ms", "read_spin=0", "test_link_time=0", "ueid_list=SMCR-A,SMCR-B")
	if err != nil {
		t.Fatal(err)
	}
	if err := applyEngine(e, old, n); err != nil {
		t.Fatal(err)
	}
	if got := e.UEIDs(); !slices.Equal(got, []string{"SMCR-A", "SMCR-B"}) {
		t.Fatalf("engine user eids %q, want SMCR-A and SMCR-B", got)
	}
	want := smcr.Settings{MaxMemory: 3 << 20, RMBSize: 32 << 10, CLCTimeout: 1500 * time.Millisecond, ReadSpin: -1, TestLinkInterval: -1}
	if got := e.Settings(); got != want {
		t.Fatalf("engine settings %+v, want %+v", got, want)
	}
	// Attributes that did not change leave the engine alone.
	n2, err := n.Set("port_range_list=5201")
	if err != nil {
		t.Fatal(err)
	}
	e.SetMaxMemory(7)
	if err := applyEngine(e, n, n2); err != nil {
		t.Fatal(err)
	}
	if got := e.Settings().MaxMemory; got != 7 {
		t.Fatalf("an unrelated change reset max memory to %d", got)
	}
	restoreEngine(e, want)
	if got := e.Settings(); got != want {
		t.Fatalf("restored %+v, want %+v", got, want)
	}
}

func TestChangesNotes(t *testing.T) {
	old := config.Default()
	n, err := old.Set("providers=soft", "sndbuf_size=64K", "max_memory=64", "log_level=debug")
	if err != nil {
		t.Fatal(err)
	}
	changed, notes := changes(old, n, true)
	var names []string
	for _, a := range changed {
		names = append(names, a.Name)
	}
	if got := strings.Join(names, ","); got != "max_memory,sndbuf_size,providers,log_level" {
		t.Errorf("changed %s", got)
	}
	want := []string{
		"sndbuf_size: kept, but no effect on connections (a send buffer mirrors the peer's RMB, so its size is the peer's rmb_size)",
		"providers: applies when smcrd restarts (the RDMA devices are opened at start)",
		"log_level: applies when smcrd restarts (the logger is made at start)",
	}
	if strings.Join(notes, "\n") != strings.Join(want, "\n") {
		t.Errorf("notes:\n%s\nwant:\n%s", strings.Join(notes, "\n"), strings.Join(want, "\n"))
	}
	// Without persist, a restart-only change never applies: the note says so.
	if _, notes := changes(old, n, false); len(notes) != 3 || !strings.HasSuffix(notes[1], "without -P a restart also forgets it: set it with -P") {
		t.Errorf("notes without persist: %q", notes)
	}
	// ip_addr_list applies at once, but not to the devices opened per interface.
	for providers, want := range map[string]int{"shm": 0, "soft": 1, "rdma,shm": 1} {
		o, err := old.Set("providers=" + providers)
		if err != nil {
			t.Fatal(err)
		}
		n, err := o.Set("ip_addr_list=eth1")
		if err != nil {
			t.Fatal(err)
		}
		if _, notes := changes(o, n, true); len(notes) != want || want == 1 && !strings.Contains(notes[0], "devices (one per interface) follow when smcrd restarts") {
			t.Errorf("providers %s, ip_addr_list changed: notes %q, want %d", providers, notes, want)
		}
	}
}

// TestConfigShowsValueInEffect: after a set, an attribute read only at start
// shows the value smcrd started with, and the one set as pending; one that
// applies at once shows the one set. Both showed the one set.
func TestConfigShowsValueInEffect(t *testing.T) {
	ctx := context.Background()
	d, _ := policyDaemon(t, config.Default(), nil)
	d.opts.Config = config.Default()
	if _, err := d.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"log_level=debug", "max_memory=64"}}); err != nil {
		t.Fatal(err)
	}
	attrs, err := d.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]control.Attribute{}
	for _, a := range attrs {
		got[a.Name] = a
	}
	if a := got["log_level"]; a.Value != "info" || a.Pending != "debug" {
		t.Errorf("log_level: value %q pending %q, want info in effect and debug pending", a.Value, a.Pending)
	}
	if a := got["max_memory"]; a.Value != "64" || a.Pending != "" {
		t.Errorf("max_memory: value %q pending %q, want 64 and nothing pending", a.Value, a.Pending)
	}
	// Set back, nothing is pending.
	if _, err := d.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"log_level=info"}}); err != nil {
		t.Fatal(err)
	}
	attrs, _ = d.Config(ctx)
	for _, a := range attrs {
		if a.Pending != "" {
			t.Errorf("%s pending %q after it was set back", a.Name, a.Pending)
		}
	}
}

// TestPersistWithoutFile: an smcrd on the embedded default refuses -P with a
// message that says what to do, and changes nothing.
func TestPersistWithoutFile(t *testing.T) {
	d := &Daemon{}
	cfg := config.Default()
	d.cfg.Store(&cfg)
	_, err := d.SetConfig(context.Background(), control.SetConfigRequest{Assignments: []string{"max_memory=64"}, Persist: true})
	if !errors.Is(err, control.ErrInvalid) || !strings.Contains(err.Error(), "start smcrd with -config FILE") {
		t.Fatalf("persist without a file: %v", err)
	}
	if d.CurrentConfig().MaxMemory != cfg.MaxMemory {
		t.Fatal("a refused persist changed the configuration")
	}
	if err := d.SetEnabled(context.Background(), false, true); !errors.Is(err, errNoFile) {
		t.Fatalf("disable -P without a file: %v", err)
	}
}

// TestReadSpin: read_spin's 0 turns the engine's busy poll off (the engine's own
// 0 would mean its default); other values pass through.
func TestReadSpin(t *testing.T) {
	for _, c := range []struct{ attr, want time.Duration }{{0, -1}, {5 * time.Microsecond, 5 * time.Microsecond}, {time.Millisecond, time.Millisecond}} {
		if got := readSpin(c.attr); got != c.want {
			t.Errorf("readSpin(%v) = %v, want %v", c.attr, got, c.want)
		}
	}
}

// fakeMaps stands in for the loader's policy maps. SetInterfaces records its
// names before failing, as a real one may attach some interfaces and then fail.
type fakeMaps struct {
	mu       sync.Mutex // followInterfaces calls from its own goroutine
	attached []string
	calls    int // of SetInterfaces
	ports    []bpf.PortRange
	fail     func(names []string) bool
}

func (f *fakeMaps) SetInterfaces(names []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attached = slices.Clone(names)
	f.calls++
	if f.fail != nil && f.fail(names) {
		return errors.New("fake: attach tc ingress failed")
	}
	return nil
}

func (f *fakeMaps) SetPorts(r []bpf.PortRange) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ports = slices.Clone(r)
	return nil
}

// policyDaemon is a Daemon with just what SetConfig needs: a real engine, fake
// maps, and cfg in effect on ifaces.
func policyDaemon(t *testing.T, cfg config.Config, ifaces []string) (*Daemon, *fakeMaps) {
	t.Helper()
	e, err := smcr.NewEngine(smcr.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	maps := &fakeMaps{attached: ifaces}
	d := &Daemon{engine: e, maps: maps, log: slog.New(slog.DiscardHandler), ifaces: ifaces, ifacesOK: true}
	d.cfg.Store(&cfg)
	return d, maps
}

// TestInterfaceGone: an interface of ip_addr_list that was removed or renamed
// after smcrd started blocks no change that leaves ip_addr_list alone, disable
// first of all. Before, every change looked ip_addr_list up again and failed
// with "no interface named gone0".
func TestInterfaceGone(t *testing.T) {
	ctx := context.Background()
	cfg := config.Default()
	cfg.Enabled = true
	cfg.Interfaces = []string{"gone0"}
	d, maps := policyDaemon(t, cfg, []string{"gone0"})
	if err := d.SetEnabled(ctx, false, false); err != nil {
		t.Fatalf("disable: %v", err)
	}
	if d.CurrentConfig().Enabled || len(maps.ports) != 0 {
		t.Fatalf("after disable: enabled %v, ports %v", d.CurrentConfig().Enabled, maps.ports)
	}
	if _, err := d.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"max_memory=64", "port_range_list=5201"}}); err != nil {
		t.Fatalf("set max_memory and port_range_list: %v", err)
	}
	if err := d.SetEnabled(ctx, true, false); err != nil {
		t.Fatalf("enable: %v", err)
	}
	if want := []bpf.PortRange{{Lo: 5201, Hi: 5201}}; !slices.Equal(maps.ports, want) {
		t.Errorf("ports %v, want %v", maps.ports, want)
	}
	// Naming it again is still refused.
	_, err := d.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"ip_addr_list=gone0,lo"}})
	if !errors.Is(err, control.ErrInvalid) {
		t.Errorf("ip_addr_list with a missing interface: %v, want refused", err)
	}
}

// TestInterfacesRollback: when SetInterfaces fails part way through a change of
// ip_addr_list, the programs are attached to the old interfaces again, as the
// configuration smcrctl shows says. Before, the rollback skipped SetInterfaces
// because the daemon's record still named the old interfaces.
func TestInterfacesRollback(t *testing.T) {
	p := nstest.NewPair(t)
	p.AddLink()
	one, two := p.A.Links[0].Name, p.A.Links[1].Name
	cfg := config.Default()
	cfg.Interfaces = []string{one}
	d, maps := policyDaemon(t, cfg, []string{one})
	maps.fail = func(names []string) bool { return len(names) == 2 }
	err := p.A.Do(func() error {
		_, err := d.SetConfig(context.Background(), control.SetConfigRequest{Assignments: []string{"ip_addr_list=" + one + "," + two}})
		return err
	})
	if err == nil {
		t.Fatal("a failed SetInterfaces did not fail the change")
	}
	if got := d.CurrentConfig().Interfaces; !slices.Equal(got, []string{one}) {
		t.Errorf("ip_addr_list %v after a failed change, want [%s]", got, one)
	}
	if !slices.Equal(maps.attached, []string{one}) {
		t.Errorf("programs attached to %v after the rollback, want [%s]", maps.attached, one)
	}
}

// TestPersistAllOrNone: set -P whose file cannot be written changes nothing,
// neither the configuration smcrctl shows nor the engine nor the maps. Before,
// the change was live and only the save failed (500).
func TestPersistAllOrNone(t *testing.T) {
	ctx := context.Background()
	old := config.Default()
	d, maps := policyDaemon(t, old, nil)
	prev := d.engine.Settings()
	d.opts.ConfigFile = filepath.Join(t.TempDir(), "smcrd.conf")
	if err := old.Save(d.opts.ConfigFile); err != nil {
		t.Fatal(err)
	}
	// Save writes smcrd.conf.tmp first: a directory there makes it fail after
	// the change was applied, which must then be undone.
	blocker := d.opts.ConfigFile + ".tmp"
	if err := os.Mkdir(blocker, 0o755); err != nil {
		t.Fatal(err)
	}
	req := control.SetConfigRequest{Assignments: []string{"max_memory=64", "port_range_list=5201"}, Persist: true}
	if _, err := d.SetConfig(ctx, req); err == nil {
		t.Fatal("set -P whose file cannot be written succeeded")
	}
	if got := d.CurrentConfig(); got.MaxMemory != old.MaxMemory || got.PortRanges.String() != old.PortRanges.String() {
		t.Errorf("configuration changed by a failed set -P: max_memory %d, port_range_list %s", got.MaxMemory, got.PortRanges)
	}
	if got := d.engine.Settings(); got != prev {
		t.Errorf("engine settings %+v after a failed set -P, want %+v", got, prev)
	}
	if want := []bpf.PortRange{{Lo: 1024, Hi: 65535}}; !slices.Equal(maps.ports, want) {
		t.Errorf("ports %v after a failed set -P, want %v", maps.ports, want)
	}

	// Where the file can be written, both happen.
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	res, err := d.SetConfig(ctx, req)
	if err != nil || !res.Persisted {
		t.Fatalf("set -P: %+v, %v", res, err)
	}
	saved, err := config.Load(d.opts.ConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	if saved.MaxMemory != d.CurrentConfig().MaxMemory || d.CurrentConfig().MaxMemory == old.MaxMemory {
		t.Errorf("max_memory saved %d, in effect %d", saved.MaxMemory, d.CurrentConfig().MaxMemory)
	}
}

// TestPersistWritesOnlyNamed pins that -P writes only the attributes named on its
// command into the file as it is now: changes made without -P stay temporary, and
// edits made to the file by hand since smcrd started stay in it.
func TestPersistWritesOnlyNamed(t *testing.T) {
	ctx := context.Background()
	d, _ := policyDaemon(t, config.Default(), nil)
	d.opts.ConfigFile = filepath.Join(t.TempDir(), "smcrd.conf")
	if err := config.Default().Save(d.opts.ConfigFile); err != nil {
		t.Fatal(err)
	}
	if err := d.SetEnabled(ctx, false, false); err != nil { // until smcrd restarts
		t.Fatal(err)
	}
	if _, err := d.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"port_range_list=5201"}}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.opts.ConfigFile, []byte("# edited by hand\nrmb_size = 64K\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := d.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"max_memory=64"}, Persist: true})
	if err != nil || !res.Persisted {
		t.Fatalf("set max_memory=64 -P: %+v, %v", res, err)
	}
	saved, err := config.Load(d.opts.ConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	def := config.Default()
	if saved.MaxMemory != 64<<20 || !saved.Enabled || saved.PortRanges.String() != def.PortRanges.String() || saved.RMBSize != 64<<10 {
		t.Errorf("file after set max_memory=64 -P: max_memory %d MB, enabled %v, port_range_list %s, rmb_size %d; want 64, yes, %s, 64K",
			saved.MaxMemory>>20, saved.Enabled, saved.PortRanges, saved.RMBSize, def.PortRanges)
	}
	// The hand-written comment and line stay as they were.
	if b, _ := os.ReadFile(d.opts.ConfigFile); !strings.HasPrefix(string(b), "# edited by hand\nrmb_size = 64K\n") || !strings.HasSuffix(string(b), "\nmax_memory = 64\n") {
		t.Errorf("file after set max_memory=64 -P:\n%s", b)
	}
	if cur := d.CurrentConfig(); cur.MaxMemory != 64<<20 || cur.Enabled || cur.PortRanges.String() != "5201" || cur.RMBSize != def.RMBSize {
		t.Errorf("in effect: %+v", cur)
	}

	// disable -P writes enabled=no and nothing else.
	if err := d.SetEnabled(ctx, false, true); err != nil {
		t.Fatal(err)
	}
	if saved, err = config.Load(d.opts.ConfigFile); err != nil || saved.Enabled || saved.PortRanges.String() != def.PortRanges.String() {
		t.Errorf("file after disable -P: enabled %v, port_range_list %s, %v", saved.Enabled, saved.PortRanges, err)
	}
}

// TestPersistBrokenFile pins that -P refuses, changing nothing, when the file as
// it is now does not load: it cannot apply the assignments to it.
func TestPersistBrokenFile(t *testing.T) {
	ctx := context.Background()
	d, _ := policyDaemon(t, config.Default(), nil)
	d.opts.ConfigFile = filepath.Join(t.TempDir(), "smcrd.conf")
	broken := []byte("max_memory = lots\n")
	if err := os.WriteFile(d.opts.ConfigFile, broken, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := d.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"rmb_size=64K"}, Persist: true})
	if !errors.Is(err, control.ErrInvalid) || !strings.Contains(err.Error(), `does not load, so nothing changed: `+d.opts.ConfigFile+`:1: max_memory: "lots"`) {
		t.Fatalf("set -P with a broken file: %v", err)
	}
	if d.CurrentConfig().RMBSize != config.Default().RMBSize {
		t.Error("a refused set -P changed rmb_size")
	}
	if b, _ := os.ReadFile(d.opts.ConfigFile); !bytes.Equal(b, broken) {
		t.Errorf("a refused set -P rewrote the file:\n%s", b)
	}
}

// TestSetRefusesUnstartable pins that set refuses a cgroup or control_group that
// smcrd could not start with, checked as start checks it, with -P or without, and
// with -P even when the value in effect is the same but gone since.
func TestSetRefusesUnstartable(t *testing.T) {
	mnt := nstest.Cgroup2(t)
	ctx := context.Background()
	d, _ := policyDaemon(t, config.Default(), nil)
	d.opts.ConfigFile = filepath.Join(t.TempDir(), "smcrd.conf")
	if err := config.Default().Save(d.opts.ConfigFile); err != nil {
		t.Fatal(err)
	}
	for a, want := range map[string]string{
		"cgroup=no/such/cgroup":       `"/no/such/cgroup" is not a cgroup: no directory ` + filepath.Join(mnt, "no/such/cgroup") + ` (the path is relative to the cgroup2 mount, ` + mnt + `): smcrd could not start with it`,
		"control_group=no-such-group": `control: group "no-such-group": group: unknown group no-such-group: smcrd could not start with it`,
	} {
		for _, persist := range []bool{false, true} {
			_, err := d.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{a}, Persist: persist})
			if !errors.Is(err, control.ErrInvalid) || !strings.HasSuffix(err.Error(), want) {
				t.Errorf("set %s (persist %v): %v, want refused with %q", a, persist, err, want)
			}
		}
	}
	if saved, err := config.Load(d.opts.ConfigFile); err != nil || !reflect.DeepEqual(saved, config.Default()) {
		t.Errorf("a refused set changed the file: %v", err)
	}
	if _, err := d.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"control_group=0"}, Persist: true}); err != nil {
		t.Errorf("set control_group=0 -P: %v", err)
	}

	// A cgroup that existed when set without -P and was removed since.
	rel := fmt.Sprintf("smcrd-policy-test-%d", os.Getpid())
	if err := os.Mkdir(filepath.Join(mnt, rel), 0o755); err != nil {
		if os.Geteuid() != 0 {
			t.Skipf("making a cgroup needs root: %v", err)
		}
		t.Fatalf("cannot make a cgroup as root: %v", err)
	}
	t.Cleanup(func() { os.Remove(filepath.Join(mnt, rel)) })
	if _, err := d.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"cgroup=" + rel}}); err != nil {
		t.Fatalf("set cgroup=%s: %v", rel, err)
	}
	if err := os.Remove(filepath.Join(mnt, rel)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"cgroup=" + rel}, Persist: true}); !errors.Is(err, control.ErrInvalid) {
		t.Errorf("set cgroup=%s -P after it was removed: %v, want refused", rel, err)
	}
}

// TestInterfacesFollowed: the programs follow ip_addr_list's interfaces as the
// host changes: an interface made again (a new device, which the tc program
// of the old one is not on) and a route added through one each get
// SetInterfaces again, and an interface gone gets none that would list no
// interface at all. Before, SetInterfaces ran at start and when ip_addr_list
// changed, and a remade interface steered nothing until smcrd restarted.
func TestInterfacesFollowed(t *testing.T) {
	p := nstest.NewPair(t)
	const name = "smcrfollow0"
	var ns netns.NsHandle
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	mkdummy := func() {
		t.Helper()
		must(p.A.Do(func() error {
			// A veth with its peer beside it: the kernel may lack dummy.
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
				return err
			}
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(198, 51, 100, 1), Mask: net.CIDRMask(24, 32)}}); err != nil {
				return err
			}
			return netlink.LinkSetUp(l)
		}))
	}
	mkdummy()
	must(p.A.Do(func() error {
		var err error
		ns, err = netns.Get()
		return err
	}))
	cfg := config.Default()
	cfg.Interfaces = []string{name}
	d, maps := policyDaemon(t, cfg, []string{name})
	d.netns = ns
	defer ns.Close()
	stop := make(chan struct{})
	done := d.followInterfaces(stop)
	defer func() { close(stop); <-done }()

	calls := func() (int, []string) {
		maps.mu.Lock()
		defer maps.mu.Unlock()
		return maps.calls, slices.Clone(maps.attached)
	}
	// waitCall waits for a call of SetInterfaces after the n-th.
	waitCall := func(n int, what string) int {
		t.Helper()
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if c, names := calls(); c > n {
				if !slices.Equal(names, []string{name}) {
					t.Errorf("%s: SetInterfaces(%v), want [%s]", what, names, name)
				}
				return c
			}
		}
		t.Fatalf("%s: SetInterfaces not called again", what)
		return 0
	}
	waitCall(0, "start")
	time.Sleep(2 * refreshEvery) // let the first refresh's own changes settle
	n, _ := calls()
	must(p.A.Do(func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	}))
	time.Sleep(2 * refreshEvery)
	if c, names := calls(); c != n {
		t.Errorf("interface gone: SetInterfaces(%v) called, want no call", names)
	}
	mkdummy()
	waitCall(n, "interface made again")
	time.Sleep(2 * refreshEvery)
	n, _ = calls()
	must(p.A.Do(func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		_, dst, _ := net.ParseCIDR("203.0.113.0/24")
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst})
	}))
	waitCall(n, "route added")
}

// TestRefreshFailureLoggedOnce: the programs failing to follow a change of the
// host's interfaces is logged once, not at every change after (routes may
// change every second), and again once it failed anew after a success.
func TestRefreshFailureLoggedOnce(t *testing.T) {
	var log bytes.Buffer
	fail := true
	f := &fakeMaps{fail: func([]string) bool { return fail }}
	d := &Daemon{log: slog.New(slog.NewTextHandler(&log, nil)), maps: f, ifaces: []string{"lo"}}
	warned := func() int { return strings.Count(log.String(), "the programs could not follow") }
	d.refreshInterfaces()
	d.refreshInterfaces()
	if n := warned(); n != 1 || f.calls != 2 {
		t.Errorf("%d warnings after %d failed refreshes, want 1 after 2", n, f.calls)
	}
	fail = false
	d.refreshInterfaces()
	fail = true
	d.refreshInterfaces()
	if n := warned(); n != 2 {
		t.Errorf("%d warnings, want 2 (failed again after a success):\n%s", n, log.String())
	}
}

// TestSetInterfaceGoneAgain pins that naming ip_addr_list looks its interfaces
// up even when the value is the one in effect: an interface removed or renamed
// since smcrd started is refused, with -P or without, rather than saved for the
// next start to fail on ("no interface named gone0", exit 1, over and over
// under Restart=on-failure).
func TestSetInterfaceGoneAgain(t *testing.T) {
	ctx := context.Background()
	cfg := config.Default()
	cfg.Interfaces = []string{"gone0"}
	d, _ := policyDaemon(t, cfg, []string{"gone0"})
	d.opts.ConfigFile = filepath.Join(t.TempDir(), "smcrd.conf")
	if err := os.WriteFile(d.opts.ConfigFile, []byte("ip_addr_list = lo\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, persist := range []bool{false, true} {
		_, err := d.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"ip_addr_list=gone0"}, Persist: persist})
		if !errors.Is(err, control.ErrInvalid) || !strings.Contains(err.Error(), `no interface named "gone0"`) {
			t.Errorf("set ip_addr_list=gone0 (persist %v) with gone0 gone: %v, want refused", persist, err)
		}
	}
	if saved, err := config.Load(d.opts.ConfigFile); err != nil || !slices.Equal(saved.Interfaces, []string{"lo"}) {
		t.Errorf("file after a refused set: ip_addr_list %v, %v; want [lo]", saved.Interfaces, err)
	}
}
