// Benchmarks of the transparent path (RFC 7609 SMC-R over the shm provider between
// two namespaces), each beside direct TCP over the same veth pair measured in the
// same run by the same program: throughput, 64-byte request/response latency, and
// the fallback path's cost. Reported, not asserted.

package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/smcr-io/smcr/internal/nstest"
)

const benchBytes = 256 << 20

// relayChain starts testapp relays on both hosts, shaped like smcrd's relay and
// outside port_range_list: the client connects to A's on loopback, which carries
// to B's over the veth, which carries to the server on port 6001 on loopback.
// That is smcrd's path without SMC-R, the floor for any user-space relay. It
// returns the address the client dials.
func relayChain(a, s *host) string {
	s.background(bins.testapp, "-listen", ":6003", "-relay", "127.0.0.1:6001")
	s.waitListening(6003)
	a.background(bins.testapp, "-listen", "127.0.0.1:6002", "-relay", fmt.Sprintf("%s:6003", s.ns.Addr4()))
	a.waitListening(6002)
	return "127.0.0.1:6002"
}

// The paths the benchmarks compare, as the client dials them.
type paths struct{ smcr, tcp, relay string }

func benchPaths(a, s *host) paths {
	s.serve(5201)
	s.serve(6001)
	return paths{
		smcr:  fmt.Sprintf("%s:5201", s.ns.Addr4()),
		tcp:   fmt.Sprintf("%s:6001", s.ns.Addr4()),
		relay: relayChain(a, s),
	}
}

// BenchmarkThroughput: one connection sending 256 MiB that the server discards
// (iperf3's shape), through smcrd (port 5201), direct (port 6001, not in
// port_range_list), and through two plain relays.
func BenchmarkThroughput(b *testing.B) {
	a, s := hosts(b)
	a.start("providers = shm", ports)
	s.start("providers = shm", ports)
	p := benchPaths(a, s)
	var smc, tcp, rel []float64
	for b.Loop() {
		for _, run := range []struct {
			addr string
			out  *[]float64
		}{{p.smcr, &smc}, {p.tcp, &tcp}, {p.relay, &rel}} {
			r, err := a.client(run.addr, "-mode", "discard", "-bytes", fmt.Sprint(benchBytes))
			if err != nil {
				b.Fatal(err)
			}
			*run.out = append(*run.out, r.MBps)
		}
	}
	if st := a.stats(); st.Connections.SMCR != uint64(len(smc)) {
		b.Fatalf("not every smcrd run went SMC-R: %+v", st.Connections)
	}
	b.ReportMetric(nstest.Median(smc), "smcr-MB/s")
	b.ReportMetric(nstest.Median(tcp), "tcp-MB/s")
	b.ReportMetric(nstest.Median(rel), "relay-MB/s")
	b.ReportMetric(nstest.Median(smc)/nstest.Median(tcp), "ratio")
	b.ReportMetric(nstest.Median(smc)/nstest.Median(rel), "ratio-relay")
}

// BenchmarkLatency64: 64-byte request/response, 2000 round trips per run.
func BenchmarkLatency64(b *testing.B) {
	a, s := hosts(b)
	a.start("providers = shm", ports)
	s.start("providers = shm", ports)
	p := benchPaths(a, s)
	var smc50, smc99, tcp50, tcp99, rel50, rel99 []float64
	for b.Loop() {
		for _, run := range []struct {
			addr     string
			p50, p99 *[]float64
		}{{p.smcr, &smc50, &smc99}, {p.tcp, &tcp50, &tcp99}, {p.relay, &rel50, &rel99}} {
			r, err := a.client(run.addr, "-mode", "pingpong", "-bytes", "64", "-n", "2000")
			if err != nil {
				b.Fatal(err)
			}
			*run.p50, *run.p99 = append(*run.p50, r.P50us), append(*run.p99, r.P99us)
		}
	}
	b.ReportMetric(nstest.Median(smc50), "smcr-p50-us")
	b.ReportMetric(nstest.Median(smc99), "smcr-p99-us")
	b.ReportMetric(nstest.Median(tcp50), "tcp-p50-us")
	b.ReportMetric(nstest.Median(tcp99), "tcp-p99-us")
	b.ReportMetric(nstest.Median(rel50), "relay-p50-us")
	b.ReportMetric(nstest.Median(rel99), "relay-p99-us")
}

// BenchmarkFallback: the server host has no smcrd, so the client's smcrd carries
// the connection as plain TCP (splice). The negative cache entry (1 s) is let
// lapse before each run so every run takes the fallback path. The server
// discards, as in BenchmarkThroughput: sink's hashing on both ends would bound
// both paths and hide the relay's cost.
func BenchmarkFallback(b *testing.B) {
	a, s := hosts(b)
	a.start("providers = shm", ports, "peer_cache_ttl = 1s")
	s.serve(5201)
	s.serve(6001)
	var fb, tcp []float64
	for b.Loop() {
		time.Sleep(1100 * time.Millisecond)
		for _, port := range []int{5201, 6001} {
			r, err := a.client(fmt.Sprintf("%s:%d", s.ns.Addr4(), port), "-mode", "discard", "-bytes", fmt.Sprint(benchBytes))
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
	b.ReportMetric(nstest.Median(fb), "fallback-MB/s")
	b.ReportMetric(nstest.Median(tcp), "tcp-MB/s")
	b.ReportMetric(nstest.Median(fb)/nstest.Median(tcp), "ratio")
}
