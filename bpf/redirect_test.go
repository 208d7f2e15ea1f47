package bpf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/smcr-io/smcr/internal/nstest"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

const (
	portListed   = 7001
	portUnlisted = 7009
)

// clientHost is namespace A with smcrd's redirect listeners, and B with the real
// servers on a listed and an unlisted port.
type clientHost struct {
	p                *nstest.Pair
	l                *Loader
	redir4, redir6   net.Listener
	server, unlisted net.Listener // in B, dual-stack
}

func newClientHost(t *testing.T) *clientHost {
	t.Helper()
	p := nstest.NewPair(t)
	cg := testCgroup(t)
	h := &clientHost{p: p}
	h.l = loadIn(t, p.A, Options{CgroupPath: cg, Interfaces: []string{p.A.Links[0].Name}})
	h.redir4 = listen(t, p.A, "127.0.0.1:0", nil, nil)
	h.redir6 = listen(t, p.A, "[::1]:0", nil, nil)
	h.server = listen(t, p.B, ":7001", nil, nil)
	h.unlisted = listen(t, p.B, ":7009", nil, nil)
	must(t, h.l.SetRedirect(addrPort(h.redir4.Addr()), addrPort(h.redir6.Addr())))
	must(t, h.l.SetPorts([]PortRange{{7000, 7005}, {8000, 8000}}))
	must(t, h.l.SetAlive(time.Minute))
	return h
}

func TestRedirect(t *testing.T) {
	h := newClientHost(t)
	for _, fam := range []struct {
		name  string
		b, a  netip.Addr
		redir net.Listener
	}{
		{"ipv4", h.p.B.Addr4(), h.p.A.Addr4(), h.redir4},
		{"ipv6", h.p.B.Addr6(), h.p.A.Addr6(), h.redir6},
	} {
		t.Run(fam.name, func(t *testing.T) {
			orig := netip.AddrPortFrom(fam.b, portListed)
			who, app, acc := whoAccepts(t, h.p.A, orig.String(), fam.redir, h.server)
			if who != 0 {
				t.Fatalf("connection to listed port %s went to listener %d, want the redirect listener", orig, who)
			}
			// smcrd's side: SO_ORIGINAL_DST through the getsockopt program, and the map.
			got, err := OriginalDst(acc.(*net.TCPConn))
			if err != nil || got != orig {
				t.Errorf("SO_ORIGINAL_DST = %v, %v; want %v", got, err, orig)
			}
			// Go's dialer turns keepalive on after its connect (15 s, 15 s,
			// 9 probes): the setsockopt program puts it in the entry.
			goKeepAlive := []Sockopt{{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1}, {unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 15},
				{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, 15}, {unix.IPPROTO_TCP, unix.TCP_KEEPCNT, 9}}
			o, err := h.l.OriginalOf(addrPort(acc.LocalAddr()), addrPort(acc.RemoteAddr()))
			if err != nil || o.Dst != orig || !slices.Equal(o.Options, goKeepAlive) {
				t.Errorf("OriginalOf = %+v, %v; want %v and options %v", o, err, orig, goKeepAlive)
			}
			// The application's side: getpeername shows the server it dialled,
			// getsockname the address of the interface the route leaves through.
			if got := addrPort(app.RemoteAddr()); got != orig {
				t.Errorf("application's getpeername = %v, want %v", got, orig)
			}
			if got := addrPort(app.LocalAddr()); got.Addr() != fam.a || got.Port() != addrPort(acc.RemoteAddr()).Port() {
				t.Errorf("application's getsockname = %v, want %v port %d", got, fam.a, addrPort(acc.RemoteAddr()).Port())
			}
			// Bytes flow through the redirect.
			if _, err := app.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 4)
			acc.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := acc.Read(buf); err != nil || string(buf) != "ping" {
				t.Errorf("redirected read = %q, %v", buf, err)
			}

			unlisted := netip.AddrPortFrom(fam.b, portUnlisted)
			if who, _, _ := whoAccepts(t, h.p.A, unlisted.String(), h.unlisted, fam.redir); who != 0 {
				t.Errorf("connection to unlisted port %s went to listener %d, want the server", unlisted, who)
			}
		})
	}
	st, err := h.l.Stats()
	must(t, err)
	if st["redirected"] != 2 || st["orig_dst_answered"] != 2 {
		t.Errorf("stats = %v, want 2 redirected, 2 original destinations answered", st)
	}
}

