// The transparent path: unmodified TCP client and server, one smcrd per namespace
// (RFC 7609 SMC-R negotiated by the daemons on the applications' behalf), with
// the smcrds' CPU and memory counted, and max_memory checked through their
// control API (what smcrctl stats shows).

package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/internal/cgroupfs"
	"github.com/smcr-io/smcr/internal/nstest"
)

// transparentPort is where the server peer listens; smcrd accelerates only it.
const transparentPort = 5301

// maxMemoryCheck: with max_memory this small (MB) and rmb/sndbuf of 256 KiB, only
// a few of maxMemoryConns connections fit; the rest must fall back.
const (
	maxMemoryMB    = 2
	maxMemoryConns = 32
)

// transparentResult is what the transparent-path runs add to the report.
type transparentResult struct {
	figures     []Figure
	unavailable []Unavailable
	notes       []string
}

// daemon is one running smcrd.
type daemon struct {
	cmd    *exec.Cmd
	done   chan struct{}
	ctl    *control.Client
	log    *bytes.Buffer
	pinDir string
}

// host is one namespace with its cgroup, for the transparent path.
type host struct {
	ns     *nstest.NS
	cgRel  string
	cgDir  string
	cgFD   *os.File
	dir    string
	pinDir string
	starts int
}

func (e *runEnv) transparent(ctx context.Context, opts Options, sz sizes, jobs func(scenario) []job) (tr transparentResult) {
	unavailable := func(reason string) transparentResult {
		for _, p := range opts.Providers {
			tr.unavailable = append(tr.unavailable, Unavailable{"smcrd-" + p, reason}, Unavailable{"direct-" + p, reason})
		}
		return tr
	}
	if opts.NoTransparent {
		return unavailable("skipped (-no-transparent)")
	}
	bin := opts.Smcrd
	if bin == "" {
		var err error
		if bin, err = buildSmcrd(ctx); err != nil {
			return unavailable(err.Error())
		}
		defer os.RemoveAll(filepath.Dir(bin))
	}
	mnt, err := cgroupfs.Mount()
	if err != nil {
		return unavailable("kernel lacks cgroup v2: " + err.Error())
	}
	hosts, err := e.hosts(mnt)
	if err != nil {
		return unavailable(err.Error())
	}
	defer func() {
		for _, h := range hosts {
			h.remove()
		}
	}()
	tools, toolsErr := buildDirectTools(ctx)
	if toolsErr == nil {
		defer os.RemoveAll(tools.dir)
	}
	for _, p := range opts.Providers {
		e.log.Info("direct", "provider", p)
		if toolsErr != nil {
			tr.unavailable = append(tr.unavailable, Unavailable{"direct-" + p, toolsErr.Error()})
		} else if figs, note, err := e.directRuns(ctx, bin, tools, hosts, p, opts.Repeats, sz); err != nil {
			tr.unavailable = append(tr.unavailable, Unavailable{"direct-" + p, err.Error()})
		} else {
			tr.figures = append(tr.figures, figs...)
			tr.notes = append(tr.notes, note)
		}
		name := "smcrd-" + p
		e.log.Info("transparent", "provider", p)
		figs, note, err := e.transparentRuns(ctx, bin, hosts, p, opts.Repeats, jobs(scenario{name, transportTCP, false}))
		if err != nil {
			tr.unavailable = append(tr.unavailable, Unavailable{name, err.Error()})
			continue
		}
		tr.figures = append(tr.figures, figs...)
		tr.notes = append(tr.notes, note)
		for _, n := range opts.Scale {
			e.log.Info("transparent scale", "provider", p, "conns", n)
			tr.figures = append(tr.figures, e.transparentScale(ctx, bin, hosts, p, n, max(sz.scalePer/int64(n), 64<<10), nil)...)
		}
		e.log.Info("transparent max_memory", "provider", p)
		tr.figures = append(tr.figures, e.transparentScale(ctx, bin, hosts, p, maxMemoryConns, 64<<10,
			[]string{fmt.Sprintf("max_memory = %d", maxMemoryMB), "rmb_size = 256K", "sndbuf_size = 256K"})...)
	}
	return tr
}

