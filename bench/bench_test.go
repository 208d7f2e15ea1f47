package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/smcr-io/smcr/control"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	if IsPeer() {
		RunPeer() // the test binary re-executed as a benchmark peer
	}
	os.Exit(m.Run())
}

// TestQuick runs the CI form of the benchmark end to end and checks only that it
// produced well-formed output: the figures themselves are the machine's business.
func TestQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("the quick benchmark takes about a minute; skipped under -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, cgroups and BPF")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	profiles := t.TempDir()
	rep, err := Run(ctx, Options{Quick: true, ProfileDir: profiles, Command: "go test -run TestQuick ./bench"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("quick run took %v", time.Since(start).Round(time.Second))
	checkProfiles(t, profiles)
	for _, u := range rep.Unavailable {
		t.Logf("not available: %s: %s", u.Scenario, u.Reason)
	}
	dir := t.TempDir()
	files, err := WriteAll(rep, dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"report.md", "report.json", "throughput.png", "latency.png", "setup.png"}
	if len(files) != len(want) {
		t.Fatalf("wrote %v, want %v", files, want)
	}

	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Machine struct {
			Cores  int
			Kernel string
			Go     string
		}
		Figures []struct {
			Scenario, Metric, Case, Unit string
			Median                       *float64
			Runs                         []float64
		}
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("report.json: %v", err)
	}
	if got.Machine.Cores < 1 || got.Machine.Kernel == "" || got.Machine.Go == "" {
		t.Errorf("machine description incomplete: %+v", got.Machine)
	}
	// The baselines run on any machine with namespaces: their figures must be there.
	for _, k := range []struct{ scen, metric, cas string }{
		{"memcpy", "throughput", "1MiB"},
		{"tcp-loopback", "throughput", "64KiB"},
		{"tcp-veth", "throughput", "4KiB"},
		{"tcp-veth", "latency-p99.9", "64B"},
		{"tcp-veth", "setup", "connect"},
		{"tcp-veth", "cpu", "1MiB"},
		{"tcp-veth", "core-handoff", "cpu0-cpu1"},
	} {
		found := false
		for _, f := range got.Figures {
			if f.Scenario == k.scen && f.Metric == k.metric && f.Case == k.cas {
				found = true
				if f.Median == nil || *f.Median <= 0 || len(f.Runs) != rep.Repeats {
					t.Errorf("%v: median %v from %d runs, want a positive median of %d", k, f.Median, len(f.Runs), rep.Repeats)
				}
			}
		}
		if !found {
			t.Errorf("report.json has no figure %v", k)
		}
	}

	// The direct mode's rows, where smcrd and the library run here.
	for _, p := range []string{"shm", "soft"} {
		scen := "direct-" + p
		if slices.ContainsFunc(rep.Unavailable, func(u Unavailable) bool { return u.Scenario == scen }) {
			continue
		}
		for _, k := range []struct{ scen, metric, cas string }{
			{scen, "throughput", "64KiB"}, {scen, "throughput", "1MiB"}, {scen, "cpu", "1MiB"}, {scen, "latency-p50", "64B"},
			{"tcp-veth (" + scen + " phase)", "throughput", "1MiB"},
		} {
			f := rep.find(k.scen, k.metric, k.cas)
			if f == nil || !(f.Median > 0) || len(f.Runs) != rep.Repeats {
				t.Errorf("%v: %+v, want a positive median of %d runs", k, f, rep.Repeats)
			} else if k.scen == scen && f.Ratios[f.Baseline] <= 0 {
				t.Errorf("%v: no ratio to %q: %v", k, f.Baseline, f.Ratios)
			}
		}
	}

	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"## Throughput", "## Request/response latency, 64B", "## Connection setup", "| tcp-veth |"} {
		if !bytes.Contains(md, []byte(s)) {
			t.Errorf("report.md lacks %q", s)
		}
	}
	for _, name := range want[2:] {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Errorf("%s: %v", name, err)
		} else if r := img.Bounds(); r.Dx() < 400 || r.Dy() < 300 {
			t.Errorf("%s is %dx%d, too small to read", name, r.Dx(), r.Dy())
		}
	}
}

