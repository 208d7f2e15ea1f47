// The direct mode's rows: a C peer (test/e2e/testdata/ddbench.c) with
// libsmcr-preload.so on both ends, one smcrd per namespace, beside the same C
// programs without the library to a port smcrd does not list (plain TCP over
// the veth, their same-phase baseline). The Go peer of the other rows makes its
// own system calls, which a preload library never sees.

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// directTools are the direct mode's library and the C benchmark peer.
type directTools struct {
	dir, lib, ddbench string
}

// buildDirectTools builds libsmcr-preload.so (make -C preload) and ddbench
// (gcc) from this module's sources into a temporary directory.
func buildDirectTools(ctx context.Context) (*directTools, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return nil, fmt.Errorf("find the module's sources: %w", err)
	}
	root := strings.TrimSpace(string(out))
	dir, err := os.MkdirTemp("", "smcrbench-direct-")
	if err != nil {
		return nil, err
	}
	t := &directTools{dir: dir, lib: filepath.Join(dir, "libsmcr-preload.so"), ddbench: filepath.Join(dir, "ddbench")}
	for _, args := range [][]string{
		{"make", "-s", "-C", filepath.Join(root, "preload"), "BIN=" + dir},
		{"gcc", "-O2", "-Wall", "-Werror", "-o", t.ddbench, filepath.Join(root, "test/e2e/testdata/ddbench.c"), "-lpthread"},
	} {
		if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("%s does not build here (%v): %s", args[0], err, lastLine(string(out)))
		}
	}
	return t, nil
}

// ddbenchResult is ddbench's client output.
type ddbenchResult struct {
	MBps  float64 `json:"mbps"`
	P50us float64 `json:"p50us"`
	P99us float64 `json:"p99us"`
}

// ddbenchCmd is ddbench in h's namespace and cgroup, with the library and
// h's smcrd when lib is set.
func (t *directTools) cmd(ctx context.Context, h *host, lib bool, args ...string) *exec.Cmd {
	cmd := h.inCgroup(exec.CommandContext(ctx, "nsenter", append([]string{"--net=/run/netns/" + h.ns.Name, t.ddbench}, args...)...))
	cmd.Env = os.Environ()
	if lib {
		cmd.Env = append(cmd.Env, "LD_PRELOAD="+t.lib, "SMCR_DIRECT_SOCKET="+filepath.Join(h.dir, "direct.sock"))
	}
	return cmd
}

// run runs a ddbench client to its end and decodes its output.
func (t *directTools) run(cmd *exec.Cmd) (ddbenchResult, error) {
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var r ddbenchResult
	if err == nil {
		err = json.Unmarshal(out, &r)
	}
	if err != nil {
		return r, fmt.Errorf("ddbench %s: %w: %s%s", strings.Join(cmd.Args[2:], " "), err, out, lastLine(stderr.String()))
	}
	return r, nil
}

// cgroupCPU is the CPU seconds every process in h's cgroup has used: the
// programs and smcrd.
func (h *host) cgroupCPU() (float64, error) {
	b, err := os.ReadFile(filepath.Join(h.cgDir, "cpu.stat"))
	if err != nil {
		return 0, fmt.Errorf("cgroup cpu: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "usage_usec "); ok {
			us, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cgroup cpu: %q: %w", line, err)
			}
			return float64(us) / 1e6, nil
		}
	}
	return 0, errors.New("cgroup cpu: no usage_usec in cpu.stat")
}

