package smcr

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/smcr-io/smcr/internal/nstest"
	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr/internal/memverbs"
	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/shm"
	"github.com/smcr-io/smcr/smcr/verbs/soft"
)

// linkCounts returns the number of links of each of e's link groups and the
// connections on each link.
func linkCounts(e *Engine) (links []int, conns [][]int) {
	for _, lg := range e.LinkGroups() {
		links = append(links, len(lg.Links))
		var cs []int
		for _, l := range lg.Links {
			cs = append(cs, l.Conns)
		}
		conns = append(conns, cs)
	}
	return links, conns
}

func twoLinks(e *Engine) bool {
	links, _ := linkCounts(e)
	return len(links) == 1 && links[0] == 2
}

func oneLink(e *Engine) bool {
	links, _ := linkCounts(e)
	return len(links) == 1 && links[0] == 1
}

// closeAll closes both ends of every pair and waits until both engines released
// all buffers.
func (p *pair) closeAll(t *testing.T, conns [][2]*Conn) {
	t.Helper()
	for _, cs := range conns {
		cs[0].Close()
		cs[1].Close()
	}
	eventually(t, "released", func() bool {
		return p.cli.Stats().MemoryInUse == 0 && p.srv.Stats().MemoryInUse == 0
	})
}

// twoDevices returns a memverbs device for each end, their verbs lifecycle
// checked at cleanup.
func twoDevices(t *testing.T) (c, s *memverbs.Device) {
	c, s = memverbs.New(verbs.KindSoft), memverbs.New(verbs.KindSoft)
	t.Cleanup(func() { closeChecked(t, c, s) })
	return c, s
}

// fourDevices returns two memverbs devices for each end, their verbs lifecycle
// checked at cleanup.
func fourDevices(t *testing.T) (c1, c2, s1, s2 *memverbs.Device) {
	c1, c2 = memverbs.New(verbs.KindSoft), memverbs.New(verbs.KindSoft)
	s1, s2 = memverbs.New(verbs.KindSoft), memverbs.New(verbs.KindSoft)
	t.Cleanup(func() { closeChecked(t, c1, c2, s1, s2) })
	return c1, c2, s1, s2
}

// streamPairs streams total bytes each way on every pair of connections while
// during() runs, and checks every byte by hash.
func streamPairs(t *testing.T, conns [][2]*Conn, total int, seed uint64, during func()) {
	t.Helper()
	var wg sync.WaitGroup
	for i, cs := range conns {
		wg.Add(2)
		go func() { defer wg.Done(); stream(t, cs[0], cs[1], total, seed+uint64(2*i)) }()
		go func() { defer wg.Done(); stream(t, cs[1], cs[0], total, seed+uint64(2*i+1)) }()
	}
	during()
	wg.Wait()
}

// TestSecondLinkFailover brings up a second link (ADD_LINK), spreads connections
// over both, fails one device mid-transfer (the connections move to the other link
// with every byte once), then fails the last one (continuation over TCP).
func TestSecondLinkFailover(t *testing.T) {
	c1, c2, s1, s2 := fourDevices(t)
	cfg := func(d ...verbs.Device) Config {
		return Config{Devices: d, RMBSize: 16 << 10, TestLinkInterval: -1}
	}
	p := newPair(t, cfg(c1, c2), cfg(s1, s2))
	var conns [][2]*Conn
	c, s := p.connect(t)
	mustSMC(t, c, s)
	conns = append(conns, [2]*Conn{c, s})
	eventually(t, "two links on both ends", func() bool { return twoLinks(p.cli) && twoLinks(p.srv) })
	conns = append(conns, p.connectSMC(t, 5)...)
	for _, e := range []*Engine{p.cli, p.srv} {
		st := e.Stats()
		if st.AddLinks != 1 || st.FirstContact != 1 || st.LinkConfirms != 2 {
			t.Fatalf("add links %d, first contacts %d, link confirms %d; want 1, 1, 2", st.AddLinks, st.FirstContact, st.LinkConfirms)
		}
		if _, per := linkCounts(e); per[0][0] == 0 || per[0][1] == 0 {
			t.Fatalf("connections per link %v: one link unused", per[0])
		}
	}

	// One device fails mid-transfer: the connections on its link move.
	streamPairs(t, conns, 8<<20, 100, func() {
		eventually(t, "streams under way", func() bool { return p.cli.Stats().RxBytes > 8<<20 })
		s1.Fail()
		eventually(t, "one link left", func() bool { return oneLink(p.cli) && oneLink(p.srv) })
	})
	cs, ss := p.cli.Stats(), p.srv.Stats()
	// Whichever end sees the failure first sends DELETE_LINK; both may, when
	// they see it at once.
	if cs.DeleteLinks > 1 || ss.DeleteLinks > 1 || cs.DeleteLinks+ss.DeleteLinks == 0 {
		t.Errorf("DELETE_LINK received: client %d, server %d; want one end or both once", cs.DeleteLinks, ss.DeleteLinks)
	}
	if cs.MovedConns == 0 || ss.MovedConns == 0 || cs.MovedConns != ss.MovedConns {
		t.Errorf("moved connections: client %d, server %d", cs.MovedConns, ss.MovedConns)
	}
	if cs.Continued+ss.Continued != 0 {
		t.Errorf("%d connections continued over tcp with a link left", cs.Continued+ss.Continued)
	}
	if _, per := linkCounts(p.srv); per[0][0] != len(conns) {
		t.Errorf("connections on the surviving link: %v, want %d", per, len(conns))
	}

	// New connections after the failover still work, on the surviving link.
	for _, cs := range conns {
		cs[0].Close()
		cs[1].Close()
	}
	fresh := p.connectSMC(t, 3)

	// The last link fails mid-transfer: continuation over TCP, still every byte.
	streamPairs(t, fresh, 8<<20, 200, func() {
		base := p.srv.Stats().RxBytes
		eventually(t, "streams under way", func() bool { return p.srv.Stats().RxBytes > base+4<<20 })
		s2.Fail()
	})
	if n := p.cli.Stats().Continued + p.srv.Stats().Continued; n != uint64(2*len(fresh)) {
		t.Errorf("continued %d connections, want %d", n, 2*len(fresh))
	}
	p.closeAll(t, fresh)
}

