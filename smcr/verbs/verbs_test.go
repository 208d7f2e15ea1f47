package verbs

import "testing"

// TestPortChanges: every waiter holds the same channel until a Notify closes
// it; the next waiter gets a fresh one, and a Notify with no waiter is lost.
func TestPortChanges(t *testing.T) {
	var c PortChanges
	c.Notify() // nobody waits: nothing to close
	a, b := c.Next(), c.Next()
	if a != b {
		t.Fatal("two waiters before a change hold different channels")
	}
	select {
	case <-a:
		t.Fatal("closed before any change")
	default:
	}
	c.Notify()
	for _, ch := range []<-chan struct{}{a, b} {
		select {
		case <-ch:
		default:
			t.Fatal("a waiter's channel is still open after Notify")
		}
	}
	select {
	case <-c.Next():
		t.Fatal("a channel taken after the change is closed already")
	default:
	}
}
