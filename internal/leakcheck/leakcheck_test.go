package leakcheck

import (
	"strings"
	"testing"
	"time"
)

// TestLeft: a goroutine of this module still running is reported with its
// stack, after the wait; once it ends, nothing is, and the caller's own
// goroutine never is.
func TestLeft(t *testing.T) {
	stop, done := make(chan struct{}), make(chan struct{})
	go blockedUntil(stop, done)
	start := time.Now()
	left := Left(200 * time.Millisecond)
	if !strings.Contains(left, "leakcheck.blockedUntil") {
		t.Fatalf("a blocked goroutine of this module not reported:\n%s", left)
	}
	if waited := time.Since(start); waited < 200*time.Millisecond {
		t.Errorf("reported after %v: it must wait for goroutines still ending", waited)
	}
	if strings.Contains(left, "leakcheck.Left(") {
		t.Errorf("the caller's goroutine reported:\n%s", left)
	}
	close(stop)
	<-done
	if left := Left(5 * time.Second); left != "" {
		t.Fatalf("reported after it ended:\n%s", left)
	}
}

func blockedUntil(stop <-chan struct{}, done chan<- struct{}) {
	<-stop
	close(done)
}