// An application that writes and closes at once is gone before smcrd accepts: its
// original destination and its bytes still wait for smcrd, until smcrd forgets it.
func TestRedirectSendAndClose(t *testing.T) {
	h := newClientHost(t)
	orig := netip.AddrPortFrom(h.p.B.Addr4(), portListed)
	app := dial(t, h.p.A, orig.String(), nil, nil)
	if _, err := app.Write([]byte("fire-and-forget")); err != nil {
		t.Fatal(err)
	}
	app.Close()
	time.Sleep(100 * time.Millisecond) // the application's socket reaches CLOSE
	acc := acceptWithin(t, h.redir4, time.Second)
	if acc == nil {
		t.Fatal("redirect listener accepted nothing")
	}
	if got, err := OriginalDst(acc.(*net.TCPConn)); err != nil || got != orig {
		t.Errorf("SO_ORIGINAL_DST after the application closed = %v, %v; want %v", got, err, orig)
	}
	local, remote := addrPort(acc.LocalAddr()), addrPort(acc.RemoteAddr())
	if o, err := h.l.OriginalOf(local, remote); err != nil || o.Dst != orig {
		t.Errorf("OriginalOf after the application closed = %+v, %v; want %v", o, err, orig)
	}
	buf := make([]byte, 64)
	acc.SetReadDeadline(time.Now().Add(time.Second))
	if n, err := acc.Read(buf); err != nil || string(buf[:n]) != "fire-and-forget" {
		t.Errorf("read = %q, %v; want the application's bytes", buf[:n], err)
	}
	must(t, h.l.ForgetOriginalDst(local, remote))
	if _, err := h.l.OriginalOf(local, remote); err != ErrUnknown {
		t.Errorf("OriginalOf after ForgetOriginalDst: %v, want ErrUnknown", err)
	}
	must(t, h.l.ForgetOriginalDst(local, remote)) // twice: nothing to do

	// A leftover (smcrd crashed before reading it) on the 4-tuple of a new
	// redirected connection gives way to that connection's destination. The
	// application's port is one of two: a bound socket is not redirected.
	const appPort = 41234
	stale := netip.AddrPortFrom(h.p.B.Addr4(), 9)
	for port := uint16(appPort); port <= appPort+1; port++ {
		key := tuple(addrPort(h.redir4.Addr()), netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port))
		stale := smcrOrig{Dst: smcrAddrPort{Family: unix.AF_INET, Addr: addrWords(stale.Addr()), Port: netPort(stale.Port())}}
		stale.Opts.Have, stale.Opts.Tos = optTOS, 0x10
		must(t, h.l.objs.SmcrOrigdst.Put(key, stale))
	}
	must(t, h.p.A.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", fmt.Appendf(nil, "%d %d", appPort, appPort+1), 0)
	}))
	must(t, h.p.A.Do(func() error {
		d := net.Dialer{Timeout: 3 * time.Second, KeepAlive: -1}
		d.SetMultipathTCP(false)
		c, err := d.Dial("tcp", orig.String())
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
		return err
	}))
	acc = acceptWithin(t, h.redir4, time.Second)
	if acc == nil {
		t.Fatal("redirect listener accepted nothing")
	}
	if got := addrPort(acc.RemoteAddr()).Port(); got != appPort && got != appPort+1 {
		t.Fatalf("application's port %d, want %d or %d", got, appPort, appPort+1)
	}
	if got, err := OriginalDst(acc.(*net.TCPConn)); err != nil || got != orig {
		t.Errorf("SO_ORIGINAL_DST over a leftover entry = %v, %v; want %v", got, err, orig)
	}
	if o, err := h.l.OriginalOf(addrPort(acc.LocalAddr()), addrPort(acc.RemoteAddr())); err != nil || len(o.Options) != 0 {
		t.Errorf("options over a leftover entry = %+v, %v; want none", o.Options, err)
	}
}

// TestRedirectSocketOptions: the options an application set on its socket that
// shape its connection on the wire are recorded for smcrd's connection to take:
// those set before its connect with its destination, those set after through the
// ring, in order. A dual-stack socket's IPv4 traffic class set before the connect
// is not read (bpf_getsockopt answers IP_TOS on IPv4 sockets only); set after, it
// is.
func TestRedirectSocketOptions(t *testing.T) {
	h := newClientHost(t)
	r, err := h.l.Sockopts()
	must(t, err)
	defer r.Close()
	mapped := netip.AddrFrom16(h.p.B.Addr4().As16())
	keep := []Sockopt{{unix.SOL_SOCKET, unix.SO_PRIORITY, 3},
		{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1}, {unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 77},
		{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, 11}, {unix.IPPROTO_TCP, unix.TCP_KEEPCNT, 4},
		{unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, 4321}}
	tos4 := Sockopt{unix.IPPROTO_IP, unix.IP_TOS, 0x28}
	tos6 := Sockopt{unix.IPPROTO_IPV6, unix.IPV6_TCLASS, 0x28}
	for _, tc := range []struct {
		name  string
		sa    unix.Sockaddr
		redir net.Listener
		tos   Sockopt // what the application sets
		want  []Sockopt
	}{
		{"ipv4", &unix.SockaddrInet4{Addr: h.p.B.Addr4().As4(), Port: portListed}, h.redir4, tos4, append([]Sockopt{tos4}, keep...)},
		{"ipv6", &unix.SockaddrInet6{Addr: h.p.B.Addr6().As16(), Port: portListed}, h.redir6, tos6, append([]Sockopt{tos6}, keep...)},
		{"ipv4-mapped", &unix.SockaddrInet6{Addr: mapped.As16(), Port: portListed}, h.redir4, tos6, keep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			family := unix.AF_INET
			if _, ok := tc.sa.(*unix.SockaddrInet6); ok {
				family = unix.AF_INET6
			}
			var fd int
			before := Monotonic()
			must(t, h.p.A.Do(func() error {
				var err error
				if fd, err = unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
					return err
				}
				t.Cleanup(func() { unix.Close(fd) })
				for _, o := range append([]Sockopt{tc.tos}, keep...) {
					if err := unix.SetsockoptInt(fd, o.Level, o.Name, o.Value); err != nil {
						return fmt.Errorf("setsockopt %v: %w", o, err)
					}
				}
				return unix.Connect(fd, tc.sa)
			}))
			acc := acceptWithin(t, tc.redir, time.Second)
			if acc == nil {
				t.Fatal("redirect listener accepted nothing")
			}
			defer acc.Close()
			local, remote := addrPort(acc.LocalAddr()), addrPort(acc.RemoteAddr())
			o, err := h.l.OriginalOf(local, remote)
			if err != nil {
				t.Fatal(err)
			}
			if o.Dst.Port() != portListed || !slices.Equal(o.Options, tc.want) {
				t.Errorf("OriginalOf = %v, want options %v", o, tc.want)
			}
			if now := Monotonic(); o.Connected < before || o.Connected > now {
				t.Errorf("connected at %v, want between %v and %v", o.Connected, before, now)
			}

			// After the connect: to the ring, and to the entry while it is there.
			// A dual-stack socket's IPv4 traffic takes IP_TOS: the mapped
			// case sets that, as the application would.
			after := []Sockopt{{unix.SOL_SOCKET, unix.SO_PRIORITY, 5}, {unix.SOL_SOCKET, unix.SO_KEEPALIVE, 0},
				{unix.IPPROTO_TCP, unix.TCP_NODELAY, 1}, {unix.IPPROTO_IP, unix.IP_TOS, 0x48}}
			if tc.name == "ipv6" {
				after[3] = Sockopt{unix.IPPROTO_IPV6, unix.IPV6_TCLASS, 0x48}
			}
			set := Monotonic()
			for _, s := range after {
				must(t, unix.SetsockoptInt(fd, s.Level, s.Name, s.Value))
			}
			for _, want := range slices.Delete(slices.Clone(after), 2, 3) { // TCP_NODELAY is none of them
				got, err := readSockopt(r, time.Second)
				if err != nil || got.Local != local || got.Remote != remote || got.Sockopt != want {
					t.Errorf("ring: %+v, %v; want %v on %v-%v", got, err, want, local, remote)
				}
				if now := Monotonic(); got.At < set || got.At > now {
					t.Errorf("%v set at %v, want between %v and %v", got.Sockopt, got.At, set, now)
				}
			}
			o, err = h.l.OriginalOf(local, remote)
			must(t, err)
			want := []Sockopt{after[3], {unix.SOL_SOCKET, unix.SO_PRIORITY, 5}, {unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, 4321}}
			if !slices.Equal(o.Options, want) {
				t.Errorf("OriginalOf after the options changed = %v, want %v", o.Options, want)
			}
		})
	}
	if got, err := readSockopt(r, 100*time.Millisecond); err == nil {
		t.Errorf("ring: %+v more", got)
	}
	st, err := h.l.Stats()
	must(t, err)
	if st["sockopt_lost"] != 0 {
		t.Errorf("%d options lost", st["sockopt_lost"])
	}
}

