package lograte

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestLimiter: a flood gives Burst lines per window, and the first line of the
// next window says how many were left out.
func TestLimiter(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	now := time.Unix(1000, 0)
	l := &Limiter{Burst: 3, Window: time.Second, Now: func() time.Time { return now }}
	for range 100 {
		l.Log(log, slog.LevelWarn, "garbage", "peer", "x")
	}
	if n := strings.Count(buf.String(), "garbage"); n != 3 {
		t.Fatalf("%d lines for 100 in one window, want 3:\n%s", n, buf.String())
	}
	if strings.Contains(buf.String(), "suppressed") {
		t.Errorf("a line of the first window says lines were left out:\n%s", buf.String())
	}
	buf.Reset()
	now = now.Add(time.Second)
	l.Log(log, slog.LevelWarn, "garbage", "peer", "y")
	if !strings.Contains(buf.String(), "suppressed=97") {
		t.Errorf("first line of the next window: %q, want suppressed=97", buf.String())
	}
	buf.Reset()
	l.Log(log, slog.LevelDebug, "below the level")
	if buf.Len() != 0 {
		t.Errorf("a line below the logger's level was logged: %q", buf.String())
	}
}
