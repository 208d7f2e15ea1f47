package main

import (
	"bytes"
	"io"
	"net"
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

// TestPingpongFor: -n counts round trips; -for, when given, times them instead.
func TestPingpongFor(t *testing.T) {
	ln := serveLoopback(t)
	addr := ln.Addr().String()
	defer func() { pingFor = 0 }()
	for _, d := range []time.Duration{0, 200 * time.Millisecond} {
		pingFor = d
		start := time.Now()
		_, _, _, lat, err := one(addr, "pingpong", 64, 5, 0)
		took := time.Since(start)
		switch {
		case err != nil:
			t.Fatalf("-for %v: %v", d, err)
		case d == 0 && len(lat) != 5:
			t.Errorf("-n 5: %d round trips", len(lat))
		case d > 0 && (took < d || len(lat) <= 5):
			t.Errorf("-n 5 -for %v: %d round trips in %v", d, len(lat), took)
		}
	}
}

// TestOddSizes: sink and echo move sizes that are not whole 64-bit words, and
// the stream is the same however the reads split it.
func TestOddSizes(t *testing.T) {
	ln := serveLoopback(t)
	for _, size := range []int64{1, 7, 9, 1000003} {
		for _, mode := range []string{"sink", "echo"} {
			done := make(chan error, 1)
			go func() {
				_, _, _, _, err := one(ln.Addr().String(), mode, size, 1, 3)
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s %d bytes: %v", mode, size, err)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("%s %d bytes: no answer in 30 s", mode, size)
			}
		}
	}
	whole, split := make([]byte, 29), make([]byte, 29)
	io.ReadFull(payload(5), whole)
	r := payload(5)
	for i := 0; i < len(split); i += 3 {
		r.Read(split[i:min(i+3, len(split))])
	}
	if !bytes.Equal(whole, split) {
		t.Errorf("payload read in 3-byte pieces = %x, in one read %x", split, whole)
	}
}

// serveLoopback runs testapp's server on a loopback listener until the test ends.
func serveLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
	return ln
}
