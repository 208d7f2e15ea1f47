// Harness of the end-to-end tests: two hosts (network namespaces joined by veth),
// each with its own cgroup and its own smcrd built from this tree, and unmodified
// programs started inside those cgroups, so the transparent path of RFC 7609
// SMC-R runs exactly as in production.

package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/internal/nstest"
)

// bins holds the binaries TestMain builds: smcrd and the static test application.
var bins struct {
	dir     string
	smcrd   string
	testapp string
	preload string // libsmcr-preload.so, the direct mode's library
	ddbench string // the direct mode's benchmark peer (testdata/ddbench.c)
	err     error
}

// SMCR_E2E_BIN names a directory holding smcrd and testapp already built: the
// soft-RoCE VM (test/vm) runs this suite with an smcrd built with the ibv tag,
// and with no Go toolchain cache to build one in the guest.
func TestMain(m *testing.M) {
	if dir := os.Getenv("SMCR_E2E_BIN"); dir != "" {
		bins.smcrd = filepath.Join(dir, "smcrd")
		bins.testapp = filepath.Join(dir, "testapp")
		bins.preload = filepath.Join(dir, "libsmcr-preload.so")
		bins.ddbench = filepath.Join(dir, "ddbench")
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "smcr-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins.dir = dir
	bins.smcrd = filepath.Join(dir, "smcrd")
	bins.testapp = filepath.Join(dir, "testapp")
	bins.preload = filepath.Join(dir, "libsmcr-preload.so")
	bins.ddbench = filepath.Join(dir, "ddbench")
	if out, err := exec.Command("make", "-s", "-C", "../../preload", "BIN="+dir).CombinedOutput(); err != nil {
		bins.err = fmt.Errorf("make preload: %v\n%s", err, out)
	} else if out, err := exec.Command("gcc", "-O2", "-Wall", "-Werror", "-o", bins.ddbench, "testdata/ddbench.c", "-lpthread").CombinedOutput(); err != nil {
		bins.err = fmt.Errorf("build ddbench: %v\n%s", err, out)
	}
	for _, b := range []struct{ out, pkg string }{{bins.smcrd, "../../cmd/smcrd"}, {bins.testapp, "./testapp"}} {
		cmd := exec.Command("go", "build", "-o", b.out, b.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // static, as the issue asks of the Go program
		if out, err := cmd.CombinedOutput(); err != nil {
			bins.err = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
			break
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// providers are the providers the tests run once each with: shm and soft here,
// or SMCR_E2E_PROVIDERS (the VM: rdma).
func providers() []string {
	if p := os.Getenv("SMCR_E2E_PROVIDERS"); p != "" {
		return strings.Split(p, ",")
	}
	return []string{"shm", "soft"}
}

// providerConf is the configuration that makes a host use provider p. For rdma
// both hosts share the RDMA device SMCR_E2E_RDMA_DEVICE (the VM's rxe0): its
// netdev is outside their namespaces, so rdma_devices names it, and two queue
// pairs on one device reach each other as over a fabric.
func (h *host) providerConf(p string) []string {
	conf := []string{"providers = " + p}
	if p == "rdma" {
		dev := os.Getenv("SMCR_E2E_RDMA_DEVICE")
		if dev == "" {
			h.t.Fatal("provider rdma needs SMCR_E2E_RDMA_DEVICE, the RDMA device to use")
		}
		conf = append(conf, "rdma_devices = "+h.ns.Links[0].Name+"="+dev)
	}
	return conf
}

// host is one namespace of a pair with its cgroup and, once started, its smcrd.
type host struct {
	t      testing.TB
	ns     *nstest.NS
	pair   *nstest.Pair // both hosts'; AddLink joins them by one more veth pair
	other  *host        // the pair's other host
	name   string
	cgRel  string // relative to the cgroup2 mount
	cgDir  string
	cgFD   *os.File
	dir    string
	pinDir string
	shmDir string

	smcrd      *exec.Cmd
	smcrdFlags []string // more of smcrd's flags, for the next start
	log        *syncWriter
	done       chan struct{}
	exitErr    error // smcrd's exit, once done is closed
	ctl        *control.Client
}

// hosts makes a pair of hosts A (198.18.0.1) and B (198.18.0.2), each with a
// cgroup of its own.
func hosts(t testing.TB) (*host, *host) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, cgroups and BPF")
	}
	nstest.Require(t)
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	mnt := nstest.Cgroup2(t)
	pair := nstest.NewPair(t)
	id := randID()
	shm := t.TempDir()
	var out [2]*host
	for i, ns := range []*nstest.NS{pair.A, pair.B} {
		h := &host{t: t, ns: ns, pair: pair, name: string(rune('a' + i)), dir: t.TempDir(), shmDir: shm}
		h.cgRel = filepath.Join("smcr-e2e-"+id, h.name)
		h.cgDir = filepath.Join(mnt, h.cgRel)
		if err := os.MkdirAll(h.cgDir, 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		h.cgFD, err = os.Open(h.cgDir)
		if err != nil {
			t.Fatal(err)
		}
		h.pinDir = filepath.Join("/sys/fs/bpf", "smcr-e2e-"+id+"-"+h.name)
		t.Cleanup(func() {
			h.stop()
			h.cgFD.Close()
			os.RemoveAll(h.pinDir) // detaches the pinned programs
			os.Remove(h.cgDir)
			os.Remove(filepath.Dir(h.cgDir))
		})
		out[i] = h
	}
	out[0].other, out[1].other = out[1], out[0]
	return out[0], out[1]
}

func randID() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// inCgroup makes cmd start inside the host's cgroup (clone3 CLONE_INTO_CGROUP):
// `ip netns exec` remounts /sys, so the cgroup is joined before that.
func (h *host) inCgroup(cmd *exec.Cmd) *exec.Cmd {
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(h.cgFD.Fd()), Setpgid: true}
	return cmd
}

// start runs smcrd in the host with the given configuration lines added to the
// test defaults, and waits until its control socket answers.
func (h *host) start(conf ...string) {
	h.t.Helper()
	sock := filepath.Join(h.dir, "smcrd.sock")
	lines := append([]string{
		"cgroup = " + h.cgRel,
		"control_socket = " + sock,
		"metrics_address =",
		"log_level = debug",
		"clc_timeout = 2s",
		"peer_cache_ttl = 1m",
	}, conf...)
	// Later lines override earlier ones: keep the last of each attribute.
	seen := map[string]string{}
	var order []string
	for _, l := range lines {
		k, _, _ := strings.Cut(l, "=")
		k = strings.TrimSpace(k)
		if _, ok := seen[k]; !ok {
			order = append(order, k)
		}
		seen[k] = l
	}
	var b strings.Builder
	for _, k := range order {
		b.WriteString(seen[k] + "\n")
	}
	file := filepath.Join(h.dir, "smcrd.conf")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		h.t.Fatal(err)
	}
	// nsenter joins only the network namespace: /sys/fs/bpf and the cgroup mount
	// stay visible, which `ip netns exec` would hide.
	cmd := exec.Command("nsenter", append([]string{"--net=/run/netns/" + h.ns.Name, bins.smcrd, "-config", file,
		"-pin-dir", h.pinDir, "-shm-dir", h.shmDir, "-liveness-ttl", "1s", "-drain-timeout", "5s"}, h.smcrdFlags...)...)
	h.log = &syncWriter{w: &bytes.Buffer{}}
	cmd.Stdout = h.log
	cmd.Stderr = cmd.Stdout
	h.inCgroup(cmd)
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	h.smcrd = cmd
	h.done = make(chan struct{})
	go func() { h.exitErr = cmd.Wait(); close(h.done) }()
	h.ctl = control.NewClient(sock)
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := h.ctl.Status(ctx)
		cancel()
		if err == nil {
			h.checkDevices(seen["providers"], st.Providers)
			return
		}
		select {
		case <-h.done:
			h.t.Fatalf("smcrd on %s exited: %s", h.name, h.logText())
		default:
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("smcrd on %s not answering: %v\n%s", h.name, err, h.logText())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkDevices fails the test when a stand-in provider it configured (shm,
// soft: these open on any host) gave smcrd no device: smcrd would then run
// every connection as plain TCP and a test could pass without SMC-R at all.
func (h *host) checkDevices(line string, inUse []string) {
	h.t.Helper()
	_, val, _ := strings.Cut(line, "=")
	for _, p := range strings.Fields(strings.ReplaceAll(val, ",", " ")) {
		if (p == "shm" || p == "soft") && len(inUse) == 0 {
			h.t.Fatalf("smcrd on %s opened no device for providers %q:\n%s", h.name, strings.TrimSpace(val), h.logText())
		}
	}
}

// stop ends smcrd with SIGTERM (drain) and waits for it.
func (h *host) stop() {
	if h.smcrd == nil {
		return
	}
	h.smcrd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.done:
		// A drain that ends in a panic or an error exit is a failure too.
		if h.exitErr != nil {
			h.t.Errorf("smcrd on %s ended on SIGTERM with %v", h.name, h.exitErr)
		}
	case <-time.After(15 * time.Second):
		h.smcrd.Process.Kill()
		<-h.done
		h.t.Errorf("smcrd on %s did not stop on SIGTERM", h.name)
	}
	h.checkRace()
	if h.t.Failed() {
		h.t.Logf("smcrd %s log:\n%s", h.name, h.logText())
	}
	h.smcrd = nil
	h.ctl.Close()
}

// kill ends smcrd at once, as a crash would.
func (h *host) kill() {
	h.smcrd.Process.Kill()
	<-h.done
	if h.checkRace() {
		h.t.Logf("smcrd %s log:\n%s", h.name, h.logText())
	}
	h.smcrd = nil
}

// checkRace fails the test when the race detector reported in smcrd's log
// (make test-race runs this suite against an smcrd built with -race). A killed
// smcrd is checked too: a restart replaces the log.
func (h *host) checkRace() bool {
	if !strings.Contains(h.logText(), "DATA RACE") {
		return false
	}
	h.t.Errorf("the race detector found a data race in smcrd on %s", h.name)
	return true
}

func (h *host) logText() string {
	w := h.log
	if w == nil {
		return ""
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.String()
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// command is a program run inside the host's namespace and cgroup.
func (h *host) command(name string, args ...string) *exec.Cmd {
	return h.inCgroup(h.ns.Command(name, args...))
}

// serve starts the test application's server on port inside the host.
func (h *host) serve(port int) {
	h.t.Helper()
	h.background(bins.testapp, "-listen", fmt.Sprintf(":%d", port))
	h.waitListening(port)
}

// background starts a long-running program in the host, killed at cleanup.
func (h *host) background(name string, args ...string) *exec.Cmd {
	h.t.Helper()
	cmd := h.command(name, args...)
	var out syncWriter
	out.w = &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	return cmd
}

func (h *host) waitListening(port int) {
	h.t.Helper()
	want := fmt.Sprintf(":%04X ", port)
	for range 200 {
		out, _ := h.ns.Command("cat", "/proc/net/tcp", "/proc/net/tcp6").Output()
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			if len(f) > 3 && strings.HasSuffix(f[1]+" ", want) && f[3] == "0A" {
				return
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	h.t.Fatalf("nothing listens on port %d in %s", port, h.name)
}

// appResult is testapp's client output.
type appResult struct {
	OK, Errors           int
	Bytes                int64
	Seconds              float64
	MBps                 float64
	Peers, Local, Remote []string
	P50us, P99us         float64
	Err                  string
}

// stuckAfter is how long a client runs before the harness logs both smcrds'
// connections and links: well before testapp's own 60 s timeout, so that a
// connection that stopped moving shows its cursors while it is still open.
const stuckAfter = 40 * time.Second

// client runs the test application's client in the host and decodes its result.
func (h *host) client(addr string, args ...string) (appResult, error) {
	cmd := h.command(bins.testapp, append([]string{"-connect", addr}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	// The test and the smcrds to ask are taken here: the test may stop or
	// restart an smcrd while the client runs.
	t, mine, other := h.t, h.snapshotter(), h.other.snapshotter()
	logged := make(chan struct{})
	watch := time.AfterFunc(stuckAfter, func() {
		defer close(logged)
		t.Logf("testapp on %s still running after %v:\n%s%s", h.name, stuckAfter, mine(), other())
	})
	out, err := cmd.Output()
	if !watch.Stop() {
		<-logged // the test must not end while it logs
	}
	var r appResult
	if jerr := json.Unmarshal(out, &r); jerr != nil {
		return r, fmt.Errorf("testapp: %v: %s %s", err, out, stderr.String())
	}
	if err != nil {
		return r, fmt.Errorf("testapp: %v: %s (%s)", err, r.Err, stderr.String())
	}
	return r, nil
}

// snapshotter returns what tells, when called, what smcrd on h says of its
// links and connections, cursors included, for a log; it fails nothing, and
// tells nothing when no smcrd runs on h now.
func (h *host) snapshotter() func() string {
	if h == nil || h.smcrd == nil {
		return func() string { return "" }
	}
	name, ctl := h.name, h.ctl
	return func() string { return snapshot(name, ctl) }
}

func snapshot(name string, ctl *control.Client) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var b strings.Builder
	fmt.Fprintf(&b, "smcrd on %s:\n", name)
	links, err := ctl.Links(ctx)
	if err != nil {
		fmt.Fprintf(&b, "  links: %v\n", err)
	}
	for _, l := range links {
		fmt.Fprintf(&b, "  link %d/%d %s: tx %d B %d WR, rx %d B %d WR, errors %d\n", l.LinkGroup, l.Num, l.State,
			l.TX.Bytes, l.TX.WorkRequests, l.RX.Bytes, l.RX.WorkRequests, l.Errors)
	}
	conns, err := ctl.Conns(ctx)
	if err != nil {
		fmt.Fprintf(&b, "  connections: %v\n", err)
	}
	for _, c := range conns {
		fmt.Fprintf(&b, "  conn %d %s %s %s→%s: tx %d B (prod %v cons %v), rx %d B (prod %v cons %v)\n", c.ID, c.Mode, c.State,
			c.Local, c.Remote, c.TxBytes, c.TxProd, c.TxCons, c.RxBytes, c.RxProd, c.RxCons)
	}
	return b.String()
}

func (h *host) stats() control.Stats {
	h.t.Helper()
	s, err := h.ctl.Stats(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

func (h *host) links() []control.Link {
	h.t.Helper()
	l, err := h.ctl.Links(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	return l
}

func (h *host) conns() []control.Conn {
	h.t.Helper()
	c, err := h.ctl.Conns(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

// recordTB keeps the errors a harness function reports instead of failing the test.
type recordTB struct {
	testing.TB
	errs []string
}

func (r *recordTB) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// errorsOf runs f, a harness function of h, and returns the errors it reported
// instead of failing the test with them.
func (h *host) errorsOf(f func()) []string {
	t := h.t
	rec := &recordTB{TB: t}
	h.t = rec
	defer func() { h.t = t }()
	f()
	return rec.errs
}

// startStandIn starts, in place of smcrd, a script that runs it (the
// harness's own tests).
func (h *host) startStandIn(script string) {
	h.t.Helper()
	path := filepath.Join(h.t.TempDir(), "smcrd")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		h.t.Fatal(err)
	}
	real := bins.smcrd
	bins.smcrd = path
	defer func() { bins.smcrd = real }()
	h.start()
}

// TestStopSeesFailedExit: an smcrd that exits with an error status at SIGTERM
// (a panic in its drain, say) fails the test that stops it. The stand-in runs
// the real smcrd and, at SIGTERM, stops it and exits 3.
func TestStopSeesFailedExit(t *testing.T) {
	a, _ := hosts(t)
	a.startStandIn("#!/bin/bash\n" + bins.smcrd + " \"$@\" &\npid=$!\n" +
		"trap 'kill -TERM $pid; wait $pid; exit 3' TERM\nwait $pid\n")
	if errs := a.errorsOf(a.stop); len(errs) != 1 || !strings.Contains(errs[0], "exit status 3") {
		t.Fatalf("stop reported %q, want the exit status 3", errs)
	}
}

// TestKillSeesRace: a race smcrd reported before it was killed fails the test
// (TestKill's transfers run against a race-built smcrd in make test-race, and
// the restart that follows a kill replaces the log). The stand-in prints the
// race detector's header, then runs the real smcrd.
func TestKillSeesRace(t *testing.T) {
	a, _ := hosts(t)
	a.startStandIn("#!/bin/sh\necho 'WARNING: DATA RACE' >&2\nexec " + bins.smcrd + " \"$@\"\n")
	if errs := a.errorsOf(a.kill); len(errs) != 1 || !strings.Contains(errs[0], "data race") {
		t.Fatalf("kill reported %q, want the data race", errs)
	}
}
