package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/internal/nstest"
)

const portSteered = 7002

// TestOptionAndSteering: smcrd on A connects with the SMC option; on B, tc marks the
// SYN, sk_lookup hands it to smcrd's steering listener, which echoes the option.
// Untagged connections carry no option and reach the application.
// It runs with tc ingress as a tcx link and as the cls_bpf filter kernels before
// 6.6 get.
func TestOptionAndSteering(t *testing.T) {
	for _, cls := range []bool{false, true} {
		name := map[bool]string{false: "tcx", true: "cls_bpf"}[cls]
		t.Run(name, func(t *testing.T) { testOptionAndSteering(t, cls) })
	}
}

func testOptionAndSteering(t *testing.T, clsBPF bool) {
	p := nstest.NewPair(t)
	cg := testCgroup(t)
	la := loadIn(t, p.A, Options{CgroupPath: cg})
	lb := loadIn(t, p.B, Options{CgroupPath: cg, Interfaces: []string{p.B.Links[0].Name}, ClsBPF: clsBPF})
	app := listen(t, p.B, ":7002", nil, nil)
	steer4 := listen(t, p.B, "127.0.0.1:0", lb, &Tag{SMCOption: true})
	steer6 := listen(t, p.B, "[::1]:0", lb, &Tag{SMCOption: true})
	must(t, lb.RegisterSteering(steer4.(*net.TCPListener)))
	must(t, lb.RegisterSteering(steer6.(*net.TCPListener)))
	must(t, lb.SetPorts([]PortRange{{portSteered, portSteered}}))
	must(t, lb.SetAlive(time.Minute))

	for _, dst := range []netip.AddrPort{
		netip.AddrPortFrom(p.B.Addr4(), portSteered),
		netip.AddrPortFrom(p.B.Addr6(), portSteered),
	} {
		steer := steer4
		if dst.Addr().Is6() {
			steer = steer6
		}
		t.Run(dst.Addr().String(), func(t *testing.T) {
			stop := capture(t, p.B, p.B.Links[0].Name)
			c := dial(t, p.A, dst.String(), la, &Tag{SMCOption: true})
			acc := acceptWithin(t, steer, time.Second)
			if acc == nil {
				t.Fatal("SYN with the SMC option did not reach the steering listener")
			}
			if got := addrPort(acc.LocalAddr()); got != dst {
				t.Errorf("steered connection's local address = %v, want %v", got, dst)
			}
			// The handshake done, its mark is gone: it could only steer a
			// later connection on the 4-tuple.
			noMark(t, lb, dst, addrPort(c.LocalAddr()))
			// Untagged: no option, straight to the application.
			plain := dial(t, p.A, dst.String(), nil, nil)
			if acceptWithin(t, app, time.Second) == nil {
				t.Fatal("SYN without the option did not reach the application")
			}
			time.Sleep(50 * time.Millisecond) // let the capture read the last frames
			segs := stop()
			checkHandshake(t, segs, addrPort(c.LocalAddr()), dst, true)
			checkHandshake(t, segs, addrPort(plain.LocalAddr()), dst, false)

			sa, err := la.Seen(addrPort(c.LocalAddr()), addrPort(c.RemoteAddr()))
			want := SeenSentSYNOption | SeenPeerEchoed | SeenPeerSMCX | SeenEstablished
			if err != nil || sa&want != want || !sa.PeerSupportsSMC() {
				t.Errorf("client Seen = %#x, %v; want sent, echoed with SMCX, established", sa, err)
			}
			// Steered: nothing recorded (the capture shows the echo). A
			// handshake that never completes would leave its entry to the
			// LRU, and a flood of them push out those of smcrd's connects.
			if sb, err := lb.Seen(addrPort(acc.LocalAddr()), addrPort(acc.RemoteAddr())); err != ErrUnknown {
				t.Errorf("server Seen = %#x, %v; want ErrUnknown", sb, err)
			}
			if _, err := la.Seen(addrPort(plain.LocalAddr()), addrPort(plain.RemoteAddr())); err != ErrUnknown {
				t.Errorf("untagged connection: Seen error %v, want ErrUnknown", err)
			}
		})
	}
	st, err := lb.Stats()
	must(t, err)
	if st["steered"] != 2 || st["syn_marked"] != 2 || st["synack_opt_sent"] != 2 {
		t.Errorf("server stats = %v, want 2 marked, steered and echoed", st)
	}

	// smcrd dead: a SYN with the option goes to the application (fail open).
	must(t, lb.SetAlive(0))
	dial(t, p.A, netip.AddrPortFrom(p.B.Addr4(), portSteered).String(), la, &Tag{SMCOption: true})
	if acceptWithin(t, app, time.Second) == nil {
		t.Error("smcrd dead: SYN with the option did not reach the application")
	}
}

