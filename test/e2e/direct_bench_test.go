package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"testing"

	"github.com/smcr-io/smcr/internal/nstest"
)

// ddResult is ddbench's client output.
type ddResult struct {
	MBps  float64 `json:"mbps"`
	P50us float64 `json:"p50us"`
	P99us float64 `json:"p99us"`
}

func ddClient(b *testing.B, cmd *exec.Cmd) ddResult {
	b.Helper()
	out, err := cmd.Output()
	var r ddResult
	if err == nil {
		err = json.Unmarshal(out, &r)
	}
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		b.Fatalf("ddbench %v: %v %s %s", cmd.Args, err, out, msg)
	}
	return r
}

// directPaths starts ddbench servers on s: with the library on port 5201 (the
// direct mode), without it on 5202 (the relay) and on 6001 (plain TCP: the
// port is not listed).
func directPaths(s *host) (direct, relay, tcp string) {
	s.directBackground(bins.ddbench, "server", "5201")
	s.background(bins.ddbench, "server", "5202")
	s.background(bins.ddbench, "server", "6001")
	for _, p := range []int{5201, 5202, 6001} {
		s.waitListening(p)
	}
	addr := s.ns.Addr4().String()
	return addr, addr, addr
}

// BenchmarkDirect: the direct mode (C programs with libsmcr-preload.so on
// both hosts, shm provider) beside plain TCP over the same veth and the relay
// (the same programs without the library), in the same run: throughput of
// 256 MiB in 64 KiB and 1 MiB writes, and the 64-byte round trip. Reported,
// not asserted.
func BenchmarkDirect(b *testing.B) {
	for _, prov := range []string{"shm", "soft"} {
		b.Run(prov, func(b *testing.B) {
			a, s := hosts(b)
			a.start("providers = "+prov, ports)
			s.start("providers = "+prov, ports)
			addr, _, _ := directPaths(s)
			type path struct {
				name   string
				port   int
				direct bool
			}
			paths := []path{{"direct", 5201, true}, {"tcp", 6001, false}, {"relay", 5202, false}}
			tput := map[string]map[int][]float64{}
			p50, p99 := map[string][]float64{}, map[string][]float64{}
			for b.Loop() {
				for _, p := range paths {
					cmd := func(args ...string) *exec.Cmd {
						c := a.command(bins.ddbench, args...)
						if p.direct {
							a.direct(c)
						}
						return c
					}
					if tput[p.name] == nil {
						tput[p.name] = map[int][]float64{}
					}
					for _, sz := range []int{64 << 10, 1 << 20} {
						r := ddClient(b, cmd("tput", addr, fmt.Sprint(p.port), fmt.Sprint(benchBytes), fmt.Sprint(sz)))
						tput[p.name][sz] = append(tput[p.name][sz], r.MBps)
					}
					r := ddClient(b, cmd("lat", addr, fmt.Sprint(p.port), "5000"))
					p50[p.name] = append(p50[p.name], r.P50us)
					p99[p.name] = append(p99[p.name], r.P99us)
				}
			}
			if st := a.stats(); st.Direct.SMCR == 0 {
				b.Fatalf("no direct connection went SMC-R: %+v", st.Direct)
			}
			for _, p := range paths {
				b.ReportMetric(nstest.Median(tput[p.name][64<<10]), p.name+"-64K-MB/s")
				b.ReportMetric(nstest.Median(tput[p.name][1<<20]), p.name+"-1M-MB/s")
				b.ReportMetric(nstest.Median(p50[p.name]), p.name+"-p50-us")
				b.ReportMetric(nstest.Median(p99[p.name]), p.name+"-p99-us")
			}
			b.ReportMetric(nstest.Median(tput["direct"][1<<20])/nstest.Median(tput["tcp"][1<<20]), "direct/tcp-1M")
			b.ReportMetric(nstest.Median(p50["direct"])/nstest.Median(p50["tcp"]), "direct/tcp-p50")
		})
	}
}
