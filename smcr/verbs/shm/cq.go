// Completion queues: a local ring of work completions, polled by the caller, whose
// Poll and Wait also drive the shared queues of the QPs attached to them (busy-poll),
// before Wait sleeps until a QP's doorbell goroutine signals. Stands in for the RNIC
// CQ that the SMC-R work-request layer (RFC 7609 §4.2, Linux smc_wr) polls.

package shm

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/smcr-io/smcr/smcr/verbs"
)

const (
	minSpin    = 2 * time.Microsecond // the least a Wait spins
	probeEvery = 32                   // every so many Waits spin the full SpinMax
)

type cq struct {
	dev *device

	mu      sync.Mutex
	buf     []verbs.WorkCompletion // ring; grows when full rather than lose a completion
	head, n int
	closed  bool

	qps      atomic.Pointer[[]*qp] // attached QPs, copy on write
	sleepers atomic.Int32
	wake     chan struct{}
	done     chan struct{}
	spin     atomic.Int64 // current busy-poll budget in ns (adaptive)
	waits    atomic.Uint32
}

func newCQ(d *device, depth int) *cq {
	c := &cq{dev: d, buf: make([]verbs.WorkCompletion, depth), wake: make(chan struct{}, 1), done: make(chan struct{})}
	empty := []*qp{}
	c.qps.Store(&empty)
	c.spin.Store(int64(d.cfg.SpinMax))
	return c
}

func (c *cq) attach(q *qp) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := *c.qps.Load()
	for _, o := range old {
		if o == q {
			return
		}
	}
	next := append(append([]*qp(nil), old...), q)
	c.qps.Store(&next)
}

func (c *cq) detach(q *qp) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := *c.qps.Load()
	next := make([]*qp, 0, len(old))
	for _, o := range old {
		if o != q {
			next = append(next, o)
		}
	}
	c.qps.Store(&next)
}

// push appends a completion and wakes a sleeping waiter.
func (c *cq) push(wc verbs.WorkCompletion) {
	c.mu.Lock()
	if c.n == len(c.buf) {
		grown := make([]verbs.WorkCompletion, 2*len(c.buf))
		for i := 0; i < c.n; i++ {
			grown[i] = c.buf[(c.head+i)%len(c.buf)]
		}
		c.buf, c.head = grown, 0
	}
	c.buf[(c.head+c.n)%len(c.buf)] = wc
	c.n++
	c.mu.Unlock()
	if c.sleepers.Load() > 0 {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// Poll drives the attached QPs' shared queues, then moves completions into wc.
// It leaves a doorbell armed while a Wait sleeps on it (qp.drive).
func (c *cq) Poll(wc []verbs.WorkCompletion) (int, error) {
	for _, q := range *c.qps.Load() {
		q.drive(false)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, verbs.ErrClosed
	}
	k := 0
	for k < len(wc) && c.n > 0 {
		wc[k] = c.buf[c.head]
		c.head = (c.head + 1) % len(c.buf)
		c.n--
		k++
	}
	c.mu.Unlock()
	return k, nil
}

func (c *cq) ready() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n > 0 || c.closed
}

// Wait busy-polls the attached QPs for up to the adaptive spin budget, then arms
// their doorbells and sleeps until a completion is pushed, ctx ends or Close.
func (c *cq) Wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	budget := time.Duration(c.spin.Load())
	if c.waits.Add(1)%probeEvery == 0 {
		budget = c.dev.cfg.SpinMax // probe: the peer may be back on a CPU
	}
	start := time.Now()
	for i := 0; ; i++ {
		for _, q := range *c.qps.Load() {
			q.poll()
		}
		if c.ready() {
			if budget < c.dev.cfg.SpinMax {
				c.spin.Store(int64(min(c.dev.cfg.SpinMax, 2*budget)))
			}
			return c.closedErr()
		}
		// Reading the clock every few rounds keeps the spin cheap. Yielding there,
		// and at once when the first round finds nothing, lets a goroutine the
		// caller just woke (a reader its completion made runnable) run on this
		// CPU now instead of after the spin, where it would lengthen every
		// small message's round trip between two processes.
		if i&15 == 0 {
			if i > 0 && time.Since(start) > budget {
				break
			}
			runtime.Gosched()
		}
	}
	c.sleepers.Add(1)
	defer c.sleepers.Add(-1)
	for _, q := range *c.qps.Load() {
		q.arm()
	}
	if c.ready() {
		return c.closedErr()
	}
	select {
	case <-c.wake:
	case <-c.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	// Adapt as an adaptive mutex does: a spin that had to give up halves the next
	// one (on an overcommitted machine the peer is off-CPU and spinning only delays
	// it), a spin that found work (above) doubles it, up to SpinMax.
	c.spin.Store(int64(max(minSpin, budget/2)))
	return c.closedErr()
}

func (c *cq) closedErr() error {
	select {
	case <-c.done:
		return verbs.ErrClosed
	default:
		return nil
	}
}

func (c *cq) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	close(c.done)
	return nil
}

func (c *cq) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}
