package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
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

// redisRPS runs redis-benchmark against addr:port and returns the requests per
// second of SET and GET.
func redisRPS(b *testing.B, cmd *exec.Cmd) (set, get float64) {
	b.Helper()
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("redis-benchmark %v: %v %s", cmd.Args, err, out)
	}
	// Progress lines end in \r, the results in \n.
	for _, l := range strings.FieldsFunc(string(out), func(r rune) bool { return r == '\r' || r == '\n' }) {
		// "SET: 12345.67 requests per second, p50=0.1 msec"
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ": ")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		switch name {
		case "SET":
			set = v
		case "GET":
			get = v
		}
	}
	if set == 0 || get == 0 {
		b.Fatalf("redis-benchmark said: %s", out)
	}
	return set, get
}

// BenchmarkDirectRedis: redis-benchmark against redis-server, both with the
// library (direct mode, shm), beside both without it to a port not listed
// (plain TCP) and to a listed one (the relay), with and without pipelining.
func BenchmarkDirectRedis(b *testing.B) {
	for _, p := range []string{"redis-server", "redis-benchmark"} {
		if _, err := exec.LookPath(p); err != nil {
			b.Skipf("%s not installed (scripts/deps.sh installs it)", p)
		}
	}
	a, s := hosts(b)
	a.start("providers = shm", ports)
	s.start("providers = shm", ports)
	server := func(port int) []string {
		return []string{"--port", fmt.Sprint(port), "--save", "", "--appendonly", "no", "--protected-mode", "no"}
	}
	s.directBackground("redis-server", server(5201)...)
	s.background("redis-server", server(5202)...)
	s.background("redis-server", server(6001)...)
	for _, p := range []int{5201, 5202, 6001} {
		s.waitListening(p)
	}
	addr := s.ns.Addr4().String()
	type path struct {
		name   string
		port   int
		direct bool
	}
	paths := []path{{"direct", 5201, true}, {"tcp", 6001, false}, {"relay", 5202, false}}
	rps := map[string][]float64{}
	for b.Loop() {
		for _, p := range paths {
			for _, pipeline := range []string{"1", "16"} {
				c := a.command("redis-benchmark", "-h", addr, "-p", fmt.Sprint(p.port), "-t", "set,get", "-n", "20000", "-c", "8", "-P", pipeline, "-q")
				if p.direct {
					a.direct(c)
				}
				set, get := redisRPS(b, c)
				rps[p.name+"-P"+pipeline+"-set"] = append(rps[p.name+"-P"+pipeline+"-set"], set)
				rps[p.name+"-P"+pipeline+"-get"] = append(rps[p.name+"-P"+pipeline+"-get"], get)
			}
		}
	}
	if st := a.stats(); st.Direct.SMCR == 0 {
		b.Fatalf("no direct connection went SMC-R: %+v", st.Direct)
	}
	for k, v := range rps {
		b.ReportMetric(nstest.Median(v), k+"-rps")
	}
	for _, pl := range []string{"1", "16"} {
		b.ReportMetric(nstest.Median(rps["direct-P"+pl+"-get"])/nstest.Median(rps["tcp-P"+pl+"-get"]), "direct/tcp-P"+pl+"-get")
	}
}