// readSockopt reads the next option from r, waiting up to d.
func readSockopt(r *SockoptReader, d time.Duration) (SetSockopt, error) {
	r.SetDeadline(time.Now().Add(d))
	defer r.SetDeadline(time.Time{})
	return r.Read()
}

func TestRedirectFailsOpen(t *testing.T) {
	h := newClientHost(t)
	orig := netip.AddrPortFrom(h.p.B.Addr4(), portListed).String()
	must(t, h.l.SetAlive(0))
	if who, _, _ := whoAccepts(t, h.p.A, orig, h.server, h.redir4); who != 0 {
		t.Errorf("smcrd dead: connection went to listener %d, want the server", who)
	}
	// A heartbeat that lapses counts as dead too.
	must(t, h.l.SetAlive(200*time.Millisecond))
	if who, _, _ := whoAccepts(t, h.p.A, orig, h.redir4, h.server); who != 0 {
		t.Errorf("smcrd alive: connection went to listener %d, want the redirect listener", who)
	}
	time.Sleep(300 * time.Millisecond)
	if who, _, _ := whoAccepts(t, h.p.A, orig, h.server, h.redir4); who != 0 {
		t.Errorf("heartbeat lapsed: connection went to listener %d, want the server", who)
	}
}

// TestRedirectNegativeCache: a destination in the negative cache is connected to
// direct until its entry expires or is removed; the same host's other listed
// ports are still redirected (a server host may offer SMC-R on some only).
func TestRedirectNegativeCache(t *testing.T) {
	h := newClientHost(t)
	for _, b := range []netip.Addr{h.p.B.Addr4(), h.p.B.Addr6()} {
		redir := h.redir4
		if b.Is6() {
			redir = h.redir6
		}
		dst := netip.AddrPortFrom(b, portListed)
		orig := dst.String()
		must(t, h.l.AddNegative(dst, 300*time.Millisecond))
		if who, _, _ := whoAccepts(t, h.p.A, orig, h.server, redir); who != 0 {
			t.Errorf("%s in the negative cache: connection went to listener %d, want the server", dst, who)
		}
		other := netip.AddrPortFrom(b, portListed+1).String()
		if who, _, _ := whoAccepts(t, h.p.A, other, redir); who != 0 {
			t.Errorf("%s in the negative cache: connection to %s went to listener %d, want the redirect listener", dst, other, who)
		}
		time.Sleep(400 * time.Millisecond)
		if who, _, _ := whoAccepts(t, h.p.A, orig, redir, h.server); who != 0 {
			t.Errorf("%s's negative entry expired: connection went to listener %d, want the redirect listener", dst, who)
		}
		must(t, h.l.AddNegative(dst, time.Minute))
		if neg, err := h.l.Negatives(); err != nil || len(neg) != 1 || neg[dst] <= 50*time.Second || neg[dst] > time.Minute {
			t.Errorf("Negatives() = %v, %v; want %s with about a minute left", neg, err, dst)
		}
		must(t, h.l.RemoveNegative(dst))
		if neg, err := h.l.Negatives(); err != nil || len(neg) != 0 {
			t.Errorf("Negatives() after the removal = %v, %v; want none", neg, err)
		}
		if who, _, _ := whoAccepts(t, h.p.A, orig, redir, h.server); who != 0 {
			t.Errorf("%s's negative entry removed: connection went to listener %d, want the redirect listener", dst, who)
		}
	}
}

func TestRedirectPrefixes(t *testing.T) {
	h := newClientHost(t)
	// A second link is not listed: destinations routed through it stay direct.
	_, b2 := h.p.AddLink()
	ln := h.server
	orig := netip.AddrPortFrom(b2.Addr4.Addr(), portListed).String()
	must(t, h.p.A.Do(func() error { return h.l.SetInterfaces([]string{h.p.A.Links[0].Name}) }))
	if who, _, _ := whoAccepts(t, h.p.A, orig, ln, h.redir4); who != 0 {
		t.Errorf("destination behind an unlisted interface went to listener %d, want the server", who)
	}
	must(t, h.p.A.Do(func() error { return h.l.SetInterfaces([]string{h.p.A.Links[0].Name, h.p.A.Links[1].Name}) }))
	if who, _, _ := whoAccepts(t, h.p.A, orig, h.redir4, ln); who != 0 {
		t.Errorf("destination behind a listed interface went to listener %d, want the redirect listener", who)
	}
	// The host's own addresses are never redirected.
	own := listen(t, h.p.A, netip.AddrPortFrom(h.p.A.Addr4(), portListed).String(), nil, nil)
	if who, _, _ := whoAccepts(t, h.p.A, own.Addr().String(), own, h.redir4); who != 0 {
		t.Errorf("connection to an own address went to listener %d, want the local server", who)
	}
}