// newSteering4: loaders in A and B; in B the application and smcrd's IPv4
// steering listener on portSteered, listed, smcrd alive.
func newSteering4(t *testing.T) (p *nstest.Pair, la, lb *Loader, app, steer4 net.Listener) {
	t.Helper()
	p = nstest.NewPair(t)
	cg := testCgroup(t)
	la = loadIn(t, p.A, Options{CgroupPath: cg})
	lb = loadIn(t, p.B, Options{CgroupPath: cg, Interfaces: []string{p.B.Links[0].Name}})
	app = listen(t, p.B, fmt.Sprintf(":%d", portSteered), nil, nil)
	steer4 = listen(t, p.B, "127.0.0.1:0", lb, &Tag{SMCOption: true})
	must(t, lb.RegisterSteering(steer4.(*net.TCPListener)))
	must(t, lb.SetPorts([]PortRange{{portSteered, portSteered}}))
	must(t, lb.SetAlive(time.Minute))
	return p, la, lb, app, steer4
}

// A mark outlives its connection in the LRU. After the port leaves the list, a
// plain client reusing the marked 4-tuple reaches the application; and
// sk_lookup steers by a mark only while the port is listed and the mark is
// recent, whatever tc did (it does not parse every SYN).
func TestStaleMark(t *testing.T) {
	p, la, lb, app, steer4 := newSteering4(t)
	listed := []PortRange{{portSteered, portSteered}}
	dst := netip.AddrPortFrom(p.B.Addr4(), portSteered)
	dialFrom := func(ns *nstest.NS, src netip.AddrPort, l *Loader, tag *Tag) net.Conn {
		var c net.Conn
		must(t, ns.Do(func() error {
			d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(src)}
			d.SetMultipathTCP(false)
			if tag != nil {
				d.Control = l.Control(*tag)
			}
			var err error
			c, err = d.Dial("tcp", dst.String())
			return err
		}))
		t.Cleanup(func() { c.Close() })
		return c
	}

	src := netip.AddrPortFrom(p.A.Addr4(), 41234)
	c := dialFrom(p.A, src, la, &Tag{SMCOption: true})
	acc := acceptWithin(t, steer4, time.Second)
	if acc == nil {
		t.Fatal("SYN with the SMC option not steered")
	}
	c.(*net.TCPConn).SetLinger(0) // a reset: the 4-tuple is free at once
	c.Close()
	acc.Close()
	time.Sleep(100 * time.Millisecond)
	must(t, lb.SetPorts(nil))
	dialFrom(p.A, src, nil, nil)
	if acceptWithin(t, steer4, 300*time.Millisecond) != nil {
		t.Error("plain SYN to a port no longer listed steered to smcrd by an old mark")
	} else if acceptWithin(t, app, time.Second) == nil {
		t.Error("plain SYN to a port no longer listed: the application accepted nothing")
	}

	// sk_lookup alone: connections from B to itself pass no tc program, so
	// the marks planted here are all sk_lookup sees.
	for i, c := range []struct {
		name   string
		listed bool
		age    time.Duration
		steer  bool
	}{
		{"fresh mark", true, 0, true},
		{"port not listed", false, 0, false},
		{"mark a minute old", true, time.Minute, false},
	} {
		ports := listed
		if !c.listed {
			ports = nil
		}
		must(t, lb.SetPorts(ports))
		src := netip.AddrPortFrom(p.B.Addr4(), uint16(41240+i))
		at := monotonic() - uint64(c.age)
		must(t, lb.objs.SmcrSynmark.Put(tuple(dst, src), at))
		dialFrom(p.B, src, nil, nil)
		want, other := app, steer4
		if c.steer {
			want, other = steer4, app
		}
		if acceptWithin(t, want, time.Second) == nil || acceptWithin(t, other, 100*time.Millisecond) != nil {
			t.Errorf("%s: steered %v, want %v", c.name, !c.steer, c.steer)
		}
	}
}

