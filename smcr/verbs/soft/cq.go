// Completion queues: a ring of work completions with a wait that spins briefly and
// then sleeps, so SMC-R's CDC and LLC handlers (RFC 7609 §4.3, §4.4) wake quickly.

package soft

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// cq implements verbs.CQ.
type cq struct {
	spin time.Duration

	mu     sync.Mutex
	ring   []verbs.WorkCompletion
	head   int // index of the oldest completion
	n      int // completions held
	closed bool

	ready  atomic.Int32  // n, for the lock-free spin in Wait
	notify chan struct{} // a token after each push; Wait sleeps on it
	done   chan struct{} // closed by Close
}

func newCQ(depth int, spin time.Duration) *cq {
	return &cq{
		spin:   spin,
		ring:   make([]verbs.WorkCompletion, depth),
		notify: make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
}

// push appends a completion. A full ring grows rather than dropping it: losing a
// completion would lose a work request (hardware would raise a CQ overrun).
func (c *cq) push(wc verbs.WorkCompletion) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	if c.n == len(c.ring) {
		grown := make([]verbs.WorkCompletion, 2*len(c.ring))
		k := copy(grown, c.ring[c.head:])
		copy(grown[k:], c.ring[:c.head])
		c.ring, c.head = grown, 0
	}
	c.ring[(c.head+c.n)%len(c.ring)] = wc
	c.n++
	c.ready.Store(int32(c.n))
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *cq) Poll(wc []verbs.WorkCompletion) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, verbs.ErrClosed
	}
	k := min(len(wc), c.n)
	for i := range k {
		wc[i] = c.ring[c.head]
		c.head = (c.head + 1) % len(c.ring)
	}
	c.n -= k
	c.ready.Store(int32(c.n))
	return k, nil
}

func (c *cq) Wait(ctx context.Context) error {
	select {
	case <-c.done:
		return verbs.ErrClosed
	default:
	}
	if c.ready.Load() > 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// Spin first: a completion usually follows within microseconds, and a sleep
	// and wake-up across CPUs costs 40-100 µs on these machines.
	if c.spin > 0 {
		deadline := time.Now().Add(c.spin)
		for time.Now().Before(deadline) {
			if c.ready.Load() > 0 {
				return nil
			}
			runtime.Gosched()
		}
	}
	select {
	case <-c.notify:
		return nil
	case <-c.done:
		return verbs.ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *cq) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		close(c.done)
	}
	return nil
}

func (c *cq) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}