// Destinations smcrd could not dial as the application meant them stay direct even
// where a route through a listed interface covers them: 0.0.0.0 and :: (this
// host, on Linux), and link-local IPv6 (the zone is the socket's, smcrd never
// sees it).
func TestRedirectSkipsUnspecifiedAndLinkLocal(t *testing.T) {
	h := newClientHost(t)
	la, lb := h.p.A.Links[0].Name, h.p.B.Links[0].Name
	must(t, h.p.A.Do(func() error {
		lk, err := netlink.LinkByName(la)
		if err != nil {
			return err
		}
		for _, gw := range []netip.Addr{h.p.B.Addr4(), h.p.B.Addr6()} {
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: lk.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
				return fmt.Errorf("default route via %s: %w", gw, err)
			}
		}
		return nil
	}))
	for _, x := range []struct {
		ns   *nstest.NS
		link string
		ip   string
	}{{h.p.A, la, "fe80::a1"}, {h.p.B, lb, "fe80::b1"}} {
		must(t, x.ns.Do(func() error {
			lk, err := netlink.LinkByName(x.link)
			if err != nil {
				return err
			}
			a := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(x.ip), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
			return netlink.AddrAdd(lk, a)
		}))
	}
	// Rules from the routes above: 0.0.0.0/0, ::/0 and fe80::/64 through la.
	must(t, h.p.A.Do(func() error { return h.l.SetInterfaces([]string{la}) }))
	local := listen(t, h.p.A, fmt.Sprintf(":%d", portListed), nil, nil)
	// Go's Dial would rewrite the unspecified addresses itself: connect(2) them.
	for _, sa := range []unix.Sockaddr{&unix.SockaddrInet4{Port: portListed}, &unix.SockaddrInet6{Port: portListed}} {
		connectRaw(t, h.p.A, sa)
		for i, ln := range []net.Listener{local, h.redir4, h.redir6} {
			if acceptWithin(t, ln, 300*time.Millisecond) != nil && i != 0 {
				t.Errorf("connection to the unspecified address (%T) went to redirect listener %v, want the local server", sa, ln.Addr())
			}
		}
	}
	ll := fmt.Sprintf("[fe80::b1%%%s]:%d", la, portListed)
	if who, _, _ := whoAccepts(t, h.p.A, ll, h.server, h.redir6); who != 0 {
		t.Errorf("connection to %s went to listener %d, want the server", ll, who)
	}
	// The routes do make global destinations redirected.
	orig := netip.AddrPortFrom(h.p.B.Addr6(), portListed).String()
	if who, _, _ := whoAccepts(t, h.p.A, orig, h.redir6, h.server); who != 0 {
		t.Errorf("connection to %s went to listener %d, want the redirect listener", orig, who)
	}
}

// A socket whose redirected connect failed and which then connects elsewhere,
// directly, shows that connection's addresses, not the first destination.
func TestRedirectFailedThenDirect(t *testing.T) {
	h := newClientHost(t)
	for _, b := range []netip.Addr{h.p.B.Addr4(), h.p.B.Addr6()} {
		// A connect program attached after smcr's refuses the first
		// connect (EPERM), once connect4/6 has redirected it.
		at := ebpf.AttachCGroupInet4Connect
		if b.Is6() {
			at = ebpf.AttachCGroupInet6Connect
		}
		refuse, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type:         ebpf.CGroupSockAddr,
			AttachType:   at,
			License:      "Dual MIT/GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		})
		must(t, err)
		defer refuse.Close()
		refuseLink, err := link.AttachCgroup(link.CgroupOptions{Path: h.l.cgroup, Attach: at, Program: refuse})
		must(t, err)
		sockaddr := func(port int) unix.Sockaddr {
			if b.Is4() {
				return &unix.SockaddrInet4{Addr: b.As4(), Port: port}
			}
			return &unix.SockaddrInet6{Addr: b.As16(), Port: port}
		}
		family := unix.AF_INET
		if b.Is6() {
			family = unix.AF_INET6
		}
		var peer, local unix.Sockaddr
		must(t, h.p.A.Do(func() error {
			fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			t.Cleanup(func() { unix.Close(fd) })
			if err := unix.Connect(fd, sockaddr(portListed)); err != unix.EPERM {
				return fmt.Errorf("redirected connect, then refused: %v, want EPERM", err)
			}
			if err := refuseLink.Close(); err != nil {
				return err
			}
			if err := unix.Connect(fd, sockaddr(portUnlisted)); err != nil {
				return fmt.Errorf("direct connect after it: %w", err)
			}
			peer, local, err = names(fd)
			return err
		}))
		acc := acceptWithin(t, h.unlisted, time.Second)
		if acc == nil {
			t.Fatalf("%s: the unlisted server accepted nothing", b)
		}
		if got, want := sockaddrAP(peer), netip.AddrPortFrom(b, portUnlisted); got != want {
			t.Errorf("getpeername = %v, want %v", got, want)
		}
		if got, want := sockaddrAP(local), addrPort(acc.RemoteAddr()); got != want {
			t.Errorf("getsockname = %v, want %v", got, want)
		}
	}
}

// names returns what getpeername and getsockname answer for fd.
func names(fd int) (peer, local unix.Sockaddr, err error) {
	if peer, err = unix.Getpeername(fd); err != nil {
		return nil, nil, err
	}
	local, err = unix.Getsockname(fd)
	return peer, local, err
}

func sockaddrAP(sa unix.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
	}
	return netip.AddrPort{}
}

// A routing table larger than the old 1024-rule tries fits; rules beyond the
// tries' size fail with an error naming the limit.
func TestRedirectManyRoutes(t *testing.T) {
	h := newClientHost(t)
	la := h.p.A.Links[0].Name
	const routes = 3000
	must(t, h.p.A.Do(func() error {
		lk, err := netlink.LinkByName(la)
		if err != nil {
			return err
		}
		for i := range routes {
			dst := &net.IPNet{IP: net.IPv4(10, byte(i>>8), byte(i), 0), Mask: net.CIDRMask(24, 32)}
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: lk.Attrs().Index, Dst: dst, Gw: h.p.B.Addr4().AsSlice()}); err != nil {
				return fmt.Errorf("route %s: %w", dst, err)
			}
		}
		return nil
	}))
	must(t, h.p.A.Do(func() error { return h.l.SetInterfaces([]string{la}) }))
	dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, (routes - 1) >> 8, (routes - 1) & 255, 1}), portListed)
	if who, _, _ := whoAccepts(t, h.p.A, dst.String(), h.redir4); who != 0 {
		t.Errorf("connection to %s, routed through the listed interface, not redirected", dst)
	}

	limit := int(h.l.objs.SmcrPrefix4.MaxEntries())
	rules := make([]PrefixRule, limit+1)
	for i := range rules {
		rules[i] = PrefixRule{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{11, byte(i >> 16), byte(i >> 8), byte(i)}), 32), Allow: true}
	}
	err := h.l.SetPrefixes(rules)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("smcr_prefix4 full: it holds %d rules", limit)) {
		t.Errorf("SetPrefixes with %d rules: %v, want an error naming smcr_prefix4's limit", len(rules), err)
	}
}