// An option-carrying client facing a plain server: sent, not echoed.
func TestOptionNotEchoed(t *testing.T) {
	p := nstest.NewPair(t)
	cg := testCgroup(t)
	la := loadIn(t, p.A, Options{CgroupPath: cg})
	app := listen(t, p.B, ":7002", nil, nil)
	c := dial(t, p.A, netip.AddrPortFrom(p.B.Addr4(), portSteered).String(), la, &Tag{SMCOption: true})
	if acceptWithin(t, app, time.Second) == nil {
		t.Fatal("application accepted nothing")
	}
	s, err := la.Seen(addrPort(c.LocalAddr()), addrPort(c.RemoteAddr()))
	if err != nil || s&SeenSentSYNOption == 0 || s&(SeenPeerEchoed|SeenPeerSMCX) != 0 || s.PeerSupportsSMC() {
		t.Errorf("Seen = %#x, %v; want sent and not echoed", s, err)
	}
}

func checkHandshake(t *testing.T, segs []segment, client, server netip.AddrPort, smc bool) {
	t.Helper()
	var syn, synack bool
	for _, s := range segs {
		switch {
		case s.src == client && s.dst == server && !s.ack:
			syn = true
			if s.smc != smc || s.smcx {
				t.Errorf("SYN %v: SMC option %v, want %v, and no SMCX option", s, s.smc, smc)
			}
		case s.src == server && s.dst == client && s.ack:
			synack = true
			if s.smc != smc || s.smcx != smc {
				t.Errorf("SYN-ACK %v: SMC and SMCX options %v %v, want %v", s, s.smc, s.smcx, smc)
			}
		}
	}
	if !syn || !synack {
		t.Errorf("%v->%v: captured SYN %v, SYN-ACK %v; segments %v", client, server, syn, synack, segs)
	}
}

// Pinning: a closed loader leaves programs attached and maps pinned; the next one
// takes the same maps and links over.
func TestPinnedTakeover(t *testing.T) {
	h := newClientHost(t)
	ids, err := h.l.MapIDs()
	must(t, err)
	dir := h.l.opts.PinDir
	must(t, h.l.Close())

	orig := netip.AddrPortFrom(h.p.B.Addr4(), portListed).String()
	if who, _, _ := whoAccepts(t, h.p.A, orig, h.redir4, h.server); who != 0 {
		t.Errorf("loader closed: connection went to listener %d, want the redirect listener (programs stay)", who)
	}
	l2 := loadIn(t, h.p.A, Options{CgroupPath: h.l.cgroup, Interfaces: h.l.opts.Interfaces, PinDir: dir})
	ids2, err := l2.MapIDs()
	must(t, err)
	for name, id := range ids {
		if ids2[name] != id {
			t.Errorf("map %s: id %d after takeover, want %d", name, ids2[name], id)
		}
	}
	want := 9 + 1 + 1 // cgroup hooks, sk_lookup, tc
	if l2.cls {
		want-- // tc is a cls_bpf filter, not a link (no tcx)
	}
	if len(l2.links) != want {
		t.Errorf("took over %d links, want %d", len(l2.links), want)
	}
	if who, _, _ := whoAccepts(t, h.p.A, orig, h.redir4, h.server); who != 0 {
		t.Errorf("after takeover: connection went to listener %d, want the redirect listener", who)
	}
	// The test's cleanup of the first loader removes the shared pins; do it now
	// and check everything is detached.
	must(t, l2.Remove())
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("pin dir after Remove: %v", err)
	}
	if who, _, _ := whoAccepts(t, h.p.A, orig, h.server, h.redir4); who != 0 {
		t.Errorf("after Remove: connection went to listener %d, want the server", who)
	}
}

// A pinned map of another layout (an older smcrd's smcr_prefix4, with 1024
// entries) is replaced by one of this build's; the other maps are taken over.
func TestPinnedIncompatible(t *testing.T) {
	h := newClientHost(t)
	ids, err := h.l.MapIDs()
	must(t, err)
	dir := h.l.opts.PinDir
	must(t, h.l.Close())

	spec, err := loadSmcr()
	must(t, err)
	old := spec.Maps["smcr_prefix4"].Copy()
	old.MaxEntries, old.Pinning = 1024, ebpf.PinNone
	path := filepath.Join(dir, "smcr_prefix4")
	must(t, os.Remove(path))
	m, err := ebpf.NewMap(old)
	must(t, err)
	must(t, m.Pin(path))
	info, err := m.Info()
	must(t, err)
	oldID, _ := info.ID()
	m.Close()

	l2 := loadIn(t, h.p.A, Options{CgroupPath: h.l.cgroup, Interfaces: h.l.opts.Interfaces, PinDir: dir})
	if got, want := l2.objs.SmcrPrefix4.MaxEntries(), spec.Maps["smcr_prefix4"].MaxEntries; got != want {
		t.Errorf("smcr_prefix4 holds %d entries after load, want %d", got, want)
	}
	ids2, err := l2.MapIDs()
	must(t, err)
	for name, id := range ids {
		switch {
		case name == "smcr_prefix4" && (ids2[name] == oldID || ids2[name] == id):
			t.Errorf("map %s: id %d, want a new map", name, ids2[name])
		case name != "smcr_prefix4" && ids2[name] != id:
			t.Errorf("map %s: id %d after load, want %d taken over", name, ids2[name], id)
		}
	}
	orig := netip.AddrPortFrom(h.p.B.Addr4(), portListed).String()
	if who, _, _ := whoAccepts(t, h.p.A, orig, h.redir4, h.server); who != 0 {
		t.Errorf("after load: connection went to listener %d, want the redirect listener", who)
	}
}

