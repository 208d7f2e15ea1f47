// Package nstest makes test hosts: fresh network namespaces joined by veth pairs,
// so tests and benchmarks exchange real traffic between "hosts" on one machine.
//
//	 namespace A (smcr-xxxxxx-a)               namespace B (smcr-xxxxxx-b)
//	┌─────────────────────────┐             ┌─────────────────────────┐
//	│ lo  127.0.0.1           │             │ lo  127.0.0.1           │
//	│ <veth>a 198.18.0.1/24   │◀── veth ───▶│ <veth>b 198.18.0.2/24   │
//	│         fd00:534d:4352::1/64          │         fd00:534d:4352::2/64
//	│ (AddLink: 198.19.0.1)   │◀── veth ───▶│ (AddLink: 198.19.0.2)   │
//	└─────────────────────────┘             └─────────────────────────┘
//
// The addresses come from the benchmarking range (RFC 2544) and a ULA prefix, and
// exist only inside the namespaces a test made. Everything is removed by t.Cleanup.
package nstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NS is one test host: a named network namespace, or the process's own (BenchMain).
type NS struct {
	Name   string
	Links  []Link // veth ends in this namespace, in the order they were added
	handle netns.NsHandle
	own    bool // the process's namespace: every thread is in it
}

// Link is one veth end inside a namespace.
type Link struct {
	Name  string
	Addr4 netip.Prefix
	Addr6 netip.Prefix
}

// Pair is two test hosts joined by one or more veth pairs.
type Pair struct {
	A, B *NS
	t    testing.TB
}

// Require skips the test when network namespaces cannot be made here.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("nstest: needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) to create network namespaces")
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		t.Skipf("nstest: kernel without network namespaces: %v", err)
	}
}

// NewPair creates two namespaces joined by a veth pair (198.18.0.1 ↔ 198.18.0.2).
func NewPair(t testing.TB) *Pair {
	t.Helper()
	Require(t)
	id := randomID()
	p := &Pair{t: t}
	var err error
	if p.A, err = newA("smcr-" + id + "-a"); err != nil {
		t.Fatalf("nstest: %v", err)
	}
	t.Cleanup(func() { p.A.remove() })
	if p.B, err = newNS("smcr-" + id + "-b"); err != nil {
		t.Fatalf("nstest: %v", err)
	}
	t.Cleanup(func() { p.B.remove() })
	p.AddLink()
	return p
}