// openDeviceAt opens a device of kind in ns; soft listens on addr, the address of
// one of the namespace's links.
func openDeviceAt(t *testing.T, kind string, ns *nstest.NS, addr netip.Addr, dir, name string) verbs.Device {
	var d verbs.Device
	err := ns.Do(func() error {
		var err error
		switch kind {
		case "shm":
			d, err = shm.Open(shm.Config{Dir: dir, Name: name})
		case "soft":
			var ln net.Listener
			if ln, err = net.Listen("tcp", netip.AddrPortFrom(addr, 0).String()); err != nil {
				return err
			}
			d, err = soft.Open(soft.Config{Listener: ln, Dial: func(ctx context.Context, network, a string) (net.Conn, error) {
				var c net.Conn
				err := ns.Do(func() error {
					var err error
					c, err = (&net.Dialer{}).DialContext(ctx, network, a)
					return err
				})
				return c, err
			}})
		}
		return err
	})
	if err != nil {
		t.Skipf("%s provider unavailable: %v", kind, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestSecondLinkNamespaces runs two links over two veth pairs between two network
// namespaces, on soft and shm: ADD_LINK once, connections on both links, one
// device closed mid-transfer (failover, DELETE_LINK), then the other (continuation
// over TCP), every byte checked.
func TestSecondLinkNamespaces(t *testing.T) {
	for _, kind := range []string{"soft", "shm"} {
		t.Run(kind, func(t *testing.T) {
			p := nstest.NewPair(t)
			la, lb := p.AddLink()
			dir := t.TempDir()
			ca1 := openDeviceAt(t, kind, p.A, p.A.Addr4(), dir, "a1")
			ca2 := openDeviceAt(t, kind, p.A, la.Addr4.Addr(), dir, "a2")
			sb1 := openDeviceAt(t, kind, p.B, p.B.Addr4(), dir, "b1")
			sb2 := openDeviceAt(t, kind, p.B, lb.Addr4.Addr(), dir, "b2")
			cfg := func(d ...verbs.Device) Config {
				return Config{Devices: d, RMBSize: 64 << 10, TestLinkInterval: -1}
			}
			cli, srv := newEngine(t, cfg(ca1, ca2)), newEngine(t, cfg(sb1, sb2))
			var ln *Listener
			if err := p.B.Do(func() error {
				var err error
				ln, err = srv.Listen("tcp", netip.AddrPortFrom(p.B.Addr4(), 0).String())
				return err
			}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			s := &nsSetup{pair: p, cli: cli, srv: srv, ln: ln, addr: ln.Addr().String()}
			connect := func() [2]*Conn {
				c := s.dial(t, cli)
				sc, err := ln.AcceptSMC()
				if err != nil {
					t.Fatal(err)
				}
				mustSMC(t, c, sc)
				return [2]*Conn{c, sc}
			}
			conns := [][2]*Conn{connect()}
			eventually(t, "two links on both ends", func() bool { return twoLinks(cli) && twoLinks(srv) })
			for range 3 {
				conns = append(conns, connect())
			}
			if a, b := cli.Stats().AddLinks, srv.Stats().AddLinks; a != 1 || b != 1 {
				t.Fatalf("ADD_LINK exchanges: client %d, server %d; want 1", a, b)
			}
			if _, per := linkCounts(srv); per[0][0] == 0 || per[0][1] == 0 {
				t.Fatalf("connections per link %v: one link unused", per[0])
			}
			streamPairs(t, conns, 16<<20, 300, func() {
				eventually(t, "streams under way", func() bool { return cli.Stats().RxBytes > 8<<20 })
				start := time.Now()
				sb1.Close()
				eventually(t, "one link left", func() bool { return oneLink(cli) && oneLink(srv) })
				t.Logf("both ends down to one link %v after the device closed", time.Since(start))
			})
			cs, ss := cli.Stats(), srv.Stats()
			if cs.MovedConns == 0 || ss.MovedConns == 0 || cs.Continued+ss.Continued != 0 {
				t.Fatalf("moved %d/%d, continued %d/%d", cs.MovedConns, ss.MovedConns, cs.Continued, ss.Continued)
			}
			if cs.DeleteLinks+ss.DeleteLinks == 0 {
				t.Errorf("no DELETE_LINK seen")
			}
			for _, c := range conns {
				c[0].Close()
				c[1].Close()
			}
			// Released first: one still closing when the last link goes would
			// continue over TCP too, and the count below is of the new ones.
			eventually(t, "closed connections released", func() bool { return len(cli.Conns()) == 0 && len(srv.Conns()) == 0 })
			conns = [][2]*Conn{connect(), connect()}
			streamPairs(t, conns, 16<<20, 400, func() {
				base := srv.Stats().RxBytes
				eventually(t, "streams under way", func() bool { return srv.Stats().RxBytes > base+8<<20 })
				sb2.Close()
			})
			if n := cli.Stats().Continued + srv.Stats().Continued; n != 4 {
				t.Errorf("continued %d connections over tcp, want 4", n)
			}
			for _, c := range conns {
				c[0].Close()
				c[1].Close()
			}
		})
	}
}

// TestSecondLinkNeedsBothEnds: a second device on one end only adds no link, and
// the one link carries the connections.
func TestSecondLinkNeedsBothEnds(t *testing.T) {
	for _, srvTwo := range []bool{true, false} {
		c1, c2, s1, s2 := fourDevices(t)
		cli, srv := Config{Devices: []verbs.Device{c1, c2}}, Config{Devices: []verbs.Device{s1}}
		if srvTwo {
			cli, srv = Config{Devices: []verbs.Device{c1}}, Config{Devices: []verbs.Device{s1, s2}}
		}
		p := newPair(t, cli, srv)
		c, s := p.connect(t)
		mustSMC(t, c, s)
		echoOK(t, c, s)
		eventually(t, "the server's try to add a link", func() bool { return p.srv.addLinkTries.Load() > 0 })
		for _, e := range []*Engine{p.cli, p.srv} {
			if l, _ := linkCounts(e); len(l) != 1 || l[0] != 1 || e.Stats().AddLinks != 0 {
				t.Fatalf("server with two devices %v: links %v, add links %d", srvTwo, l, e.Stats().AddLinks)
			}
		}
	}
}

// TestFailoverManyConns moves 20 busy connections at once.
func TestFailoverManyConns(t *testing.T) {
	c1, c2, s1, s2 := fourDevices(t)
	cfg := func(d ...verbs.Device) Config {
		return Config{Devices: d, RMBSize: 16 << 10, TestLinkInterval: -1}
	}
	p := newPair(t, cfg(c1, c2), cfg(s1, s2))
	// Each moved connection's validation must name a CDC the sender really sent
	// and its receiver got (Linux's smc_cdc_msg_validate aborts the connection
	// on a number it never saw), not a fresh number. Checked once all CDCs are
	// in: a validation over the surviving link can overtake the failed link's
	// last CDCs in the receiver's other poller, and is then checked too early.
	var mu sync.Mutex
	type sent struct {
		c   *Conn
		seq uint16
	}
	var validations []sent
	got := map[sent]bool{}
	hook := func(c *Conn, m *rmb.CDC) {
		mu.Lock()
		defer mu.Unlock()
		if m.Flags&rmb.FlagFailoverValidation != 0 {
			validations = append(validations, sent{c, m.Seq})
		} else {
			got[sent{c, m.Seq}] = true
		}
	}
	testHookCDC.Store(&hook)
	t.Cleanup(func() { testHookCDC.Store(nil) })
	c, s := p.connect(t)
	conns := [][2]*Conn{{c, s}}
	eventually(t, "two links", func() bool { return twoLinks(p.cli) && twoLinks(p.srv) })
	conns = append(conns, p.connectSMC(t, 39)...)
	var onFailed int
	streamPairs(t, conns, 1<<20, 500, func() {
		eventually(t, "streams under way", func() bool { return p.cli.Stats().RxBytes > 2<<20 })
		_, per := linkCounts(p.cli)
		onFailed = per[0][1]
		c2.Fail() // the client's second device this time
	})
	if a, b := p.cli.Stats().MovedConns, p.srv.Stats().MovedConns; a != uint64(onFailed) || b != a || a < 15 {
		t.Errorf("moved %d connections (client) and %d (server), want the %d of the failed link", a, b, onFailed)
	}
	if n := p.cli.Stats().Continued + p.srv.Stats().Continued; n != 0 {
		t.Errorf("%d connections continued over tcp", n)
	}
	moved := int(p.cli.Stats().MovedConns + p.srv.Stats().MovedConns)
	eventually(t, "validations received", func() bool { mu.Lock(); defer mu.Unlock(); return len(validations) == moved })
	mu.Lock()
	unseen := 0
	for _, v := range validations {
		if v.seq != 0 && !got[v] { // 0: no CDC of the sender had completed
			unseen++
		}
	}
	mu.Unlock()
	if unseen != 0 {
		t.Errorf("%d of %d failover validations named a CDC their receiver never got", unseen, moved)
	}
	p.closeAll(t, conns)
}

// TestSecondLinkReadded: after one of two links failed, the server adds a link
// again (LinkRetry) with a fresh link number, over the device that failed; the
// connections that moved off the failed link, and their RMBs' rkeys on the new
// link, survive the failure of the other link in turn, with every byte once
// and no continuation over TCP.
func TestSecondLinkReadded(t *testing.T) {
	c1, c2, s1, s2 := fourDevices(t)
	cfg := func(d ...verbs.Device) Config {
		return Config{Devices: d, RMBSize: 32 << 10, LinkRetry: 20 * time.Millisecond}
	}
	p := newPair(t, cfg(c1, c2), cfg(s1, s2))
	// Two sets on both links: the first streams through the first failure, the
	// second through the second.
	var first, second [][2]*Conn
	for i := range 8 {
		c, s := p.connect(t)
		mustSMC(t, c, s)
		if i%2 == 0 {
			first = append(first, [2]*Conn{c, s})
		} else {
			second = append(second, [2]*Conn{c, s})
		}
		eventually(t, "two links on both ends", func() bool { return twoLinks(p.cli) && twoLinks(p.srv) })
	}
	linkNums := func(e *Engine) []uint8 {
		var nums []uint8
		for _, lg := range e.LinkGroups() {
			for _, l := range lg.Links {
				nums = append(nums, l.Num)
			}
		}
		return nums
	}
	streamPairs(t, first, 4<<20, 300, func() {
		eventually(t, "streams under way", func() bool { return p.cli.Stats().RxBytes > 2<<20 })
		s1.Fail()
		eventually(t, "a link added again on both ends", func() bool {
			return p.srv.Stats().AddLinks == 2 && p.cli.Stats().AddLinks == 2 && twoLinks(p.cli) && twoLinks(p.srv)
		})
	})
	if got := linkNums(p.srv); len(got) != 2 || got[0] == 1 || got[1] == 1 {
		t.Fatalf("server links %v: want two, link 1 (failed) not among them", got)
	}
	// Every connection now runs on link 2 (they moved); fail it: they move to
	// the added link, whose rkeys for their RMBs came with ADD_LINK_CONT. Its
	// port goes down with it, so no link is added back over it while the test
	// looks for the one left.
	streamPairs(t, second, 4<<20, 400, func() {
		base := p.srv.Stats().RxBytes
		eventually(t, "streams under way", func() bool { return p.srv.Stats().RxBytes > base+2<<20 })
		s2.SetPortUp(false)
		s2.Fail()
		eventually(t, "one link left", func() bool { return oneLink(p.cli) && oneLink(p.srv) })
	})
	if n := p.cli.Stats().Continued + p.srv.Stats().Continued; n != 0 {
		t.Errorf("%d connections continued over tcp with a link left", n)
	}
	// Each set had connections on each link, and the second set moved twice.
	if cs, ss := p.cli.Stats(), p.srv.Stats(); cs.MovedConns < uint64(len(second)) || ss.MovedConns < uint64(len(second)) {
		t.Errorf("moved connections: client %d, server %d; want at least %d each", cs.MovedConns, ss.MovedConns, len(second))
	}
	p.closeAll(t, append(first, second...))
}

// TestPortDownFailsLink: a device whose port goes down fails its link by
// itself, though the device still carries, as Linux's smcr_port_err on
// IB_EVENT_PORT_ERR: at once on the device's port event (verbs.PortNotifier;
// the poll is an hour away), or within the engine's port poll when no event
// comes. The connections move to the other link and carry on, on both ends.
func TestPortDownFailsLink(t *testing.T) {
	for _, events := range []bool{true, false} {
		t.Run(map[bool]string{true: "event", false: "polled"}[events], func(t *testing.T) {
			c1, c2, s1, s2 := fourDevices(t)
			cfg := func(d ...verbs.Device) Config {
				c := Config{Devices: d}
				if events {
					c.portPoll = time.Hour
				}
				return c
			}
			c2.SetPortEvents(events)
			p := newPair(t, cfg(c1, c2), cfg(s1, s2))
			pairs := p.connectSMC(t, 4)
			eventually(t, "two links on both ends", func() bool { return twoLinks(p.cli) && twoLinks(p.srv) })
			start := time.Now()
			c2.SetPortUp(false)
			eventually(t, "one link left on both ends", func() bool { return oneLink(p.cli) && oneLink(p.srv) })
			if d := time.Since(start); !events && d > 5*portPoll {
				t.Errorf("the link failed %v after its port went down, want within a few port polls (%v)", d, portPoll)
			}
			for _, cs := range pairs {
				echoCheck(t, cs[0], cs[1])
			}
			if st := p.cli.Stats(); st.Continued != 0 {
				t.Errorf("%d connections continued over TCP, want them moved to the other link", st.Continued)
			}
			for _, cs := range pairs {
				cs[0].Close()
				cs[1].Close()
			}
		})
	}
}

// TestSecondLinkPortDown: a link is added again only once the ports on both ends
// are up (verbs.PortStater), as Linux waits for a port event: while the server's
// port is down it does not try, while the client's is down the client rejects.
func TestSecondLinkPortDown(t *testing.T) {
	c1, c2, s1, s2 := fourDevices(t)
	cfg := func(d ...verbs.Device) Config {
		return Config{Devices: d, LinkRetry: 10 * time.Millisecond}
	}
	p := newPair(t, cfg(c1, c2), cfg(s1, s2))
	c, s := p.connect(t)
	mustSMC(t, c, s)
	bothTwo := func() bool { return twoLinks(p.cli) && twoLinks(p.srv) }
	eventually(t, "two links on both ends", bothTwo)
	oneLeft := func() bool { return oneLink(p.cli) && oneLink(p.srv) }
	for i, down := range []*memverbs.Device{s1, c1} {
		down.SetPortUp(false)
		s1.Fail() // whichever device is down, the link over s1 and c1 goes
		eventually(t, "one link left", oneLeft)
		tries := p.srv.addLinkTries.Load()
		eventually(t, "three more tries", func() bool { return p.srv.addLinkTries.Load() >= tries+3 })
		if !oneLeft() || p.srv.Stats().AddLinks != uint64(1+i) {
			t.Fatalf("%s down: links added %d, want %d", down.Name(), p.srv.Stats().AddLinks, 1+i)
		}
		down.SetPortUp(true)
		eventually(t, "the link added again", bothTwo)
	}
	echoCheck(t, c, s)
	c.Close()
	s.Close()
}

// TestReusedRMBFailsOver: connections that got pooled RMBs, announced by the
// connections before them with their rkeys on both links and not again, move
// to the other link when theirs fails: the peer's entry for each RMB, kept
// since, names it there. Every byte arrives once.
func TestReusedRMBFailsOver(t *testing.T) {
	c1, c2, s1, s2 := fourDevices(t)
	cfg := func(d ...verbs.Device) Config { return Config{Devices: d, RMBSize: 32 << 10} }
	p := newPair(t, cfg(c1, c2), cfg(s1, s2))
	keep, ks := p.connect(t)
	mustSMC(t, keep, ks)
	eventually(t, "two links on both ends", func() bool { return twoLinks(p.cli) && twoLinks(p.srv) })
	const n = 6
	before := p.connectSMC(t, n)
	for _, cs := range before {
		cs[0].Close()
		cs[1].Close()
	}
	eventually(t, "buffers pooled", func() bool {
		const all = n * 2 * 32 << 10 // an RMB and a send buffer each
		return p.cli.Stats().MemoryPooled == all && p.srv.Stats().MemoryPooled == all
	})
	var conns [][2]*Conn
	unannounced := [2]int{}
	for range n {
		c, s := p.connect(t)
		mustSMC(t, c, s)
		conns = append(conns, [2]*Conn{c, s})
		for i, x := range []*Conn{c, s} {
			if x.rmbPooled && x.rkeyAnnounced == nil {
				unannounced[i]++
			}
		}
	}
	if unannounced[0] == 0 || unannounced[1] == 0 {
		t.Fatalf("connections on unannounced pooled RMBs (client, server) %v: want some on each end", unannounced)
	}
	streamPairs(t, conns, 2<<20, 500, func() {
		eventually(t, "streams under way", func() bool { return p.cli.Stats().RxBytes > 1<<20 })
		s1.Fail()
		eventually(t, "one link left", func() bool { return oneLink(p.cli) && oneLink(p.srv) })
	})
	if n := p.cli.Stats().Continued + p.srv.Stats().Continued; n != 0 {
		t.Errorf("%d connections continued over tcp with a link left", n)
	}
	if p.cli.Stats().MovedConns == 0 || p.srv.Stats().MovedConns == 0 {
		t.Error("no connection moved")
	}
	p.closeAll(t, append(conns, [2]*Conn{keep, ks}))
}

// twoLinkConn is a pair of engines with two devices each, and a connection on
// the link group once its second link is up.
func twoLinkConn(t *testing.T) (*pair, *Conn, *Conn) {
	c1, c2, s1, s2 := fourDevices(t)
	cfg := func(d ...verbs.Device) Config {
		return Config{Devices: d, RMBSize: 16 << 10, TestLinkInterval: -1}
	}
	p := newPair(t, cfg(c1, c2), cfg(s1, s2))
	c, s := p.connect(t)
	mustSMC(t, c, s)
	eventually(t, "two links on both ends", func() bool { return twoLinks(p.cli) && twoLinks(p.srv) })
	return p, c, s
}

// TestGIDGoneFailsLink: a link whose local address went (an interface's
// address changed, and the RDMA port's GID with it) fails at once, not when
// TEST_LINK (off here) or the transport's retries give up: its connections
// move to the group's other link, or continue over TCP with none left.
func TestGIDGoneFailsLink(t *testing.T) {
	newGID := [16]byte{0xfe, 0x80, 15: 0x99}
	t.Run("two links", func(t *testing.T) {
		p, c, s := twoLinkConn(t)
		c.mu.Lock()
		dev := c.lnk.dev.(*memverbs.Device)
		c.mu.Unlock()
		dev.ChangeGID(newGID)
		eventually(t, "the link on the address that went failed", func() bool { return oneLink(p.cli) })
		eventually(t, "the connection moved", func() bool { return p.cli.Stats().MovedConns == 1 })
		c.mu.Lock()
		left := c.lnk.dev
		c.mu.Unlock()
		if left == verbs.Device(dev) {
			t.Fatal("the connection stayed on the link whose address went")
		}
		stream(t, c, s, 1<<20, 11)
		stream(t, s, c, 1<<20, 12)
		p.closeAll(t, [][2]*Conn{{c, s}})
	})
	t.Run("last link", func(t *testing.T) {
		_, c, s, dev := singleLinkPair(t, func(cfg *Config) { cfg.TestLinkInterval = -1 })
		dev.ChangeGID(newGID)
		eventually(t, "the connection continued over TCP", func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.cont.fo
		})
		echoN(t, c, s, 1000)
		echoN(t, s, c, 1000)
	})
}

// echoN writes n bytes on w and reads them on r.
func echoN(t *testing.T, w, r *Conn, n int) {
	t.Helper()
	msg := randomBytes(uint64(n), n)
	if _, err := w.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	r.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("read %d of %d bytes: %v", len(got), n, err)
	}
}

// TestChainFailsPartWay: a chunk's post that fails part way (its first
// requests posted, as a full send queue fails ibv_post_send) fails the link; the
// connection moves to the group's other link, the peer reads every byte once,
// and the WRITEs that went are accounted for (the release waits for them).
func TestChainFailsPartWay(t *testing.T) {
	for _, tc := range []struct {
		name string
		wrap bool // the chunk wraps the ring: two WRITEs
		at   int  // the request that fails
	}{
		{"cdc", false, 1},         // WRITE | CDC
		{"second write", true, 1}, // WRITE | WRITE, CDC
		{"wrapped cdc", true, 2},  // WRITE, WRITE | CDC
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, c, s := twoLinkConn(t)
			c.mu.Lock()
			size, dev := int(c.tx.Size()), c.lnk.dev.(*memverbs.Device)
			c.mu.Unlock()
			if tc.wrap { // the producer cursor 100 bytes before the ring's end
				echoN(t, c, s, size-100)
				eventually(t, "the ring free", func() bool { // one chunk of 300 bytes
					c.mu.Lock()
					defer c.mu.Unlock()
					return c.tx.InFlight() == 0
				})
			}
			dev.FailChainAt(tc.at)
			echoN(t, c, s, 300)
			eventually(t, "the connection moved: the chain failed", func() bool { return p.cli.Stats().MovedConns == 1 })
			eventually(t, "the posted WRITEs accounted for", func() bool { return c.wrOut.Load() == 0 })
			stream(t, c, s, 1<<20, 4)
			stream(t, s, c, 1<<20, 5)
			p.closeAll(t, [][2]*Conn{{c, s}})
			if n := p.srv.Stats().ProtoErrors; n != 0 {
				t.Errorf("%d protocol errors at the peer", n)
			}
		})
	}
}