// TestClsBPFTakeover: on kernels without tcx, tc ingress is smcr's cls_bpf filter;
// a restarted smcrd replaces it in place instead of adding a second one, an
// interface no longer listed loses it, Remove takes it away, and a later smcrd
// sweeps up one a previous smcrd left on an interface it does not list.
func TestClsBPFTakeover(t *testing.T) {
	p := nstest.NewPair(t)
	cg := testCgroup(t)
	ifname := p.B.Links[0].Name
	var idx int
	filters := func() map[int]int {
		t.Helper()
		ids := map[int]int{}
		must(t, p.B.Do(func() error {
			i, err := net.InterfaceByName(ifname)
			if err != nil {
				return err
			}
			idx = i.Index
			nl, err := netlink.NewHandle()
			if err != nil {
				return err
			}
			defer nl.Close()
			fs, err := clsBPFFilters(nl)
			for idx, f := range fs {
				ids[idx] = f.(*netlink.BpfFilter).Id
			}
			return err
		}))
		return ids
	}
	l1 := loadIn(t, p.B, Options{CgroupPath: cg, Interfaces: []string{ifname}, ClsBPF: true})
	if got := filters(); len(got) != 1 || got[idx] != progID(t, l1) {
		t.Fatalf("filters after load: %v, want one on %s (index %d) running program %d", got, ifname, idx, progID(t, l1))
	}
	must(t, l1.Close())
	l2 := loadIn(t, p.B, Options{CgroupPath: cg, Interfaces: []string{ifname}, ClsBPF: true, PinDir: l1.opts.PinDir})
	if got := filters(); len(got) != 1 || got[idx] != progID(t, l2) {
		t.Errorf("filters after takeover: %v, want one on index %d running the new program %d", got, idx, progID(t, l2))
	}
	must(t, p.B.Do(func() error { return l2.SetInterfaces(nil) }))
	if got := filters(); len(got) != 0 {
		t.Errorf("filters after the interface was unlisted: %v, want none", got)
	}
	must(t, p.B.Do(func() error { return l2.SetInterfaces([]string{ifname}) }))
	if got := filters(); len(got) != 1 {
		t.Errorf("filters after the interface was listed again: %v, want one", got)
	}
	must(t, l2.Remove())
	if got := filters(); len(got) != 0 {
		t.Errorf("filters after Remove: %v, want none", got)
	}

	l3 := loadIn(t, p.B, Options{CgroupPath: cg, Interfaces: []string{ifname}, ClsBPF: true})
	must(t, l3.Close())
	if got := filters(); len(got) != 1 {
		t.Fatalf("filters after close: %v, want the one left in place", got)
	}
	loadIn(t, p.B, Options{CgroupPath: cg, PinDir: l3.opts.PinDir})
	if got := filters(); len(got) != 0 {
		t.Errorf("filters after a loader listing no interface: %v, want none", got)
	}
}

func progID(t *testing.T, l *Loader) int {
	t.Helper()
	info, err := l.objs.SmcrTcIngress.Info()
	must(t, err)
	id, _ := info.ID()
	return int(id)
}