func TestFigureSummary(t *testing.T) {
	for _, tc := range []struct {
		runs          []float64
		med, min, max float64
	}{
		{[]float64{3, 1, 2}, 2, 1, 3},
		{[]float64{4, 1, 3, 2}, 2.5, 1, 4},
		{[]float64{7}, 7, 7, 7},
	} {
		f := newFigure("s", "m", "c", "u", tc.runs)
		if f.Median != tc.med || f.Min != tc.min || f.Max != tc.max {
			t.Errorf("%v: median %v [%v–%v], want %v [%v–%v]", tc.runs, f.Median, f.Min, f.Max, tc.med, tc.min, tc.max)
		}
	}
	f := newFigure("s", "m", "c", "u", nil)
	if !math.IsNaN(f.Median) {
		t.Errorf("no runs: median %v, want NaN", f.Median)
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatalf("a figure without runs must still encode: %v", err)
	}
	if !strings.Contains(string(b), `"Median":null`) {
		t.Errorf("no runs encoded as %s, want a null median", b)
	}
}

func TestRatiosAndMarkdown(t *testing.T) {
	r := &Report{Repeats: 2, Figures: []Figure{
		newFigure("tcp-veth", "throughput", "4KiB", "MB/s", []float64{100, 200}),
		newFigure("smcr-shm", "throughput", "4KiB", "MB/s", []float64{300, 600}),
		newFigure("tcp-veth", "setup", "connect", "conn/s", []float64{1000}),
		newFigure("smcr-shm", "setup", "reuse", "conn/s", []float64{250}),
		newFigure("tcp-veth (smcrd-shm phase)", "throughput", "4KiB", "MB/s", []float64{50}),
		newFigure("smcrd-shm", "throughput", "4KiB", "MB/s", []float64{25}),
	}}
	r.Figures[len(r.Figures)-1].Baseline = "tcp-veth (smcrd-shm phase)"
	r.addRatios(map[string][]string{"throughput": {"tcp-veth"}, "setup": {"tcp-veth"}})
	if got := r.find("smcr-shm", "throughput", "4KiB").Ratios["tcp-veth"]; got != 3 {
		t.Errorf("throughput ratio %v, want 450/150 = 3", got)
	}
	if got := r.find("smcr-shm", "setup", "reuse").Ratios["tcp-veth"]; got != 0.25 {
		t.Errorf("setup ratio %v, want 250/1000 against TCP connect", got)
	}
	if _, ok := r.find("tcp-veth", "throughput", "4KiB").Ratios["tcp-veth"]; ok {
		t.Error("a baseline has a ratio to itself")
	}
	// The smcrd row's ratio is to direct TCP of its own phase, not tcp-veth's.
	if got := r.find("smcrd-shm", "throughput", "4KiB").Ratios; len(got) != 1 || got["tcp-veth (smcrd-shm phase)"] != 0.5 {
		t.Errorf("smcrd ratios %v, want only 25/50 to its phase's TCP", got)
	}
	var b strings.Builder
	if err := r.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	for _, row := range []string{"| smcr-shm | 450 [300–600] ×3.00 |", "| tcp-veth (smcrd-shm phase) | 50 ×0.33 |", "| smcrd-shm | 25 ×0.50 |"} {
		if !strings.Contains(b.String(), row) {
			t.Errorf("markdown row %q missing or wrong:\n%s", row, b.String())
		}
	}
}

func TestProcParsers(t *testing.T) {
	// The command name may hold spaces and parentheses; fields count from the last ")".
	stat := "1234 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0 100 0 0"
	if got := parseStatCPU([]byte(stat)); got != 3 {
		t.Errorf("cpu %v s, want (250+50)/100 = 3", got)
	}
	if got := parseStatCPU([]byte("garbage")); got != 0 {
		t.Errorf("garbage: %v, want 0", got)
	}
	status := "Name:\tx\nVmPeak:\t  9000 kB\nVmRSS:\t    1536 kB\nThreads: 3\n"
	if got := parseVmRSS([]byte(status)); got != 1536<<10 {
		t.Errorf("rss %d, want %d", got, 1536<<10)
	}
	if rssOf([]int{os.Getpid()}) <= 0 || cpuOf([]int{os.Getpid()}) < 0 {
		t.Error("own /proc entries unreadable")
	}
}

