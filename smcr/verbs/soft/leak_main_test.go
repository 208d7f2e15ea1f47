package soft

import (
	"os"
	"testing"

	"github.com/smcr-io/smcr/internal/leakcheck"
)

// TestMain fails a run whose goroutines outlive its tests (leakcheck).
func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }
