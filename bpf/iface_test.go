package bpf

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/internal/nstest"
)

// remakeLink removes p's first veth pair and makes it again, with the same
// names and IPv4 addresses: new devices, as after a driver reload.
func remakeLink(t *testing.T, p *nstest.Pair) {
	t.Helper()
	a, b := p.A.Links[0], p.B.Links[0]
	var nsA int
	must(t, p.A.Do(func() error {
		var err error
		nsA, err = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		return err
	}))
	defer unix.Close(nsA)
	must(t, p.B.Do(func() error {
		l, err := netlink.LinkByName(b.Name)
		if err != nil {
			return err
		}
		if err := netlink.LinkDel(l); err != nil {
			return err
		}
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: b.Name}, PeerName: a.Name}); err != nil {
			return err
		}
		peer, err := netlink.LinkByName(a.Name)
		if err != nil {
			return err
		}
		return netlink.LinkSetNsFd(peer, nsA)
	}))
	for _, end := range []struct {
		ns   *nstest.NS
		link nstest.Link
	}{{p.A, a}, {p.B, b}} {
		must(t, end.ns.Do(func() error {
			l, err := netlink.LinkByName(end.link.Name)
			if err != nil {
				return err
			}
			a4 := end.link.Addr4
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: a4.Addr().AsSlice(), Mask: net.CIDRMask(a4.Bits(), 32)}}); err != nil {
				return err
			}
			return netlink.LinkSetUp(l)
		}))
	}
}

// TestInterfaceRemade: an interface that goes away and comes back is a new
// device, without the tc program the old one had, so SYNs arriving on it are
// not steered; SetInterfaces with the same names (smcrd's followInterfaces
// calls it when interfaces change) attaches the program to it, and lets the
// link of the old device go.
func TestInterfaceRemade(t *testing.T) {
	p, la, lb, app, steer4 := newSteering4(t)
	dst := netip.AddrPortFrom(p.B.Addr4(), portSteered)
	steered := func() bool {
		t.Helper()
		dial(t, p.A, dst.String(), la, &Tag{SMCOption: true})
		if acceptWithin(t, steer4, time.Second) != nil {
			return true
		}
		if acceptWithin(t, app, time.Second) == nil {
			t.Fatal("neither smcrd nor the application accepted the connection")
		}
		return false
	}
	remakeLink(t, p)
	if steered() {
		t.Log("steered on the new device before SetInterfaces: the kernel kept the program")
	}
	name := p.B.Links[0].Name
	must(t, p.B.Do(func() error { return lb.SetInterfaces([]string{name}) }))
	if !steered() {
		t.Error("not steered on the new device after SetInterfaces")
	}
	if lb.cls {
		return // tc is a cls_bpf filter, held by no link (no tcx)
	}
	if lk, ok := lb.links["tc_"+name]; !ok {
		t.Error("no tc link held after SetInterfaces")
	} else if info, err := lk.Info(); err != nil || info.TCX() != nil && info.TCX().Ifindex == 0 {
		t.Errorf("tc link held is the old device's: %+v, %v", info, err)
	}
	// Asked again with nothing changed: the link stays as it is.
	held := lb.links["tc_"+name]
	must(t, p.B.Do(func() error { return lb.SetInterfaces([]string{name}) }))
	if lb.links["tc_"+name] != held {
		t.Error("SetInterfaces with nothing changed replaced the tc link")
	}
}