// TestWorkloads drives every workload against serve over loopback TCP, so a
// broken request or timing shows up without namespaces or root.
func TestWorkloads(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	ctx := context.Background()
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", ln.Addr().String())
	}
	if d, err := throughput(ctx, dial, 4096, 1<<20+7); err != nil || d <= 0 {
		t.Errorf("throughput: %v %v", d, err)
	}
	rtts, err := latency(ctx, dial, 64, 20)
	if err != nil || len(rtts) != 20 {
		t.Errorf("latency: %d round trips, %v", len(rtts), err)
	}
	fresh := 0
	times, err := setup(ctx, nil, func() (dialer, func(), error) {
		fresh++
		return dial, func() {}, nil
	}, 5)
	if err != nil || len(times) != 5 || fresh != 5 {
		t.Errorf("setup: %d times, %d fresh dialers, %v", len(times), fresh, err)
	}
	sampled := false
	r := scale(ctx, dial, 10, 4, 100<<10, func() { sampled = true })
	if r.Opened != 10 || r.Failed != 0 || r.Bytes != 10*100<<10 || !sampled {
		t.Errorf("scale: %+v, sampled %v", r, sampled)
	}
	// A server refusing a bad request must say so, not hang.
	c, err := dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := request(c, 'X', 0); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("bad request answered %d bytes, %v; want the connection closed", n, err)
	}
}

// TestCoreHandoff: on two CPUs the probe gives a hand-off time a cache line can
// take (well under a millisecond).
func TestCoreHandoff(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("one CPU: nothing to hand off between")
	}
	ns, ok := CoreHandoff()
	if !ok || ns <= 0 || ns > 1e6 {
		t.Fatalf("core hand-off %v ns, ok %v", ns, ok)
	}
	t.Logf("core hand-off %.0f ns", ns)
}

