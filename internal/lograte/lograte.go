// Package lograte keeps the log lines that others cause (a peer's garbage, a
// local program's stray connection) from flooding the log: a few lines at
// once, then none until the window is over, and the next line says how many
// were left out.
package lograte

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Defaults of a Limiter's zero fields: Burst lines every Window.
const (
	DefaultBurst  = 5
	DefaultWindow = time.Minute
)

// Limiter lets through at most Burst lines per Window; the zero value takes
// the defaults. One Limiter per kind of line, so that one flood does not hide
// another kind.
type Limiter struct {
	Burst  int
	Window time.Duration
	Now    func() time.Time // the clock (default time.Now)

	mu      sync.Mutex
	start   time.Time // of the current window
	lines   int       // logged in it
	dropped int       // left out since the last line logged
}

// Log logs msg at level to log with args, unless the window's lines are used
// up. The first line after some were left out carries "suppressed", their
// number.
func (l *Limiter) Log(log *slog.Logger, level slog.Level, msg string, args ...any) {
	ctx := context.Background()
	if !log.Enabled(ctx, level) {
		return
	}
	n, ok := l.take()
	if !ok {
		return
	}
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	log.Log(ctx, level, msg, args...)
}

// take reports whether a line may go now, and how many were left out before it.
func (l *Limiter) take() (dropped int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now
	if l.Now != nil {
		now = l.Now
	}
	burst, window := l.Burst, l.Window
	if burst <= 0 {
		burst = DefaultBurst
	}
	if window <= 0 {
		window = DefaultWindow
	}
	if t := now(); t.Sub(l.start) >= window || t.Before(l.start) {
		l.start, l.lines = t, 0
	}
	if l.lines >= burst {
		l.dropped++
		return 0, false
	}
	l.lines++
	dropped, l.dropped = l.dropped, 0
	return dropped, true
}