// TestMoveChainFailsPartWay: a move posts its resend's WRITE and the failover
// validation as one chain on the surviving link. When that chain fails after
// the WRITE, the surviving link fails too, and the connection, with no link
// left, continues over TCP: the peer reads every byte once, and the WRITE that
// went is accounted for.
func TestMoveChainFailsPartWay(t *testing.T) {
	p, c, s := twoLinkConn(t)
	c.mu.Lock()
	old := c.lnk.dev.(*memverbs.Device)
	c.mu.Unlock()
	var nw *memverbs.Device
	for _, d := range p.cli.cfg.Devices {
		if d != verbs.Device(old) {
			nw = d.(*memverbs.Device)
		}
	}
	// What c sends on old is lost with no completion, so its last CDC is not
	// known to have arrived and the move resends its bytes.
	old.SetCarry(false)
	msg := randomBytes(21, 3000)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	resend := c.tx.Pos() - max(c.tx.PeerConsumerPos(), c.move.txAcked.Load())
	c.mu.Unlock()
	if resend != uint64(len(msg)) {
		t.Fatalf("%d bytes to resend, want %d", resend, len(msg))
	}
	nw.FailChainAt(1) // WRITE | validation
	old.Fail()
	eventually(t, "the connection continued over TCP", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.cont.fo
	})
	eventually(t, "the posted WRITE accounted for", func() bool { return c.wrOut.Load() == 0 })
	got := make([]byte, len(msg))
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("the peer read %q..., %v; want the bytes written before the move", got[:16], err)
	}
	stream(t, c, s, 1<<20, 22)
	stream(t, s, c, 1<<20, 23)
	p.closeAll(t, [][2]*Conn{{c, s}})
}