// buildSmcrd builds cmd/smcrd of this module into a temporary directory.
func buildSmcrd(ctx context.Context) (string, error) {
	dir, err := os.MkdirTemp("", "smcrbench-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "smcrd")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/smcr-io/smcr/cmd/smcrd")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("smcrd does not build here (%v): %s", err, lastLine(string(out)))
	}
	return bin, nil
}

// hosts makes a cgroup per namespace: smcrd accelerates the programs of its own.
func (e *runEnv) hosts(mnt string) ([]*host, error) {
	var b [4]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	var out []*host
	for i, ns := range []*nstest.NS{e.pair.A, e.pair.B} {
		name := string(rune('a' + i))
		h := &host{ns: ns, cgRel: filepath.Join("smcrbench-"+id, name),
			pinDir: filepath.Join("/sys/fs/bpf", "smcrbench-"+id+"-"+name)}
		h.cgDir = filepath.Join(mnt, h.cgRel)
		var err error
		if err = os.MkdirAll(h.cgDir, 0o755); err == nil {
			h.cgFD, err = os.Open(h.cgDir)
		}
		if err == nil {
			h.dir, err = os.MkdirTemp("", "smcrbench-"+name+"-")
		}
		out = append(out, h)
		if err != nil {
			for _, h := range out {
				h.remove()
			}
			return nil, fmt.Errorf("cgroup: %w", err)
		}
	}
	return out, nil
}

func (h *host) remove() {
	if h.cgFD != nil {
		h.cgFD.Close()
	}
	os.Remove(h.cgDir)
	os.Remove(filepath.Dir(h.cgDir))
	if h.dir != "" {
		os.RemoveAll(h.dir)
	}
}

// inCgroup starts cmd inside the host's cgroup (clone3 CLONE_INTO_CGROUP), before
// `ip netns exec` remounts /sys.
func (h *host) inCgroup(cmd *exec.Cmd) *exec.Cmd {
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(h.cgFD.Fd())}
	return cmd
}