// A getsockopt answering more than a page, under the getsockopt program, keeps the
// kernel's answer. Kernels before 6.5 fail it with EFAULT unless the program
// passes optlen 0 on; later ones ignore the program's optlen, so a probe
// attached after it reads the optlen it passes on.
func TestGetsockoptLargeResult(t *testing.T) {
	h := newClientHost(t)
	const (
		nsrc    = 40               // mld_max_msf defaults to 64
		gfSize0 = 144              // offsetof(struct group_filter, gf_slist)
		gfSize  = gfSize0 + 128*40 // 5264: more than a page
	)
	probe, seen := optlenProbe(t, h.l.cgroup, unix.IPPROTO_IPV6, unix.MCAST_MSFILTER)
	defer probe.Close()

	// struct sockaddr_in6 inside a struct sockaddr_storage.
	sin6 := func(b []byte, a netip.Addr) {
		binary.NativeEndian.PutUint16(b, unix.AF_INET6)
		a16 := a.As16()
		copy(b[8:24], a16[:])
	}
	group := netip.MustParseAddr("ff3e::4321")
	var got []byte
	must(t, h.p.A.Do(func() error {
		iface, err := net.InterfaceByName(h.p.A.Links[0].Name)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for i := range nsrc {
			var gsr [264]byte // struct group_source_req
			binary.NativeEndian.PutUint32(gsr[0:], uint32(iface.Index))
			sin6(gsr[8:], group)
			sin6(gsr[136:], netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(i + 1)}))
			if err := unix.SetsockoptString(fd, unix.IPPROTO_IPV6, unix.MCAST_JOIN_SOURCE_GROUP, string(gsr[:])); err != nil {
				return fmt.Errorf("join source %d: %w", i, err)
			}
		}
		buf := make([]byte, gfSize) // struct group_filter
		binary.NativeEndian.PutUint32(buf[0:], uint32(iface.Index))
		sin6(buf[8:], group)
		binary.NativeEndian.PutUint32(buf[140:], nsrc)
		n := uint32(len(buf))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_IPV6, unix.MCAST_MSFILTER,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		if e != 0 {
			return fmt.Errorf("getsockopt MCAST_MSFILTER: %w", e)
		}
		got = buf[:n]
		return nil
	}))
	if len(got) != gfSize {
		t.Errorf("MCAST_MSFILTER answered %d bytes, want %d", len(got), gfSize)
	} else if n, last := binary.NativeEndian.Uint32(got[140:]), got[gfSize-128+8+15]; n != nsrc || last != nsrc {
		t.Errorf("MCAST_MSFILTER answered %d sources, the last 2001:db8::%x; want %d, the last 2001:db8::%x", n, last, nsrc, nsrc)
	}
	if n := seen(); n != 0 {
		t.Errorf("the getsockopt program passed optlen %d on, want 0 (keep the kernel's answer)", n)
	}
}

// A setsockopt handing more than a page, under the setsockopt program, reaches the
// kernel as the application gave it: kernels before 6.5 fail it with EFAULT
// unless the program passes optlen 0 on (the guest's 6.1 checks this).
func TestSetsockoptLargeValue(t *testing.T) {
	h := newClientHost(t)
	must(t, h.p.A.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		buf := make([]byte, 8192) // IP_TOS takes the first int of it
		binary.NativeEndian.PutUint32(buf, 0x28)
		_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.IPPROTO_IP, unix.IP_TOS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0)
		if e != 0 {
			return fmt.Errorf("setsockopt IP_TOS with %d bytes: %w", len(buf), e)
		}
		if tos, err := unix.GetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_TOS); err != nil || tos != 0x28 {
			return fmt.Errorf("IP_TOS %#x, %v after setting 0x28", tos, err)
		}
		return nil
	}))
}

// optlenProbe attaches to cgroup, after smcr's programs, a getsockopt program that
// records the optlen it is handed for level, optname; seen returns the last one
// (-1: none).
func optlenProbe(t *testing.T, cgroup string, level, optname int32) (probe link.Link, seen func() int32) {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	must(t, err)
	t.Cleanup(func() { m.Close() })
	must(t, m.Put(uint32(0), int32(-1)))
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:       ebpf.CGroupSockopt,
		AttachType: ebpf.AttachCGroupGetsockopt,
		License:    "Dual MIT/GPL",
		Instructions: asm.Instructions{
			// struct bpf_sockopt: level at 24, optname at 28, optlen at 32.
			asm.LoadMem(asm.R2, asm.R1, 24, asm.Word),
			asm.JNE.Imm(asm.R2, level, "out"),
			asm.LoadMem(asm.R2, asm.R1, 28, asm.Word),
			asm.JNE.Imm(asm.R2, optname, "out"),
			asm.LoadMem(asm.R6, asm.R1, 32, asm.Word),
			asm.StoreImm(asm.RFP, -4, 0, asm.Word),
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "out"),
			asm.StoreMem(asm.R0, 0, asm.R6, asm.Word),
			asm.Mov.Imm(asm.R0, 1).WithSymbol("out"),
			asm.Return(),
		},
	})
	must(t, err)
	t.Cleanup(func() { prog.Close() })
	probe, err = link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: ebpf.AttachCGroupGetsockopt, Program: prog})
	must(t, err)
	return probe, func() int32 {
		var v int32
		must(t, m.Lookup(uint32(0), &v))
		return v
	}
}