// TestNonEthernetWarnedNeedsIP: without iproute2's ip, which the set-up
// installs, TestNonEthernetWarned fails rather than skips.
func TestNonEthernetWarnedNeedsIP(t *testing.T) {
	nstest.Require(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestNonEthernetWarned$", "-test.v")
	cmd.Env = append(os.Environ(), "PATH="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "ip tuntap add") {
		t.Fatalf("TestNonEthernetWarned without ip: %v, want its ip tuntap add to fail it:\n%s", err, out)
	}
}

// TestNonEthernetWarned: tc ingress reads Ethernet headers, so listing a tun
// device (no link-layer header) is worth a warning; a veth is not.
func TestNonEthernetWarned(t *testing.T) {
	p := nstest.NewPair(t)
	// Only a kernel without TUN skips: a failing ip (or none) is a broken set-up.
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("kernel without TUN: %v", err)
	}
	if out, err := p.B.Command("ip", "tuntap", "add", "dev", "smcrtun0", "mode", "tun").CombinedOutput(); err != nil {
		t.Fatalf("ip tuntap add: %v: %s", err, out)
	}
	var log bytes.Buffer
	l := loadIn(t, p.B, Options{CgroupPath: testCgroup(t), Logger: slog.New(slog.NewTextHandler(&log, nil))})
	must(t, p.B.Do(func() error { return l.SetInterfaces([]string{p.B.Links[0].Name}) }))
	if strings.Contains(log.String(), "without Ethernet headers") {
		t.Errorf("a veth was warned about:\n%s", log.String())
	}
	must(t, p.B.Do(func() error { return l.SetInterfaces([]string{p.B.Links[0].Name, "smcrtun0"}) }))
	if !strings.Contains(log.String(), "without Ethernet headers") || !strings.Contains(log.String(), "interface=smcrtun0") {
		t.Errorf("listing a tun device logged no warning:\n%s", log.String())
	}
	// Once: smcrd applies the list again whenever the host's interfaces or
	// routes change.
	must(t, p.B.Do(func() error { return l.SetInterfaces([]string{p.B.Links[0].Name, "smcrtun0"}) }))
	if n := strings.Count(log.String(), "without Ethernet headers"); n != 1 {
		t.Errorf("warned %d times, want once:\n%s", n, log.String())
	}
}

// A SYN-ACK lost on the way: the steering listener's retransmission, whether
// its timer or the client's repeated SYN sends it, echoes the option as the
// first did. Without it the client counts the server as lacking SMC-R.
func TestOptionSYNACKRetransmitted(t *testing.T) {
	p, la, _, app, steer4 := newSteering4(t)
	dst := netip.AddrPortFrom(p.B.Addr4(), portSteered)
	// Neighbours resolved, so that dropping what A receives drops only the SYN-ACK.
	dial(t, p.A, dst.String(), nil, nil).Close()
	if acceptWithin(t, app, time.Second) == nil {
		t.Fatal("application accepted nothing")
	}

	drop, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		License:      "Dual MIT/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* TC_ACT_SHOT */), asm.Return()},
	})
	must(t, err)
	defer drop.Close()
	// TCX where the kernel has it (6.6), else a cls_bpf filter ahead of any other.
	var undrop func() error
	must(t, p.A.Do(func() error {
		iface, err := net.InterfaceByName(p.A.Links[0].Name)
		if err != nil {
			return err
		}
		l, err := link.AttachTCX(link.TCXOptions{Interface: iface.Index, Program: drop, Attach: ebpf.AttachTCXIngress})
		if err == nil {
			undrop = l.Close
			return nil
		}
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return err
		}
		nl, err := netlink.NewHandle() // in A, for good
		if err != nil {
			return err
		}
		qdisc := &netlink.GenericQdisc{QdiscType: "clsact", QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: iface.Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
		if err := nl.QdiscReplace(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: iface.Index, Parent: netlink.HANDLE_MIN_INGRESS,
			Handle: 1, Priority: 1, Protocol: unix.ETH_P_ALL}, Fd: drop.FD(), Name: "drop", DirectAction: true}
		if err := nl.FilterAdd(f); err != nil {
			return err
		}
		undrop = func() error { defer nl.Close(); return nl.FilterDel(f) }
		return nil
	}))
	time.AfterFunc(300*time.Millisecond, func() { undrop() })
	c := dial(t, p.A, dst.String(), la, &Tag{SMCOption: true})
	if acceptWithin(t, steer4, time.Second) == nil {
		t.Fatal("SYN with the SMC option not steered")
	}
	s, err := la.Seen(addrPort(c.LocalAddr()), addrPort(c.RemoteAddr()))
	want := SeenSentSYNOption | SeenPeerEchoed | SeenPeerSMCX
	if err != nil || s&want != want {
		t.Errorf("client Seen = %#x, %v; want the option sent and echoed with SMCX", s, err)
	}
}

