//go:build ibv

// Tests of the libibverbs provider on a real verbs stack (soft-RoCE in the
// test/vm harness, or hardware): data movement, remote access errors, flush,
// waits and the no-allocation posting path.

package ibv

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// testConfig opens SMCR_IBV_INTERFACE (the harness sets dummy0) or the first
// active RDMA port. Without one the test skips, unless SMCR_IBV_REQUIRE=1 (the VM
// harness sets it) makes that a failure.
func testConfig(t testing.TB) Config {
	t.Helper()
	if ifc := os.Getenv("SMCR_IBV_INTERFACE"); ifc != "" {
		return Config{Interface: ifc, GIDIndex: -1}
	}
	ports, err := Devices()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		if p.Active() && p.Netdev != "" {
			return Config{Device: p.Device, Port: p.Port, GIDIndex: -1}
		}
	}
	if os.Getenv("SMCR_IBV_REQUIRE") == "1" {
		t.Fatal("no active RDMA port, and SMCR_IBV_REQUIRE=1")
	}
	t.Skip("no active RDMA port on this machine (kernel without rdma_rxe or RDMA hardware); test/vm runs these tests on soft-RoCE")
	return Config{}
}

func openDev(t testing.TB) verbs.Device {
	t.Helper()
	d, err := Open(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

type side struct {
	dev verbs.Device
	pd  verbs.PD
	scq verbs.CQ
	rcq verbs.CQ
	qp  verbs.QP
	mr  verbs.MR
	wc  []verbs.WorkCompletion
}

func newSide(t testing.TB, dev verbs.Device, size int, cfg verbs.QPConfig) *side {
	t.Helper()
	s := &side{dev: dev, wc: make([]verbs.WorkCompletion, 16)}
	var err error
	if s.pd, err = dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if s.scq, err = dev.CreateCQ(256); err != nil {
		t.Fatal(err)
	}
	if s.rcq, err = dev.CreateCQ(256); err != nil {
		t.Fatal(err)
	}
	if s.mr, err = s.pd.AllocMR(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	cfg.SendCQ, cfg.RecvCQ = s.scq, s.rcq
	if s.qp, err = s.pd.CreateQP(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.qp.Close()
		s.mr.Close()
		s.scq.Close()
		s.rcq.Close()
		s.pd.Close()
	})
	return s
}

// pair returns two connected RC queue pairs on two opens of the device.
func pair(t testing.TB, size int, cfg verbs.QPConfig) (a, b *side) {
	t.Helper()
	a = newSide(t, openDev(t), size, cfg)
	b = newSide(t, openDev(t), size, cfg)
	ctx := context.Background()
	if err := a.qp.Connect(ctx, b.qp.Attr()); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(ctx, a.qp.Attr()); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// next waits for one completion on cq.
func next(t testing.TB, cq verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wc := make([]verbs.WorkCompletion, 1)
	for {
		n, err := cq.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return wc[0]
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("wait for completion: %v", err)
		}
	}
}

func TestDiscovery(t *testing.T) {
	cfg := testConfig(t)
	d := openDev(t)
	pa := d.Port()
	if !pa.LinkUp || !pa.MTU.Valid() || pa.Netdev == "" || pa.GIDType == "" {
		t.Fatalf("port attributes incomplete: %+v", pa)
	}
	// The GID must be one of the netdev's own addresses: that is what a peer
	// routes RoCE v2 packets to.
	ifi, err := net.InterfaceByName(pa.Netdev)
	if err != nil {
		t.Fatal(err)
	}
	addrs, _ := ifi.Addrs()
	found := false
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.Equal(net.IP(pa.GID[:])) {
			found = true
		}
	}
	if !found {
		t.Fatalf("gid %v is not an address of %s (%v)", net.IP(pa.GID[:]), pa.Netdev, addrs)
	}
	if pa.MAC != [6]byte(ifi.HardwareAddr) {
		t.Errorf("mac %x, netdev has %x", pa.MAC, ifi.HardwareAddr)
	}
	// Resolving by the GID's address finds the same device as by the interface.
	byIP, err := Resolve(net.IP(pa.GID[:]).String())
	if err != nil {
		t.Fatal(err)
	}
	if byIP.Device != d.Name() || byIP.Netdev != pa.Netdev {
		t.Errorf("Resolve(%v) = %+v, want device %s", net.IP(pa.GID[:]), byIP, d.Name())
	}
	if cfg.Interface != "" && pa.Netdev != cfg.Interface {
		t.Errorf("opened netdev %s for interface %s", pa.Netdev, cfg.Interface)
	}
	if d.Kind() != verbs.KindRDMA || d.Endpoint() != nil {
		t.Errorf("kind %v endpoint %v", d.Kind(), d.Endpoint())
	}
	// The live query agrees with Open's (the engine asks it before adding a
	// link again, multilink.go).
	if ps, ok := d.(verbs.PortStater); !ok || !ps.PortUp() {
		t.Errorf("PortUp: implemented %v, up %v; want an active port", ok, ok && ps.PortUp())
	}
}

func TestSendRecv(t *testing.T) {
	a, b := pair(t, 4096, verbs.QPConfig{})
	copy(a.mr.Bytes()[100:], "hello, ")
	copy(a.mr.Bytes()[300:], "smc-r")
	if err := b.qp.PostRecv(&verbs.RecvWR{ID: 7, SG: []verbs.SGE{{MR: b.mr, Offset: 1000, Length: 64}}}); err != nil {
		t.Fatal(err)
	}
	err := a.qp.PostSend(&verbs.SendWR{ID: 9, Opcode: verbs.OpSend, Signaled: true, SG: []verbs.SGE{
		{MR: a.mr, Offset: 100, Length: 7}, {MR: a.mr, Offset: 300, Length: 5}}})
	if err != nil {
		t.Fatal(err)
	}
	if wc := next(t, a.scq); wc.ID != 9 || wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCSend || wc.QPN != a.qp.Attr().QPN {
		t.Fatalf("send completion %+v", wc)
	}
	wc := next(t, b.rcq)
	if wc.ID != 7 || wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || wc.ByteLen != 12 || wc.HasImm {
		t.Fatalf("recv completion %+v", wc)
	}
	if got := string(b.mr.Bytes()[1000 : 1000+wc.ByteLen]); got != "hello, smc-r" {
		t.Fatalf("received %q", got)
	}
}

func TestWriteAndWriteImm(t *testing.T) {
	a, b := pair(t, 1<<20, verbs.QPConfig{})
	src := a.mr.Bytes()
	for i := range src {
		src[i] = byte(i * 7)
	}
	// A plain WRITE consumes no RECV and raises nothing at the responder.
	err := a.qp.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Signaled: true,
		SG: []verbs.SGE{{MR: a.mr, Offset: 0, Length: 300000}}, RemoteAddr: b.mr.Addr() + 4096, RKey: b.mr.RKey()})
	if err != nil {
		t.Fatal(err)
	}
	if wc := next(t, a.scq); wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCWrite || wc.ID != 1 {
		t.Fatalf("write completion %+v", wc)
	}
	if !bytes.Equal(b.mr.Bytes()[4096:4096+300000], src[:300000]) {
		t.Fatal("written bytes differ")
	}
	if n, _ := b.rcq.Poll(b.wc); n != 0 {
		t.Fatalf("write raised %d completions at the responder", n)
	}

	if err := b.qp.PostRecv(&verbs.RecvWR{ID: 5}); err != nil {
		t.Fatal(err)
	}
	err = a.qp.PostSend(&verbs.SendWR{ID: 2, Opcode: verbs.OpWriteImm, Signaled: true, Imm: 0xdeadbeef,
		SG: []verbs.SGE{{MR: a.mr, Offset: 10, Length: 20}}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	if err != nil {
		t.Fatal(err)
	}
	if wc := next(t, a.scq); wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCWrite {
		t.Fatalf("write imm completion %+v", wc)
	}
	wc := next(t, b.rcq)
	if wc.ID != 5 || wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecvRDMAImm || !wc.HasImm || wc.Imm != 0xdeadbeef || wc.ByteLen != 20 {
		t.Fatalf("recv of write imm %+v", wc)
	}
	if !bytes.Equal(b.mr.Bytes()[:20], src[10:30]) {
		t.Fatal("write imm bytes differ")
	}
}

func TestRemoteAccessErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int
		addr func(b *side) uint64
		rkey func(b *side) uint32
	}{
		{"bad rkey", 4096, func(b *side) uint64 { return b.mr.Addr() }, func(b *side) uint32 { return b.mr.RKey() ^ 0x5a5a00 }},
		{"out of bounds", 4096, func(b *side) uint64 { return b.mr.Addr() + 4000 }, func(b *side) uint32 { return b.mr.RKey() }},
		// The page the region was mapped in goes on past it: registered was
		// the region only.
		{"past the region, inside its page", 1000, func(b *side) uint64 { return b.mr.Addr() + 900 }, func(b *side) uint32 { return b.mr.RKey() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t, tc.size, verbs.QPConfig{})
			err := a.qp.PostSend(&verbs.SendWR{ID: 3, Opcode: verbs.OpWrite, Signaled: true,
				SG: []verbs.SGE{{MR: a.mr, Length: 200}}, RemoteAddr: tc.addr(b), RKey: tc.rkey(b)})
			if err != nil {
				t.Fatal(err)
			}
			if wc := next(t, a.scq); wc.ID != 3 || wc.Status != verbs.WCRemAccessErr {
				t.Fatalf("completion %+v, want %v", wc, verbs.WCRemAccessErr)
			}
			if s := a.qp.State(); s != verbs.QPError {
				t.Fatalf("requester in %v after a remote access error", s)
			}
		})
	}
}

