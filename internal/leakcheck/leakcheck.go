// Package leakcheck finds, for a package's TestMain, the goroutines of this
// module that outlived its tests: a connection, listener, engine, device or
// relay a test did not close, or one whose Close leaves a goroutine behind.
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Run runs m and returns its exit code, for os.Exit: 1 when its tests passed
// but, 10 seconds after, goroutines of this module still run, whose stacks it
// prints.
func Run(m *testing.M) int { return After(m.Run()) }

// After is Run for a TestMain that runs m itself: code is m.Run's.
func After(code int) int {
	if code != 0 {
		return code
	}
	if left := Left(10 * time.Second); left != "" {
		fmt.Fprintf(os.Stderr, "goroutines of this module outlived the tests:\n\n%s\n", left)
		return 1
	}
	return 0
}

// Left waits up to d for every goroutine that runs this module's code, or was
// started by it, to end, and returns the stacks of those left. The caller's own
// goroutine (TestMain's) is not counted.
func Left(d time.Duration) string {
	for deadline := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
		left := ours()
		if len(left) == 0 || time.Now().After(deadline) {
			return strings.Join(left, "\n\n")
		}
	}
}

// Stacks returns the stacks of every goroutine, as runtime.Stack writes them:
// one block a goroutine, blocks apart by an empty line.
func Stacks() []byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}

func ours() []string {
	var left []string
	for i, g := range strings.Split(string(Stacks()), "\n\n") {
		if i > 0 && strings.Contains(g, "github.com/smcr-io/smcr/") {
			left = append(left, g)
		}
	}
	return left
}