// TestCloseDuringMove: a connection closed while it moves to the surviving link
// keeps its send buffer until the resend from it is posted, and sends its
// closing CDC after the resent bytes (after it, the peer may let its RMB go).
func TestCloseDuringMove(t *testing.T) {
	p, c, s := twoLinkConn(t)
	if _, err := c.Write([]byte("not yet read by the server: resent on the move")); err != nil {
		t.Fatal(err)
	}
	w := &closeWithin{c: c, s: s} // the move's resend reads the send buffer
	w.install(t)
	c.lnk.dev.(*memverbs.Device).Fail()
	eventually(t, "one link left", func() bool { return oneLink(p.cli) })
	eventually(t, "moved", func() bool { return p.cli.Stats().MovedConns == 1 })
	if w.released {
		t.Error("send buffer released while the move resent from it")
	}
	if w.returned {
		t.Error("Close sent its closing CDC before the move's resend")
	}
	eventually(t, "released after the move", w.isReleased)
}

// TestValidationFencesOldLink: a peer's failover validation for a connection on
// the other link closes the link the connection was on for us, before the
// cursors that follow, and our side moves too: nothing more may land over it.
func TestValidationFencesOldLink(t *testing.T) {
	p, c, s := twoLinkConn(t)
	c.mu.Lock()
	old, seq := c.lnk, c.rxSeq
	c.mu.Unlock()
	var other *link // the server's end of the link c is not on
	s.lg.mu.RLock()
	for _, l := range s.lg.links {
		if l.num != old.num {
			other = l
		}
	}
	s.lg.mu.RUnlock()
	if err := other.sendCDC(&rmb.CDC{Seq: seq, Token: c.token, Flags: rmb.FlagFailoverValidation}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "old link closed", old.down.Load)
	eventually(t, "one link left on both ends", func() bool { return oneLink(p.cli) && oneLink(p.srv) })
	// linkFailed takes the link out of the group before it moves the link's
	// connections, so the move may come after the count drops.
	eventually(t, "connection moved off the closed link", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.lnk != old
	})
	echoOK(t, c, s)
}