func TestLocalErrors(t *testing.T) {
	a, b := pair(t, 4096, verbs.QPConfig{})
	// A RECV too small for the SEND fails at both ends: the receiver's RECV with a
	// length error, the sender's SEND with a remote one.
	if err := b.qp.PostRecv(&verbs.RecvWR{ID: 1, SG: []verbs.SGE{{MR: b.mr, Length: 8}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(&verbs.SendWR{ID: 2, Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: a.mr, Length: 64}}}); err != nil {
		t.Fatal(err)
	}
	if wc := next(t, b.rcq); wc.ID != 1 || wc.Status != verbs.WCLocLenErr {
		t.Fatalf("recv completion %+v, want %v", wc, verbs.WCLocLenErr)
	}
	if wc := next(t, a.scq); wc.ID != 2 || (wc.Status != verbs.WCRemInvReqErr && wc.Status != verbs.WCRemOpErr) {
		t.Fatalf("send completion %+v, want a remote error", wc)
	}
	// SGEs outside their region never reach the device.
	for _, sg := range [][]verbs.SGE{
		{{MR: a.mr, Offset: 4000, Length: 200}},
		{{MR: a.mr, Offset: -1, Length: 1}},
		make([]verbs.SGE, maxSGE+1),
	} {
		if err := a.qp.PostSend(&verbs.SendWR{Opcode: verbs.OpSend, SG: sg}); !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("post send %+v: %v, want ErrInvalid", sg, err)
		}
	}
	if err := a.qp.PostSend(&verbs.SendWR{Opcode: 99}); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("unknown opcode: %v", err)
	}
}