// OpenPair is NewPair for programs that have no testing.TB (cmd/smcrbench): it
// returns an error instead of failing a test, and the caller must Close the pair.
func OpenPair() (*Pair, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("nstest: needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) to create network namespaces")
	}
	id := randomID()
	p := &Pair{}
	var err error
	if p.A, err = newNS("smcr-" + id + "-a"); err != nil {
		return nil, fmt.Errorf("nstest: %w", err)
	}
	if p.B, err = newNS("smcr-" + id + "-b"); err != nil {
		p.A.remove()
		return nil, fmt.Errorf("nstest: %w", err)
	}
	if _, _, err := p.addLink(); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Close removes a pair made by OpenPair (NewPair's pairs are removed by t.Cleanup).
func (p *Pair) Close() error {
	p.A.remove()
	p.B.remove()
	return nil
}

// AddLink joins A and B by another veth pair, in subnet 198.(18+n).0.0/24 and
// fd00:534d:4352:n::/64 for the n-th link (counting from 0), and returns the new ends.
func (p *Pair) AddLink() (a, b Link) {
	p.t.Helper()
	a, b, err := p.addLink()
	if err != nil {
		p.t.Fatal(err)
	}
	return a, b
}

func (p *Pair) addLink() (a, b Link, err error) {
	n := len(p.A.Links)
	id := randomID()
	a = Link{
		Name:  fmt.Sprintf("sm%s%da", id, n),
		Addr4: netip.PrefixFrom(netip.AddrFrom4([4]byte{198, byte(18 + n), 0, 1}), 24),
		Addr6: netip.PrefixFrom(ula(n, 1), 64),
	}
	b = Link{
		Name:  fmt.Sprintf("sm%s%db", id, n),
		Addr4: netip.PrefixFrom(netip.AddrFrom4([4]byte{198, byte(18 + n), 0, 2}), 24),
		Addr6: netip.PrefixFrom(ula(n, 2), 64),
	}
	if err := addVeth(p.A, a, p.B, b); err != nil {
		return a, b, fmt.Errorf("nstest: add link: %w", err)
	}
	p.A.Links = append(p.A.Links, a)
	p.B.Links = append(p.B.Links, b)
	return a, b, nil
}

// Addr4 is the IPv4 address of the namespace's first link.
func (n *NS) Addr4() netip.Addr { return n.Links[0].Addr4.Addr() }

// Addr6 is the IPv6 address of the namespace's first link.
func (n *NS) Addr6() netip.Addr { return n.Links[0].Addr6.Addr() }

// Do runs fn on a locked OS thread inside the namespace (in the process's own, on
// the caller's goroutine). Sockets fn creates stay in the namespace and may be used
// from any goroutine afterwards.
func (n *NS) Do(fn func() error) error {
	if n.own {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("nstest: get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(n.handle); err != nil {
			errc <- fmt.Errorf("nstest: enter %s: %w", n.Name, err)
			return
		}
		err = fn()
		// A thread we could not switch back stays locked, so the runtime retires it.
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// Listen opens a TCP listener inside the namespace (MPTCP off, so it may go into a
// SOCKMAP or be an sk_lookup target).
func (n *NS) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := n.Do(func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		var err error
		ln, err = lc.Listen(context.Background(), network, addr)
		return err
	})
	return ln, err
}

// Dial opens a TCP connection from inside the namespace.
func (n *NS) Dial(network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		var err error
		c, err = net.Dial(network, addr)
		return err
	})
	return c, err
}

// Command returns a command that runs inside the namespace through `ip netns exec`
// (in the process's own, directly).
func (n *NS) Command(name string, args ...string) *exec.Cmd {
	if n.own {
		return exec.Command(name, args...)
	}
	return exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

func newNS(name string) (*NS, error) {
	n := &NS{Name: name}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		h, err := netns.NewNamed(name)
		if err != nil {
			errc <- fmt.Errorf("create netns %s: %w", name, err)
			return
		}
		n.handle = h
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	return n, nil
}

func (n *NS) remove() {
	if n.own {
		n.releaseOwn()
		return
	}
	n.handle.Close()
	netns.DeleteNamed(n.Name)
}

func addVeth(nsA *NS, a Link, nsB *NS, b Link) error {
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a.Name}, PeerName: b.Name}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s/%s: %w", a.Name, b.Name, err)
	}
	for _, end := range []struct {
		ns   *NS
		link Link
	}{{nsA, a}, {nsB, b}} {
		l, err := netlink.LinkByName(end.link.Name)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetNsFd(l, int(end.ns.handle)); err != nil {
			return fmt.Errorf("move %s into %s: %w", end.link.Name, end.ns.Name, err)
		}
		if err := configure(end.ns, end.link); err != nil {
			return err
		}
	}
	return nil
}

func configure(n *NS, link Link) error {
	h, err := netlink.NewHandleAt(n.handle)
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", n.Name, err)
	}
	defer h.Close()
	l, err := h.LinkByName(link.Name)
	if err != nil {
		return err
	}
	for _, p := range []netip.Prefix{link.Addr4, link.Addr6} {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			addr.Flags = unix.IFA_F_NODAD // usable at once, no duplicate-address wait
		}
		if err := h.AddrAdd(l, addr); err != nil {
			return fmt.Errorf("address %s on %s: %w", p, link.Name, err)
		}
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("up %s: %w", link.Name, err)
	}
	return nil
}

func ula(subnet, host int) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfd, 0x00, 0x53, 0x4d, 0x43, 0x52, 0, byte(subnet), 15: byte(host)})
}

func randomID() string {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(errors.Join(errors.New("nstest: random"), err))
	}
	return hex.EncodeToString(b[:])
}
