// End-to-end: unmodified programs exchange data through two smcrds over SMC-R
// (RFC 7609), checked by content hashes and by smcrd's own connection table and
// counters; a peer without smcrd, a port outside port_range_list, and smcrd
// killed on either side.

package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/smcr-io/smcr/control"
)

const ports = "port_range_list = 5200-5299"

// TestTransparent runs once per provider that can run here.
func TestTransparent(t *testing.T) {
	for _, p := range providers() {
		t.Run(p, func(t *testing.T) { testTransparent(t, p) })
	}
}

func testTransparent(t *testing.T, provider string) {
	a, b := hosts(t)
	a.start(append(a.providerConf(provider), ports)...)
	b.start(append(b.providerConf(provider), ports)...)
	b.serve(5201)
	a.serve(5201)

	// The static Go binary, many concurrent connections, both directions, IPv4
	// and IPv6, TCP and MPTCP sockets; each application sees the addresses it
	// would without smcrd: the server the client's, the client its own and the
	// server's.
	const conns, size = 12, 2 << 20
	cases := []struct {
		from, to *host
		addr     netip.Addr
		client   netip.Addr
		mptcp    bool
	}{
		{a, b, b.ns.Addr4(), a.ns.Addr4(), false},
		{b, a, a.ns.Addr4(), b.ns.Addr4(), false},
		{a, b, b.ns.Addr6(), a.ns.Addr6(), false},
		{a, b, b.ns.Addr4(), a.ns.Addr4(), true},
	}
	fromA := 0
	otherPort := map[*host]int{} // connections whose two applications saw different client ports
	for _, tc := range cases {
		dst := netip.AddrPortFrom(tc.addr, 5201).String()
		var mptcp []string
		if tc.mptcp {
			mptcp = []string{"-mptcp"}
		}
		if tc.from == a {
			fromA++
		}
		r, err := tc.from.client(dst, append(mptcp, "-mode", "sink", "-bytes", fmt.Sprint(size), "-conns", fmt.Sprint(conns))...)
		if err != nil || r.OK != conns {
			t.Fatalf("sink to %s (mptcp %v): %+v: %v", dst, tc.mptcp, r, err)
		}
		for _, p := range r.Peers {
			ap, err := netip.ParseAddrPort(p)
			if err != nil || ap.Addr().Unmap() != tc.client {
				t.Errorf("server application saw peer %s, want the client %s", p, tc.client)
			}
		}
		if len(r.Peers) != len(r.Local) {
			t.Fatalf("%d peers for %d connections", len(r.Peers), len(r.Local))
		}
		for i := range r.Local {
			local, lerr := netip.ParseAddrPort(r.Local[i])
			if r.Remote[i] != dst || lerr != nil || local.Addr() != tc.client {
				t.Errorf("client application (mptcp %v) saw itself at %s and the server at %s, want %s and %s",
					tc.mptcp, r.Local[i], r.Remote[i], tc.client, dst)
			}
			// Ports too: the two applications see one connection, unless
			// the client's port was taken on its interface's address (by
			// smcrd's own connection to a local server, say): smcrd then
			// connects from another port and logs it (otherPort below).
			peer, err := netip.ParseAddrPort(r.Peers[i])
			if err != nil || peer.Addr().Unmap() != local.Addr() {
				t.Errorf("client application (mptcp %v) saw itself at %s, the server application saw it at %s", tc.mptcp, r.Local[i], r.Peers[i])
			} else if peer.Port() != local.Port() {
				otherPort[tc.from]++
			}
		}
		r, err = tc.from.client(dst, append(mptcp, "-mode", "echo", "-bytes", fmt.Sprint(size/2), "-conns", fmt.Sprint(conns))...)
		if err != nil || r.OK != conns {
			t.Fatalf("echo to %s: %+v: %v", dst, r, err)
		}
	}
	for h, n := range otherPort {
		if logged := strings.Count(h.logText(), "connect from the application's port"); n > logged {
			t.Errorf("%s: %d connections from another port than the client application's, %d logged as taken", h.name, n, logged)
		}
	}
	// Every one of those went SMC-R, on both sides (each counts the client and the
	// server connections it carried), and the bytes went over it.
	wantSMC := uint64(len(cases) * 2 * conns)
	sa, sb := a.stats(), b.stats()
	if sa.Connections.SMCR != wantSMC || sb.Connections.SMCR != wantSMC {
		t.Errorf("SMC-R connections: A %d, B %d, want %d each (A fallbacks %+v, B %+v)",
			sa.Connections.SMCR, sb.Connections.SMCR, wantSMC, sa.Fallbacks, sb.Fallbacks)
	}
	if sa.Connections.Fallback+sb.Connections.Fallback != 0 {
		t.Errorf("fallbacks: A %+v, B %+v", sa.Fallbacks, sb.Fallbacks)
	}
	if min := uint64(fromA*conns*size + fromA*conns*size/2); sa.TX.Bytes < min || sb.RX.Bytes < min {
		t.Errorf("A sent %d bytes over SMC-R, B received %d; want at least %d", sa.TX.Bytes, sb.RX.Bytes, min)
	}

	// socat, from a Debian package, the other way round: B's client, A's server
	// that answers the sha256 of what it got.
	a.background("socat", "TCP-LISTEN:5203,fork,reuseaddr", "SYSTEM:sha256sum")
	a.waitListening(5203)
	data := make([]byte, 3<<20)
	rand.Read(data)
	sum := sha256.Sum256(data)
	cmd := b.command("socat", "-t", "20", "-T", "30", "-", fmt.Sprintf("TCP:%s:5203", a.ns.Addr4()))
	cmd.Stdin = bytes.NewReader(data)
	out, err := cmd.Output()
	if err != nil || !strings.HasPrefix(string(out), hex.EncodeToString(sum[:])) {
		t.Fatalf("socat: %v: got %q, want %x", err, out, sum)
	}

	// iperf3: while it runs, smcrd lists its connections as SMC-R with a link.
	b.background("iperf3", "-s", "-p", "5202")
	b.waitListening(5202)
	ip := a.command("iperf3", "-c", b.ns.Addr4().String(), "-p", "5202", "-t", "2", "-J")
	var ipOut bytes.Buffer
	ip.Stdout = &ipOut
	if err := ip.Start(); err != nil {
		t.Fatal(err)
	}
	var smcConns []control.Conn
	for range 40 {
		time.Sleep(50 * time.Millisecond)
		smcConns = smcConns[:0]
		for _, c := range a.conns() {
			if c.Mode == control.ModeSMCR && strings.HasSuffix(c.Remote, ":5202") {
				smcConns = append(smcConns, c)
			}
		}
		if len(smcConns) >= 2 { // iperf3's control and data connections
			break
		}
	}
	if err := ip.Wait(); err != nil {
		t.Fatalf("iperf3: %v\n%s", err, ipOut.String())
	}
	if len(smcConns) < 2 {
		t.Errorf("smcrd listed %d SMC-R connections to iperf3's port during the run, want 2: %+v", len(smcConns), a.conns())
	}
	links, err := a.ctl.Links(context.Background())
	if err != nil || len(links) == 0 {
		t.Errorf("links: %v %+v", err, links)
	}
	// The links ran over the provider under test and nothing else.
	devs, err := a.ctl.Devices(context.Background())
	if err != nil || len(devs) != 1 || devs[0].Provider != provider || devs[0].Links == 0 {
		t.Errorf("devices: %v %+v, want one %s device carrying the links", err, devs, provider)
	}
	var ipr struct {
		End struct {
			SumReceived struct {
				Bytes         int64   `json:"bytes"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(ipOut.Bytes(), &ipr); err != nil || ipr.End.SumReceived.Bytes == 0 {
		t.Fatalf("iperf3 output: %v\n%s", err, ipOut.String())
	}
	t.Logf("iperf3 through smcrd (%s): %.0f Mbit/s", provider, ipr.End.SumReceived.BitsPerSecond/1e6)
}

// TestTwoInterfaces: two veth pairs join the hosts and ip_addr_list names both.
// Each smcrd opens a device per interface, the link group gets its second link
// (ADD_LINK) and the connections spread over both links (RFC 7609 §3.3.1: a
// link group of two links for load balancing and failover), the bytes intact.
func TestTwoInterfaces(t *testing.T) {
	a, b := hosts(t)
	la, lb := a.pair.AddLink()
	a.start("providers = soft", ports, "ip_addr_list = "+a.ns.Links[0].Name+","+la.Name)
	b.start("providers = soft", ports, "ip_addr_list = "+b.ns.Links[0].Name+","+lb.Name)
	b.serve(5201)
	dst := fmt.Sprintf("%s:5201", b.ns.Addr4())

	// First contact makes the group; its second link follows.
	if r, err := a.client(dst, "-mode", "echo", "-bytes", "1000"); err != nil || r.OK != 1 {
		t.Fatalf("first connection: %+v %v", r, err)
	}
	active := func() []control.Link {
		var out []control.Link
		for _, l := range a.links() {
			if l.State == "active" {
				out = append(out, l)
			}
		}
		return out
	}
	for i := 0; len(active()) < 2; i++ {
		if i == 200 {
			t.Fatalf("links on A: %+v, want two active", a.links())
		}
		time.Sleep(25 * time.Millisecond)
	}
	const conns, size = 16, 1 << 20
	if r, err := a.client(dst, "-mode", "sink", "-bytes", fmt.Sprint(size), "-conns", fmt.Sprint(conns)); err != nil || r.OK != conns {
		t.Fatalf("sink over two links: %+v %v", r, err)
	}
	links := active()
	if len(links) != 2 || links[0].LinkGroup != links[1].LinkGroup {
		t.Fatalf("links on A: %+v, want two of one group", links)
	}
	for _, l := range links {
		if l.TX.Bytes == 0 || l.Interface == "" {
			t.Errorf("link %d on %q carried %d bytes: the connections did not spread", l.Num, l.Interface, l.TX.Bytes)
		}
	}
	if links[0].Interface == links[1].Interface {
		t.Errorf("both links on interface %s, want one per interface", links[0].Interface)
	}
	if st := a.stats(); st.Connections.Fallback != 0 {
		t.Errorf("fallbacks: %+v", st.Fallbacks)
	}

	// The second interface goes down mid-transfer: both smcrds see their port
	// down, fail that link and move its connections to the first; every byte
	// arrives (testapp checks each connection's hash).
	type result struct {
		r   appResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := a.client(dst, "-mode", "sink", "-bytes", fmt.Sprint(64<<20), "-conns", fmt.Sprint(conns))
		done <- result{r, err}
	}()
	for i := 0; a.stats().Connections.Active < conns; i++ {
		if i == 200 {
			t.Fatalf("transfers did not start: %+v", a.stats().Connections)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if out, err := a.ns.Command("ip", "link", "set", la.Name, "down").CombinedOutput(); err != nil {
		t.Fatalf("ip link set down: %v %s", err, out)
	}
	res := <-done
	if res.err != nil || res.r.OK != conns {
		t.Fatalf("sink while a link went down: %+v %v", res.r, res.err)
	}
	for _, h := range []*host{a, b} {
		if l := h.links(); len(l) != 1 || l[0].Interface == la.Name || l[0].Interface == lb.Name {
			t.Errorf("links on %s after the second interface went down: %+v, want the first only", h.name, l)
		}
	}
	devs, err := a.ctl.Devices(context.Background())
	if err != nil || len(devs) != 2 {
		t.Fatalf("devices on A: %+v %v", devs, err)
	}
	for _, d := range devs {
		if want := map[bool]string{true: "down", false: "active"}[d.Interface == la.Name]; d.State != want {
			t.Errorf("device %s on %s is %q, want %q", d.Name, d.Interface, d.State, want)
		}
	}
	sa, sb := a.stats(), b.stats()
	if sa.Connections.Fallback != 0 {
		t.Errorf("fallbacks after the failover: %+v", sa.Fallbacks)
	}
	if sa.Links.Added != 1 || sb.Links.Added != 1 {
		t.Errorf("links added: A %d, B %d; want 1 each", sa.Links.Added, sb.Links.Added)
	}
	if sa.Links.ConnsMoved+sb.Links.ConnsMoved == 0 || sa.Links.ConnsContinued+sb.Links.ConnsContinued != 0 {
		t.Errorf("link events A %+v, B %+v: want connections moved to the first link, none continued over TCP", sa.Links, sb.Links)
	}
}

// TestFallbackAndNegativeCache: the server host has no smcrd. The first
// connection is carried as plain TCP by the client's smcrd, the peer goes into
// the negative cache, and the next connections go direct.
func TestFallbackAndNegativeCache(t *testing.T) {
	a, b := hosts(t)
	a.start("providers = shm", ports)
	b.serve(5201)
	dst := fmt.Sprintf("%s:5201", b.ns.Addr4())
	r, err := a.client(dst, "-mode", "sink", "-bytes", "1000000")
	if err != nil {
		t.Fatalf("first connection: %v", err)
	}
	s := a.stats()
	if s.Connections.Handled != 1 || s.Connections.Fallback != 1 || s.Connections.SMCR != 0 {
		t.Fatalf("after the first connection: %+v", s.Connections)
	}
	peers, err := a.ctl.Peers(context.Background())
	if err != nil || len(peers) != 1 || peers[0].Addr != b.ns.Addr4().String() || peers[0].Port != 5201 || peers[0].Capable {
		t.Fatalf("peer cache: %v %+v, want %s not capable", err, peers, dst)
	}
	if ap, _ := netip.ParseAddrPort(r.Peers[0]); ap.Addr() != a.ns.Addr4() {
		t.Errorf("server saw %s, want %s", r.Peers[0], a.ns.Addr4())
	}
	r, err = a.client(dst, "-mode", "echo", "-bytes", "1000000", "-conns", "4")
	if err != nil || r.OK != 4 {
		t.Fatalf("later connections: %+v %v", r, err)
	}
	if s := a.stats(); s.Connections.Handled != 1 {
		t.Errorf("later connections went through smcrd: %+v", s.Connections)
	}

	// The programs keep the negative cache across a restart of smcrd, which
	// shows what it found there; forgetting the peer sends the next connection
	// through smcrd again.
	a.stop()
	a.start("providers = shm", ports)
	peers, err = a.ctl.Peers(context.Background())
	if err != nil || len(peers) != 1 || peers[0].Addr != b.ns.Addr4().String() || peers[0].Capable || peers[0].ExpiresInSeconds <= 0 {
		t.Fatalf("peer cache after a restart: %v %+v, want %s not capable", err, peers, b.ns.Addr4())
	}
	if _, err := a.client(dst, "-mode", "echo", "-bytes", "1000"); err != nil {
		t.Fatal(err)
	}
	if s := a.stats(); s.Connections.Handled != 0 {
		t.Errorf("after a restart, a connection to a peer in the negative cache went through smcrd: %+v", s.Connections)
	}
	if n, err := a.ctl.ForgetPeers(context.Background(), b.ns.Addr4().String()); err != nil || n != 1 {
		t.Fatalf("ForgetPeers: %d, %v; want 1", n, err)
	}
	if peers, err := a.ctl.Peers(context.Background()); err != nil || len(peers) != 0 {
		t.Errorf("peer cache after forgetting: %v %+v, want empty", err, peers)
	}
	if _, err := a.client(dst, "-mode", "echo", "-bytes", "1000"); err != nil {
		t.Fatal(err)
	}
	if s := a.stats(); s.Connections.Handled != 1 || s.Connections.Fallback != 1 {
		t.Errorf("after forgetting the peer, its connection did not try SMC-R: %+v", s.Connections)
	}
}

// TestSocketOptions: the options an application sets to mark its traffic
// (IP_TOS or IPV6_TCLASS, SO_PRIORITY) and keepalive go onto the wire with it,
// while its connection runs over SMC-R: on the client host, smcrd's connection to
// the server (the only one host A has to it) carries them, whether the
// application set them before its connect (testapp) or after (iperf3 -S); on the
// server host, the steered connection carries the class the application's
// accepted socket inherited from its listener. Keepalive is there only where the
// application asked for it (testapp, a Go program, does; iperf3 does not).
func TestSocketOptions(t *testing.T) {
	a, b := hosts(t)
	p := providers()[0]
	a.start(append(a.providerConf(p), ports)...)
	b.start(append(b.providerConf(p), ports)...)
	b.serve(5201)
	b.background("iperf3", "-s", "-p", "5202")
	b.waitListening(5202)
	// An IPv4 listener sets IP_TOS; Go's listener on 0.0.0.0 would be a
	// dual-stack IPv6 socket, whose IPV6_TCLASS IPv4 clients do not get.
	b.background(bins.testapp, "-listen", netip.AddrPortFrom(b.ns.Addr4(), 5203).String(), "-tos", "0x28")
	b.background(bins.testapp, "-listen", "[::]:5204", "-tos", "0x28")
	b.waitListening(5203)
	b.waitListening(5204)
	for _, addr := range []netip.Addr{b.ns.Addr4(), b.ns.Addr6()} {
		class, client := "tos:0x28", a.ns.Addr4().String()
		if addr.Is6() {
			class, client = "tclass:0x28", "["+a.ns.Addr6().String()+"]"
		}
		// toServer: smcrd's connections on A to the server's port; steered:
		// the steered connections on B from A.
		toServer := func(port int) view {
			return view{a, []string{"dst", netip.AddrPortFrom(addr, uint16(port)).String()}}
		}
		steered := func(port int) view {
			return view{b, []string{"dst", client, "sport", "=", fmt.Sprintf(":%d", port)}}
		}
		dst := netip.AddrPortFrom(addr, 5201)
		before := a.stats().Connections.SMCR
		seen := whileRunning(t, func() {
			r, err := a.client(dst.String(), "-mode", "pingpong", "-bytes", "64", "-for", "2s", "-tos", "0x28", "-priority", "3")
			if err != nil || r.OK != 1 {
				t.Fatalf("pingpong to %s: %+v: %v", dst, r, err)
			}
		}, toServer(5201))
		if got := a.stats().Connections.SMCR - before; got != 1 {
			t.Errorf("%s: %d SMC-R connections, want 1", dst, got)
		}
		lines := seen[0]
		if len(lines) == 0 {
			t.Errorf("%s: ss showed no connection to the server while the client ran", dst)
		}
		for _, l := range lines {
			if !strings.Contains(l, class) || !strings.Contains(l, "class_id:0x3") {
				t.Errorf("%s: smcrd's connection %q, want %s and priority 3 (class_id:0x3)", dst, l, class)
				break
			}
		}
		if len(lines) > 0 && !strings.Contains(lines[len(lines)-1], "keepalive") {
			t.Errorf("%s: smcrd's connection %q, want the keepalive Go turned on after the connect", dst, lines[len(lines)-1])
		}

		// iperf3 sets its data connection's class after the connect; its
		// control connection keeps the default. Neither end asks for
		// keepalive: neither connection on the wire has it. 3 s: in the
		// soft-RoCE VM (TCG) an ss takes long enough that a 1 s data
		// connection could come and go between two.
		dst = netip.AddrPortFrom(addr, 5202)
		seen = whileRunning(t, func() {
			if out, err := a.command("iperf3", "-c", addr.String(), "-p", "5202", "-t", "3", "-S", "0x28").CombinedOutput(); err != nil {
				t.Fatalf("iperf3: %v\n%s", err, out)
			}
		}, toServer(5202), steered(5202))
		if !slices.ContainsFunc(seen[0], func(l string) bool { return strings.Contains(l, class) }) {
			t.Errorf("%s: no connection of smcrd's to iperf3's server had %s: %q", dst, class, seen[0])
		}
		for _, lines := range seen {
			if i := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, "keepalive") }); i >= 0 || len(lines) == 0 {
				t.Errorf("%s: connections on the wire %q, want some, none with keepalive", dst, lines)
			}
		}

		// The server's listener marks its connections: on host B, the
		// steered connection from A's address carries the class, from the
		// moment smcrd has connected to the application (the steered
		// connection is there before).
		port := 5203
		if addr.Is6() {
			port = 5204
		}
		dst = netip.AddrPortFrom(addr, uint16(port))
		seen = whileRunning(t, func() {
			r, err := a.client(dst.String(), "-mode", "pingpong", "-bytes", "64", "-for", "2s")
			if err != nil || r.OK != 1 {
				t.Fatalf("pingpong to %s: %+v: %v", dst, r, err)
			}
		}, steered(port))
		if lines := seen[0]; len(lines) == 0 || !strings.Contains(lines[len(lines)-1], class) {
			t.Errorf("%s: the steered connection showed %q, want %s at last (the application's listener's)", dst, lines, class)
		}
	}
}

// view is what whileRunning watches: the established connections of h that
// filter (an ss filter) selects.
type view struct {
	h      *host
	filter []string
}

// whileRunning runs f and returns what ss showed meanwhile of each view, one
// line per connection and look, timers, traffic class and priority (class_id)
// included.
func whileRunning(t *testing.T, f func(), views ...view) [][]string {
	done := make(chan struct{})
	seen := make(chan [][]string, 1)
	go func() {
		lines := make([][]string, len(views))
		for {
			for i, v := range views {
				out, err := v.h.ns.Command("ss", append([]string{"-tnoH", "--tos", "state", "established"}, v.filter...)...).Output()
				if err != nil {
					t.Errorf("ss: %v", err)
				}
				for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
					if l != "" {
						lines[i] = append(lines[i], l)
					}
				}
			}
			select {
			case <-done:
				seen <- lines
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	func() {
		defer close(done)
		f()
	}()
	return <-seen
}

// TestServerListsFewerPorts: the server host's smcrd lists fewer ports than the
// client's. A connection to a port the server does not list falls back and
// puts that port, not the host, into the negative cache: the host's listed
// port keeps SMC-R, and the other port's next connections go direct.
func TestServerListsFewerPorts(t *testing.T) {
	a, b := hosts(t)
	a.start("providers = shm", ports)
	b.start("providers = shm", "port_range_list = 5201")
	b.serve(5201)
	b.serve(5202)
	listed, unlisted := netip.AddrPortFrom(b.ns.Addr4(), 5201), netip.AddrPortFrom(b.ns.Addr4(), 5202)
	if r, err := a.client(unlisted.String(), "-mode", "echo", "-bytes", "100000"); err != nil || r.OK != 1 {
		t.Fatalf("to %s: %+v %v", unlisted, r, err)
	}
	if r, err := a.client(listed.String(), "-mode", "echo", "-bytes", "100000", "-conns", "2"); err != nil || r.OK != 2 {
		t.Fatalf("to %s: %+v %v", listed, r, err)
	}
	if r, err := a.client(unlisted.String(), "-mode", "echo", "-bytes", "100000"); err != nil || r.OK != 1 {
		t.Fatalf("to %s again: %+v %v", unlisted, r, err)
	}
	if s := a.stats(); s.Connections.Handled != 3 || s.Connections.SMCR != 2 || s.Connections.Fallback != 1 {
		t.Errorf("A: %+v, want 3 through smcrd: the 2 to %s over SMC-R, the first to %s fallen back (its second went direct)", s.Connections, listed, unlisted)
	}
	peers, err := a.ctl.Peers(context.Background())
	if err != nil || len(peers) != 2 {
		t.Fatalf("peer cache: %v %+v, want %s capable and %s not", err, peers, listed, unlisted)
	}
	for _, p := range peers {
		if p.Addr != b.ns.Addr4().String() || p.Capable != (p.Port == listed.Port()) {
			t.Errorf("peer cache entry %+v, want %s capable and %s not", p, listed, unlisted)
		}
	}
	// Forgetting the one port leaves the other's entry.
	if n, err := a.ctl.ForgetPeers(context.Background(), unlisted.String()); err != nil || n != 1 {
		t.Fatalf("ForgetPeers(%s): %d, %v; want 1", unlisted, n, err)
	}
	if peers, err := a.ctl.Peers(context.Background()); err != nil || len(peers) != 1 || peers[0].Port != listed.Port() {
		t.Errorf("peer cache after forgetting %s: %v %+v, want %s alone", unlisted, err, peers, listed)
	}
}

// TestPortNotListed: a port outside port_range_list is never touched.
func TestPortNotListed(t *testing.T) {
	a, b := hosts(t)
	a.start("providers = shm", ports)
	b.start("providers = shm", ports)
	b.serve(6001)
	r, err := a.client(fmt.Sprintf("%s:6001", b.ns.Addr4()), "-mode", "echo", "-bytes", "100000", "-conns", "3")
	if err != nil || r.OK != 3 {
		t.Fatalf("%+v %v", r, err)
	}
	for _, h := range []*host{a, b} {
		if s := h.stats(); s.Connections.Handled != 0 {
			t.Errorf("smcrd on %s handled a connection to an unlisted port: %+v", h.name, s.Connections)
		}
	}
}

// TestNothingListens: a client connecting to a port of an smcrd host where
// no application listens. Its first connection, made to smcrd before either
// smcrd could know, is reset; the next ones go direct and are refused by the
// server's kernel, as without smcrd. The server host stays SMC-R capable for
// the ports where something listens.
func TestNothingListens(t *testing.T) {
	a, b := hosts(t)
	a.start("providers = shm", ports)
	b.start("providers = shm", ports)
	b.serve(5201)
	closed := netip.AddrPortFrom(b.ns.Addr4(), 5207)
	// The reset shows as ECONNRESET, or as EPIPE to a write after testapp's
	// reader took it.
	if _, err := a.client(closed.String(), "-mode", "echo", "-bytes", "16", "-timeout", "20s"); err == nil || !strings.Contains(err.Error(), "reset") && !strings.Contains(err.Error(), "broken pipe") {
		t.Errorf("first connection to %s: %v, want a reset", closed, err)
	}
	for i := range 2 {
		if _, err := a.client(closed.String(), "-mode", "echo", "-bytes", "16", "-timeout", "20s"); err == nil || !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("connection %d to %s after the first: %v, want the refusal", i+2, closed, err)
		}
	}
	peers, err := a.ctl.Peers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(peers) != 1 || peers[0].Addr != closed.Addr().String() || peers[0].Port != closed.Port() {
		t.Errorf("peers = %+v, want %v alone, unreachable (not the host as without SMC-R)", peers, closed)
	}
	if r, err := a.client(netip.AddrPortFrom(b.ns.Addr4(), 5201).String(), "-mode", "echo", "-bytes", "1000"); err != nil || r.OK != 1 {
		t.Fatalf("to the listening port: %+v %v", r, err)
	}
	// The first connection's reset, when it came during CLC, is a handshake
	// error, not a fallback: nothing was carried over TCP.
	if st := a.stats(); st.Connections.SMCR != 1 || st.Connections.Fallback != 0 {
		t.Errorf("A: %d SMC-R connections and %d fallbacks (%+v), want 1 and none", st.Connections.SMCR, st.Connections.Fallback, st.Fallbacks)
	}
}

// TestNotAccepting: an smcrd that runs but cannot accept (out of file
// descriptors) stops declaring itself alive, so applications' new connections go
// direct instead of waiting in its queue; once it accepts again, they come back.
func TestNotAccepting(t *testing.T) {
	a, b := hosts(t)
	a.start("providers = shm", ports)
	b.start("providers = shm", ports)
	b.serve(5201)
	dst := fmt.Sprintf("%s:5201", b.ns.Addr4())
	if r, err := a.client(dst, "-mode", "echo", "-bytes", "1000"); err != nil || r.OK != 1 {
		t.Fatalf("before: %+v %v", r, err)
	}
	pid := fmt.Sprint(a.smcrd.Process.Pid)
	fds, err := os.ReadDir("/proc/" + pid + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	open := map[string]bool{}
	for _, f := range fds {
		open[f.Name()] = true
	}
	lowestFree := 0
	for open[fmt.Sprint(lowestFree)] {
		lowestFree++
	}
	limit := func(n int) { // the soft limit: raising it back needs no privilege
		t.Helper()
		if out, err := exec.Command("prlimit", "--pid", pid, fmt.Sprintf("--nofile=%d:", n)).CombinedOutput(); err != nil {
			t.Fatalf("prlimit: %v: %s", err, out)
		}
	}
	limit(lowestFree) // every accept now fails with EMFILE
	// The first connections wait in smcrd's queue (and give up); within two
	// liveness periods (1 s here) new ones go direct.
	start := time.Now()
	for i := 0; ; i++ {
		r, err := a.client(dst, "-mode", "echo", "-bytes", "1000", "-timeout", "1s")
		if err == nil && r.OK == 1 {
			t.Logf("a connection went direct after %v (%d gave up first)", time.Since(start).Round(time.Millisecond), i)
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("smcrd not accepting: connections still wait for it after %v: %v", time.Since(start), err)
		}
	}
	if !strings.Contains(a.logText(), "not accepting") {
		t.Error("smcrd did not log that it stopped accepting")
	}
	limit(1024)
	before := a.stats().Connections.SMCR
	for i := 0; a.stats().Connections.SMCR == before; i++ {
		if i == 40 {
			t.Fatalf("after the limit was lifted, no connection came back to smcrd: %+v", a.stats().Connections)
		}
		if _, err := a.client(dst, "-mode", "echo", "-bytes", "1000", "-timeout", "5s"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := 0; !strings.Contains(a.logText(), "accepting again"); i++ {
		if i == 40 { // the log comes through a pipe
			t.Fatal("smcrd did not log that it accepts again")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestApplicationSlowToAccept: a server application whose accept queue is full
// still gets SMC-R. The server's kernel drops smcrd's SYN to it and sends it
// again only after a second; the client's smcrd, waiting meanwhile for a CLC
// Accept that came only once that connect was made, fell back at clc_timeout
// and put the server in its negative cache.
func TestApplicationSlowToAccept(t *testing.T) {
	a, b := hosts(t)
	a.start("providers = shm", ports, "clc_timeout = 500ms")
	b.start("providers = shm", ports)
	const port = 5209
	ln, err := b.ns.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// A backlog of 0 holds one connection; one from inside B fills it.
	rc, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var lerr error
	if err := rc.Control(func(fd uintptr) { lerr = syscall.Listen(int(fd), 0) }); err != nil || lerr != nil {
		t.Fatal(err, lerr)
	}
	filler, err := b.ns.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer filler.Close()
	// The application takes its connections after 1.5 s, three times
	// clc_timeout, and echoes as testapp's server does.
	go func() {
		time.Sleep(1500 * time.Millisecond)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var mode [1]byte
				if _, err := io.ReadFull(c, mode[:]); err == nil && mode[0] == 'E' {
					io.Copy(c, c)
					c.(*net.TCPConn).CloseWrite()
				}
			}()
		}
	}()
	start := time.Now()
	dst := netip.AddrPortFrom(b.ns.Addr4(), port)
	if r, err := a.client(dst.String(), "-mode", "echo", "-bytes", "100000", "-timeout", "30s"); err != nil || r.OK != 1 {
		t.Fatalf("connection to a server slow to accept: %+v %v", r, err)
	}
	t.Logf("echoed after %v", time.Since(start).Round(time.Millisecond))
	if st := a.stats(); st.Connections.SMCR != 1 || st.Connections.Fallback != 0 {
		t.Errorf("A: %d SMC-R connections and %d fallbacks (%+v), want 1 and none", st.Connections.SMCR, st.Connections.Fallback, st.Fallbacks)
	}
	peers, err := a.ctl.Peers(context.Background())
	if err != nil || len(peers) != 1 || !peers[0].Capable {
		t.Errorf("peers = %+v %v, want %v capable", peers, err, dst)
	}
}

// TestKill: smcrd killed on either side, during and between transfers. The
// applications never hang, and new connections work as plain TCP.
func TestKill(t *testing.T) {
	a, b := hosts(t)
	conf := []string{"providers = shm", ports, "peer_cache_ttl = 1s"}
	a.start(conf...)
	b.start(conf...)
	b.serve(5201)
	dst := fmt.Sprintf("%s:5201", b.ns.Addr4())

	during := func(victim *host) {
		t.Helper()
		cmd := a.command(bins.testapp, "-connect", dst, "-mode", "echo", "-bytes", "2000000000", "-conns", "2", "-timeout", "60s")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Both connections set up (a loaded machine may take a while), then the kill.
		for i := 0; victim.stats().Connections.Active != 2; i++ {
			if i == 100 {
				t.Fatalf("smcrd on %s carries %d SMC-R connections before the kill, want 2", victim.name, victim.stats().Connections.Active)
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond)
		victim.kill()
		waited := make(chan error, 1)
		go func() { waited <- cmd.Wait() }()
		select {
		case err := <-waited:
			t.Logf("application after smcrd on %s was killed: %v", victim.name, err)
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("application hung after smcrd on %s was killed", victim.name)
		}
	}
	check := func(what string) {
		t.Helper()
		r, err := a.client(dst, "-mode", "echo", "-bytes", "500000", "-conns", "3", "-timeout", "20s")
		if err != nil || r.OK != 3 {
			t.Fatalf("%s: %+v %v", what, r, err)
		}
	}

	during(b)
	check("new connections with the server's smcrd dead")
	b.start(conf...)
	time.Sleep(1500 * time.Millisecond) // A's negative entry for B expires
	during(a)
	time.Sleep(1500 * time.Millisecond) // the liveness TTL (1s) lapses
	check("new connections with the client's smcrd dead")
	a.start(conf...)
	a.kill() // between transfers
	time.Sleep(1500 * time.Millisecond)
	check("new connections after the client's smcrd was killed idle")
}

// TestKillResets: smcrd killed while a program reads a stream to its end,
// on either host. The kernel closed smcrd's socket facing the program with a
// FIN, and a program that takes the end of the stream for the end of the
// data (netcat) kept a truncated transfer as a whole one: it must see a reset.
func TestKillResets(t *testing.T) {
	a, b := hosts(t)
	conf := []string{"providers = shm", ports}
	a.start(conf...)
	b.start(conf...)
	const port = 5211
	ln, err := b.ns.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dst := fmt.Sprintf("%s:%d", b.ns.Addr4(), port)
	// The server writes without end to a client that reads (recv), or reads
	// to the end what a client writes (discard), and says how that ended.
	read := make(chan error, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var first [1]byte
				c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
				_, err := c.Read(first[:])
				c.SetReadDeadline(time.Time{})
				if err == nil && first[0] == 'D' {
					_, err := io.Copy(io.Discard, c)
					read <- err
					return
				}
				buf := make([]byte, 64<<10)
				for {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	carrying := func(h *host) {
		t.Helper()
		for i := 0; h.stats().Connections.Active != 1; i++ {
			if i == 100 {
				t.Fatalf("smcrd on %s carries %d connections, want 1", h.name, h.stats().Connections.Active)
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond) // bytes flow
	}

	// The client's smcrd killed while the client reads.
	cmd := a.command(bins.testapp, "-connect", dst, "-mode", "recv", "-timeout", "30s")
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	carrying(a)
	a.kill()
	cmd.Wait()
	var r appResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("testapp: %v: %s", err, out.String())
	}
	if r.OK != 0 || !strings.Contains(r.Err, "reset") {
		t.Errorf("client reading when its smcrd was killed: %+v, want a reset", r)
	}

	// The server's smcrd killed while the server reads.
	a.start(conf...)
	cmd = a.command(bins.testapp, "-connect", dst, "-mode", "discard", "-bytes", "100000000000", "-timeout", "30s")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	carrying(b)
	b.kill()
	select {
	case err := <-read:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("server reading when its smcrd was killed: %v, want a reset", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("server still reading 20 s after its smcrd was killed")
	}
}

// TestServerSmcrdRestart: restarting the server's smcrd (an upgrade) keeps
// its clients off SMC-R for seconds, not for the negative cache's TTL (a
// minute here, 10 by default). While it is down, the server host answers
// without the SMC option and the client caches it as without SMC-R; a peer
// that had SMC-R lately stays cached for 5 s the first time.
func TestServerSmcrdRestart(t *testing.T) {
	a, b := hosts(t)
	a.start("providers = shm", ports)
	b.start("providers = shm", ports)
	b.serve(5201)
	dst := fmt.Sprintf("%s:5201", b.ns.Addr4())
	one := func(what string) {
		t.Helper()
		if r, err := a.client(dst, "-mode", "echo", "-bytes", "1000"); err != nil || r.OK != 1 {
			t.Fatalf("%s: %+v %v", what, r, err)
		}
	}
	one("before the restart")
	if n := a.stats().Connections.SMCR; n != 1 {
		t.Fatalf("%d SMC-R connections before the restart, want 1", n)
	}
	b.stop()
	one("while the server's smcrd is down")
	peers, err := a.ctl.Peers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(peers) != 1 || peers[0].Capable || peers[0].ExpiresInSeconds > 5 {
		t.Errorf("peers %+v: want B without SMC-R for 5 s at most", peers)
	}
	if !strings.Contains(a.logText(), "peer without SMC-R: connections to it go direct") || !strings.Contains(a.logText(), "for=5s") {
		t.Error("A's smcrd did not log that B went into its negative cache for 5 s")
	}
	b.start("providers = shm", ports)
	start := time.Now()
	for a.stats().Connections.SMCR < 2 {
		if time.Since(start) > 15*time.Second {
			t.Fatalf("no connection went SMC-R again %v after the server's smcrd restarted (peers %+v)", time.Since(start), peers)
		}
		time.Sleep(250 * time.Millisecond)
		one("after the restart")
	}
	t.Logf("SMC-R again %v after the restart", time.Since(start).Round(time.Millisecond))
}

// TestRuntimeConfig: smcrctl-style changes take effect for the next connection,
// and persist writes the file.
func TestRuntimeConfig(t *testing.T) {
	a, b := hosts(t)
	a.start("providers = shm", ports, "metrics_address = 127.0.0.1:9464")
	b.start("providers = shm", ports)
	b.serve(5201)
	dst := fmt.Sprintf("%s:5201", b.ns.Addr4())
	ctx := context.Background()
	if err := a.ctl.Disable(ctx, false); err != nil {
		t.Fatal(err)
	}
	if _, err := a.client(dst, "-mode", "echo", "-bytes", "10000"); err != nil {
		t.Fatal(err)
	}
	if s := a.stats(); s.Connections.Handled != 0 {
		t.Fatalf("disabled smcrd handled a connection: %+v", s.Connections)
	}
	if _, err := a.ctl.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"enabled=yes", "port_range_list=5201"}, Persist: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.client(dst, "-mode", "echo", "-bytes", "10000"); err != nil {
		t.Fatal(err)
	}
	if s := a.stats(); s.Connections.SMCR != 1 {
		t.Fatalf("after enable: %+v", s.Connections)
	}
	file, _ := os.ReadFile(filepath.Join(a.dir, "smcrd.conf"))
	if !strings.Contains(string(file), "port_range_list = 5201\n") {
		t.Errorf("persisted file:\n%s", file)
	}
	if _, err := a.ctl.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"port_range_list=20-1"}}); err == nil {
		t.Error("a bad range was accepted")
	}

	// The metrics listener (inside A's namespace) counts the same connection.
	var body []byte
	err := a.ns.Do(func() error {
		c, err := net.Dial("tcp", "127.0.0.1:9464")
		if err != nil {
			return err
		}
		defer c.Close()
		fmt.Fprint(c, "GET /metrics HTTP/1.0\r\n\r\n")
		body, err = io.ReadAll(c)
		return err
	})
	if err != nil || !bytes.Contains(body, []byte("smcr_")) {
		t.Errorf("metrics: %v\n%.500s", err, body)
	}
}

// TestDrainOnSIGTERM: SIGTERM lets established connections finish with every
// byte, and new connections meanwhile go direct.
func TestDrainOnSIGTERM(t *testing.T) {
	a, b := hosts(t)
	a.start("providers = shm", ports)
	b.start("providers = shm", ports)
	b.serve(5201)
	dst := fmt.Sprintf("%s:5201", b.ns.Addr4())
	cmd := a.command(bins.testapp, "-connect", dst, "-mode", "echo", "-bytes", "100000000", "-conns", "2", "-timeout", "30s")
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for i := 0; a.stats().Connections.Active != 2; i++ {
		if i == 100 {
			t.Fatalf("before SIGTERM: %+v", a.stats().Connections)
		}
		time.Sleep(50 * time.Millisecond)
	}
	a.smcrd.Process.Signal(syscall.SIGTERM)
	// While it drains, a new connection does not go through it.
	time.Sleep(100 * time.Millisecond)
	if _, err := a.client(dst, "-mode", "sink", "-bytes", "10000", "-timeout", "10s"); err != nil {
		t.Errorf("new connection while draining: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("established connections lost bytes on SIGTERM: %v %s", err, out.String())
	}
	select {
	case <-a.done:
		if a.exitErr != nil {
			t.Errorf("smcrd's drain ended with %v:\n%s", a.exitErr, a.logText())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("smcrd did not exit after draining")
	}
	a.smcrd = nil
}