// TestProcessCPUClock: another process's CPU clock reads its nanoseconds on CPU,
// agreeing with the ticks of /proc/<pid>/stat and finer than them.
func TestProcessCPUClock(t *testing.T) {
	self := os.Getpid()
	var ts unix.Timespec
	if err := unix.ClockGettime(processCPUClock(self), &ts); err != nil {
		t.Skipf("kernel lacks process CPU clocks of other processes: %v", err)
	}
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Skipf("no shell to burn CPU: %v", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	time.Sleep(300 * time.Millisecond)
	clock := cpuOf([]int{cmd.Process.Pid})
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	ticks := parseStatCPU(b)
	if clock <= 0 || math.Abs(clock-ticks) > 0.05 {
		t.Errorf("busy child: clock %.4f s, stat %.2f s; want them within 50 ms", clock, ticks)
	}
	if clock == math.Trunc(clock*clockTick)/clockTick {
		t.Errorf("clock %.6f s is a whole number of ticks: the tick fallback answered", clock)
	}
	if got := cpuOf([]int{1 << 22}); got != 0 { // above PID_MAX_LIMIT
		t.Errorf("a process that does not exist used %v s, want 0", got)
	}
}

// TestFallbackRuns: a run in which any connection fell back is left out of an
// SMC-R figure with a note, the outcome of a transparent run comes from the
// difference of two readings of smcrd's counters, and a scenario whose every
// connection fell back has no figures.
func TestFallbackRuns(t *testing.T) {
	before := control.Stats{Connections: control.ConnCounts{SMCR: 5, Fallback: 1},
		Fallbacks: []control.FallbackCount{{Reason: "no memory", Side: "local", Count: 1}}}
	after := control.Stats{Connections: control.ConnCounts{SMCR: 7, Fallback: 3},
		Fallbacks: []control.FallbackCount{{Reason: "no memory", Side: "local", Count: 2}, {Reason: "declined", Side: "peer", Count: 1}}}
	tl := smcrdTally(before, after)
	if tl.smc != 2 || tl.fallback != 2 || tl.declines["no memory (local)"] != 1 || tl.declines["declined (peer)"] != 1 || len(tl.declines) != 2 {
		t.Errorf("smcrd tally %+v, want 2 SMC-R, 2 fallbacks, one of each reason", tl)
	}

	ok := jobResult{Job: job{Kind: "throughput", Size: 4 << 10}, Elapsed: time.Second, Bytes: 1e9, SMC: 1}
	fb := ok
	fb.SMC, fb.Fallback, fb.Declines = 0, 1, map[string]int{"declined (peer)": 1}
	setupOK := jobResult{Job: job{Kind: "setup", Count: 4}, Samples: []time.Duration{time.Millisecond}, SMC: 4}
	setupPart := setupOK
	setupPart.SMC, setupPart.Fallback = 3, 1
	figs := figuresOf("smcrd-shm", true, [][]jobResult{{ok, setupOK}, {fb, setupPart}, {ok, setupOK}})
	find := func(figs []Figure, metric, cas string) Figure {
		for _, f := range figs {
			if f.Metric == metric && f.Case == cas {
				return f
			}
		}
		t.Fatalf("no figure %s %s in %+v", metric, cas, figs)
		return Figure{}
	}
	for _, f := range []Figure{find(figs, "throughput", "4KiB"), find(figs, "setup", "reuse")} {
		if len(f.Runs) != 2 || !strings.Contains(f.Note, "fell back to TCP is not counted") {
			t.Errorf("%s: %d runs, note %q; want the fallback run left out, with a note", f.Metric, len(f.Runs), f.Note)
		}
	}
	// Plain TCP counts no SMC-R connections and is no less a figure for it.
	tcp := ok
	tcp.SMC = 0
	tcpSetup := setupOK
	tcpSetup.SMC = 0
	figs = figuresOf("tcp-veth", false, [][]jobResult{{tcp, tcpSetup}})
	if f := find(figs, "setup", "connect"); len(f.Runs) != 1 || len(find(figs, "throughput", "4KiB").Runs) != 1 {
		t.Errorf("TCP runs not counted: %+v", figs)
	}

	if why := allFellBack([][]jobResult{{fb}, {fb}}); !strings.Contains(why, "every connection fell back") || !strings.Contains(why, "declined (peer)") {
		t.Errorf("all fell back: %q", why)
	}
	if why := allFellBack([][]jobResult{{ok}, {fb}}); why != "" {
		t.Errorf("one run went SMC-R, yet %q", why)
	}
}

// checkProfiles: each smcr-shm client job has its CPU, mutex and block
// profiles, and its server one set for the same span, all non-empty.
func checkProfiles(t *testing.T, dir string) {
	t.Helper()
	jobs, _ := filepath.Glob(filepath.Join(dir, "shm-client-*-throughput-1MiB.cpu.pprof"))
	if len(jobs) == 0 {
		ents, _ := os.ReadDir(dir)
		t.Fatalf("no profile of the smcr-shm 1MiB throughput job in %d files", len(ents))
	}
	for _, cpu := range jobs {
		// shm-client-<server pid>-<n>-throughput-1MiB: the server's nth.
		parts := strings.Split(filepath.Base(cpu), "-")
		srv := filepath.Join(dir, strings.Join([]string{"shm", "server", parts[2], parts[3]}, "-"))
		base := strings.TrimSuffix(cpu, ".cpu.pprof")
		for _, f := range []string{cpu, base + ".mutex.pprof", base + ".block.pprof",
			srv + ".cpu.pprof", srv + ".mutex.pprof", srv + ".block.pprof"} {
			st, err := os.Stat(f)
			if err != nil {
				t.Error(err)
			} else if st.Size() == 0 {
				t.Errorf("profile %s is empty", filepath.Base(f))
			}
		}
	}
}

// TestPeerRMBSize: Options.RMBSize reaches a peer's engine through its spec (as
// JSON, which the peer process reads), and 0 leaves the engine's default.
func TestPeerRMBSize(t *testing.T) {
	for _, c := range []struct{ size, want int }{{512 << 10, 512 << 10}, {0, 256 << 10}} {
		env := &runEnv{rmbSize: c.size}
		b, err := json.Marshal(env.peerSpecFor(peerSpec{Role: "server", Transport: transportSHM, ShmDir: t.TempDir()}))
		if err != nil {
			t.Fatal(err)
		}
		var spec peerSpec
		if err := json.Unmarshal(b, &spec); err != nil {
			t.Fatalf("the peer's spec: %v", err)
		}
		ep, err := openEndpoint(spec)
		if err != nil {
			t.Fatalf("open the peer's endpoint: %v", err)
		}
		got := ep.engine.Settings().RMBSize
		ep.close()
		if got != c.want {
			t.Errorf("Options.RMBSize %d: the peer's engine has %d, want %d", c.size, got, c.want)
		}
	}
}
