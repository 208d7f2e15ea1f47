//go:build ibv

// The verbstest conformance suite and standard benchmarks on this provider.

package ibv

import (
	"testing"
	"time"

	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/verbstest"
)

// conformanceEnv opens two independent contexts on the same port: their QPs reach
// each other through the device's own loopback (rxe) or the fabric.
var conformanceEnv = verbstest.Env{
	Open: func(t testing.TB) (a, b verbs.Device) { return openDev(t), openDev(t) },
	// Soft-RoCE under qemu TCG is slow; the suite's waits must outlast it.
	Timeout: 60 * time.Second,
}

func TestConformance(t *testing.T) { verbstest.Run(t, conformanceEnv) }

func BenchmarkVerbs(b *testing.B) { verbstest.Bench(b, conformanceEnv) }
