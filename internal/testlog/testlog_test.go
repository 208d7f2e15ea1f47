package testlog

import (
	"testing"
)

// TestWriterAfterTheTest: a write after the test has ended goes to stderr
// instead of t.Log, which would panic.
func TestWriterAfterTheTest(t *testing.T) {
	var w interface{ Write([]byte) (int, error) }
	t.Run("inner", func(t *testing.T) {
		w = Writer(t)
		if n, err := w.Write([]byte("during\n")); n != 7 || err != nil {
			t.Fatalf("write during the test: %d, %v", n, err)
		}
	})
	if n, err := w.Write([]byte("after\n")); n != 6 || err != nil {
		t.Fatalf("write after the test: %d, %v", n, err)
	}
}