// waitListening waits until something in ns listens on port.
func waitListening(ctx context.Context, h *host, port int) error {
	want := fmt.Sprintf(":%04X ", port)
	for range 200 {
		out, _ := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+h.ns.Name, "cat", "/proc/net/tcp").Output()
		for line := range strings.Lines(string(out)) {
			f := strings.Fields(line)
			if len(f) > 3 && strings.HasSuffix(f[1]+" ", want) && f[3] == "0A" {
				return nil
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	return fmt.Errorf("ddbench server: nothing listens on port %d", port)
}

// directPhaseBaseline names the plain TCP runs measured beside the direct
// rows of one provider, the baseline of their ratios.
func directPhaseBaseline(provider string) string {
	return fmt.Sprintf("%s (direct-%s phase)", tcpVeth, provider)
}

// directRuns measures direct-<provider> and, beside each repeat, its plain TCP
// baseline: throughput in 64 KiB and 1 MiB writes with the CPU per GiB of both
// hosts' cgroups (both programs, both smcrds), and the 64 B round trip.
func (e *runEnv) directRuns(ctx context.Context, bin string, tools *directTools, hosts []*host, provider string, repeats int, sz sizes) ([]Figure, string, error) {
	ds, err := e.daemons(ctx, bin, hosts, provider, nil)
	if err != nil {
		return nil, "", err
	}
	defer func() {
		for _, d := range ds {
			d.stop()
		}
	}()
	// The library's server on the listed port, the plain one on the next (not
	// listed: smcrd leaves it alone).
	ports := map[bool]int{true: transparentPort, false: transparentPort + 1}
	for _, lib := range []bool{true, false} {
		srv := tools.cmd(ctx, hosts[1], lib, "server", strconv.Itoa(ports[lib]))
		if err := srv.Start(); err != nil {
			return nil, "", fmt.Errorf("ddbench server: %w", err)
		}
		defer func() { srv.Process.Kill(); srv.Wait() }()
		if err := waitListening(ctx, hosts[1], ports[lib]); err != nil {
			return nil, "", err
		}
	}
	name := "direct-" + provider
	type key struct{ scenario, metric, cas, unit string }
	runs := map[key][]float64{}
	var order []key
	add := func(k key, v float64) {
		if _, ok := runs[k]; !ok {
			order = append(order, k)
		}
		runs[k] = append(runs[k], v)
	}
	addr := e.pair.B.Addr4().String()
	measure := func(lib bool) error {
		scen := directPhaseBaseline(provider)
		if lib {
			scen = name
		}
		port := strconv.Itoa(ports[lib])
		for _, size := range []int{64 << 10, 1 << 20} {
			cpuA, errA := hosts[0].cgroupCPU()
			cpuB, errB := hosts[1].cgroupCPU()
			r, err := tools.run(tools.cmd(ctx, hosts[0], lib, "tput", addr, port, strconv.FormatInt(sz.total, 10), strconv.Itoa(size)))
			afterA, errC := hosts[0].cgroupCPU()
			afterB, errD := hosts[1].cgroupCPU()
			if err := errors.Join(err, errA, errB, errC, errD); err != nil {
				return err
			}
			add(key{scen, "throughput", sizeName(size), "MB/s"}, r.MBps)
			add(key{scen, "cpu", sizeName(size), "s/GiB"}, (afterA-cpuA+afterB-cpuB)/(float64(sz.total)/(1<<30)))
		}
		r, err := tools.run(tools.cmd(ctx, hosts[0], lib, "lat", addr, port, strconv.Itoa(sz.roundTrips)))
		if err != nil {
			return err
		}
		add(key{scen, "latency-p50", byteName(64), "µs"}, r.P50us)
		add(key{scen, "latency-p99", byteName(64), "µs"}, r.P99us)
		return nil
	}
	for rpt := range repeats {
		first, second := true, false
		if rpt%2 == 1 { // neither always follows the other
			first, second = second, first
		}
		for _, lib := range []bool{first, second} {
			if err := measure(lib); err != nil {
				return nil, "", err
			}
		}
	}
	st, err := ds[0].stats(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("smcrctl stats: %w", err)
	}
	if st.Direct.SMCR == 0 {
		return nil, "", fmt.Errorf("no direct connection went SMC-R: %+v", st.Direct)
	}
	note := fmt.Sprintf("%s: ddbench (C) with libsmcr-preload.so on both ends, its CPU that of both hosts' cgroups (both programs, both smcrds; cpu.stat); the client smcrd decided %d connections SMC-R (%d library to library), %d plain TCP, %d failed.",
		name, st.Direct.SMCR, st.Direct.Bypass, st.Direct.TCP, st.Direct.Failed)
	var figs []Figure
	for _, scen := range []string{directPhaseBaseline(provider), name} { // each baseline row above its row
		for _, k := range order {
			if k.scenario != scen {
				continue
			}
			f := newFigure(k.scenario, k.metric, k.cas, k.unit, runs[k])
			if scen == name {
				f.Baseline = directPhaseBaseline(provider)
			}
			figs = append(figs, f)
		}
	}
	return figs, note, nil
}
