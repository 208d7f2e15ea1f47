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
