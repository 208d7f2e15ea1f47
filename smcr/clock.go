// The engine's clock: Config.Clock, and the timers and tickers built on it, so
// that tests drive CLC, LLC, idle and close timers by hand instead of sleeping.
// RFC 7609's timers (§3.5 CLC, §3.8 TEST_LINK, §4.4 close) and ours run on it;
// what is real time by nature (realNow) does not.

package smcr

import (
	"sync"
	"time"
)

// Clock is the engine's source of time, so timers are testable without sleeping.
// Every timer of the engine runs on it, and Now also dates the deadlines of the
// TCP connection during CLC and a continuation's resync, which the kernel keeps
// in real time: a fake Clock's Now should follow the real one.
type Clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a stoppable timer made by a Clock.
type Timer interface {
	Stop() bool
}

type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// clockTimer sends on C once, d after it is made on clk, as time.Timer.
type clockTimer struct {
	C <-chan struct{}
	t Timer
}

func newTimer(clk Clock, d time.Duration) clockTimer {
	ch := make(chan struct{}, 1)
	return clockTimer{C: ch, t: clk.AfterFunc(d, func() { ch <- struct{}{} })}
}

// Stop stops the timer; it reports whether that kept it from firing.
func (t clockTimer) Stop() bool { return t.t.Stop() }

// clockTicker sends on C every d on clk, as time.Ticker: a tick the receiver has
// not taken yet is not doubled.
type clockTicker struct {
	C       <-chan struct{}
	mu      sync.Mutex
	t       Timer
	stopped bool
}

func newTicker(clk Clock, d time.Duration) *clockTicker {
	ch := make(chan struct{}, 1)
	tk := &clockTicker{C: ch}
	var arm func()
	arm = func() {
		tk.mu.Lock()
		defer tk.mu.Unlock()
		if tk.stopped {
			return
		}
		tk.t = clk.AfterFunc(d, func() {
			select {
			case ch <- struct{}{}:
			default:
			}
			arm()
		})
	}
	arm()
	return tk
}

// Stop ends the ticks.
func (tk *clockTicker) Stop() {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	tk.stopped = true
	if tk.t != nil {
		tk.t.Stop()
	}
}

// realNow is the real time, for what is real time whatever Config.Clock says:
// busy-poll budgets (a spin measures the CPU it burns; on a clock that stands
// still it would never end), the application's net.Conn deadlines (absolute
// times it took from time.Now, handed on to the TCP connection after a
// continuation), and a context's deadline.
func realNow() time.Time { return time.Now() }

// realAfterFunc is time.AfterFunc, for the net.Conn deadlines (realNow).
func realAfterFunc(d time.Duration, f func()) *time.Timer { return time.AfterFunc(d, f) }

// pause is a wait loop's breath while another goroutine finishes a short
// section (a Write posting its chunk, a move's WRITEs completing): real time,
// as a spin's.
func pause() { time.Sleep(50 * time.Microsecond) }