// startDaemon runs smcrd in the host with provider and extra configuration lines,
// and waits until its control socket answers.
func (e *runEnv) startDaemon(ctx context.Context, bin string, h *host, provider string, extra []string) (*daemon, error) {
	sock := filepath.Join(h.dir, "smcrd.sock")
	// A pin directory per start: a restarted smcrd must not meet the programs and
	// maps its predecessor left pinned.
	h.starts++
	pinDir := fmt.Sprintf("%s-%d", h.pinDir, h.starts)
	conf := strings.Join(append([]string{
		"enabled = yes",
		"providers = " + provider,
		fmt.Sprintf("port_range_list = %d", transparentPort),
		"cgroup = " + h.cgRel,
		"control_socket = " + sock,
		"metrics_address =",
		"log_level = warn",
		// Bounds the run: at 4096 connections on 2 cores, handshakes time out, and
		// 6 s each (the default) would stretch the scale step by minutes.
		"clc_timeout = 2s",
	}, extra...), "\n") + "\n"
	file := filepath.Join(h.dir, "smcrd.conf")
	if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	// nsenter joins only the network namespace, so /sys/fs/bpf and the cgroup
	// mount stay as they are; it execs smcrd in place, so the pid is smcrd's.
	cmd := h.inCgroup(exec.Command("nsenter", "--net=/run/netns/"+h.ns.Name, bin, "-config", file,
		"-pin-dir", pinDir, "-shm-dir", e.shmDir, "-liveness-ttl", "1s", "-drain-timeout", "2s"))
	d := &daemon{cmd: cmd, done: make(chan struct{}), log: &bytes.Buffer{}, pinDir: pinDir}
	cmd.Stdout, cmd.Stderr = d.log, d.log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start smcrd: %w", err)
	}
	go func() { cmd.Wait(); close(d.done) }()
	d.ctl = control.NewClient(sock)
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, cancel := context.WithTimeout(ctx, time.Second)
		_, err := d.ctl.Status(c)
		cancel()
		if err == nil {
			return d, nil
		}
		select {
		case <-d.done:
			return nil, fmt.Errorf("smcrd exited: %s", lastLine(d.log.String()))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			d.stop()
			return nil, fmt.Errorf("smcrd not answering: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends smcrd with SIGTERM and waits for it.
func (d *daemon) stop() {
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
	d.ctl.Close()
	os.RemoveAll(d.pinDir) // detaches what smcrd left pinned
}

// daemons starts smcrd in both hosts.
func (e *runEnv) daemons(ctx context.Context, bin string, hosts []*host, provider string, extra []string) ([]*daemon, error) {
	var ds []*daemon
	for _, h := range hosts {
		d, err := e.startDaemon(ctx, bin, h, provider, extra)
		if err != nil {
			for _, d := range ds {
				d.stop()
			}
			return nil, err
		}
		ds = append(ds, d)
	}
	return ds, nil
}

// appServer starts the server peer, plain TCP, in host B's cgroup, on port (0:
// one the kernel picks, outside port_range_list, so smcrd leaves it alone).
func (e *runEnv) appServer(ctx context.Context, h *host, port int) (*server, error) {
	addr := fmt.Sprintf("%s:%d", e.pair.B.Addr4(), port)
	cmd, err := e.peerCmd(ctx, e.pair.B, peerSpec{Role: "server", Transport: transportTCP, Addr: addr})
	if err != nil {
		return nil, err
	}
	return e.startServerCmd(h.inCgroup(cmd))
}

// stats reads a daemon's counters, as smcrctl stats does.
func (d *daemon) stats(ctx context.Context) (control.Stats, error) {
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return d.ctl.Stats(c)
}

// phaseBaseline names the direct TCP runs measured beside the smcrd runs of one
// provider, the baseline of their ratios.
func phaseBaseline(provider string) string {
	return fmt.Sprintf("%s (smcrd-%s phase)", tcpVeth, provider)
}

// transparentRuns runs the throughput, latency and setup jobs through the
// smcrds, and beside each repeat the same jobs direct: the same programs in the
// same cgroups, with the smcrds up, to a port smcrd does not steer. Their
// figures are phaseBaseline's, and the smcrd figures' ratios are taken to them.
func (e *runEnv) transparentRuns(ctx context.Context, bin string, hosts []*host, provider string, repeats int, jobs []job) ([]Figure, string, error) {
	ds, err := e.daemons(ctx, bin, hosts, provider, nil)
	if err != nil {
		return nil, "", err
	}
	defer func() {
		for _, d := range ds {
			d.stop()
		}
	}()
	var reps, direct [][]jobResult
	// run runs the jobs once to port, counting the CPU of the server and of
	// daemons, and appends the results to out.
	run := func(out *[][]jobResult, port int, smcrd string, daemons ...*daemon) error {
		srv, err := e.appServer(ctx, hosts[1], port)
		if err != nil {
			return err
		}
		defer srv.stop()
		peers := []int{srv.pid}
		for _, d := range daemons {
			peers = append(peers, d.cmd.Process.Pid)
		}
		res, err := e.runClientIn(ctx, hosts[0], smcrd, transportTCP, srv.addr, peers, jobs)
		*out = append(*out, res)
		return err
	}
	for rpt := range repeats {
		first, second := func() error { return run(&direct, 0, "") },
			func() error { return run(&reps, transparentPort, ds[0].ctl.Socket(), ds...) }
		if rpt%2 == 1 { // neither always follows the other
			first, second = second, first
		}
		for _, f := range []func() error{first, second} {
			if err := f(); err != nil {
				return nil, "", err
			}
		}
	}
	st, err := ds[0].stats(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("smcrctl stats: %w", err)
	}
	c := st.Connections
	if c.SMCR == 0 {
		return nil, "", fmt.Errorf("no connection went SMC-R: smcrd handled %d, %d fell back%s, %d handshake errors",
			c.Handled, c.Fallback, parens(fallbackText(st)), c.HandshakeErrors)
	}
	// Each run's outcome comes from the client smcrd's counters before and after
	// it (peerSpec.Smcrd), so figuresOf leaves out the runs that fell back.
	note := fmt.Sprintf("smcrd-%s: client smcrd carried %d connections: %d SMC-R (%d first contact, %d link-group reuse), %d fell back%s.",
		provider, c.Handled, c.SMCR, c.FirstContact, c.Reused, c.Fallback, parens(fallbackText(st)))
	figs := figuresOf(phaseBaseline(provider), false, direct)
	for _, f := range figuresOf("smcrd-"+provider, true, reps) {
		f.Baseline = phaseBaseline(provider)
		figs = append(figs, f)
	}
	return figs, note, nil
}

// transparentScale runs one scale step through fresh smcrds, counting the memory
// growth of the client, the server and both smcrds. extra, when set, is extra
// configuration, and the step becomes the max_memory check.
func (e *runEnv) transparentScale(ctx context.Context, bin string, hosts []*host, provider string, n int, per int64, extra []string) []Figure {
	name := "smcrd-" + provider
	cas := fmt.Sprintf("%d conns", n)
	ds, err := e.daemons(ctx, bin, hosts, provider, extra)
	if err != nil {
		return scaleFigures(name, cas, n, nil, err)
	}
	defer func() {
		for _, d := range ds {
			d.stop()
		}
	}()
	srv, err := e.appServer(ctx, hosts[1], transparentPort)
	if err != nil {
		return scaleFigures(name, cas, n, nil, err)
	}
	res, err := e.runClientIn(ctx, hosts[0], ds[0].ctl.Socket(), transportTCP, srv.addr,
		[]int{srv.pid, ds[0].cmd.Process.Pid, ds[1].cmd.Process.Pid}, []job{{Kind: "scale", Size: n, Total: per}})
	srv.stop()
	if extra != nil {
		st, serr := ds[0].stats(ctx)
		return []Figure{maxMemoryFigure(name, st, serr, err)}
	}
	// The scale job's fallbacks, from the client smcrd's counters, are in its note.
	return scaleFigures(name, cas, n, res, err)
}

// maxMemoryFigure reports how many connections went SMC-R under a small
// max_memory, and whether the rest fell back for lack of memory.
func maxMemoryFigure(name string, st control.Stats, serr, err error) Figure {
	cas := fmt.Sprintf("%d conns, max_memory %d MB", maxMemoryConns, maxMemoryMB)
	f := newFigure(name, "max-memory-smcr", cas, "conns", nil)
	if err = errors.Join(err, serr); err != nil {
		f.Note = err.Error()
		return f
	}
	c := st.Connections
	f = newFigure(name, "max-memory-smcr", cas, "conns", []float64{float64(c.SMCR)})
	var memFallbacks uint64
	for _, fb := range st.Fallbacks {
		if strings.Contains(strings.ToLower(fb.Reason), "memory") {
			memFallbacks += fb.Count
		}
	}
	verdict := "respected"
	if memFallbacks == 0 || st.MemoryPeak > int64(maxMemoryMB)<<20 {
		verdict = "NOT respected"
	}
	f.Note = fmt.Sprintf("max_memory %s: %d SMC-R, %d fell back for memory, peak %d KiB of %d KiB (smcrctl stats: %s)",
		verdict, c.SMCR, memFallbacks, st.MemoryPeak>>10, maxMemoryMB<<10, fallbackText(st))
	return f
}

func fallbackText(st control.Stats) string {
	var parts []string
	for _, f := range st.Fallbacks {
		parts = append(parts, fmt.Sprintf("%d× %s (%s)", f.Count, f.Reason, f.Side))
	}
	return strings.Join(parts, ", ")
}

func parens(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}