// heldSlots counts the link slots e's link groups hold: live links, links being
// added, and gone links whose protection domains still hold buffers.
func heldSlots(e *Engine) int {
	e.mu.Lock()
	lgs := slices.Clone(e.lgs)
	e.mu.Unlock()
	n := 0
	for _, lg := range lgs {
		lg.mu.RLock()
		for _, l := range lg.slots {
			if l != nil {
				n++
			}
		}
		lg.mu.RUnlock()
	}
	return n
}

// failSecond fails the second link's server device for the nth time and waits
// until both ends added the link again.
func (p *pair) failSecond(t *testing.T, s2 *memverbs.Device, n int) {
	t.Helper()
	s2.Fail()
	eventually(t, fmt.Sprintf("link added again after failure %d", n), func() bool {
		want := uint64(n + 1)
		return p.srv.Stats().AddLinks == want && p.cli.Stats().AddLinks == want && twoLinks(p.cli) && twoLinks(p.srv)
	})
}

// TestLinkFlaps: the second link fails and is added again, more times than a
// group has link slots (and than the 8 link numbers a group once had for its
// whole life, after which it stayed on one link). Each round a short
// connection opens, perhaps on the newest link, and closes; the long ones
// carry on across every failure, and a gone link's slot comes back once
// nothing is registered on it.
func TestLinkFlaps(t *testing.T) {
	c1, c2, s1, s2 := fourDevices(t)
	cfg := func(d ...verbs.Device) Config {
		return Config{Devices: d, RMBSize: 32 << 10, LinkRetry: 20 * time.Millisecond}
	}
	p := newPair(t, cfg(c1, c2), cfg(s1, s2))
	var long [][2]*Conn
	for range 4 {
		c, s := p.connect(t)
		mustSMC(t, c, s)
		long = append(long, [2]*Conn{c, s})
		eventually(t, "two links on both ends", func() bool { return twoLinks(p.cli) && twoLinks(p.srv) })
	}
	const flaps = 2*linkSlots + 4
	for i := range flaps {
		c, s := p.connect(t)
		mustSMC(t, c, s)
		echoOK(t, c, s)
		c.Close()
		s.Close()
		p.failSecond(t, s2, i+1)
		for _, cs := range long {
			echoOK(t, cs[0], cs[1])
		}
	}
	if n := p.cli.Stats().Continued + p.srv.Stats().Continued; n != 0 {
		t.Errorf("%d connections continued over tcp with a link left", n)
	}
	// The two live links': the first second link's slot went with it, though
	// the long connections started there keep their buffers.
	for _, e := range []*Engine{p.cli, p.srv} {
		eventually(t, "slots given back", func() bool { return heldSlots(e) == 2 })
	}
	p.closeAll(t, long)
	for _, e := range []*Engine{p.cli, p.srv} {
		eventually(t, "slots given back", func() bool { return heldSlots(e) == 2 })
		// The pool's buffers, and nothing else, hold memory: the failed links'
		// pooled buffers were freed once, and their memory given back once.
		e.mu.Lock()
		pool := 0
		for _, lg := range e.lgs {
			lg.mu.RLock()
			for _, b := range lg.pool {
				pool += int(b.size)
			}
			lg.mu.RUnlock()
		}
		e.mu.Unlock()
		if st := e.Stats(); st.MemoryPooled != int64(pool) || e.mem.Load() != int64(pool) {
			t.Errorf("pool holds %d bytes; stats say %d pooled, %d reserved", pool, st.MemoryPooled, e.mem.Load())
		}
	}
}

