//go:build ibv

// Two engines, server and client, each on its own context of the same rxe device
// (QPs on one device reach each other through it, as on a fabric), connect over
// TCP on the device's interface address: RFC 7609 §3.5 (CLC), §3.3 (link group
// and its reuse), §4 (data through the RMBEs) and §4.4 (half-close).

package engine

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/smcr-io/smcr/internal/testlog"
	"github.com/smcr-io/smcr/smcr"
	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/ibv"
)

// Bounded for a 2-vCPU TCG guest: a few MB each way is enough to wrap the 64 KiB
// RMBEs many times over.
const (
	toServer = 3 << 20
	toClient = 2 << 20
)

// trailer is what the server sends after it read the client's EOF: bytes that
// can only arrive if the half-closed connection still carries the other way.
var trailer = []byte("after your sending-done, still mine to send")

// iface is the interface whose RDMA device the engines use (the VM: dummy0,
// carrying rxe0). Without one the test skips, unless SMCR_IBV_REQUIRE=1 (set by
// the VM harness) makes that a failure.
func iface(t testing.TB) string {
	t.Helper()
	if ifc := os.Getenv("SMCR_IBV_INTERFACE"); ifc != "" {
		return ifc
	}
	ports, err := ibv.Devices()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		if p.Active() && p.Netdev != "" {
			return p.Netdev
		}
	}
	if os.Getenv("SMCR_IBV_REQUIRE") == "1" {
		t.Fatal("no active RDMA port, and SMCR_IBV_REQUIRE=1")
	}
	t.Skip("no active RDMA port on this machine (kernel without rdma_rxe or RDMA hardware); test/vm runs this test on soft-RoCE")
	return ""
}

// ipv4Of returns the first IPv4 address of the interface: the address the
// device's RoCE v2 GID encodes and the engines dial.
func ipv4Of(t testing.TB, name string) net.IP {
	t.Helper()
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
			return ipn.IP
		}
	}
	t.Fatalf("%s has no IPv4 address", name)
	return nil
}

// countingDevice counts the protection domains the engine holds. The engine
// closes a link's QP, CQ and MRs and then its PD in a goroutine that may outlive
// Engine.Close; closing the device under them would free the verbs context they
// still use, so the cleanup waits for the count to reach zero (and fails the
// test if it never does: the engine leaked its verbs resources).
type countingDevice struct {
	verbs.Device
	open atomic.Int64
}

type countedPD struct {
	verbs.PD
	d    *countingDevice
	once sync.Once
}

func (d *countingDevice) AllocPD() (verbs.PD, error) {
	pd, err := d.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	d.open.Add(1)
	return &countedPD{PD: pd, d: d}, nil
}

// RegisterMR and PortUp pass through what the engine asks of the device
// beyond verbs.Device and verbs.PD: a second link's registrations
// (verbs.Registrar) and the port's state (verbs.PortStater).
func (p *countedPD) RegisterMR(other verbs.MR, access verbs.Access) (verbs.MR, error) {
	r, ok := p.PD.(verbs.Registrar)
	if !ok {
		return nil, errors.New("the device cannot register another device's memory")
	}
	return r.RegisterMR(other, access)
}

func (d *countingDevice) PortUp() bool {
	ps, ok := d.Device.(verbs.PortStater)
	return !ok || ps.PortUp()
}

func (p *countedPD) Close() error {
	err := p.PD.Close()
	p.once.Do(func() { p.d.open.Add(-1) })
	return err
}

func newEngine(t testing.TB, name, ifc string, id byte) *smcr.Engine {
	return newEngineOn(t, name, id, nil, ifc)
}

