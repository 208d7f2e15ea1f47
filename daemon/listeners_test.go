package daemon

import (
	"context"
	"fmt"
	"net"
	"testing"

	"github.com/smcr-io/smcr/config"
	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// TestListeners: smcrctl listeners shows each listener with whether smcrd
// steers its connections, and why not: loopback only, a port not listed,
// smcrd disabled. smcrd's own listeners are left out.
func TestListeners(t *testing.T) {
	listen := func(addr string) (net.Listener, uint16) {
		ln, err := net.Listen("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		return ln, uint16(ln.Addr().(*net.TCPAddr).Port)
	}
	_, lo := listen("127.0.0.1:0")
	_, any := listen("0.0.0.0:0")
	_, unlisted := listen("0.0.0.0:0")
	ownLn, own := listen("127.0.0.1:0")
	cfg, err := config.Default().Set(fmt.Sprintf("port_range_list=%d,%d,%d", lo, any, own))
	if err != nil {
		t.Fatal(err)
	}
	d, _ := policyDaemon(t, cfg, nil)
	d.devs = []verbs.Device{portDev{name: "mlx5_0"}}
	d.steering = []net.Listener{ownLn}
	check := func(want map[uint16]control.Listener) {
		t.Helper()
		ls, err := d.Listeners(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got := map[uint16]control.Listener{}
		for _, l := range ls {
			got[l.Port] = l
		}
		for port, w := range want {
			if g, ok := got[port]; !ok || g != w {
				t.Errorf("port %d: %+v (listed %v), want %+v", port, g, ok, w)
			}
		}
		if _, ok := got[own]; ok {
			t.Errorf("smcrd's own listener %d listed", own)
		}
	}
	check(map[uint16]control.Listener{
		lo:       {Addr: "127.0.0.1", Port: lo, Reason: "loopback only: its connections do not arrive on the interfaces"},
		any:      {Addr: "0.0.0.0", Port: any, Steered: true},
		unlisted: {Addr: "0.0.0.0", Port: unlisted, Reason: "port not in port_range_list"},
	})
	if _, err := d.SetConfig(context.Background(), control.SetConfigRequest{Assignments: []string{"enabled=no"}}); err != nil {
		t.Fatal(err)
	}
	check(map[uint16]control.Listener{any: {Addr: "0.0.0.0", Port: any, Reason: "smcrd disabled"}})
}
