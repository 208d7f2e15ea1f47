// The run: namespaces, peer processes per scenario, repeats interleaved so drift
// on a noisy VM spreads over every scenario alike, then the figures and ratios.
// The scenarios are the paths RFC 7609 §1 compares: TCP, and SMC-R over a device.

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/smcr-io/smcr/internal/nstest"
)

// What is measured.
var (
	ThroughputSizes = []int{4 << 10, 64 << 10, 1 << 20}
	LatencySizes    = []int{64, 4 << 10}
	ScaleConns      = []int{1, 16, 256, 4096}
	percentiles     = []struct {
		name string
		p    float64
	}{{"p50", 50}, {"p99", 99}, {"p99.9", 99.9}}
)

// Options says how much to measure.
type Options struct {
	Quick     bool     // the CI smoke form: fewer repeats, smaller totals (under 2 minutes)
	Repeats   int      // runs of each figure (default 5; quick 2)
	Providers []string // providers to try (default shm, soft)
	Scale     []int    // concurrent connections for the scale runs (default ScaleConns; quick 1, 16, 256)
	// Executable is re-executed as the peer processes (default os.Executable: a
	// program calls RunPeer when IsPeer, as cmd/smcrbench and TestMain do).
	Executable string
	// Smcrd is the smcrd binary for the transparent path (default: built from this
	// module with go build); NoTransparent skips that path.
	Smcrd         string
	NoTransparent bool
	// ProfileDir, when set, is where the peer processes write CPU, mutex and
	// block profiles of each client job (profile.go).
	ProfileDir string
	// RMBSize is the RMB each engine peer offers, in bytes (0: the engine's
	// default, smcr.Config.RMBSize).
	RMBSize int
	Command string       // how the run was started, for the report
	Logger  *slog.Logger // progress (default: discarded)
}

// warmupBytes is the untimed transfer each client makes before its timed jobs.
const warmupBytes = 16 << 20

// sizes of one run.
type sizes struct {
	total      int64 // throughput bytes per run
	roundTrips int
	setups     int
	firsts     int
	scalePer   int64 // scale: bytes in all, spread over the connections
	memcpy     int64
}

func (o *Options) sizes() sizes {
	if o.Quick {
		return sizes{total: 48 << 20, roundTrips: 1000, setups: 40, firsts: 8, scalePer: 32 << 20, memcpy: 256 << 20}
	}
	// 1 GiB per throughput run: 0.4–2 s over TCP and through smcrd here, ~70 ms
	// for smcr-shm in a fast spell (384 MiB took 25–800 ms).
	return sizes{total: 1 << 30, roundTrips: 5000, setups: 200, firsts: 30, scalePer: 256 << 20, memcpy: 2 << 30}
}

