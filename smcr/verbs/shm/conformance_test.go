// The verbs conformance suite and the standard benchmarks on shm, with both ends
// in one network namespace and with the two ends in two network namespaces.

package shm

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/smcr-io/smcr/internal/nstest"
	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/verbstest"
)

// testDir is the rendezvous directory of the conformance tests: fixed, because the
// peer-process test's child must find its parent's sockets there.
var testDir = filepath.Join(os.TempDir(), "smcr-shm-test")

func openIn(t testing.TB, ns *nstest.NS) verbs.Device {
	t.Helper()
	var d verbs.Device
	open := func() error {
		var err error
		d, err = Open(Config{Dir: testDir})
		return err
	}
	var err error
	if ns == nil {
		err = open()
	} else {
		err = ns.Do(open)
	}
	if err != nil {
		t.Fatalf("shm: open: %v", err)
	}
	return d
}

func TestConformance(t *testing.T) {
	verbstest.Run(t, verbstest.Env{
		Open: func(t testing.TB) (a, b verbs.Device) { return openIn(t, nil), openIn(t, nil) },
	})
}

// TestConformanceNetns runs the suite with each end in its own network namespace,
// the peer process included (started inside namespace B).
func TestConformanceNetns(t *testing.T) {
	if verbstest.InPeer() {
		verbstest.Run(t, verbstest.Env{
			Open:     func(t testing.TB) (a, b verbs.Device) { return openIn(t, nil), openIn(t, nil) },
			OpenPeer: func(t testing.TB) verbs.Device { return openIn(t, nil) },
		})
		return
	}
	p := nstest.NewPair(t)
	verbstest.Run(t, verbstest.Env{
		Open:        func(t testing.TB) (a, b verbs.Device) { return openIn(t, p.A), openIn(t, p.B) },
		PeerCommand: p.B.Command,
	})
}

// BenchmarkVerbs: RDMA WRITE throughput, SEND ping-pong, and the memcpy and TCP
// over veth baselines, the two shm ends in two network namespaces.
func BenchmarkVerbs(b *testing.B) {
	p := nstest.NewPair(b)
	verbstest.Bench(b, verbstest.Env{
		Open: func(t testing.TB) (a, bb verbs.Device) { return openIn(t, p.A), openIn(t, p.B) },
	})
}