// newEngineOn opens the RDMA device of each interface (one link each at most)
// and makes an engine of them; tweak, if not nil, changes its configuration.
func newEngineOn(t testing.TB, name string, id byte, tweak func(*smcr.Config), ifcs ...string) *smcr.Engine {
	t.Helper()
	log := slog.New(slog.NewTextHandler(testlog.Writer(t), nil)).With("engine", name)
	var raws []verbs.Device
	var devs []*countingDevice
	var devices []verbs.Device
	for _, ifc := range ifcs {
		raw, err := ibv.Open(ibv.Config{Interface: ifc, GIDIndex: -1, Logger: log})
		if err != nil {
			t.Fatalf("open rdma device of %s: %v", ifc, err)
		}
		dev := &countingDevice{Device: raw}
		raws, devs, devices = append(raws, raw), append(devs, dev), append(devices, dev)
	}
	cfg := smcr.Config{
		Devices: devices,
		// Distinct peer IDs: both engines sit on the same device (same MAC).
		PeerID: [8]byte{0x53, 0x4d, 0x43, id},
		// Soft-RoCE under TCG on a loaded host can stall for tens of ms per
		// step; the defaults (6 s, 2 s) are for hardware.
		CLCTimeout: 60 * time.Second,
		LLCTimeout: 30 * time.Second,
		Logger:     log,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	e, err := smcr.NewEngine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The engine first, then its verbs objects, then the device contexts.
	t.Cleanup(func() {
		e.Close()
		deadline := time.Now().Add(30 * time.Second)
		for i, dev := range devs {
			for dev.open.Load() > 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := dev.open.Load(); n > 0 {
				// Closing the device now would crash the goroutines still using it.
				t.Errorf("%s engine: %d protection domains still open on %s 30s after Close", name, n, ifcs[i])
				return
			}
		}
		for _, raw := range raws {
			raw.Close()
		}
	})
	return e
}

// source is a reproducible random byte stream, written in random-size chunks.
type source struct {
	rng *rand.Rand
	buf []byte
}

func newSource(seed uint64) *source {
	s := &source{rng: rand.New(rand.NewPCG(seed, 1)), buf: make([]byte, 256<<10)}
	for i := range s.buf {
		s.buf[i] = byte(s.rng.Uint32())
	}
	return s
}

// send writes total bytes in chunks of 1 B..200 KiB (crossing the RMBE size both
// ways) and returns their hash.
func (s *source) send(w io.Writer, total int) ([32]byte, error) {
	h := sha256.New()
	for sent := 0; sent < total; {
		n := min(1+s.rng.IntN(200<<10), total-sent)
		off := s.rng.IntN(len(s.buf) - n + 1)
		h.Write(s.buf[off : off+n])
		if _, err := w.Write(s.buf[off : off+n]); err != nil {
			return [32]byte{}, err
		}
		sent += n
	}
	return [32]byte(h.Sum(nil)), nil
}

// drain reads to EOF with random-size reads and returns the count and hash.
func drain(r io.Reader, seed uint64) (int, [32]byte, error) {
	rng := rand.New(rand.NewPCG(seed, 2))
	h := sha256.New()
	buf := make([]byte, 300<<10)
	n := 0
	for {
		k, err := r.Read(buf[:1+rng.IntN(len(buf)-1)])
		h.Write(buf[:k])
		n += k
		if errors.Is(err, io.EOF) {
			return n, [32]byte(h.Sum(nil)), nil
		}
		if err != nil {
			return n, [32]byte{}, err
		}
	}
}

func mustSMC(t testing.TB, who string, c *smcr.Conn) {
	t.Helper()
	if c.Mode() != smcr.ModeSMCR {
		t.Fatalf("%s connection is %v, not SMC-R: %v", who, c.Mode(), c.Decline())
	}
}

// exchange runs one connection: the client sends toCli bytes and half-closes; the
// server, concurrently, sends toSrv bytes and, once it has read the client's EOF,
// the trailer, then closes. Both sides compare hashes.
func exchange(t *testing.T, ln *smcr.Listener, cli *smcr.Engine, addr string, toSrv, toCli int, seed uint64) (c, s *smcr.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	type accepted struct {
		c   *smcr.Conn
		err error
	}
	acc := make(chan accepted, 1)
	go func() {
		c, err := ln.AcceptSMC()
		acc <- accepted{c, err}
	}()
	c, err := cli.Dial(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	a := <-acc
	if a.err != nil {
		t.Fatal(a.err)
	}
	s = a.c
	mustSMC(t, "client", c)
	mustSMC(t, "server", s)
	// A stuck transfer fails the test in the guest instead of running into the
	// VM's timeout with nothing said.
	dl := time.Now().Add(4 * time.Minute)
	c.SetDeadline(dl)
	s.SetDeadline(dl)

	type result struct {
		n    int
		sum  [32]byte
		sent [32]byte
		err  error
	}
	srvDone := make(chan result, 1)
	go func() {
		var r result
		sentc := make(chan [32]byte, 1)
		errc := make(chan error, 1)
		go func() {
			h, err := newSource(seed+1).send(s, toCli)
			sentc <- h
			errc <- err
		}()
		r.n, r.sum, r.err = drain(s, seed+2)
		if err := <-errc; r.err == nil {
			r.err = err
		}
		r.sent = <-sentc
		if r.err == nil {
			// The client's sending-done arrived; our direction must still work.
			_, r.err = s.Write(trailer)
		}
		if err := s.Close(); r.err == nil {
			r.err = err
		}
		srvDone <- r
	}()

	sentc := make(chan [32]byte, 1)
	errc := make(chan error, 1)
	go func() {
		h, err := newSource(seed).send(c, toSrv)
		if err == nil {
			err = c.CloseWrite()
		}
		sentc <- h
		errc <- err
	}()
	// The client reads the server's stream plus the trailer up to the EOF of the
	// server's Close.
	want := sha256.New()
	src := newSource(seed + 1)
	if _, err := src.send(want, toCli); err != nil {
		t.Fatal(err)
	}
	want.Write(trailer)
	n, got, err := drain(c, seed+3)
	if err != nil {
		t.Fatalf("client read after %d bytes: %v", n, err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("client send: %v", err)
	}
	sent := <-sentc
	r := <-srvDone
	if r.err != nil {
		t.Fatalf("server: %v", r.err)
	}
	if n != toCli+len(trailer) || got != [32]byte(want.Sum(nil)) {
		t.Fatalf("client got %d bytes (want %d), hash match %v", n, toCli+len(trailer), got == [32]byte(want.Sum(nil)))
	}
	if r.n != toSrv || r.sum != sent {
		t.Fatalf("server got %d bytes (want %d), hash match %v", r.n, toSrv, r.sum == sent)
	}
	return c, s
}

func TestEngineOverRDMA(t *testing.T) {
	ifc := iface(t)
	ip := ipv4Of(t, ifc)
	srv := newEngine(t, "server", ifc, 1)
	cli := newEngine(t, "client", ifc, 2)
	ln, err := srv.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	addr := ln.Addr().String()

	start := time.Now()
	c1, _ := exchange(t, ln, cli, addr, toServer, toClient, 100)
	t.Logf("first connection: %d + %d bytes in %v", toServer, toClient, time.Since(start).Round(time.Millisecond))
	c1.Close()
	lgs := cli.LinkGroups()
	if len(lgs) != 1 || lgs[0].Provider != verbs.KindRDMA.String() || len(lgs[0].Links) != 1 {
		t.Fatalf("client link groups after the first connection: %+v", lgs)
	}
	first := lgs[0]
	t.Logf("link group %d over %s: QPN %d to peer QPN %d", first.ID, first.Links[0].Device, first.Links[0].QPN, first.Links[0].PeerQPN)

	// The second connection must ride the same link group: no new CONFIRM_LINK.
	start = time.Now()
	c2, _ := exchange(t, ln, cli, addr, 256<<10, 512<<10, 200)
	t.Logf("second connection in %v", time.Since(start).Round(time.Millisecond))
	c2.Close()
	lgs = cli.LinkGroups()
	if len(lgs) != 1 || lgs[0].ID != first.ID || lgs[0].Links[0].QPN != first.Links[0].QPN {
		t.Fatalf("second connection did not reuse link group %d: %+v", first.ID, lgs)
	}
	for name, e := range map[string]*smcr.Engine{"client": cli, "server": srv} {
		st := e.Stats()
		if st.SMC != 2 || st.FirstContact != 1 || st.LinkConfirms != 1 || st.Reused != 1 || len(st.Fallback) != 0 {
			t.Errorf("%s stats: smc %d, first contact %d, link confirms %d, reused %d, fallbacks %v",
				name, st.SMC, st.FirstContact, st.LinkConfirms, st.Reused, st.Fallback)
		}
		if want := uint64(toServer + toClient + len(trailer) + 256<<10 + 512<<10 + len(trailer)); st.TxBytes+st.RxBytes != want {
			t.Errorf("%s moved %d+%d bytes over RDMA, want %d in all", name, st.TxBytes, st.RxBytes, want)
		}
	}
}

// TestTwoLinksOverRDMA: with a second device on a second interface the link
// group gets its second link over real verbs (ADD_LINK, ADD_LINK_CONT with the
// RMBs' rkeys on the new device, TEST_LINK, CONFIRM_LINK). While a connection
// streams both ways the second interface goes down: its port goes down, the
// link fails and the connection moves to the first link with every byte once;
// when the interface comes back the server adds a link again.
func TestTwoLinksOverRDMA(t *testing.T) {
	ifc := iface(t)
	ifc2 := os.Getenv("SMCR_IBV_INTERFACE2")
	if ifc2 == "" {
		if os.Getenv("SMCR_IBV_REQUIRE") == "1" {
			t.Fatal("no SMCR_IBV_INTERFACE2, and SMCR_IBV_REQUIRE=1")
		}
		t.Skip("SMCR_IBV_INTERFACE2 names no second interface with an RDMA device; test/vm runs this test on two soft-RoCE devices")
	}
	ip := ipv4Of(t, ifc)
	retry := func(c *smcr.Config) { c.LinkRetry = 500 * time.Millisecond }
	srv := newEngineOn(t, "server", 1, retry, ifc, ifc2)
	cli := newEngineOn(t, "client", 2, retry, ifc, ifc2)
	ln, err := srv.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	addr := ln.Addr().String()
	links := func(e *smcr.Engine) int {
		lgs := e.LinkGroups()
		if len(lgs) != 1 {
			return -len(lgs)
		}
		n := 0
		for _, l := range lgs[0].Links {
			if l.State == "active" {
				n++
			}
		}
		return n
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); !cond(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: client %+v, server %+v", what, cli.LinkGroups(), srv.LinkGroups())
			}
		}
	}
	ipLink := func(state string) {
		if out, err := exec.Command("ip", "link", "set", ifc2, state).CombinedOutput(); err != nil {
			t.Errorf("ip link set %s %s: %v: %s", ifc2, state, err, out)
		}
	}
	t.Cleanup(func() { ipLink("up") })

	c1, _ := exchange(t, ln, cli, addr, 256<<10, 256<<10, 500)
	c1.Close()
	waitFor("two links on both ends", func() bool { return links(cli) == 2 && links(srv) == 2 })
	for _, lg := range cli.LinkGroups() {
		for _, l := range lg.Links {
			t.Logf("link %d over %s: QPN %d to peer QPN %d", l.Num, l.Device, l.QPN, l.PeerQPN)
		}
	}

	// Two connections at once, one on each link (the server places them in
	// turn), each with its own listener so that each accepts its own; the
	// second interface goes down once bytes flow. That waits in a goroutine
	// of its own, not a third parallel subtest: the guest's two CPUs allow
	// two at a time (-test.parallel), and a third started only once a
	// transfer had ended, when there was little or nothing left to move.
	ln2, err := srv.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln2.Close() })
	start := time.Now()
	base, smc := cli.Stats().TxBytes+cli.Stats().RxBytes, cli.Stats().SMC
	down := make(chan struct{})
	go func() {
		defer close(down)
		// Both connections set up (a setup whose link fails falls back),
		// and bytes flowing.
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
			if st := cli.Stats(); st.SMC >= smc+2 && st.TxBytes+st.RxBytes > base+2<<20 {
				break
			}
		}
		ipLink("down")
	}()
	t.Run("failover", func(t *testing.T) {
		for i, l := range []*smcr.Listener{ln, ln2} {
			t.Run(fmt.Sprint("conn", i), func(t *testing.T) {
				t.Parallel()
				// Long enough that the failure is found mid-transfer (the
				// port poll, or a failed completion) on a TCG guest.
				c, _ := exchange(t, l, cli, l.Addr().String(), 16<<20, 16<<20, uint64(600+10*i))
				c.Close()
			})
		}
	})
	<-down
	t.Logf("connection across the failure: two of %d + %d bytes in %v", 16<<20, 16<<20, time.Since(start).Round(time.Millisecond))
	waitFor("one link left", func() bool { return links(cli) == 1 && links(srv) == 1 })

	ipLink("up")
	waitFor("the second link added again", func() bool {
		return links(cli) == 2 && links(srv) == 2 && srv.Stats().AddLinks >= 2
	})
	c3, _ := exchange(t, ln, cli, addr, 512<<10, 512<<10, 700)
	c3.Close()
	for name, e := range map[string]*smcr.Engine{"client": cli, "server": srv} {
		st := e.Stats()
		t.Logf("%s: links added %d, connections moved %d, continued %d", name, st.AddLinks, st.MovedConns, st.Continued)
		if st.Continued != 0 || len(st.Fallback) != 0 || st.MovedConns == 0 {
			t.Errorf("%s: %d connections moved, %d continued over TCP, fallbacks %v", name, st.MovedConns, st.Continued, st.Fallback)
		}
	}
}