// TestSteeredBehindSyncookies: a listener answering with a syncookie keeps no
// state for the SYN, so sk_lookup meets the mark again on the handshake's last
// ACK (MARK_TTL_NS covers it); the connection reaches smcrd's steering
// listener, and its mark goes with the handshake.
func TestSteeredBehindSyncookies(t *testing.T) {
	p, la, lb, app, steer4 := newSteering4(t)
	must(t, p.B.Do(func() error { // 2: a cookie for every SYN
		return os.WriteFile("/proc/sys/net/ipv4/tcp_syncookies", []byte("2"), 0o644)
	}))
	st0, err := lb.Stats()
	must(t, err)
	dst := netip.AddrPortFrom(p.B.Addr4(), portSteered)
	c := dial(t, p.A, dst.String(), la, &Tag{SMCOption: true})
	if acceptWithin(t, steer4, time.Second) == nil {
		t.Fatal("SYN with the SMC option, answered with a cookie, did not reach the steering listener")
	}
	if acceptWithin(t, app, 100*time.Millisecond) != nil {
		t.Error("the application accepted a connection too")
	}
	st, err := lb.Stats()
	must(t, err)
	// The SYN and the last ACK each went through sk_lookup.
	if got := st["steered"] - st0["steered"]; got != 2 {
		t.Errorf("steered %d times, want 2 (the SYN, the ACK with the cookie)", got)
	}
	noMark(t, lb, dst, addrPort(c.LocalAddr()))
}

// noMark fails unless lb's tc holds no SYN mark for the connection from src
// to dst.
func noMark(t *testing.T, lb *Loader, dst, src netip.AddrPort) {
	t.Helper()
	var at uint64
	if err := lb.objs.SmcrSynmark.Lookup(tuple(dst, src), &at); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("SYN mark of %v → %v after its handshake: %v (want none)", src, dst, err)
	}
}

// With no IPv4 steering listener, an IPv4 SYN goes to the IPv6 one, which
// takes it when it is dual-stack. Only one bound to the wildcard address is:
// bpf_sk_assign refuses (steer_failed) one bound to ::1, as smcrd's is, so
// smcrd warns that IPv4 goes unsteered when it has no IPv4 steering listener.
func TestSteeredToDualStackListener(t *testing.T) {
	for _, tc := range []struct {
		addr    string
		steered bool
	}{{"[::]:0", true}, {"[::1]:0", false}} {
		t.Run(tc.addr, func(t *testing.T) {
			p := nstest.NewPair(t)
			cg := testCgroup(t)
			la := loadIn(t, p.A, Options{CgroupPath: cg})
			lb := loadIn(t, p.B, Options{CgroupPath: cg, Interfaces: []string{p.B.Links[0].Name}})
			app := listen(t, p.B, fmt.Sprintf(":%d", portSteered), nil, nil)
			steer6 := listen(t, p.B, tc.addr, lb, &Tag{SMCOption: true})
			must(t, lb.RegisterSteering(steer6.(*net.TCPListener)))
			must(t, lb.SetPorts([]PortRange{{portSteered, portSteered}}))
			must(t, lb.SetAlive(time.Minute))
			dst := netip.AddrPortFrom(p.B.Addr4(), portSteered)
			dial(t, p.A, dst.String(), la, &Tag{SMCOption: true})
			want, other := app, steer6
			if tc.steered {
				want, other = steer6, app
			}
			acc := acceptWithin(t, want, time.Second)
			st, err := lb.Stats()
			must(t, err)
			if acc == nil {
				t.Fatalf("IPv4 SYN with the SMC option: not accepted where expected (steered %v); stats %v", tc.steered, st)
			}
			if got := addrPort(acc.LocalAddr()); got.Addr().Unmap() != dst.Addr() || got.Port() != dst.Port() {
				t.Errorf("accepted connection's local address = %v, want %v", got, dst)
			}
			if acceptWithin(t, other, 100*time.Millisecond) != nil {
				t.Error("accepted on the other listener too")
			}
			if tc.steered && st["steered"] != 1 || !tc.steered && st["steer_failed"] != 1 {
				t.Errorf("stats %v: want steered (or, for ::1, steer_failed) 1", st)
			}
		})
	}
}