// TestFlapsUnderLongConnections: every round opens connections on both links
// and keeps them open, then fails the second link. Those that started there
// move to the first with their buffers, which stay in the failed link's
// protection domain until they end; the failed link's slot is free at once,
// so the link comes back every round (when a buffer held its slot, the
// seventh round stopped the re-adds for the group's life).
func TestFlapsUnderLongConnections(t *testing.T) {
	c1, c2, s1, s2 := fourDevices(t)
	cfg := func(d ...verbs.Device) Config {
		return Config{Devices: d, RMBSize: 32 << 10, LinkRetry: 20 * time.Millisecond}
	}
	p := newPair(t, cfg(c1, c2), cfg(s1, s2))
	first, firstSrv := p.connect(t)
	first.mu.Lock()
	firstLink := first.lnk
	first.mu.Unlock()
	p.cli.mu.Lock()
	lg := p.cli.lgs[0]
	p.cli.mu.Unlock()
	var conns [][2]*Conn
	const flaps = linkSlots + 4
	for i := range flaps {
		eventually(t, "two links on both ends", func() bool { return twoLinks(p.cli) && twoLinks(p.srv) })
		onSecond := 0
		for range 2 { // round robin: one on each link
			c, s := p.connect(t)
			mustSMC(t, c, s)
			conns = append(conns, [2]*Conn{c, s})
			c.mu.Lock()
			if c.lnk != firstLink && c.move.rmbHome == c.lnk && c.move.sndHome == c.lnk {
				onSecond++
			}
			c.mu.Unlock()
		}
		if onSecond != 1 {
			t.Fatalf("round %d: %d of 2 new connections on the second link", i+1, onSecond)
		}
		p.failSecond(t, s2, i+1)
		for _, cs := range conns {
			echoOK(t, cs[0], cs[1])
		}
	}
	for _, e := range []*Engine{p.cli, p.srv} {
		eventually(t, "only the live links hold slots", func() bool { return heldSlots(e) == 2 })
	}
	// The moved connections still use the buffers allocated on failed links.
	moved := 0
	lg.mu.RLock()
	live := slices.Clone(lg.links)
	lg.mu.RUnlock()
	for _, cs := range conns {
		c := cs[0]
		c.mu.Lock()
		if !slices.Contains(live, c.move.rmbHome) && c.move.rmbOn[c.lnk.ix] != nil {
			moved++
		}
		c.mu.Unlock()
	}
	if moved != flaps {
		t.Errorf("%d moved connections keep a buffer from a failed link, want %d", moved, flaps)
	}
	streamPairs(t, conns[len(conns)-4:], 256<<10, 7, func() {})
	conns = append(conns, [2]*Conn{first, firstSrv})
	p.closeAll(t, conns)
	for _, e := range []*Engine{p.cli, p.srv} {
		eventually(t, "slots given back", func() bool { return heldSlots(e) == 2 })
	}
}

