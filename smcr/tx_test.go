package smcr

import (
	"slices"
	"testing"
)

// TestRingSpans: where a range of the stream lies in the send buffer, a ring
// of 100 bytes here: one span, two when it runs past the end, none when empty.
func TestRingSpans(t *testing.T) {
	for _, c := range []struct {
		from, to uint64
		want     []span
	}{
		{0, 0, nil},
		{230, 230, nil},
		{0, 100, []span{{0, 100}}},
		{10, 60, []span{{10, 50}}},
		{250, 300, []span{{50, 50}}},
		{290, 320, []span{{90, 10}, {0, 20}}},
		{99, 199, []span{{99, 1}, {0, 99}}},
	} {
		var w [2]span
		if got := ringSpans(&w, c.from, c.to, 100); !slices.Equal(got, c.want) {
			t.Errorf("[%d, %d): %v, want %v", c.from, c.to, got, c.want)
		}
	}
	// Nothing to place needs no ring: a connection still in setup has none.
	var w [2]span
	if got := ringSpans(&w, 0, 0, 0); len(got) != 0 {
		t.Errorf("empty range in no ring: %v", got)
	}
}