func TestStatesAndFlush(t *testing.T) {
	dev := openDev(t)
	a := newSide(t, dev, 4096, verbs.QPConfig{MaxRecvWR: 8})
	if s := a.qp.State(); s != verbs.QPInit {
		t.Fatalf("new qp in %v", s)
	}
	if err := a.qp.PostSend(&verbs.SendWR{Opcode: verbs.OpSend}); !errors.Is(err, verbs.ErrQPState) {
		t.Fatalf("send before connect: %v", err)
	}
	for i := range 5 {
		if err := a.qp.PostRecv(&verbs.RecvWR{ID: uint64(100 + i), SG: []verbs.SGE{{MR: a.mr, Length: 64}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.qp.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if wc := next(t, a.rcq); wc.ID != uint64(100+i) || wc.Status != verbs.WCWRFlushErr {
			t.Fatalf("completion %d after close: %+v", i, wc)
		}
	}
	if n, _ := a.rcq.Poll(a.wc); n != 0 {
		t.Fatalf("%d more completions (drain markers leaked?)", n)
	}
	if err := a.qp.PostRecv(&verbs.RecvWR{}); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("post on a closed qp: %v", err)
	}
}

func TestQueueFull(t *testing.T) {
	dev := openDev(t)
	a := newSide(t, dev, 4096, verbs.QPConfig{MaxRecvWR: 4})
	var err error
	posted := 0
	for ; posted < 100000; posted++ {
		if err = a.qp.PostRecv(&verbs.RecvWR{ID: uint64(posted)}); err != nil {
			break
		}
	}
	if !errors.Is(err, verbs.ErrQueueFull) || posted < 4 {
		t.Fatalf("after %d recvs: %v, want ErrQueueFull", posted, err)
	}
}

// TestInlineSpace: the device grants the inline space asked for, and a queue pair
// that asks for more than the device has is still created, without it.
func TestInlineSpace(t *testing.T) {
	dev := openDev(t)
	for _, c := range []struct{ ask, atLeast, atMost int }{
		{64, 64, 1 << 16},
		{1 << 20, 0, 1<<20 - 1},
	} {
		s := newSide(t, dev, 4096, verbs.QPConfig{MaxInline: c.ask})
		got := s.qp.(*qp).maxInline
		if got < c.atLeast || got > c.atMost {
			t.Errorf("asked for %d bytes inline: granted %d, want %d..%d", c.ask, got, c.atLeast, c.atMost)
		}
		t.Logf("asked for %d bytes inline: granted %d", c.ask, got)
	}
}

func TestWait(t *testing.T) {
	dev := openDev(t)
	cq, err := dev.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := cq.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("idle wait: %v", err)
	}
	if d := time.Since(start); d < 40*time.Millisecond {
		t.Fatalf("idle wait returned after %v", d)
	}
	// Cancel without a deadline wakes a sleeping Wait.
	ctx2, cancel2 := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cq.Wait(ctx2) }()
	time.Sleep(20 * time.Millisecond)
	cancel2()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
	// Close wakes a sleeping Wait with ErrClosed.
	go func() { done <- cq.Wait(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	if err := cq.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, verbs.ErrClosed) {
			t.Fatalf("wait across close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake Wait")
	}
}

// TestWaitWakes checks the event path: a Wait that went to sleep returns when a
// completion arrives.
func TestWaitWakes(t *testing.T) {
	a, b := pair(t, 4096, verbs.QPConfig{})
	if err := b.qp.PostRecv(&verbs.RecvWR{ID: 1, SG: []verbs.SGE{{MR: b.mr, Length: 64}}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- b.rcq.Wait(ctx)
	}()
	time.Sleep(50 * time.Millisecond) // well past the spin
	if err := a.qp.PostSend(&verbs.SendWR{Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: a.mr, Length: 10}}}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if wc := next(t, b.rcq); wc.ID != 1 || wc.ByteLen != 10 {
		t.Fatalf("completion %+v", wc)
	}
}

func TestNoAllocations(t *testing.T) {
	a, b := pair(t, 4096, verbs.QPConfig{MaxSendWR: 256, MaxRecvWR: 256})
	send := &verbs.SendWR{ID: 1, Opcode: verbs.OpWriteImm, Signaled: true, Imm: 1,
		SG: []verbs.SGE{{MR: a.mr, Length: 64}}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
	recv := &verbs.RecvWR{ID: 2}
	round := func() {
		if err := b.qp.PostRecv(recv); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(send); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < 2; {
			n, _ := a.scq.Poll(a.wc)
			m, _ := b.rcq.Poll(b.wc)
			got += n + m
		}
	}
	round()
	if n := testing.AllocsPerRun(100, round); n != 0 {
		t.Fatalf("%v allocations per post/poll round", n)
	}
}

// TestPortEvents: the port's async events reach PortChanged as the interface
// under the device goes down and comes back. It uses the second device
// (SMCR_IBV_INTERFACE2, rxe2 on dummy1 in the harness), which no other test of
// the package holds.
func TestPortEvents(t *testing.T) {
	ifc := secondInterface(t, "take down")
	link, err := netlink.LinkByName(ifc)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Open(Config{Interface: ifc, GIDIndex: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	t.Cleanup(func() { netlink.LinkSetUp(link) })
	ports := d.(verbs.PortStater)
	changed := d.(verbs.PortNotifier).PortChanged
	for _, step := range []struct {
		up  bool
		set func(netlink.Link) error
	}{{false, netlink.LinkSetDown}, {true, netlink.LinkSetUp}} {
		ch := changed()
		if err := step.set(link); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("no port event 5 s after %s went up=%v", ifc, step.up)
		}
		if got := ports.PortUp(); got != step.up {
			t.Fatalf("PortUp after the event = %v, want %v", got, step.up)
		}
	}
}

// secondInterface returns SMCR_IBV_INTERFACE2, an interface with an RDMA device
// that no other test of the package holds, for a test that would do to it what.
func secondInterface(t *testing.T, what string) string {
	t.Helper()
	ifc := os.Getenv("SMCR_IBV_INTERFACE2")
	if ifc == "" {
		if os.Getenv("SMCR_IBV_REQUIRE") == "1" {
			t.Fatal("no SMCR_IBV_INTERFACE2, and SMCR_IBV_REQUIRE=1")
		}
		t.Skipf("SMCR_IBV_INTERFACE2 names no interface with an RDMA device to %s; test/vm runs this test on soft-RoCE", what)
	}
	return ifc
}

// TestGIDChange: the device follows its interface's address. When the address
// it was opened on goes and another comes, Port reports the new address's GID,
// as a fresh Open does, and a queue pair made then connects and carries a SEND.
// A second address alone does not move it. Before, the device kept the GID
// entry it had at Open, which went with the address: new links failed until
// smcrd restarted. HasGID follows the table, and PortChanged tells the engine,
// which fails the links on the address that went.
func TestGIDChange(t *testing.T) {
	ifc := secondInterface(t, "readdress")
	link, err := netlink.LinkByName(ifc)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 {
		t.Fatalf("%s has IPv4 addresses %v (%v), want one", ifc, addrs, err)
	}
	old := addrs[0]
	nw := old
	nw.IPNet = &net.IPNet{IP: slices.Clone(old.IP.To4()), Mask: old.Mask}
	nw.IP[2] ^= 0x40 // another subnet: deleting old would take a secondary address along
	nw.Label = ""
	gidOf := func(ip net.IP) [16]byte { return [16]byte(ip.To16()) }

	d, err := Open(Config{Interface: ifc, GIDIndex: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if got := d.Port().GID; got != gidOf(old.IP) {
		t.Fatalf("source GID %v at Open, want %v's", net.IP(got[:]), old.IP)
	}
	gh := d.(verbs.GIDHolder)
	if !gh.HasGID(gidOf(old.IP)) || gh.HasGID(gidOf(nw.IP)) {
		t.Fatalf("HasGID at Open: %v's %v, %v's %v", old.IP, gh.HasGID(gidOf(old.IP)), nw.IP, gh.HasGID(gidOf(nw.IP)))
	}
	if err := netlink.AddrAdd(link, &nw); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		netlink.AddrDel(link, &nw)
		netlink.AddrReplace(link, &old)
	})
	time.Sleep(time.Second) // for the GID change event
	if got := d.Port().GID; got != gidOf(old.IP) {
		t.Fatalf("source GID %v after a second address came, want %v's still", net.IP(got[:]), old.IP)
	}
	if !gh.HasGID(gidOf(old.IP)) || !gh.HasGID(gidOf(nw.IP)) {
		t.Fatalf("HasGID with both addresses: %v's %v, %v's %v", old.IP, gh.HasGID(gidOf(old.IP)), nw.IP, gh.HasGID(gidOf(nw.IP)))
	}
	changed := d.(verbs.PortNotifier).PortChanged()
	if err := netlink.AddrDel(link, &old); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); d.Port().GID != gidOf(nw.IP); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			got := d.Port().GID
			t.Fatalf("source GID %v 10 s after %v went, want %v's", net.IP(got[:]), old.IP, nw.IP)
		}
	}
	// The engine hears of it, and fails the links on the address that went.
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no PortChanged for the GID change")
	}
	if gh.HasGID(gidOf(old.IP)) || !gh.HasGID(gidOf(nw.IP)) {
		t.Fatalf("HasGID after %v went: its %v, %v's %v", old.IP, gh.HasGID(gidOf(old.IP)), nw.IP, gh.HasGID(gidOf(nw.IP)))
	}
	fresh, err := Open(Config{Interface: ifc, GIDIndex: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if fresh.Port() != d.Port() {
		t.Errorf("port after the change %+v, a fresh Open's %+v", d.Port(), fresh.Port())
	}

	a, b := newSide(t, d, 4096, verbs.QPConfig{}), newSide(t, fresh, 4096, verbs.QPConfig{})
	if got := a.qp.Attr().GID; got != gidOf(nw.IP) {
		t.Fatalf("new queue pair names GID %v, want %v's", net.IP(got[:]), nw.IP)
	}
	ctx := context.Background()
	if err := a.qp.Connect(ctx, b.qp.Attr()); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(ctx, a.qp.Attr()); err != nil {
		t.Fatal(err)
	}
	msg := "after the address changed"
	copy(a.mr.Bytes(), msg)
	if err := b.qp.PostRecv(&verbs.RecvWR{ID: 1, SG: []verbs.SGE{{MR: b.mr, Offset: 1024, Length: 64}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(&verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Signaled: true, SG: []verbs.SGE{{MR: a.mr, Length: len(msg)}}}); err != nil {
		t.Fatal(err)
	}
	if wc := next(t, a.scq); wc.Status != verbs.WCSuccess {
		t.Fatalf("send completion %+v", wc)
	}
	wc := next(t, b.rcq)
	if got := string(b.mr.Bytes()[1024 : 1024+wc.ByteLen]); wc.Status != verbs.WCSuccess || got != msg {
		t.Fatalf("recv completion %+v, %q", wc, got)
	}
}

// TestPollOneCallWhenFewer: a Poll that finds fewer completions than it has
// room for calls into the library once: the CQ is empty then. Before, it asked
// again and found nothing, a second cgo crossing on every non-empty poll (the
// engine polls with room for 32).
func TestPollOneCallWhenFewer(t *testing.T) {
	a, b := pair(t, 4096, verbs.QPConfig{})
	if err := b.qp.PostRecv(&verbs.RecvWR{ID: 1, SG: []verbs.SGE{{MR: b.mr, Length: 64}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(&verbs.SendWR{ID: 2, Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: a.mr, Length: 8}}}); err != nil {
		t.Fatal(err)
	}
	rcq := b.rcq.(*cq)
	wc := make([]verbs.WorkCompletion, 32)
	for deadline := time.Now().Add(10 * time.Second); ; {
		rcq.mu.Lock()
		before := rcq.polls
		rcq.mu.Unlock()
		n, err := rcq.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		rcq.mu.Lock()
		calls := rcq.polls - before
		rcq.mu.Unlock()
		if n > 0 {
			if n != 1 || wc[0].ID != 1 || calls != 1 {
				t.Fatalf("Poll returned %d completions (first %+v) in %d library calls, want 1 in 1", n, wc[0], calls)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no receive completion in 10 s")
		}
	}
}
