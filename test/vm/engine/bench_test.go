//go:build ibv

package engine

import (
	"context"
	"io"
	"net"
	"slices"
	"testing"
	"time"
)

// BenchmarkRoundTrip times 64 B request/response round trips between two
// engines over the RDMA device, and over plain TCP between the same addresses
// (the baseline), alternating in rounds so a change in the host's load hits
// both alike. It reports the one-way p50 of each in µs and their ratio.
func BenchmarkRoundTrip(b *testing.B) {
	ifc := iface(b)
	ip := ipv4Of(b, ifc)
	srv := newEngine(b, "server", ifc, 1)
	cli := newEngine(b, "client", ifc, 2)
	ln, err := srv.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go echo(ln)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	smc, err := cli.Dial(ctx, "tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer smc.Close()
	mustSMC(b, "client", smc)

	tln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tln.Close() })
	go echo(tln)
	tcp, err := net.Dial("tcp", tln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer tcp.Close()

	const rounds = 10
	msg := make([]byte, 64)
	var rtts [2][]time.Duration
	b.ResetTimer()
	for r := range rounds {
		n := b.N / rounds
		if r < b.N%rounds {
			n++
		}
		for i, c := range []net.Conn{smc, tcp} {
			for range n {
				start := time.Now()
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, msg); err != nil {
					b.Fatal(err)
				}
				rtts[i] = append(rtts[i], time.Since(start))
			}
		}
	}
	b.StopTimer()
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Nanoseconds()) / 2 / 1000
	}
	if len(rtts[0]) > 0 {
		s, t := p50(rtts[0]), p50(rtts[1])
		b.ReportMetric(s, "us-p50-smcr")
		b.ReportMetric(t, "us-p50-tcp")
		b.ReportMetric(s/t, "ratio")
	}
}

// echo answers every connection of ln with what it reads.
func echo(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			io.Copy(c, c)
		}()
	}
}