// The server host: smcrd connects to the application on behalf of the client,
// and the application sees the client's address.
func TestShowPeer(t *testing.T) {
	p := nstest.NewPair(t)
	cg := testCgroup(t)
	l := loadIn(t, p.B, Options{CgroupPath: cg})
	app := listen(t, p.B, ":7003", nil, nil)
	for _, c := range []struct{ dst, client netip.AddrPort }{
		{netip.AddrPortFrom(p.B.Addr4(), 7003), netip.AddrPortFrom(p.A.Addr4(), 40001)},
		{netip.AddrPortFrom(p.B.Addr6(), 7003), netip.AddrPortFrom(p.A.Addr6(), 40002)},
		// An IPv4 client shown to the dual-stack application over IPv6.
		{netip.AddrPortFrom(p.B.Addr6(), 7003), netip.AddrPortFrom(p.A.Addr4(), 40003)},
	} {
		dial(t, p.B, c.dst.String(), l, &Tag{ShowPeer: c.client})
		acc := acceptWithin(t, app, time.Second)
		if acc == nil {
			t.Fatal("application accepted nothing")
		}
		if got := addrPort(acc.RemoteAddr()); got != c.client {
			t.Errorf("application's peer = %v, want the client %v", got, c.client)
		}
	}
	// An untagged connection shows its real peer.
	c := dial(t, p.B, netip.AddrPortFrom(p.B.Addr4(), 7003).String(), nil, nil)
	acc := acceptWithin(t, app, time.Second)
	if got, want := addrPort(acc.RemoteAddr()), addrPort(c.LocalAddr()); got != want {
		t.Errorf("untagged: application's peer = %v, want %v", got, want)
	}
}

// The server host: the options the application's socket accepted from smcrd
// inherited from its listener, and those it sets later, go to smcrd for the
// steered connection on the wire, named by smcrd's connection to the application.
func TestShowPeerSocketOptions(t *testing.T) {
	p := nstest.NewPair(t)
	cg := testCgroup(t)
	l := loadIn(t, p.B, Options{CgroupPath: cg})
	r, err := l.Sockopts()
	must(t, err)
	defer r.Close()
	// What the listener has; its accepted sockets inherit all but the
	// priority (Linux gives them 0).
	listener := []Sockopt{{unix.IPPROTO_IP, unix.IP_TOS, 0x28}, {unix.SOL_SOCKET, unix.SO_PRIORITY, 3},
		{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 77}, {unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, 11},
		{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, 4}, {unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
		{unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, 4321}}
	inherited := slices.Delete(slices.Clone(listener), 1, 2)
	var app net.Listener
	must(t, p.B.Do(func() error {
		lc := net.ListenConfig{KeepAlive: -1, Control: func(_, _ string, c syscall.RawConn) error {
			var errs []error
			c.Control(func(fd uintptr) {
				for _, o := range listener {
					errs = append(errs, unix.SetsockoptInt(int(fd), o.Level, o.Name, o.Value))
				}
			})
			return errors.Join(errs...)
		}}
		lc.SetMultipathTCP(false)
		var err error
		app, err = lc.Listen(context.Background(), "tcp4", ":7004")
		return err
	}))
	defer app.Close()
	dst := netip.AddrPortFrom(p.B.Addr4(), 7004)
	smcrd := dial(t, p.B, dst.String(), l, &Tag{ShowPeer: netip.AddrPortFrom(p.A.Addr4(), 40004)})
	acc := acceptWithin(t, app, time.Second)
	if acc == nil {
		t.Fatal("application accepted nothing")
	}
	defer acc.Close()
	later := Sockopt{unix.IPPROTO_IP, unix.IP_TOS, 0x48}
	rc, err := acc.(*net.TCPConn).SyscallConn()
	must(t, err)
	rc.Control(func(fd uintptr) { must(t, unix.SetsockoptInt(int(fd), later.Level, later.Name, later.Value)) })
	for _, want := range append(inherited, later) {
		got, err := readSockopt(r, time.Second)
		if err != nil || got.Local != addrPort(smcrd.LocalAddr()) || got.Remote != dst || got.Sockopt != want {
			t.Errorf("ring: %+v, %v; want %v on %v-%v", got, err, want, smcrd.LocalAddr(), dst)
		}
	}
	// A connection not from smcrd passes nothing on.
	c := dial(t, p.B, dst.String(), nil, nil)
	defer c.Close()
	if acc := acceptWithin(t, app, time.Second); acc != nil {
		acc.Close()
	}
	if got, err := readSockopt(r, 100*time.Millisecond); err == nil {
		t.Errorf("ring: %+v for a connection not from smcrd", got)
	}
}

// connectRaw connects a new socket to sa from ns with connect(2) itself.
func connectRaw(t *testing.T, ns *nstest.NS, sa unix.Sockaddr) int {
	t.Helper()
	family := unix.AF_INET
	if _, ok := sa.(*unix.SockaddrInet6); ok {
		family = unix.AF_INET6
	}
	var fd int
	must(t, ns.Do(func() error {
		var err error
		if fd, err = unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		t.Cleanup(func() { unix.Close(fd) })
		return unix.Connect(fd, sa)
	}))
	return fd
}

// A socket bound to a device (SO_BINDTODEVICE, a VRF) cannot reach smcrd's
// loopback listener: redirected, its connect would fail with "no route to
// host". It goes where it asked, as without smcrd.
func TestRedirectSkipsBoundToDevice(t *testing.T) {
	h := newClientHost(t)
	goesDirect(t, h, func(fd int) error {
		return unix.SetsockoptString(fd, unix.SOL_SOCKET, unix.SO_BINDTODEVICE, h.p.A.Links[0].Name)
	})
}

// A socket marked for policy routing (SO_MARK) may be routed elsewhere than
// smcrd's own connection would be (around a VPN, say): it goes where it asked,
// as without smcrd.
func TestRedirectSkipsMarked(t *testing.T) {
	h := newClientHost(t)
	goesDirect(t, h, func(fd int) error { return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, 0x1234) })
}

// goesDirect connects from A to the server's listed port, IPv4 and IPv6, on
// sockets prepared by set, and fails unless the server accepts them.
func goesDirect(t *testing.T, h *clientHost, set func(fd int) error) {
	t.Helper()
	for _, b := range []netip.Addr{h.p.B.Addr4(), h.p.B.Addr6()} {
		family, sa := unix.AF_INET6, unix.Sockaddr(&unix.SockaddrInet6{Addr: b.As16(), Port: portListed})
		if b.Is4() {
			family, sa = unix.AF_INET, &unix.SockaddrInet4{Addr: b.As4(), Port: portListed}
		}
		must(t, h.p.A.Do(func() error {
			fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			t.Cleanup(func() { unix.Close(fd) })
			if err := set(fd); err != nil {
				return err
			}
			if err := unix.Connect(fd, sa); err != nil {
				return fmt.Errorf("connect to %s: %w", b, err)
			}
			return nil
		}))
		if acceptWithin(t, h.server, time.Second) == nil {
			t.Errorf("%s: the server accepted nothing", b)
		}
	}
}

