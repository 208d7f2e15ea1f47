package e2e

import (
	"flag"
	"fmt"
	"testing"
)

var stressConns = flag.Int("e2e.stress", 512, "connections TestStress starts at once")

// TestStress starts many connections at once through two smcrds, on shm and on
// soft, echoing hash-checked content (testapp checks it): fallbacks and
// continuations over TCP may happen under the load, but no connection may fail
// or lose a byte.
func TestStress(t *testing.T) {
	for _, p := range []string{"shm", "soft"} {
		t.Run(p, func(t *testing.T) {
			a, b := hosts(t)
			a.start("providers = "+p, ports)
			b.start("providers = "+p, ports)
			b.serve(5201)
			n := *stressConns
			dst := fmt.Sprintf("%s:5201", b.ns.Addr4())
			for _, mode := range []string{"echo", "sink"} {
				r, err := a.client(dst, "-mode", mode, "-bytes", fmt.Sprint(256<<10), "-conns", fmt.Sprint(n), "-timeout", "40s")
				if err != nil || r.OK != n || r.Errors != 0 {
					t.Errorf("%s, %d connections: %d ok, %d failed (%s): %v", mode, n, r.OK, r.Errors, r.Err, err)
				}
			}
			sa, sb := a.stats(), b.stats()
			t.Logf("A: %d SMC-R, %d fallbacks %+v; B: %d SMC-R, %d fallbacks %+v",
				sa.Connections.SMCR, sa.Connections.Fallback, sa.Fallbacks, sb.Connections.SMCR, sb.Connections.Fallback, sb.Fallbacks)
		})
	}
}
