// Tests of CLC's context at the end of setup: a context that ends as the
// handshake (RFC 7609 §3.5) completes must not leave a past deadline on the
// TCP connection handed out.

package smcr

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// deadlineConn records the last deadline set on it. A past deadline (the
// context's interruption) takes effect late, as when its goroutine is slow to
// run; the first clearing of the deadline can cancel a context, as when it
// ends right then.
type deadlineConn struct {
	net.Conn
	mu      sync.Mutex
	last    time.Time
	onClear func()
}

func (d *deadlineConn) SetDeadline(t time.Time) error {
	if !t.IsZero() && t.Before(time.Unix(1000, 0)) {
		time.Sleep(50 * time.Millisecond) // the scenario: an interruption slow to land
	}
	d.mu.Lock()
	d.last = t
	clear := t.IsZero() && d.onClear != nil
	f := d.onClear
	if clear {
		d.onClear = nil
	}
	d.mu.Unlock()
	if clear {
		f()
	}
	return d.Conn.SetDeadline(t)
}

func (d *deadlineConn) lastDeadline() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last
}

// TestInterruptStopWaits: once stop returns, the interruption is over, so a
// deadline cleared after it stays cleared. Before, stop returned at once when
// the context had just ended, and the past deadline came after the clearing.
func TestInterruptStopWaits(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	c := &deadlineConn{Conn: a}
	ctx, cancel := context.WithCancel(context.Background())
	stop := interruptOnCancel(ctx, c)
	cancel()
	stop()
	c.SetDeadline(noDeadline)
	stop() // again: returns at once
	awaitInterruptions(t)
	if dl := c.lastDeadline(); !dl.IsZero() {
		t.Fatalf("deadline %v after stop and clearing, want none", dl)
	}
}

// TestSetupEndsAsContextEnds: a context that ends just as setup finished (the
// connection's deadline being cleared for its user) leaves the connection
// usable, over SMC-R and after a fallback. Before, the interruption's past
// deadline could land on the TCP connection after it was handed out.
func TestSetupEndsAsContextEnds(t *testing.T) {
	t.Run("smcr", func(t *testing.T) {
		p := memPair(t)
		p.echoAll()
		tcp, err := net.Dial("tcp", p.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		dc := &deadlineConn{Conn: tcp, onClear: cancel}
		c, err := p.cli.Client(ctx, dc)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		mustSMC(t, c)
		awaitInterruptions(t)
		if dl := dc.lastDeadline(); !dl.IsZero() {
			t.Fatalf("TCP deadline %v on a connection set up, want none", dl)
		}
		echoOnce(t, c)
	})
	t.Run("fallback", func(t *testing.T) {
		e := newEngine(t, Config{}) // no device: falls back at once
		addr := rawServer(t, func(c net.Conn) {
			defer c.Close()
			io.Copy(c, c)
		})
		tcp, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		dc := &deadlineConn{Conn: tcp, onClear: cancel}
		c, err := e.Client(ctx, dc)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if c.Mode() != ModeFallback {
			t.Fatalf("mode %v, want fallback", c.Mode())
		}
		awaitInterruptions(t)
		if dl := dc.lastDeadline(); !dl.IsZero() {
			t.Fatalf("TCP deadline %v on a connection set up, want none", dl)
		}
		echoOnce(t, c)
	})
}

// awaitInterruptions waits until no interruption of interruptOnCancel runs, so
// that the deadline it sets, if any, is set.
func awaitInterruptions(t *testing.T) {
	t.Helper()
	eventually(t, "the interruptions done", func() bool { return goroutinesIn("smcr.interruptOnCancel.func") == 0 })
}

func echoOnce(t *testing.T, c net.Conn) {
	t.Helper()
	msg := []byte("after setup")
	if _, err := c.Write(msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != string(msg) {
		t.Fatalf("read %q, %v", got, err)
	}
}