func (o *Options) defaults() {
	if o.Repeats <= 0 {
		o.Repeats = 5
		if o.Quick {
			o.Repeats = 2
		}
	}
	if o.Providers == nil {
		o.Providers = []string{transportSHM, transportSoft}
	}
	if o.Scale == nil {
		o.Scale = ScaleConns
		if o.Quick {
			o.Scale = []int{1, 16, 256}
		}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Command == "" {
		o.Command = strings.Join(os.Args, " ")
	}
}

// scenario is one path under test, run by a server and a client peer.
type scenario struct {
	name      string
	transport string
	loopback  bool // both ends in namespace A over 127.0.0.1
}

// Run measures everything and returns the report.
func Run(ctx context.Context, opts Options) (*Report, error) {
	opts.defaults()
	start := time.Now()
	rep := &Report{Date: start, Command: opts.Command, Quick: opts.Quick, Repeats: opts.Repeats, Machine: Describe()}
	exe := opts.Executable
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("bench: find own executable: %w", err)
		}
	}
	sz := opts.sizes()
	log := opts.Logger

	log.Info("memcpy baseline")
	for _, s := range ThroughputSizes {
		rep.Figures = append(rep.Figures, newFigure("memcpy", "throughput", sizeName(s), "MB/s", memcpyRuns(s, sz.memcpy, opts.Repeats)))
	}

	pair, err := nstest.OpenPair()
	if err != nil {
		rep.Unavailable = append(rep.Unavailable, Unavailable{"tcp-veth, smcr-*, smcrd-*", err.Error()})
		rep.Duration = time.Since(start)
		return rep, nil
	}
	defer pair.Close()
	shmDir, err := os.MkdirTemp("", "smcrbench-shm-")
	if err != nil {
		return nil, fmt.Errorf("bench: shm dir: %w", err)
	}
	defer os.RemoveAll(shmDir)
	if opts.ProfileDir != "" {
		if err := os.MkdirAll(opts.ProfileDir, 0o755); err != nil {
			return nil, fmt.Errorf("bench: profile dir: %w", err)
		}
	}
	env := &runEnv{exe: exe, pair: pair, shmDir: shmDir, profileDir: opts.ProfileDir, rmbSize: opts.RMBSize, log: log}
	defer func() {
		for _, stop := range env.stops {
			stop()
		}
	}()

	scens := []scenario{{"tcp-loopback", transportTCP, true}, {"tcp-veth", transportTCP, false}}
	for _, p := range opts.Providers {
		scens = append(scens, scenario{"smcr-" + p, p, false})
	}
	jobs := func(sc scenario) []job {
		// A warm-up transfer first, untimed: the peers' first bytes fault in
		// buffers and grow heaps that no timed job should pay for.
		js := []job{{Kind: "warmup", Size: 64 << 10, Total: warmupBytes}}
		for _, s := range ThroughputSizes {
			js = append(js, job{Kind: "throughput", Size: s, Total: sz.total})
		}
		for _, m := range LatencySizes {
			js = append(js, job{Kind: "latency", Size: m, Count: sz.roundTrips})
		}
		js = append(js, job{Kind: "setup", Count: sz.setups})
		if sc.transport != transportTCP {
			js = append(js, job{Kind: "setup-first", Count: sz.firsts})
		}
		return js
	}
	results := map[string][][]jobResult{} // scenario → repeat → jobs
	handoffs := map[string][]float64{}    // scenario → the core hand-off before each run
	copies := map[string][]float64{}      // scenario → two parallel copies before each run
	broken := map[string]bool{}
	for rpt := range opts.Repeats {
		for _, sc := range scens {
			if broken[sc.name] {
				continue
			}
			if ns, ok := CoreHandoff(); ok {
				handoffs[sc.name] = append(handoffs[sc.name], ns)
				copies[sc.name] = append(copies[sc.name], ParallelCopy())
			}
			log.Info("run", "scenario", sc.name, "repeat", rpt+1)
			res, err := env.runScenario(ctx, sc, jobs(sc))
			if err != nil {
				broken[sc.name] = true
				rep.Unavailable = append(rep.Unavailable, Unavailable{sc.name, err.Error()})
				continue
			}
			results[sc.name] = append(results[sc.name], res)
		}
	}
	for _, sc := range scens {
		smc := sc.transport != transportTCP
		if why := allFellBack(results[sc.name]); smc && why != "" {
			broken[sc.name] = true
			rep.Unavailable = append(rep.Unavailable, Unavailable{sc.name, why})
		} else if rs := results[sc.name]; len(rs) > 0 {
			rep.Figures = append(rep.Figures, figuresOf(sc.name, smc, rs)...)
		}
		if hs := handoffs[sc.name]; len(hs) > 0 {
			rep.Figures = append(rep.Figures, newFigure(sc.name, "core-handoff", "cpu0-cpu1", "ns", hs),
				newFigure(sc.name, "parallel-copy", "2x32MiB", "MB/s", copies[sc.name]))
		}
	}
	if len(handoffs) > 0 {
		rep.Notes = append(rep.Notes, "Placement: just before each run, how long a cache line took from CPU 0 to CPU 1, "+
			"and how fast two goroutines copied 32 MiB each at once (per run in report.json). "+
			"A hand-off of tens of ns with fast copies: the two vCPUs sat on cores sharing a last-level cache; "+
			"hundreds of ns: cores that share none; tens with copies a fifth slower: likely two hyperthreads of one core. "+
			"Same-host transfers (shm above all) ran 2-3 times slower in the last two. See docs/benchmarks.md, \"The machine's spells\".")
	}

	for _, sc := range scens {
		if sc.loopback || broken[sc.name] {
			continue
		}
		log.Info("scale", "scenario", sc.name)
		rep.Figures = append(rep.Figures, env.scaleScenario(ctx, sc, opts.Scale, sz.scalePer)...)
	}

	tp := env.transparent(ctx, opts, sz, jobs)
	rep.Figures = append(rep.Figures, tp.figures...)
	rep.Unavailable = append(rep.Unavailable, tp.unavailable...)
	rep.Notes = append(rep.Notes, tp.notes...)

	rep.addRatios(map[string][]string{
		"throughput":       {"tcp-veth", "tcp-loopback", "memcpy"},
		"latency-p50":      {"tcp-veth", "tcp-loopback"},
		"latency-p99":      {"tcp-veth", "tcp-loopback"},
		"latency-p99.9":    {"tcp-veth", "tcp-loopback"},
		"setup":            {"tcp-veth", "tcp-loopback"},
		"cpu":              {"tcp-veth", "tcp-loopback"},
		"scale-throughput": {"tcp-veth"},
		"memory-per-conn":  {"tcp-veth"},
	})
	rep.Notes = append(rep.Notes,
		"Throughput, also at scale, is timed until the receiving application has read the last byte.",
		"CPU counts user+system time of every process on the path (client, server, and the smcrds on the transparent path), from each process's CPU-time clock (the scheduler's ns on CPU, all threads; /proc/<pid>/stat's 10 ms ticks only where that clock cannot be read).",
		"Setup: each connection timed from dial to the server's one-byte answer. First contact uses a fresh client engine per connection (new link group, QPs, CONFIRM_LINK); reuse dials from one engine.",
		"Scale runs once per scenario, not repeated. Memory per connection: the VmRSS growth of the client and the server (transparent path: and both smcrds), "+
			"from before the connections to after all of them have sent (every buffer touched), divided by the connections. "+
			"TCP's socket buffers are kernel memory, in no process's RSS: the TCP rows count only the programs' own memory.")
	rep.Duration = time.Since(start)
	return rep, nil
}

