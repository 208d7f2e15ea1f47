// Benchmarks of the transparent path (RFC 7609 SMC-R over the shm provider between
// two namespaces), each beside direct TCP over the same veth pair measured in the
// same run by the same program: throughput, 64-byte request/response latency, and
// the fallback path's cost. Reported, not asserted.

package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

const benchBytes = 256 << 20

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// BenchmarkThroughput: one connection sinking 256 MiB, through smcrd (port 5201)
// and direct (port 6001, not in port_range_list).
func BenchmarkThroughput(b *testing.B) {
	a, s := hosts(b)
	a.start("providers = shm", ports)
	s.start("providers = shm", ports)
	s.serve(5201)
	s.serve(6001)
	var smc, tcp []float64
	for b.Loop() {
		for _, port := range []int{5201, 6001} {
			r, err := a.client(fmt.Sprintf("%s:%d", s.ns.Addr4(), port), "-mode", "sink", "-bytes", fmt.Sprint(benchBytes))
			if err != nil {
				b.Fatal(err)
			}
			if port == 5201 {
				smc = append(smc, r.MBps)
			} else {
				tcp = append(tcp, r.MBps)
			}
		}
	}
	if st := a.stats(); st.Connections.SMCR != uint64(len(smc)) {
		b.Fatalf("not every smcrd run went SMC-R: %+v", st.Connections)
	}
	b.ReportMetric(median(smc), "smcr-MB/s")
	b.ReportMetric(median(tcp), "tcp-MB/s")
	b.ReportMetric(median(smc)/median(tcp), "ratio")
}

// BenchmarkLatency64: 64-byte request/response, 2000 round trips per run.
func BenchmarkLatency64(b *testing.B) {
	a, s := hosts(b)
	a.start("providers = shm", ports)
	s.start("providers = shm", ports)
	s.serve(5201)
	s.serve(6001)
	var smc50, smc99, tcp50, tcp99 []float64
	for b.Loop() {
		for _, port := range []int{5201, 6001} {
			r, err := a.client(fmt.Sprintf("%s:%d", s.ns.Addr4(), port), "-mode", "pingpong", "-bytes", "64", "-n", "2000")
			if err != nil {
				b.Fatal(err)
			}
			if port == 5201 {
				smc50, smc99 = append(smc50, r.P50us), append(smc99, r.P99us)
			} else {
				tcp50, tcp99 = append(tcp50, r.P50us), append(tcp99, r.P99us)
			}
		}
	}
	b.ReportMetric(median(smc50), "smcr-p50-us")
	b.ReportMetric(median(smc99), "smcr-p99-us")
	b.ReportMetric(median(tcp50), "tcp-p50-us")
	b.ReportMetric(median(tcp99), "tcp-p99-us")
}

// BenchmarkFallback: the server host has no smcrd, so the client's smcrd carries
// the connection as plain TCP (splice). The negative cache entry (1 s) is let
// lapse before each run so every run takes the fallback path.
func BenchmarkFallback(b *testing.B) {
	a, s := hosts(b)
	a.start("providers = shm", ports, "peer_cache_ttl = 1s")
	s.serve(5201)
	s.serve(6001)
	var fb, tcp []float64
	for b.Loop() {
		time.Sleep(1100 * time.Millisecond)
		for _, port := range []int{5201, 6001} {
			r, err := a.client(fmt.Sprintf("%s:%d", s.ns.Addr4(), port), "-mode", "sink", "-bytes", fmt.Sprint(benchBytes))
			if err != nil {
				b.Fatal(err)
			}
			if port == 5201 {
				fb = append(fb, r.MBps)
			} else {
				tcp = append(tcp, r.MBps)
			}
		}
	}
	if st := a.stats(); st.Connections.Fallback != uint64(len(fb)) {
		b.Fatalf("not every run took the fallback path: %+v", st.Connections)
	}
	b.ReportMetric(median(fb), "fallback-MB/s")
	b.ReportMetric(median(tcp), "tcp-MB/s")
	b.ReportMetric(median(fb)/median(tcp), "ratio")
}