// smcrd may be done with a connection before the application accepts it: a
// client that sends and closes at once. The application still sees the client,
// in accept and in getpeername, for as long as its socket lives.
func TestShowPeerAfterSmcrdClosed(t *testing.T) {
	p := nstest.NewPair(t)
	l := loadIn(t, p.B, Options{CgroupPath: testCgroup(t)})
	app := listen(t, p.B, ":7003", nil, nil)
	for _, c := range []struct{ dst, client netip.AddrPort }{
		{netip.AddrPortFrom(p.B.Addr4(), 7003), netip.AddrPortFrom(p.A.Addr4(), 40001)},
		{netip.AddrPortFrom(p.B.Addr6(), 7003), netip.AddrPortFrom(p.A.Addr6(), 40002)},
	} {
		s := dial(t, p.B, c.dst.String(), l, &Tag{ShowPeer: c.client})
		if _, err := s.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		s.Close()
		time.Sleep(100 * time.Millisecond) // smcrd's socket reaches CLOSE
		acc := acceptWithin(t, app, time.Second)
		if acc == nil {
			t.Fatal("application accepted nothing")
		}
		if got := addrPort(acc.RemoteAddr()); got != c.client {
			t.Errorf("accept after smcrd closed: peer %v, want the client %v", got, c.client)
		}
		var peer unix.Sockaddr
		rc, err := acc.(*net.TCPConn).SyscallConn()
		must(t, err)
		must(t, rc.Control(func(fd uintptr) { peer, err = unix.Getpeername(int(fd)) }))
		must(t, err)
		if got := sockaddrAP(peer); netip.AddrPortFrom(got.Addr().Unmap(), got.Port()) != c.client {
			t.Errorf("getpeername after smcrd closed: %v, want the client %v", got, c.client)
		}
	}
}

// smcrd crashed: its heartbeat deadline lasts up to the TTL, but its redirect
// listeners are gone at once. Connections go direct meanwhile instead of being
// refused at the dead listener.
func TestRedirectListenerGone(t *testing.T) {
	h := newClientHost(t)
	h.redir4.Close()
	h.redir6.Close()
	for _, b := range []netip.Addr{h.p.B.Addr4(), h.p.B.Addr6()} {
		orig := netip.AddrPortFrom(b, portListed).String()
		var c net.Conn
		err := h.p.A.Do(func() error {
			d := net.Dialer{Timeout: 3 * time.Second}
			d.SetMultipathTCP(false)
			var err error
			c, err = d.Dial("tcp", orig)
			return err
		})
		if err != nil {
			t.Errorf("connect to %s with smcrd's listeners gone: %v", orig, err)
			continue
		}
		c.Close()
		if acceptWithin(t, h.server, time.Second) == nil {
			t.Errorf("%s: the server accepted nothing", orig)
		}
	}
}

// An application that bound its socket chose the address or port the server
// sees (an allow-list, NFS's reserved ports). smcrd's own connection would
// leave from an address and port of its choosing, so such sockets go direct.
func TestRedirectSkipsBound(t *testing.T) {
	h := newClientHost(t)
	for i, c := range []struct {
		bind netip.AddrPort
		dst  netip.Addr
	}{
		{netip.AddrPortFrom(h.p.A.Addr4(), 0), h.p.B.Addr4()},
		{netip.AddrPortFrom(h.p.A.Addr6(), 0), h.p.B.Addr6()},
		{netip.AddrPortFrom(netip.IPv4Unspecified(), 41250), h.p.B.Addr4()},
		{netip.AddrPortFrom(netip.IPv6Unspecified(), 41251), h.p.B.Addr6()},
	} {
		var local unix.Sockaddr
		must(t, h.p.A.Do(func() error {
			family, bind := unix.AF_INET6, unix.Sockaddr(&unix.SockaddrInet6{Addr: c.bind.Addr().As16(), Port: int(c.bind.Port())})
			dst := unix.Sockaddr(&unix.SockaddrInet6{Addr: c.dst.As16(), Port: portListed})
			if c.dst.Is4() {
				family, bind = unix.AF_INET, &unix.SockaddrInet4{Addr: c.bind.Addr().As4(), Port: int(c.bind.Port())}
				dst = &unix.SockaddrInet4{Addr: c.dst.As4(), Port: portListed}
			}
			fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			t.Cleanup(func() { unix.Close(fd) })
			if err := unix.Bind(fd, bind); err != nil {
				return err
			}
			if err := unix.Connect(fd, dst); err != nil {
				return fmt.Errorf("connect bound to %v: %w", c.bind, err)
			}
			local, err = unix.Getsockname(fd)
			return err
		}))
		acc := acceptWithin(t, h.server, time.Second)
		if acc == nil {
			t.Errorf("%d: bound to %v: the server accepted nothing (redirected)", i, c.bind)
			continue
		}
		if got, want := addrPort(acc.RemoteAddr()), sockaddrAP(local); got != want || (c.bind.Port() != 0 && got.Port() != c.bind.Port()) ||
			(c.bind.Port() == 0 && got.Addr() != c.bind.Addr()) {
			t.Errorf("%d: bound to %v: the server sees %v, the application %v", i, c.bind, got, want)
		}
	}
}

