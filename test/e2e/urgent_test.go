// Urgent data (MSG_OOB) through smcrd: each urgent byte an application sends
// reaches the other application as urgent data, at its place in the stream, with
// every byte around it — over SMC-R (the CDC's urgent flag), after a CLC fallback
// (the smcr.Conn over TCP), and through the plain relay for a peer without SMC
// (splice, which stops at the mark).

package e2e

import (
	"fmt"
	"net/netip"
	"testing"
)

func TestUrgentData(t *testing.T) {
	for _, p := range providers() {
		t.Run("smc-r/"+p, func(t *testing.T) {
			a, b := hosts(t)
			a.start(append(a.providerConf(p), ports)...)
			b.start(append(b.providerConf(p), ports)...)
			a.serve(5201)
			b.serve(5201)
			for _, tc := range []struct{ from, to *host }{{a, b}, {b, a}} {
				urgentClients(t, tc.from, netip.AddrPortFrom(tc.to.ns.Addr4(), 5201))
			}
			if s := a.stats(); s.Connections.SMCR != 2*4 {
				t.Errorf("SMC-R connections on A: %+v, fallbacks %+v", s.Connections, s.Fallbacks)
			}
		})
	}
	t.Run("clc-fallback", func(t *testing.T) {
		a, b := hosts(t)
		a.start("providers = shm", ports)
		b.start("providers = soft", ports) // no provider in common: a Decline
		b.serve(5201)
		// The first connection falls back after CLC and goes on through the
		// smcr.Conn; the negative cache sends the later ones direct.
		urgentClients(t, a, netip.AddrPortFrom(b.ns.Addr4(), 5201))
		if s := a.stats(); s.Connections.Fallback != 1 || s.Connections.SMCR != 0 || len(s.Fallbacks) != 1 || s.Fallbacks[0].Code == 0 {
			t.Errorf("connections on A: %+v, fallbacks %+v", s.Connections, s.Fallbacks)
		}
	})
	t.Run("no-smc-peer", func(t *testing.T) {
		a, b := hosts(t)
		a.start("providers = shm", ports)
		b.serve(5201)
		// The first connection goes through A's smcrd (spliced), before the
		// negative cache sends the next ones direct.
		urgentClients(t, a, netip.AddrPortFrom(b.ns.Addr4(), 5201))
		if s := a.stats(); s.Connections.Handled != 1 {
			t.Errorf("connections on A: %+v", s.Connections)
		}
	})
}

// urgentClients runs testapp's urgent mode from h to dst: one connection, then
// three at once.
func urgentClients(t *testing.T, h *host, dst netip.AddrPort) {
	t.Helper()
	for _, conns := range []int{1, 3} {
		r, err := h.client(dst.String(), "-mode", "urgent", "-bytes", "400000", "-conns", fmt.Sprint(conns))
		if err != nil || r.OK != conns {
			t.Fatalf("urgent data to %s: %+v: %v\nsmcrd log:\n%s", dst, r, err, h.logText())
		}
	}
}