// rawSYN sends, from a raw socket in ns, a SYN from src to dst carrying opts (a
// multiple of 4 long) and returns whether the SYN-ACK that comes back echoes
// the SMC option, and whether one came at all.
func rawSYN(t *testing.T, ns *nstest.NS, src, dst netip.AddrPort, opts []byte) (echoed, answered bool) {
	t.Helper()
	th := make([]byte, 20+len(opts))
	binary.BigEndian.PutUint16(th[0:], src.Port())
	binary.BigEndian.PutUint16(th[2:], dst.Port())
	binary.BigEndian.PutUint32(th[4:], 0x12345678)
	th[12] = byte(len(th)/4) << 4
	th[13] = 0x02 // SYN
	binary.BigEndian.PutUint16(th[14:], 64240)
	copy(th[20:], opts)
	// Checksum over the pseudo-header and the segment.
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
	}
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	add(s4[:])
	add(d4[:])
	sum += unix.IPPROTO_TCP + uint32(len(th))
	add(th)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(th[16:], ^uint16(sum))

	var fd int
	must(t, ns.Do(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		return err
	}))
	defer unix.Close(fd)
	tv := unix.Timeval{Usec: 100000}
	must(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv))
	must(t, unix.Sendto(fd, th, 0, &unix.SockaddrInet4{Addr: d4}))
	buf := make([]byte, 1500)
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil || n < 20 {
			continue
		}
		p := buf[:n]
		p = p[int(p[0]&15)*4:]
		if len(p) < 20 || binary.BigEndian.Uint16(p[0:]) != dst.Port() || binary.BigEndian.Uint16(p[2:]) != src.Port() || p[13]&0x12 != 0x12 {
			continue
		}
		hl := int(p[12]>>4) * 4
		return hl <= len(p) && hasExpOption(p[20:hl], "\xe2\xd4\xc3\xd9"), true
	}
	return false, false
}

// TestSteeredOnlyEchoed: a SYN is steered to smcrd exactly when smcrd's
// steering listener echoes its SMC option. The listener finds the option as
// the kernel's bpf_load_hdr_opt does: the first experimental option with the
// SMC-R ExID decides, and an experimental option too short for an ExID of 4
// bytes (RFC 7413's experimental Fast Open, 254 4 F9 89) ends the search. A
// SYN that tc marked past either reaches smcrd without an echo: its client
// goes on as plain TCP while smcrd waits for a CLC Proposal.
func TestSteeredOnlyEchoed(t *testing.T) {
	p, _, lb, _, _ := newSteering4(t)
	dst := netip.AddrPortFrom(p.B.Addr4(), portSteered)
	for i, c := range []struct {
		name string
		opts []byte
	}{
		{"smc", []byte{1, 1, 254, 6, 0xe2, 0xd4, 0xc3, 0xd9}},
		{"smcx then smc", []byte{254, 6, 'S', 'M', 'C', 'X', 254, 6, 0xe2, 0xd4, 0xc3, 0xd9}},
		{"experimental fast open then smc", []byte{254, 4, 0xf9, 0x89, 1, 1, 254, 6, 0xe2, 0xd4, 0xc3, 0xd9}},
		{"smc of 8 bytes then smc", []byte{254, 8, 0xe2, 0xd4, 0xc3, 0xd9, 0, 0, 1, 1, 254, 6, 0xe2, 0xd4, 0xc3, 0xd9}},
		{"none", nil},
	} {
		st0, err := lb.Stats()
		must(t, err)
		src := netip.AddrPortFrom(p.A.Addr4(), uint16(42000+i))
		echoed, answered := rawSYN(t, p.A, src, dst, c.opts)
		st, err := lb.Stats()
		must(t, err)
		steered := st["steered"] != st0["steered"]
		if !answered {
			t.Errorf("%s: no SYN-ACK", c.name)
			continue
		}
		if steered != echoed {
			t.Errorf("%s: steered to smcrd %v, SYN-ACK echoes the option %v (stats %v)", c.name, steered, echoed, st)
		}
	}
}

// foreignHdrOpt attaches to cgroup another sockops program, as Katran's TCP
// packet routing is: it asks for the header option callbacks
// (BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG) on every connecting and listening
// socket, for an option of its own. The flags are the socket's, shared by
// every sockops program of its cgroups.
func foreignHdrOpt(t *testing.T, cgroup string) {
	t.Helper()
	const (
		connectCB  = 3  // BPF_SOCK_OPS_TCP_CONNECT_CB
		listenCB   = 11 // BPF_SOCK_OPS_TCP_LISTEN_CB
		cbFlags    = 84 // offsetof(struct bpf_sock_ops, bpf_sock_ops_cb_flags)
		writeHdrCB = 64 // BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SockOps,
		License: "Dual MIT/GPL",
		Instructions: asm.Instructions{
			asm.Mov.Reg(asm.R6, asm.R1),
			asm.LoadMem(asm.R2, asm.R1, 0, asm.Word),
			asm.JEq.Imm(asm.R2, connectCB, "set"),
			asm.JEq.Imm(asm.R2, listenCB, "set"),
			asm.Mov.Imm(asm.R0, 1),
			asm.Return(),
			asm.LoadMem(asm.R2, asm.R6, cbFlags, asm.Word).WithSymbol("set"),
			asm.Or.Imm(asm.R2, writeHdrCB),
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.FnSockOpsCbFlagsSet.Call(),
			asm.Mov.Imm(asm.R0, 1),
			asm.Return(),
		},
	})
	must(t, err)
	t.Cleanup(func() { prog.Close() })
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: ebpf.AttachCGroupSockOps, Program: prog})
	must(t, err)
	t.Cleanup(func() { l.Close() })
}