// runEnv is what scenarios share: the namespaces and the binary.
type runEnv struct {
	exe    string
	pair   *nstest.Pair
	shmDir string
	// profileDir is Options.ProfileDir and rmbSize Options.RMBSize, handed to
	// every peer.
	profileDir string
	rmbSize    int
	log        *slog.Logger
	stops      []func() bool // context.AfterFunc registrations to drop at the end
}

// peerSpecFor is spec with what every peer gets from the run's options.
func (e *runEnv) peerSpecFor(spec peerSpec) peerSpec {
	spec.ProfileDir, spec.RMBSize = e.profileDir, e.rmbSize
	return spec
}

// peerCmd builds a peer process for spec inside ns.
func (e *runEnv) peerCmd(ctx context.Context, ns *nstest.NS, spec peerSpec) (*exec.Cmd, error) {
	b, err := json.Marshal(e.peerSpecFor(spec))
	if err != nil {
		return nil, err
	}
	cmd := ns.Command(e.exe)
	cmd.Env = append(os.Environ(), peerEnv+"="+string(b))
	// ip netns exec execs the peer in place, so killing this pid kills the peer.
	stop := context.AfterFunc(ctx, func() {
		if cmd.Process != nil {
			cmd.Process.Kill()
		}
	})
	e.stops = append(e.stops, stop)
	return cmd, nil
}

// server is a running server peer.
type server struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addr  string
	pid   int
}

func (s *server) stop() {
	s.stdin.Close()
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
}

func (e *runEnv) startServer(ctx context.Context, sc scenario) (*server, error) {
	ns, addr := e.pair.B, e.pair.B.Addr4().String()
	if sc.loopback {
		ns, addr = e.pair.A, "127.0.0.1"
	}
	cmd, err := e.peerCmd(ctx, ns, peerSpec{Role: "server", Transport: sc.transport,
		Addr: addr + ":0", LocalIP: addr, ShmDir: e.shmDir})
	if err != nil {
		return nil, err
	}
	return e.startServerCmd(cmd)
}

