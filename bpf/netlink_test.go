package bpf

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/smcr-io/smcr/internal/nstest"
)

// TestRetryDump: a dump the kernel interrupted is run again, up to dumpTries
// times; any other error, or success, ends it at once.
func TestRetryDump(t *testing.T) {
	calls := 0
	interruptedTwice := func() (int, error) {
		calls++
		if calls <= 2 {
			return -1, netlink.ErrDumpInterrupted
		}
		return calls, nil
	}
	if v, err := retryDump(interruptedTwice); err != nil || v != 3 {
		t.Errorf("interrupted twice: %v, %v after %d calls; want 3, nil", v, err, calls)
	}
	calls = 0
	always := func() (int, error) { calls++; return -1, fmt.Errorf("dump: %w", netlink.ErrDumpInterrupted) }
	if _, err := retryDump(always); !errors.Is(err, netlink.ErrDumpInterrupted) || calls != dumpTries {
		t.Errorf("always interrupted: %v after %d calls; want ErrDumpInterrupted after %d", err, calls, dumpTries)
	}
	calls = 0
	other := errors.New("no such device")
	if _, err := retryDump(func() (int, error) { calls++; return 0, other }); err != other || calls != 1 {
		t.Errorf("other error: %v after %d calls; want it after 1", err, calls)
	}
}

// TestInterfacePrefixesWhileAddressesChange: smcrd reads the listed
// interfaces' addresses and routes at start and on every change; an address
// added or removed meanwhile (DAD ending, DHCP, another program) interrupts
// the kernel's dump, which must not fail the reading (it stopped smcrd from
// starting, once, in the VM suite).
func TestInterfacePrefixesWhileAddressesChange(t *testing.T) {
	nstest.Require(t)
	p := nstest.NewPair(t)
	name := p.A.Links[0].Name
	var stop atomic.Bool
	churned := make(chan error, 1)
	ready := make(chan struct{}, 1)
	go func() {
		churned <- p.A.Do(func() error {
			lk, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			// Enough addresses that a dump takes several messages: the kernel
			// marks one interrupted only between them.
			for i := range 500 {
				a := &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 78, byte(i>>8), byte(i)), Mask: net.CIDRMask(32, 32)}}
				if err := netlink.AddrAdd(lk, a); err != nil {
					return err
				}
			}
			ready <- struct{}{}
			// A change every millisecond or so, as often as a dump takes here:
			// most dumps meet one.
			for i := 0; !stop.Load(); i++ {
				a := &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 77, byte(i>>8), byte(i)), Mask: net.CIDRMask(32, 32)}}
				if err := netlink.AddrAdd(lk, a); err != nil {
					return err
				}
				time.Sleep(time.Millisecond)
				if err := netlink.AddrDel(lk, a); err != nil {
					return err
				}
				time.Sleep(time.Millisecond)
			}
			return nil
		})
	}()
	select {
	case <-ready:
	case err := <-churned:
		t.Fatalf("adding addresses: %v", err)
	}
	err := p.A.Do(func() error {
		for range 200 {
			if _, err := InterfacePrefixes([]string{name}); err != nil {
				return err
			}
		}
		return nil
	})
	stop.Store(true)
	if cerr := <-churned; cerr != nil {
		t.Fatalf("changing addresses: %v", cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
}
