package smcr

import (
	"runtime"
	"strings"
	"time"
)

// leakedGoroutines waits up to d for every goroutine that runs this module's
// code, or was started by it, to end, and returns the stacks of those left: a
// connection, listener, engine or device a test did not close, or one whose
// close leaves a goroutine behind.
func leakedGoroutines(d time.Duration) string {
	for deadline := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
		left := moduleGoroutines()
		if len(left) == 0 || time.Now().After(deadline) {
			return strings.Join(left, "\n\n")
		}
	}
}

func moduleGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var left []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "github.com/smcr-io/smcr/") && !strings.Contains(g, "smcr.TestMain(") {
			left = append(left, g)
		}
	}
	return left
}