func (e *runEnv) startServerCmd(cmd *exec.Cmd) (*server, error) {
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start server: %w", err)
	}
	s := &server{cmd: cmd, stdin: stdin, pid: cmd.Process.Pid}
	s.addr, err = readyLine(stdout)
	if err != nil {
		s.stop()
		return nil, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	go io.Copy(io.Discard, stdout)
	return s, nil
}

// runClient runs a client peer in namespace A and returns its results.
func (e *runEnv) runClient(ctx context.Context, transport, addr string, peers []int, jobs []job) ([]jobResult, error) {
	return e.runClientIn(ctx, nil, "", transport, addr, peers, jobs)
}

// runClientIn is runClient inside h's cgroup (when h is not nil), telling each
// job's outcome from the counters of the smcrd whose control socket is smcrd
// (when set).
func (e *runEnv) runClientIn(ctx context.Context, h *host, smcrd, transport, addr string, peers []int, jobs []job) ([]jobResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd, err := e.peerCmd(ctx, e.pair.A, peerSpec{Role: "client", Transport: transport, Addr: addr,
		LocalIP: e.pair.A.Addr4().String(), ShmDir: e.shmDir, Jobs: jobs, PeerPIDs: peers, Smcrd: smcrd})
	if err != nil {
		return nil, err
	}
	if h != nil {
		h.inCgroup(cmd)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("bench: client: %w: %s", err, lastLine(stderr.String()))
	}
	var res []jobResult
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, fmt.Errorf("bench: client output: %w", err)
	}
	return res, nil
}

