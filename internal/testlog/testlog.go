// Package testlog gives tests a log writer that outlives them: an engine's
// teardown goroutines may still log once the test has ended, and testing.T
// panics on a Log after that.
package testlog

import (
	"bytes"
	"io"
	"os"
	"sync"
	"testing"
)

// Writer sends each write to t.Log, without its trailing newlines, while the
// test runs, and to stderr once it has ended.
func Writer(t testing.TB) io.Writer {
	w := &writer{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return w
}

type writer struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func (w *writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return os.Stderr.Write(p)
	}
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}
