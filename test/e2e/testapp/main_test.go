package main

import (
	"testing"
	"time"

	"github.com/smcr-io/smcr/internal/nstest"
)

// TestPercentile: testapp's percentiles are the benchmarks' (nearest rank).
func TestPercentile(t *testing.T) {
	for _, n := range []int{1, 2, 99, 100, 101, 2000} {
		d := make([]time.Duration, n)
		for i := range d {
			d[i] = time.Duration(i + 1)
		}
		for _, p := range []float64{50, 99, 99.9} {
			if got, want := percentile(d, p), nstest.Percentile(d, p); got != want {
				t.Errorf("n=%d p%v: %v, nstest says %v", n, p, got, want)
			}
		}
	}
	// 2000 round trips: p99 is the 1980th, not the 1981st.
	d := make([]time.Duration, 2000)
	for i := range d {
		d[i] = time.Duration(i + 1)
	}
	if got := percentile(d, 99); got != 1980 {
		t.Errorf("p99 of 1..2000 = %v, want 1980", got)
	}
}