// TestReaddOnDeadPath: the second path connects but carries nothing (an
// adapter whose peer's port is dead), so every try to add the link again
// fails. The tries go on, and connection setups that announce a new RMB
// meanwhile do not wait for them: the server tests the new link before it
// takes the flow lock (before, each try held it until CONFIRM_LINK timed
// out). Once the path carries again the link comes back.
func TestReaddOnDeadPath(t *testing.T) {
	c1, c2, s1, s2 := fourDevices(t)
	const llcTimeout = 200 * time.Millisecond
	cfg := func(d ...verbs.Device) Config {
		return Config{Devices: d, RMBSize: 32 << 10, LinkRetry: 10 * time.Millisecond, LLCTimeout: llcTimeout}
	}
	p := newPair(t, cfg(c1, c2), cfg(s1, s2))
	c, s := p.connect(t)
	mustSMC(t, c, s)
	conns := [][2]*Conn{{c, s}}
	eventually(t, "two links on both ends", func() bool { return twoLinks(p.cli) && twoLinks(p.srv) })
	lastNum := func() uint8 {
		p.srv.mu.Lock()
		lg := p.srv.lgs[0]
		p.srv.mu.Unlock()
		lg.mu.RLock()
		defer lg.mu.RUnlock()
		return lg.lastNum
	}
	s2.SetCarry(false)
	c2.SetCarry(false)
	s2.Fail()
	eventually(t, "one link left", func() bool { return oneLink(p.cli) && oneLink(p.srv) })
	first := lastNum()
	// The connections stay open, so each takes a new RMB and announces it,
	// until the server has tried to add the link twice.
	var slowest time.Duration
	for end := time.Now().Add(waitLimit); lastNum()-first < 2; time.Sleep(10 * time.Millisecond) { // the sleep paces the dials
		if time.Now().After(end) {
			t.Fatalf("%d tries to add the link again in %v", lastNum()-first, waitLimit)
		}
		start := time.Now()
		c, s := p.connect(t)
		mustSMC(t, c, s)
		slowest = max(slowest, time.Since(start))
		conns = append(conns, [2]*Conn{c, s})
	}
	if slowest >= llcTimeout {
		t.Errorf("a setup took %v while the link was being added (LLC timeout %v)", slowest, llcTimeout)
	}
	s2.SetCarry(true)
	c2.SetCarry(true)
	eventually(t, "the link back on both ends", func() bool { return twoLinks(p.cli) && twoLinks(p.srv) })
	for _, cs := range conns {
		echoOK(t, cs[0], cs[1])
	}
	p.closeAll(t, conns)
}

// TestFreshLinkNum: the server's link numbers follow the last it took, wrap from
// 255 to 1, and skip numbers of links the group holds.
func TestFreshLinkNum(t *testing.T) {
	lg := &linkGroup{peerRMBs: newPeerRMBTable(), lastNum: 253}
	for _, n := range []uint8{1, 255} {
		if err := lg.takeSlot(&link{lg: lg, num: n}); err != nil {
			t.Fatal(err)
		}
	}
	var got []uint8
	for range 3 {
		got = append(got, lg.freshLinkNum())
	}
	if want := []uint8{254, 2, 3}; !slices.Equal(got, want) {
		t.Errorf("numbers %v, want %v", got, want)
	}
	if lg.numFree(1) || lg.numFree(0) || !lg.numFree(2) {
		t.Errorf("numFree: 1 and 0 are not free, 2 is")
	}
}

// TestSetupLinkFailsDuringRKeyWait: a connection placed on the second link waits,
// at the client, for the server's CONFIRM_RKEY over that link; the link fails
// and the request with it. The client declines at once and the connection is
// plain TCP, rather than waiting out the LLC timeout while the group lives on
// over its first link.
func TestSetupLinkFailsDuringRKeyWait(t *testing.T) {
	c1, c2, s1, s2 := fourDevices(t)
	const llcTimeout = 3 * time.Second
	cfg := func(d ...verbs.Device) Config {
		return Config{Devices: d, RMBSize: 32 << 10, LinkRetry: -1, LLCTimeout: llcTimeout}
	}
	p := newPair(t, cfg(c1, c2), cfg(s1, s2))
	c, _ := p.connect(t) // kept open, as the ones below: each setup takes a new RMB
	p.echoAll()
	eventually(t, "two links on both ends", func() bool { return twoLinks(p.cli) && twoLinks(p.srv) })
	s2.SetCarry(false) // the server's CONFIRM_RKEY on link 2 is lost
	defer c.Close()
	for range 4 { // the server places setups on its links in turn
		type dialed struct {
			c   *Conn
			err error
		}
		done := make(chan dialed, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*llcTimeout)
			defer cancel()
			nc, err := p.cli.Dial(ctx, "tcp", p.ln.Addr().String())
			if err != nil {
				done <- dialed{nil, err}
				return
			}
			done <- dialed{nc, nil}
		}()
		select {
		case d := <-done: // on link 1
			if d.err != nil {
				t.Fatal(d.err)
			}
			mustSMC(t, d.c)
			defer d.c.Close()
			continue
		case <-time.After(300 * time.Millisecond): // waiting for the rkey over link 2
		}
		start := time.Now()
		c2.Fail()
		d := within(t, done, "the transfer")
		if d.err != nil {
			t.Fatal(d.err)
		}
		defer d.c.Close()
		if took := time.Since(start); took > llcTimeout/3 {
			t.Errorf("the setup ended %v after its link failed (LLC timeout %v)", took, llcTimeout)
		}
		if d.c.Mode() != ModeFallback {
			t.Fatalf("connection is %v after its link failed in setup", d.c.Mode())
		}
		t.Logf("fell back: %v", d.c.Decline())
		msg := []byte("still carried, over tcp")
		if _, err := d.c.Write(msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(d.c, got); err != nil || string(got) != string(msg) {
			t.Fatalf("echo over the fallback: %q, %v", got, err)
		}
		return
	}
	t.Fatal("no setup waited for an rkey over link 2")
}