func (e *runEnv) runScenario(ctx context.Context, sc scenario, jobs []job) ([]jobResult, error) {
	srv, err := e.startServer(ctx, sc)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	return e.runClient(ctx, sc.transport, srv.addr, []int{srv.pid}, jobs)
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// figuresOf turns the repeats of one scenario into figures. smc says the scenario
// is an SMC-R path: a run whose connections did not all go SMC-R is not counted.
func figuresOf(name string, smc bool, reps [][]jobResult) []Figure {
	type key struct{ metric, cas, unit string }
	runs := map[key][]float64{}
	notes := map[key][]string{}
	var order []key
	add := func(k key, v float64, r jobResult) {
		if !slices.Contains(order, k) {
			order = append(order, k)
		}
		if r.Err != "" {
			notes[k] = append(notes[k], r.Err)
			return
		}
		if smc && r.Fallback > 0 {
			// Measured over TCP, in part or whole: not a figure of this path.
			notes[k] = append(notes[k], fmt.Sprintf("a run in which %d of %d connections fell back to TCP is not counted (%s)",
				r.Fallback, r.Fallback+r.SMC, declineText(r.Declines)))
			return
		}
		if smc && r.SMC == 0 {
			notes[k] = append(notes[k], "a run whose connections SMC-R never saw (none reached smcrd) is not counted")
			return
		}
		runs[k] = append(runs[k], v)
	}
	for _, rep := range reps {
		for _, r := range rep {
			j := r.Job
			switch j.Kind {
			case "throughput":
				secs := r.Elapsed.Seconds()
				add(key{"throughput", sizeName(j.Size), "MB/s"}, float64(r.Bytes)/secs/1e6, r)
				add(key{"cpu", sizeName(j.Size), "s/GiB"}, (r.CPUSelf+r.CPUPeers)/(float64(r.Bytes)/(1<<30)), r)
			case "latency":
				for _, p := range percentiles {
					v := float64(nstest.Percentile(r.Samples, p.p).Nanoseconds()) / 1e3
					add(key{"latency-" + p.name, byteName(j.Size), "µs"}, v, r)
				}
			case "setup", "setup-first":
				cas := "reuse"
				if j.Kind == "setup-first" {
					cas = "first-contact"
				} else if !smc {
					cas = "connect" // plain TCP: no link groups
				}
				var sum time.Duration
				for _, d := range r.Samples {
					sum += d
				}
				v := 0.0
				if sum > 0 {
					v = float64(len(r.Samples)) / sum.Seconds()
				}
				add(key{"setup", cas, "conn/s"}, v, r)
			}
		}
	}
	var out []Figure
	for _, k := range order {
		f := newFigure(name, k.metric, k.cas, k.unit, runs[k])
		f.Note = strings.Join(uniq(notes[k]), "; ")
		out = append(out, f)
	}
	return out
}

// allFellBack says why an SMC-R scenario has no figures when every connection of
// every run fell back to TCP (the reasons), and "" when any went SMC-R.
func allFellBack(reps [][]jobResult) string {
	var smc, fallback int
	declines := map[string]int{}
	for _, rep := range reps {
		for _, r := range rep {
			smc, fallback = smc+r.SMC, fallback+r.Fallback
			for k, v := range r.Declines {
				declines[k] += v
			}
		}
	}
	if smc > 0 || fallback == 0 {
		return ""
	}
	return fmt.Sprintf("every connection fell back to TCP (%d: %s)", fallback, declineText(declines))
}

func declineText(m map[string]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%d× %s", v, k))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

func uniq(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}

// scaleScenario runs the scale steps once each, with a fresh server per step so
// memory is measured from a clean start.
func (e *runEnv) scaleScenario(ctx context.Context, sc scenario, steps []int, bytes int64) []Figure {
	var out []Figure
	for _, n := range steps {
		cas := fmt.Sprintf("%d conns", n)
		srv, err := e.startServer(ctx, sc)
		var res []jobResult
		if err == nil {
			res, err = e.runClient(ctx, sc.transport, srv.addr, []int{srv.pid},
				[]job{{Kind: "scale", Size: n, Total: max(bytes/int64(n), 64<<10)}})
			srv.stop()
		}
		out = append(out, scaleFigures(sc.name, cas, n, res, err)...)
	}
	return out
}

// scaleFigures turns one scale step into figures.
func scaleFigures(name, cas string, n int, res []jobResult, err error) []Figure {
	opened := newFigure(name, "scale-opened", cas, "conns", nil)
	tput := newFigure(name, "scale-throughput", cas, "MB/s", nil)
	setupF := newFigure(name, "scale-setup", cas, "conn/s", nil)
	mem := newFigure(name, "memory-per-conn", cas, "KiB/conn", nil)
	if err == nil && (len(res) != 1 || res[0].Scale == nil) {
		err = errors.New("bench: no scale result")
	}
	if err != nil {
		opened.Note = err.Error()
		return []Figure{opened, tput, setupF, mem}
	}
	r := res[0]
	s := r.Scale
	opened = newFigure(name, "scale-opened", cas, "conns", []float64{float64(s.Opened)})
	var notes []string
	if s.Failed > 0 {
		notes = append(notes, fmt.Sprintf("%d of %d dials failed: %s", s.Failed, n, s.FirstErr))
	}
	if want := int64(s.Opened) * r.Job.Total; s.Bytes < want && s.Failed == 0 {
		notes = append(notes, fmt.Sprintf("%d of %d bytes delivered: %s", s.Bytes, want, s.FirstErr))
	}
	if r.Fallback > 0 {
		notes = append(notes, fmt.Sprintf("%d of %d connections fell back to TCP (%s)", r.Fallback, r.Fallback+r.SMC, declineText(r.Declines)))
	}
	opened.Note = strings.Join(notes, "; ")
	if s.Opened > 0 {
		tput = newFigure(name, "scale-throughput", cas, "MB/s", []float64{float64(s.Bytes) / s.SendIn.Seconds() / 1e6})
		setupF = newFigure(name, "scale-setup", cas, "conn/s", []float64{float64(s.Opened) / s.SetupIn.Seconds()})
		grow := r.RSSAfter - r.RSSBefore
		mem = newFigure(name, "memory-per-conn", cas, "KiB/conn", []float64{float64(grow) / 1024 / float64(s.Opened)})
	}
	return []Figure{opened, tput, setupF, mem}
}

// memcpyRuns times copying total bytes in chunks of size, repeats times, in MB/s.
func memcpyRuns(size int, total int64, repeats int) []float64 {
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	n := max(1, int(total/int64(size)))
	var out []float64
	for range repeats {
		start := time.Now()
		for range n {
			copy(dst, src)
		}
		out = append(out, float64(n)*float64(size)/time.Since(start).Seconds()/1e6)
	}
	return out
}
