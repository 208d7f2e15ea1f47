package bpf

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/smcr-io/smcr/internal/nstest"
)

// TestCloseWhileInUse: smcrd's control server reads the maps (stats, peers)
// while smcrd shuts down and closes the loader. Each read finishes before
// Close closes the maps, or fails with net.ErrClosed; none works on a closed,
// perhaps reused, descriptor (the race-built smcrd caught the control
// server's Stats beside Close). After Close every method that touches a map
// says the loader is closed.
func TestCloseWhileInUse(t *testing.T) {
	p := nstest.NewPair(t)
	l := loadIn(t, p.A, Options{CgroupPath: testCgroup(t)})
	var wg sync.WaitGroup
	var reads atomic.Int64
	for range 4 {
		wg.Go(func() {
			for {
				_, err := l.Stats()
				if err == nil {
					_, err = l.Unreachables()
				}
				switch {
				case err == nil:
					reads.Add(1)
				case errors.Is(err, net.ErrClosed):
					return
				default:
					t.Errorf("read beside Close: %v", err)
					return
				}
			}
		})
	}
	for reads.Load() < 100 {
		time.Sleep(time.Millisecond)
	}
	must(t, l.Close())
	wg.Wait()

	ap := netip.MustParseAddrPort("192.0.2.1:80")
	for name, err := range map[string]error{
		"SetAlive":       l.SetAlive(time.Second),
		"SetPorts":       l.SetPorts([]PortRange{{Lo: 80, Hi: 80}}),
		"SetPrefixes":    l.SetPrefixes(nil),
		"AddNegative":    l.AddNegative(ap, time.Second),
		"AddUnreachable": l.AddUnreachable(ap, time.Second),
		"TagSocket":      l.TagSocket(0, Tag{}),
		"Seen":           second(l.Seen(ap, ap)),
		"Negatives":      second(l.Negatives()),
		"Stats":          second(l.Stats()),
		"MapIDs":         second(l.MapIDs()),
		"SetInterfaces":  l.SetInterfaces(nil),
	} {
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("%s after Close: %v, want net.ErrClosed", name, err)
		}
	}
	if _, ok := l.ShownSource(ap.Addr()); ok {
		t.Error("ShownSource after Close found a source")
	}
}

func second[T any](_ T, err error) error { return err }

// TestConfigUpdatesKeepEachOther: SetRedirect and SetPrefixes each change
// their own fields of smcr_config's one entry, under different locks; run
// together, neither write may put back what the other replaced. Each checks
// after its write that its field holds what it wrote.
func TestConfigUpdatesKeepEachOther(t *testing.T) {
	p := nstest.NewPair(t)
	l := loadIn(t, p.A, Options{CgroupPath: testCgroup(t)})
	config := func() smcrConfig {
		var c smcrConfig
		if err := l.objs.SmcrConfig.Lookup(uint32(0), &c); err != nil {
			t.Error(err)
		}
		return c
	}
	rule := []PrefixRule{{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Allow: true}}
	const rounds = 2000
	var lost atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range rounds {
			port := uint16(10000 + i)
			if err := l.SetRedirect(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), netip.AddrPort{}); err != nil {
				t.Error(err)
				return
			}
			if hostPort(config().Redir4Port) != port {
				lost.Add(1)
			}
		}
	})
	wg.Go(func() {
		for i := range rounds {
			if err := l.SetPrefixes(rule[:i%2]); err != nil {
				t.Error(err)
				return
			}
			if on := config().Flags&cfgCheckPrefix != 0; on != (i%2 == 1) {
				lost.Add(1)
			}
		}
	})
	wg.Wait()
	if n := lost.Load(); n > 0 {
		t.Errorf("%d of %d writes undone by the other's", n, 2*rounds)
	}
}