// A dual-stack IPv6 socket reaches IPv4 servers through IPv4-mapped addresses,
// as every Java application does: redirected like an IPv4 socket, and shown
// the mapped addresses it would have had.
func TestRedirectMapped(t *testing.T) {
	h := newClientHost(t)
	b4, a4 := h.p.B.Addr4(), h.p.A.Addr4()
	mapped := netip.AddrFrom16(b4.As16())
	var peer, local unix.Sockaddr
	must(t, h.p.A.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		t.Cleanup(func() { unix.Close(fd) })
		if err := unix.Connect(fd, &unix.SockaddrInet6{Addr: mapped.As16(), Port: portListed}); err != nil {
			return fmt.Errorf("connect to %s: %w", mapped, err)
		}
		peer, local, err = names(fd)
		return err
	}))
	acc := acceptWithin(t, h.redir4, time.Second)
	if acc == nil {
		acceptWithin(t, h.server, 100*time.Millisecond)
		t.Fatalf("connection to %s not redirected", mapped)
	}
	orig := netip.AddrPortFrom(b4, portListed)
	if got, err := OriginalDst(acc.(*net.TCPConn)); err != nil || got != orig {
		t.Errorf("SO_ORIGINAL_DST = %v, %v; want %v", got, err, orig)
	}
	if got, want := sockaddrAP(peer), netip.AddrPortFrom(mapped, portListed); got != want {
		t.Errorf("application's getpeername = %v, want %v", got, want)
	}
	if got, want := sockaddrAP(local), netip.AddrPortFrom(netip.AddrFrom16(a4.As16()), addrPort(acc.RemoteAddr()).Port()); got != want {
		t.Errorf("application's getsockname = %v, want %v", got, want)
	}
	// The IPv4 policy applies: a negative entry for the server keeps it direct.
	must(t, h.l.AddNegative(netip.AddrPortFrom(b4, portListed), time.Minute))
	connectRaw(t, h.p.A, &unix.SockaddrInet6{Addr: mapped.As16(), Port: portListed})
	if acceptWithin(t, h.server, time.Second) == nil {
		t.Errorf("%s in the negative cache: the server accepted nothing", b4)
	}
}

// An MPTCP socket connects through its first subflow, a TCP socket, which
// connect4/6 redirect: the MPTCP socket still shows the server it dialled and
// its own interface's address, IPv4-mapped ones on a dual-stack socket too.
func TestRedirectMPTCP(t *testing.T) {
	h := newClientHost(t)
	b4, a4, b6, a6 := h.p.B.Addr4(), h.p.A.Addr4(), h.p.B.Addr6(), h.p.A.Addr6()
	mapped := func(a netip.Addr) netip.Addr { return netip.AddrFrom16(a.As16()) }
	for _, c := range []struct {
		name         string
		family       int
		server, self netip.Addr // as the application's socket shows them
		redir        net.Listener
	}{
		{"ipv4", unix.AF_INET, b4, a4, h.redir4},
		{"ipv6", unix.AF_INET6, b6, a6, h.redir6},
		{"mapped", unix.AF_INET6, mapped(b4), mapped(a4), h.redir4},
	} {
		t.Run(c.name, func(t *testing.T) {
			var peer, local unix.Sockaddr
			must(t, h.p.A.Do(func() error {
				fd, err := unix.Socket(c.family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_MPTCP)
				if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ENOPROTOOPT) {
					t.Skipf("kernel without MPTCP: %v", err)
				}
				if err != nil {
					return err
				}
				t.Cleanup(func() { unix.Close(fd) })
				var sa unix.Sockaddr = &unix.SockaddrInet6{Addr: c.server.As16(), Port: portListed}
				if c.family == unix.AF_INET {
					sa = &unix.SockaddrInet4{Addr: c.server.As4(), Port: portListed}
				}
				if err := unix.Connect(fd, sa); err != nil {
					return fmt.Errorf("connect to %s: %w", c.server, err)
				}
				peer, local, err = names(fd)
				return err
			}))
			acc := acceptWithin(t, c.redir, time.Second)
			if acc == nil {
				acceptWithin(t, h.server, 100*time.Millisecond)
				t.Fatalf("MPTCP connection to %s not redirected", c.server)
			}
			if got, want := sockaddrAP(peer), netip.AddrPortFrom(c.server, portListed); got != want {
				t.Errorf("application's getpeername = %v, want %v", got, want)
			}
			if got, want := sockaddrAP(local), netip.AddrPortFrom(c.self, addrPort(acc.RemoteAddr()).Port()); got != want {
				t.Errorf("application's getsockname = %v, want %v", got, want)
			}
		})
	}
}

// A destination smcrd could not reach goes direct, so the application gets the
// kernel's refusal itself; each refusal keeps it so for another ttl, and the
// first connection that succeeds makes the next ones go through smcrd again.
func TestRedirectUnreachable(t *testing.T) {
	h := newClientHost(t)
	for _, c := range []struct {
		dst   netip.AddrPort
		redir net.Listener
	}{
		{netip.AddrPortFrom(h.p.B.Addr4(), portListed+1), h.redir4},
		{netip.AddrPortFrom(h.p.B.Addr6(), portListed+2), h.redir6},
	} {
		t.Run(c.dst.Addr().String(), func(t *testing.T) {
			const ttl = 3 * time.Second
			must(t, h.l.AddUnreachable(c.dst, ttl))
			time.Sleep(time.Second)
			err := h.p.A.Do(func() error {
				conn, err := net.DialTimeout("tcp", c.dst.String(), 2*time.Second)
				if err == nil {
					conn.Close()
				}
				return err
			})
			if !errors.Is(err, unix.ECONNREFUSED) {
				acceptWithin(t, c.redir, 100*time.Millisecond)
				t.Fatalf("connect to unreachable %s: %v, want the refusal", c.dst, err)
			}
			left, err := h.l.Unreachables()
			must(t, err)
			if left[c.dst] < ttl-time.Second/2 {
				t.Errorf("after a refused direct connect, %v has %v left, want about %v (kept for another ttl)", c.dst, left[c.dst], ttl)
			}
			// The server comes up: the direct connect succeeds, and the next
			// one goes through smcrd.
			server := listen(t, h.p.B, c.dst.String(), nil, nil)
			if who, _, _ := whoAccepts(t, h.p.A, c.dst.String(), server, c.redir); who != 0 {
				t.Fatalf("connect to %s once it listens went to listener %d, want the server (direct)", c.dst, who)
			}
			left, err = h.l.Unreachables()
			must(t, err)
			if _, ok := left[c.dst]; ok {
				t.Errorf("%v still unreachable after a connection succeeded", c.dst)
			}
			if who, _, _ := whoAccepts(t, h.p.A, c.dst.String(), c.redir, server); who != 0 {
				t.Errorf("connect to %s after that went to listener %d, want smcrd's", c.dst, who)
			}
		})
	}
	st, err := h.l.Stats()
	must(t, err)
	if st["skip_unreachable"] != 4 {
		t.Errorf("skip_unreachable = %d, want 4", st["skip_unreachable"])
	}
}
