package smcr

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/smcr-io/smcr/internal/nstest"
)

// TestPrefixCache: the interface addresses are read once for a burst of
// connections, again when the list lacks the local address (a new one) or is a
// second old, and a changed prefix shows after that second.
func TestPrefixCache(t *testing.T) {
	now := time.Unix(1000, 0)
	reads := 0
	ifaddrs := []net.Addr{&net.IPNet{IP: net.IPv4(10, 1, 2, 3), Mask: net.CIDRMask(24, 32)}}
	pc := newPrefixCache(func() ([]net.Addr, error) { reads++; return append([]net.Addr(nil), ifaddrs...), nil }, func() time.Time { return now })
	check := func(local string, want string, wantReads int) {
		t.Helper()
		p, ok := pc.lookup(netip.MustParseAddr(local))
		if got := p.String(); (want == "") == ok || ok && got != want || reads != wantReads {
			t.Fatalf("lookup %s: %v %v after %d reads; want %q after %d", local, p, ok, reads, want, wantReads)
		}
	}
	check("10.1.2.3", "10.1.2.0/24", 1)
	for range 10 {
		check("10.1.2.3", "10.1.2.0/24", 1)
	}
	ifaddrs = append(ifaddrs, &net.IPNet{IP: net.IPv4(10, 9, 0, 1), Mask: net.CIDRMask(16, 32)})
	check("10.9.0.1", "10.9.0.0/16", 2) // a new address: read at once
	check("192.0.2.1", "", 3)           // not ours: read, still not found
	ifaddrs[0] = &net.IPNet{IP: net.IPv4(10, 1, 2, 3), Mask: net.CIDRMask(16, 32)}
	check("10.1.2.3", "10.1.2.0/24", 3) // the old prefix, within the second
	now = now.Add(prefixTTL)
	check("10.1.2.3", "10.1.0.0/16", 4)
}

// TestLocalPrefixAddrTypes: the local address of a wrapped connection may be of
// the wrapper's own type (parsed from its string) or missing (no prefix, no panic).
func TestLocalPrefixAddrTypes(t *testing.T) {
	e := &Engine{cfg: Config{Prefixes: func(a netip.Addr) (netip.Prefix, bool) {
		return netip.PrefixFrom(a, 24).Masked(), a.Is4()
	}}}
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5}, "10.1.2.0/24"},
		{fakeAddr("10.9.8.7:80"), "10.9.8.0/24"},
		{fakeAddr("not an address"), "invalid Prefix"},
		{nil, "invalid Prefix"},
	} {
		if got := e.localPrefix(addrConn{local: tc.addr}, nil).String(); got != tc.want {
			t.Errorf("%v: %s, want %s", tc.addr, got, tc.want)
		}
	}
}

type fakeAddr string

func (fakeAddr) Network() string  { return "tcp" }
func (a fakeAddr) String() string { return string(a) }

// addrConn is a connection that has nothing but a local address.
type addrConn struct {
	net.Conn
	local net.Addr
}

func (c addrConn) LocalAddr() net.Addr { return c.local }

// TestPrefixCacheBySocket: the engine keys the cache by the namespace of the
// connection's socket (its netns cookie, no stat in /proc). Addresses read on a
// thread in another namespace than the socket's are used once and not kept
// under the socket's.
func TestPrefixCacheBySocket(t *testing.T) {
	p := nstest.NewPair(t)
	reads := 0
	pc := newPrefixCache(func() ([]net.Addr, error) {
		reads++
		return []net.Addr{&net.IPNet{IP: net.IPv4(10, 1, 2, 3), Mask: net.CIDRMask(24, 32)}}, nil
	}, time.Now)
	local := netip.MustParseAddr("10.1.2.3")
	connIn := func(ns *nstest.NS) net.Conn {
		t.Helper()
		var c net.Conn
		err := ns.Do(func() error {
			ln, err := net.Listen("tcp", netip.AddrPortFrom(ns.Addr4(), 0).String())
			if err != nil {
				return err
			}
			defer ln.Close()
			c, err = net.Dial("tcp", ln.Addr().String())
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := connIn(p.A), connIn(p.B)
	if _, ok := socketNS(a); !ok {
		t.Skip("kernel without SO_NETNS_COOKIE (Linux 5.14): the engine keys by the thread's namespace")
	}
	// On a thread in A, A's socket: read once, then kept.
	err := p.A.Do(func() error {
		for range 3 {
			if pfx, ok := pc.lookupConn(a, local); !ok || pfx.String() != "10.1.2.0/24" {
				t.Errorf("lookup in A: %v %v", pfx, ok)
			}
		}
		return nil
	})
	if err != nil || reads != 1 {
		t.Fatalf("A: %d reads (%v), want 1", reads, err)
	}
	// B's socket from a thread in A: nothing kept for B, and A's entry serves
	// no socket of B.
	err = p.A.Do(func() error {
		for range 2 {
			pc.lookupConn(b, local)
		}
		return nil
	})
	if err != nil || reads != 3 {
		t.Fatalf("B from A: %d reads (%v), want 3", reads, err)
	}
	if ka, _ := socketNS(a); func() bool { kb, _ := socketNS(b); return ka == kb }() {
		t.Fatal("sockets of two namespaces share a key")
	}
}
