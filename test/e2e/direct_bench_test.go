package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// cgroupCPU is the CPU time, in seconds, that every process in h's cgroup
// (its smcrd and the programs started in the host) has used so far.
func (h *host) cgroupCPU() float64 {
	h.t.Helper()
	b, err := os.ReadFile(filepath.Join(h.cgDir, "cpu.stat"))
	if err != nil {
		h.t.Fatalf("%s's CPU time: %v", h.name, err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
			us, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				h.t.Fatalf("%s's cpu.stat: %q: %v", h.name, l, err)
			}
			return float64(us) / 1e6
		}
	}
	h.t.Fatalf("%s's cpu.stat has no usage_usec:\n%s", h.name, b)
	return 0
}

// BenchmarkDirect: the direct mode (C programs with libsmcr-preload.so on
// both hosts) beside plain TCP over the same veth and the relay (the same
// programs without the library), in the same run, with the shm and soft
// providers (and the library on the client only, the server's through the
// relay): throughput of 256 MiB in 64 KiB and 1 MiB writes, the CPU
// seconds per GiB moved in 1 MiB writes (both programs and both smcrds: every
// process in both hosts' cgroups), and the 64-byte round trip. Reported, not
// asserted.
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
			// lib-relay: the library on the client only, the server's
			// through the relay: the client's smcrd carries the bytes
			// (over shm it drives the engine's buffers; elsewhere it pumps).
			paths := []path{{"direct", 5201, true}, {"tcp", 6001, false}, {"relay", 5202, false}, {"lib-relay", 5202, true}}
			tput := map[string]map[int][]float64{}
			cpuPerGiB := map[string][]float64{}
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
						cpu := a.cgroupCPU() + s.cgroupCPU()
						r := ddClient(b, cmd("tput", addr, fmt.Sprint(p.port), fmt.Sprint(benchBytes), fmt.Sprint(sz)))
						tput[p.name][sz] = append(tput[p.name][sz], r.MBps)
						if sz == 1<<20 {
							cpu = a.cgroupCPU() + s.cgroupCPU() - cpu
							cpuPerGiB[p.name] = append(cpuPerGiB[p.name], cpu/(float64(benchBytes)/(1<<30)))
						}
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
				b.ReportMetric(nstest.Median(cpuPerGiB[p.name]), p.name+"-cpu-s/GiB")
			}
			b.ReportMetric(nstest.Median(tput["direct"][1<<20])/nstest.Median(tput["tcp"][1<<20]), "direct/tcp-1M")
			b.ReportMetric(nstest.Median(tput["direct"][64<<10])/nstest.Median(tput["tcp"][64<<10]), "direct/tcp-64K")
			b.ReportMetric(nstest.Median(p50["direct"])/nstest.Median(p50["tcp"]), "direct/tcp-p50")
			b.ReportMetric(nstest.Median(cpuPerGiB["direct"])/nstest.Median(cpuPerGiB["tcp"]), "direct/tcp-cpu")
			b.ReportMetric(nstest.Median(tput["lib-relay"][1<<20])/nstest.Median(tput["tcp"][1<<20]), "lib-relay/tcp-1M")
			b.ReportMetric(nstest.Median(p50["lib-relay"])/nstest.Median(p50["tcp"]), "lib-relay/tcp-p50")
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
				c := a.command("redis-benchmark", "-h", addr, "-p", fmt.Sprint(p.port), "-t", "set,get", "-n", "100000", "-c", "8", "-P", pipeline, "-q")
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
		for _, op := range []string{"set", "get"} {
			k := "-P" + pl + "-" + op
			b.ReportMetric(nstest.Median(rps["direct"+k])/nstest.Median(rps["tcp"+k]), "direct/tcp"+k)
		}
	}
}

// wrkRPS runs wrk and returns the requests per second it reports.
func wrkRPS(b *testing.B, cmd *exec.Cmd) float64 {
	b.Helper()
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("wrk %v: %v %s", cmd.Args, err, out)
	}
	// "Requests/sec:  12345.67"; errors ("Non-2xx or 3xx responses: 12",
	// "Socket errors: ...") fail the run: a fast error is not a fast server.
	var rps float64
	for _, l := range strings.Split(string(out), "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "Non-2xx") || strings.HasPrefix(l, "Socket errors") {
			b.Fatalf("wrk %v: %s", cmd.Args, out)
		}
		if v, ok := strings.CutPrefix(l, "Requests/sec:"); ok {
			rps, err = strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				b.Fatalf("wrk said %q: %v", l, err)
			}
		}
	}
	if rps == 0 {
		b.Fatalf("wrk said: %s", out)
	}
	return rps
}

// BenchmarkDirectNginx: wrk fetching small files (1 KiB and 16 KiB) from
// nginx (two workers, sendfile), both with the library (direct mode, shm),
// beside both without it to a port not listed (plain TCP) and to a listed one
// (the relay), in the same run: requests per second, 2 threads and 32
// connections, 3 s a run.
func BenchmarkDirectNginx(b *testing.B) {
	for _, p := range []string{"nginx", "wrk"} {
		if _, err := exec.LookPath(p); err != nil {
			b.Skipf("%s not installed (scripts/deps.sh installs it)", p)
		}
	}
	a, s := hosts(b)
	a.start("providers = shm", ports)
	s.start("providers = shm", ports)
	files := map[string][]byte{"1k": randomBytes(1 << 10), "16k": randomBytes(16 << 10)}
	type path struct {
		name   string
		port   int
		direct bool
	}
	paths := []path{{"direct", 5201, true}, {"tcp", 6001, false}, {"relay", 5202, false}}
	for _, p := range paths {
		startNginx(b, s, p.direct, p.port, files)
	}
	addr := s.ns.Addr4().String()
	rps := map[string][]float64{}
	for b.Loop() {
		for _, p := range paths {
			for name := range files {
				c := a.command("wrk", "-t", "2", "-c", "32", "-d", "3s", fmt.Sprintf("http://%s:%d/%s", addr, p.port, name))
				if p.direct {
					a.direct(c)
				}
				rps[p.name+"-"+name] = append(rps[p.name+"-"+name], wrkRPS(b, c))
			}
		}
	}
	if st := a.stats(); st.Direct.SMCR == 0 {
		b.Fatalf("no direct connection went SMC-R: %+v", st.Direct)
	}
	for k, v := range rps {
		b.ReportMetric(nstest.Median(v), k+"-rps")
	}
	for name := range files {
		b.ReportMetric(nstest.Median(rps["direct-"+name])/nstest.Median(rps["tcp-"+name]), "direct/tcp-"+name)
	}
}