// TestForeignHeaderOptionCallbacks: another sockops program asking for the
// header option callbacks on an application's sockets does not make them
// speak SMC-R: its SYNs carry no SMC option (a server's smcrd would steer them
// and wait for a CLC Proposal), and its listener echoes none (smcrd's client
// would send its Proposal to the application).
func TestForeignHeaderOptionCallbacks(t *testing.T) {
	p, la, lb, app, steer4 := newSteering4(t)
	foreignHdrOpt(t, lb.cgroup)
	dst := netip.AddrPortFrom(p.B.Addr4(), portSteered)

	stop := capture(t, p.B, p.B.Links[0].Name)
	plain := dial(t, p.A, dst.String(), nil, nil)
	if acceptWithin(t, app, time.Second) == nil {
		t.Error("the application's plain connection was not accepted by the application")
		if acceptWithin(t, steer4, 100*time.Millisecond) != nil {
			t.Error("it was steered to smcrd")
		}
	}
	// smcrd on B not running: its SYN reaches an application listening
	// since the other program came.
	must(t, lb.SetAlive(0))
	app2 := listen(t, p.B, fmt.Sprintf(":%d", portSteered+1), nil, nil)
	dst2 := netip.AddrPortFrom(p.B.Addr4(), portSteered+1)
	tagged := dial(t, p.A, dst2.String(), la, &Tag{SMCOption: true})
	if acceptWithin(t, app2, time.Second) == nil {
		t.Fatal("smcrd's SYN did not reach the application")
	}
	time.Sleep(50 * time.Millisecond)
	segs := stop()
	checkHandshake(t, segs, addrPort(plain.LocalAddr()), dst, false)
	for _, s := range segs {
		if s.src == dst2 && s.dst == addrPort(tagged.LocalAddr()) && (s.smc || s.smcx) {
			t.Errorf("the application's SYN-ACK %v echoes the SMC option", s)
		}
	}
	if s, err := la.Seen(addrPort(tagged.LocalAddr()), addrPort(tagged.RemoteAddr())); err == nil && s.PeerSupportsSMC() {
		t.Errorf("smcrd's client sees the application as SMC-R capable (Seen %#x)", s)
	}
	// smcrd's own connections still are.
	must(t, lb.SetAlive(time.Minute))
	c := dial(t, p.A, dst.String(), la, &Tag{SMCOption: true})
	acc := acceptWithin(t, steer4, time.Second)
	if acc == nil {
		t.Fatal("smcrd's SYN with the option not steered")
	}
	if s, err := la.Seen(addrPort(c.LocalAddr()), addrPort(c.RemoteAddr())); err != nil || !s.PeerSupportsSMC() {
		t.Errorf("smcrd's connection: Seen %#x, %v; want the option sent and echoed", s, err)
	}
	noMark(t, lb, dst, addrPort(c.LocalAddr()))
}

// TestSteeredMarkOfAnEarlierHandshake: a handshake steered to smcrd that never
// completed leaves its SYN's mark, steered; a later SYN of the 4-tuple that goes
// to the application (smcrd's steering listener is gone: a restart) is answered
// without the option, even by a listener whose header option callbacks another
// program asked for.
func TestSteeredMarkOfAnEarlierHandshake(t *testing.T) {
	p, _, lb, app, steer4 := newSteering4(t)
	foreignHdrOpt(t, lb.cgroup)
	app.Close() // listening again since the other program came
	listen(t, p.B, fmt.Sprintf(":%d", portSteered), nil, nil)
	dst := netip.AddrPortFrom(p.B.Addr4(), portSteered)
	src := netip.AddrPortFrom(p.A.Addr4(), 42100)
	smc := []byte{1, 1, 254, 6, 0xe2, 0xd4, 0xc3, 0xd9}
	// A's kernel resets the SYN-ACK of a raw SYN: the handshake ends there.
	if echoed, answered := rawSYN(t, p.A, src, dst, smc); !answered || !echoed {
		t.Fatalf("first SYN: answered %v, echoed %v; want smcrd's SYN-ACK with the option", answered, echoed)
	}
	steer4.Close()
	if echoed, answered := rawSYN(t, p.A, src, dst, smc); !answered || echoed {
		t.Errorf("SYN to the application: answered %v, echoed %v; want an answer without the option", answered, echoed)
	}
}