// TestLinkGroupTotalsAfterFailover: a group that lost a link still counts
// what that link moved (its totals only grow, as the metrics' counters must),
// and says it has had two links, so a path lost shows as 1 of 2.
func TestLinkGroupTotalsAfterFailover(t *testing.T) {
	c1, c2, s1, s2 := fourDevices(t)
	cfg := func(d ...verbs.Device) Config { return Config{Devices: d, RMBSize: 16 << 10, TestLinkInterval: -1} }
	p := newPair(t, cfg(c1, c2), cfg(s1, s2))
	conns := p.connectSMC(t, 6)
	eventually(t, "two links", func() bool { return twoLinks(p.cli) && twoLinks(p.srv) })
	streamPairs(t, conns, 4<<20, 7, func() {})
	before := p.srv.LinkGroups()[0]
	s1.Fail()
	eventually(t, "one link left", func() bool { return oneLink(p.srv) })
	after := p.srv.LinkGroups()[0]
	if after.TxBytes < before.TxBytes || after.RxBytes < before.RxBytes || after.Sent < before.Sent || after.Received < before.Received {
		t.Errorf("totals went back: before %+v, after %+v", before, after)
	}
	var linkSum uint64
	for _, l := range before.Links {
		linkSum += l.TxBytes
	}
	if before.TxBytes != linkSum || before.TxBytes == 0 {
		t.Errorf("before the failure the group's tx bytes %d, its links' %d", before.TxBytes, linkSum)
	}
	if len(after.Links) != 1 || after.MostLinks != 2 || before.MostLinks != 2 {
		t.Errorf("links %d of most %d after the failure (%d before); want 1 of 2", len(after.Links), after.MostLinks, before.MostLinks)
	}
	p.closeAll(t, conns)
}

// TestFirstLinkFailsDuringAddLink: the group's only live link fails while the
// client builds the second one (ADD_LINK). The group ends and its connection
// continues over TCP with its bytes; the half-built link and the server's are
// freed, and nothing is left on the devices once the connection closes.
func TestFirstLinkFailsDuringAddLink(t *testing.T) {
	c1, c2, s1, s2 := fourDevices(t)
	g := &gatedDevice{Device: c2, entered: make(chan struct{}), release: make(chan struct{})}
	cfg := func(d ...verbs.Device) Config { return Config{Devices: d, TestLinkInterval: -1} }
	p := newPair(t, cfg(c1, g), cfg(s1, s2))
	t.Cleanup(g.open)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	select {
	case <-g.entered: // the client answers ADD_LINK: its second link is being made
	case <-time.After(5 * time.Second):
		t.Fatal("no ADD_LINK")
	}
	c1.Fail()
	eventually(t, "continued", func() bool { return c.continued() && s.continued() })
	g.open()
	echoCheck(t, c, s)
	eventually(t, "no link group left", func() bool { return p.cli.Stats().LinkGroups == 0 && p.srv.Stats().LinkGroups == 0 })
	c.Close()
	s.Close()
	for _, d := range []*memverbs.Device{c1, c2, s1, s2} {
		eventually(t, d.Name()+" freed", func() bool { return d.Live() == memverbs.Resources{} })
	}
}

// TestMoveHoldsCDCsBehindResend: while a connection moves to the surviving
// link, a CDC of its own (here a Read's consumer update, which carries our
// producer cursor too) waits until the move's resend and validation are on
// the new link: ahead of them it would announce bytes the peer does not hold
// yet, and the peer would read what its RMB held before.
func TestMoveHoldsCDCsBehindResend(t *testing.T) {
	p, c, s := twoLinkConn(t)
	var moving atomic.Bool
	var mu sync.Mutex
	var first *rmb.ProdFlags // of the first CDC s receives once c moves
	copyHook := func(conn *Conn, rx bool) {
		if conn != c || rx || moving.Swap(true) {
			return
		}
		// In moveTo, c already on the new link, before the resend: the
		// CDC waits, or goes ahead of it.
		goBlocked(t, func() { c.sendCursors(0, cdcUpdate) })
	}
	cdcHook := func(conn *Conn, m *rmb.CDC) {
		mu.Lock()
		defer mu.Unlock()
		if conn == s && moving.Load() && first == nil {
			f := m.Flags
			first = &f
		}
	}
	testHookCopy.Store(&copyHook)
	testHookCDC.Store(&cdcHook)
	t.Cleanup(func() { testHookCopy.Store(nil); testHookCDC.Store(nil) })

	c.mu.Lock()
	dev := c.lnk.dev.(*memverbs.Device)
	c.mu.Unlock()
	dev.Fail()
	eventually(t, "the first CDC after the move", func() bool { mu.Lock(); defer mu.Unlock(); return first != nil })
	mu.Lock()
	f := *first
	mu.Unlock()
	if f&rmb.FlagFailoverValidation == 0 {
		t.Errorf("the peer's first CDC after the move has flags %v, want the failover validation first", f)
	}
	// And the connection still works both ways.
	testHookCopy.Store(nil)
	stream(t, c, s, 1<<20, 7)
	stream(t, s, c, 1<<20, 8)
	p.closeAll(t, [][2]*Conn{{c, s}})
}
