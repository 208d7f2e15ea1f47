// Tests of smcrd as a process: this test binary, started again with asSmcrd set,
// runs smcrd's main in host A of a namespace pair, in a cgroup that holds the
// test process too, so the test's connections from A are redirected through it.

package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/internal/nstest"
	"golang.org/x/sys/unix"
)

// asSmcrd makes the test binary run smcrd's main with its arguments.
const asSmcrd = "SMCRD_TEST_AS_SMCRD"

func TestMain(m *testing.M) {
	if os.Getenv(asSmcrd) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// testHost is host A of a namespace pair with a cgroup that holds the test
// process and the smcrds it starts, and a pin directory of its own.
type testHost struct {
	t      *testing.T
	pair   *nstest.Pair
	cgRel  string
	cgFD   *os.File
	pinDir string
	dir    string
	conf   []string // configuration lines start adds to its own
}

func newTestHost(t *testing.T) *testHost {
	t.Helper()
	if testing.Short() {
		t.Skip("runs smcrd with BPF in namespaces; skipped with -short")
	}
	nstest.Require(t)
	mnt := nstest.Cgroup2(t)
	var b [4]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	h := &testHost{t: t, pair: nstest.NewPair(t), dir: t.TempDir()}
	h.cgRel = "smcrd-test-" + id
	cgDir := filepath.Join(mnt, h.cgRel)
	if err := os.Mkdir(cgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The test's own connections must pass the cgroup's programs.
	orig := ""
	self, _ := os.ReadFile("/proc/self/cgroup")
	for line := range strings.SplitSeq(string(self), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			orig = p
		}
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(cgDir, "cgroup.procs"), pid, 0); err != nil {
		os.Remove(cgDir)
		t.Fatal(err)
	}
	var err error
	if h.cgFD, err = os.Open(cgDir); err != nil {
		t.Fatal(err)
	}
	h.pinDir = "/sys/fs/bpf/smcrd-test-" + id
	t.Cleanup(func() {
		os.WriteFile(filepath.Join(mnt, orig, "cgroup.procs"), pid, 0)
		h.cgFD.Close()
		os.RemoveAll(h.pinDir) // detaches the pinned programs
		os.Remove(cgDir)
	})
	return h
}

// smcrd is one smcrd process.
type smcrd struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	ctl  *control.Client
}

// start runs smcrd in host A with flags after the test's own; its control socket
// is sock. It does not wait for smcrd to serve.
func (h *testHost) start(sock string, flags ...string) *smcrd {
	h.t.Helper()
	conf := filepath.Join(h.dir, "smcrd-"+strconv.Itoa(int(time.Now().UnixNano()))+".conf")
	lines := []string{
		"cgroup = " + h.cgRel,
		"control_socket = " + sock,
		"metrics_address =",
		"log_level = debug",
	}
	if !slices.ContainsFunc(h.conf, func(l string) bool { return strings.HasPrefix(l, "providers") }) {
		lines = append(lines, "providers = shm")
	}
	// h.conf's lines replace the defaults above that set the same attribute.
	lines = slices.DeleteFunc(lines, func(l string) bool {
		name, _, _ := strings.Cut(l, "=")
		return slices.ContainsFunc(h.conf, func(c string) bool {
			n, _, _ := strings.Cut(c, "=")
			return strings.TrimSpace(n) == strings.TrimSpace(name)
		})
	})
	lines = append(lines, h.conf...)
	if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		h.t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		h.t.Fatal(err)
	}
	args := append([]string{"--net=/run/netns/" + h.pair.A.Name, exe, "-config", conf,
		"-pin-dir", h.pinDir, "-shm-dir", h.dir, "-liveness-ttl", "1s"}, flags...)
	s := &smcrd{cmd: exec.Command("nsenter", args...), out: &syncBuffer{}, done: make(chan struct{})}
	s.cmd.Env = append(os.Environ(), asSmcrd+"=1")
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	s.cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(h.cgFD.Fd())}
	if err := s.cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	s.ctl = control.NewClient(sock)
	h.t.Cleanup(func() {
		s.cmd.Process.Kill()
		<-s.done
		s.ctl.Close()
		if h.t.Failed() {
			h.t.Logf("smcrd pid %d:\n%s", s.cmd.Process.Pid, s.out.String())
		}
	})
	return s
}

// serving waits until s answers on its control socket.
func (s *smcrd) serving(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := s.ctl.Status(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-s.done:
			t.Fatalf("smcrd exited: %s", s.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("smcrd not answering: %v\n%s", err, s.out.String())
		}
		time.Sleep(time.Millisecond) // the first answer: TestStatusAnswersOnceServing
	}
}

// exit waits up to d for s to exit and returns its exit code.
func (s *smcrd) exit(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-s.done:
		return s.cmd.ProcessState.ExitCode()
	case <-time.After(d):
		t.Fatalf("smcrd still running after %v:\n%s", d, s.out.String())
		return -1
	}
}

// waitLog waits until s has logged want.
func (s *smcrd) waitLog(t *testing.T, want string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(s.out.String(), want); {
		if time.Now().After(deadline) {
			t.Fatalf("smcrd did not log %q:\n%s", want, s.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// echoServer serves an echo on ln (in host B) until the test ends.
func echoServer(t *testing.T, ln net.Listener) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
}

// dialFromA connects from host A (through smcrd when it redirects).
func (h *testHost) dialFromA(addr string) (net.Conn, error) {
	var c net.Conn
	err := h.pair.A.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	})
	return c, err
}

// echoes checks that c carries a message there and back.
func echoes(c net.Conn, msg string) error {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if string(got) != msg {
		return fmt.Errorf("read %q, want %q", got, msg)
	}
	return nil
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSecondSmcrdRefused: a second smcrd on the same pin directory stops before
// touching the programs' state and names the first; the first keeps
// redirecting. Before, the second pointed the redirect address at its own
// listeners and exited on the control socket, and every redirected connect()
// was refused until the first restarted.
func TestSecondSmcrdRefused(t *testing.T) {
	h := newTestHost(t)
	ln, err := h.pair.B.Listen("tcp", ":5201")
	if err != nil {
		t.Fatal(err)
	}
	echoServer(t, ln)
	sock := filepath.Join(h.dir, "smcrd.sock")
	first := h.start(sock)
	first.serving(t)

	second := h.start(sock)
	if code := second.exit(t, 15*time.Second); code != 1 {
		t.Fatalf("second smcrd exited %d, want 1:\n%s", code, second.out.String())
	}
	want := fmt.Sprintf("another smcrd holds %s (pid %d)", h.pinDir, first.cmd.Process.Pid)
	if out := second.out.String(); !strings.Contains(out, want) {
		t.Errorf("second smcrd's output does not say %q:\n%s", want, out)
	}
	// Past the first's next heartbeat (liveness 1s: every 333ms), which would
	// have made the programs redirect again to wherever smcr_config points.
	time.Sleep(500 * time.Millisecond)

	c, err := h.dialFromA(fmt.Sprintf("%s:5201", h.pair.B.Addr4()))
	if err != nil {
		t.Fatalf("connect after the second smcrd: %v", err)
	}
	defer c.Close()
	if err := echoes(c, "still through the first"); err != nil {
		t.Fatalf("after the second smcrd: %v", err)
	}
	st, err := first.ctl.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Connections.Handled != 1 {
		t.Errorf("the first smcrd handled %d connections, want 1 (redirected)", st.Connections.Handled)
	}
}

// TestUnknownControlGroupTouchesNoBPF pins that smcrd with an unknown
// control_group exits 1 before it loads or pins anything: the pin directory is
// not even made.
func TestUnknownControlGroupTouchesNoBPF(t *testing.T) {
	h := newTestHost(t)
	h.conf = []string{"control_group = no-such-group"}
	s := h.start(filepath.Join(h.dir, "smcrd.sock"))
	if code := s.exit(t, 15*time.Second); code != 1 {
		t.Fatalf("smcrd exited %d, want 1:\n%s", code, s.out.String())
	}
	if out := s.out.String(); !strings.Contains(out, `group \"no-such-group\"`) {
		t.Errorf("smcrd's output does not name the group:\n%s", out)
	}
	if _, err := os.Stat(h.pinDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("smcrd made %s before it failed on control_group (stat: %v)", h.pinDir, err)
	}
}

// TestMetricsAddressTaken: an smcrd that cannot open its metrics listener
// does not start, names the file and line that set it, and leaves nothing
// behind. It ran on without metrics, with a warning only.
func TestMetricsAddressTaken(t *testing.T) {
	h := newTestHost(t)
	ln, err := h.pair.A.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	h.conf = []string{"metrics_address = " + ln.Addr().String()}
	sock := filepath.Join(h.dir, "smcrd.sock")
	s := h.start(sock)
	if code := s.exit(t, 15*time.Second); code != 1 {
		t.Fatalf("smcrd exited %d, want 1:\n%s", code, s.out.String())
	}
	if out := s.out.String(); !regexp.MustCompile(`\.conf:5: metrics_address: .*address already in use`).MatchString(out) {
		t.Errorf("smcrd's output does not name the line of metrics_address and the error:\n%s", out)
	}
	if _, err := os.Stat(sock); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("smcrd left its control socket behind (stat: %v)", err)
	}
}

// fullListener listens on port in ns with a backlog of 0 and fills it with one
// connection that waits to be accepted: the next SYNs are dropped until it is
// (the client retransmits its SYN a second later). Both close as the test ends.
func fullListener(t *testing.T, ns *nstest.NS, port int) net.Listener {
	t.Helper()
	var ln net.Listener
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), "listener")
		defer f.Close()
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port}); err != nil {
			return err
		}
		if err := unix.Listen(fd, 0); err != nil {
			return err
		}
		ln, err = net.FileListener(f)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	filler, err := ns.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { filler.Close() })
	return ln
}

// TestSIGTERMFinishesSetup: a connection smcrd accepted and is still setting up
// when SIGTERM comes is set up and carried, not reset. Its peer's backlog is
// full, so smcrd's connect to it waits for a SYN retransmission across the
// SIGTERM. Before, shutdown cancelled the connect and the application, whose
// connect() had succeeded, got a reset.
func TestSIGTERMFinishesSetup(t *testing.T) {
	h := newTestHost(t)
	ln := fullListener(t, h.pair.B, 5202)
	s := h.start(filepath.Join(h.dir, "smcrd.sock"))
	s.serving(t)

	app, err := h.dialFromA(fmt.Sprintf("%s:5202", h.pair.B.Addr4()))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	time.Sleep(300 * time.Millisecond) // smcrd's SYN is dropped; the next comes at 1s
	s.cmd.Process.Signal(syscall.SIGTERM)
	s.waitLog(t, "shutting down")
	time.Sleep(100 * time.Millisecond)
	// Room in the backlog for smcrd's retransmitted SYN.
	echoServer(t, ln)

	if err := echoes(app, "set up across SIGTERM"); err != nil {
		t.Fatalf("connection in setup at SIGTERM: %v", err)
	}
	app.Close()
	if code := s.exit(t, 10*time.Second); code != 0 {
		t.Fatalf("smcrd exited %d", code)
	}
	if out := s.out.String(); strings.Contains(out, "drain timed out") {
		t.Errorf("the drain timed out:\n%s", out)
	}
}

// TestSecondSignalStops: a second SIGTERM during the drain stops smcrd at once,
// aborting the connections still open. Before, it was ignored until the drain
// timed out.
func TestSecondSignalStops(t *testing.T) {
	h := newTestHost(t)
	ln, err := h.pair.B.Listen("tcp", ":5203")
	if err != nil {
		t.Fatal(err)
	}
	echoServer(t, ln)
	s := h.start(filepath.Join(h.dir, "smcrd.sock"), "-drain-timeout", "1m")
	s.serving(t)
	app, err := h.dialFromA(fmt.Sprintf("%s:5203", h.pair.B.Addr4()))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	if err := echoes(app, "established"); err != nil {
		t.Fatal(err)
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	s.waitLog(t, "shutting down")
	time.Sleep(300 * time.Millisecond) // into the drain, past the listeners' quiet time
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	st, err := s.ctl.Status(ctx)
	cancel()
	if err != nil || st.State != control.StateDraining {
		t.Errorf("status during the drain: state %q, %v; want %q", st.State, err, control.StateDraining)
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	if code := s.exit(t, 5*time.Second); code != 0 {
		t.Errorf("smcrd exited %d after a second SIGTERM, want 0", code)
	}
	if out := s.out.String(); !strings.Contains(out, "second signal: stopping at once") || !strings.Contains(out, "drain cut short") {
		t.Errorf("smcrd did not log the second signal and the abort:\n%s", out)
	}
	// The connection held open is aborted, not left to hang.
	app.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := app.Read(make([]byte, 1)); err == nil || os.IsTimeout(err) {
		t.Errorf("connection after the abort: read %v, want it ended", err)
	}
}

// TestStatusAnswersOnceServing: the control socket answers only once smcrd
// serves, so a script that waits for `smcrctl status` and then starts its
// applications finds their connections redirected. Before, it answered from
// before the programs' liveness was set, and a connection made then went
// direct (TestSIGTERMFinishesSetup failed on it under load).
func TestStatusAnswersOnceServing(t *testing.T) {
	h := newTestHost(t)
	// The server's backlog is full: a connection that goes direct gets no
	// answer to its SYN, one redirected to smcrd is connected at once.
	fullListener(t, h.pair.B, 5204)
	s := h.start(filepath.Join(h.dir, "smcrd.sock"))
	s.serving(t)
	c, err := h.dialFromA(fmt.Sprintf("%s:5204", h.pair.B.Addr4()))
	if err != nil {
		t.Fatalf("a connection made once status answered was not redirected to smcrd: %v", err)
	}
	c.Close()
}

// TestNoIPv4Loopback: on a host whose loopback lost 127.0.0.1 smcrd still
// serves and says that IPv4 connections are not accelerated (neither program
// can send them to its IPv6 listeners, on ::1), and they go direct.
func TestNoIPv4Loopback(t *testing.T) {
	h := newTestHost(t)
	if out, err := h.pair.A.Command("ip", "addr", "del", "127.0.0.1/8", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("ip addr del: %v: %s", err, out)
	}
	s := h.goesDirect(t)
	s.waitLog(t, "IPv4 connections are not accelerated")
}

// TestUnreachableGoesDirect: an application connecting to a port where nothing
// listens is reset by smcrd the first time (its connection to smcrd was made
// before smcrd could know), and refused by the kernel from then on, as without
// smcrd; once the server is up the next connection goes through smcrd again.
func TestUnreachableGoesDirect(t *testing.T) {
	h := newTestHost(t)
	s := h.start(filepath.Join(h.dir, "smcrd.sock"))
	s.serving(t)
	dst := fmt.Sprintf("%s:5206", h.pair.B.Addr4())
	listed := func() bool { // by smcrctl peers, as unreachable
		ps, err := s.ctl.Peers(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(ps, func(p control.Peer) bool {
			return p.Addr == h.pair.B.Addr4().String() && p.Port == 5206 && p.ExpiresInSeconds > 0
		})
	}
	reset := func(what string) {
		t.Helper()
		// smcrd's reset may come before the connect reports done.
		c, err := h.dialFromA(dst)
		if err == nil {
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err = c.Read(make([]byte, 1))
		}
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%s connection to %s: %v, want smcrd's reset", what, dst, err)
		}
		for deadline := time.Now().Add(5 * time.Second); !listed(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after the %s connection, smcrctl peers does not list %s as unreachable", what, dst)
			}
		}
	}
	reset("first")
	s.waitLog(t, "destination unreachable")
	if _, err := h.dialFromA(dst); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("second connect to %s: %v, want the kernel's refusal", dst, err)
	}
	// Forgotten, the destination is tried through smcrd again.
	if n, err := s.ctl.ForgetPeers(context.Background(), h.pair.B.Addr4().String()); err != nil || n != 1 || listed() {
		t.Fatalf("forget %s: %d, %v; still listed %v", h.pair.B.Addr4(), n, err, listed())
	}
	reset("third")

	handled := func() uint64 {
		st, err := s.ctl.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return st.Connections.Handled
	}
	before := handled()
	ln, err := h.pair.B.Listen("tcp", ":5206")
	if err != nil {
		t.Fatal(err)
	}
	echoServer(t, ln)
	for i, via := range []string{"direct", "through smcrd"} {
		c, err := h.dialFromA(dst)
		if err != nil {
			t.Fatal(err)
		}
		if err := echoes(c, via); err != nil {
			t.Fatal(err)
		}
		c.Close()
		if got := handled() - before; got != uint64(i) {
			t.Errorf("connection %d (%s): smcrd handled %d since the server came up, want %d", i, via, got, i)
		}
	}
	// The programs counted it all (smcrctl stats -d), and a reset zeroes
	// their counters as it does smcrd's.
	st, err := s.ctl.ResetStats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if p := st.Programs; p["redirected"] != 3 || p["skip_unreachable"] != 2 {
		t.Errorf("programs' counters %v: want 3 redirected, 2 left direct as unreachable", p)
	}
	if st, err = s.ctl.Stats(context.Background()); err != nil || st.Programs["redirected"] != 0 || st.Programs["skip_unreachable"] != 0 {
		t.Errorf("after a reset, programs' counters %v, %v: want 0", st.Programs, err)
	}
	// So does a restart, though the counters stay pinned with the programs;
	// and the control server answers while smcrd shuts down (the loader
	// refuses reads once closing: go test -race ran them into each other).
	stop := make(chan struct{})
	go func() {
		defer close(stop)
		for {
			select {
			case <-s.done:
				return
			default:
				s.ctl.Stats(context.Background())
			}
		}
	}()
	s.cmd.Process.Signal(syscall.SIGTERM)
	if code := s.exit(t, 10*time.Second); code != 0 {
		t.Errorf("smcrd exited %d on SIGTERM", code)
	}
	<-stop
	s = h.start(filepath.Join(h.dir, "smcrd2.sock"))
	s.serving(t)
	if c, err := h.dialFromA(dst); err != nil || echoes(c, "after the restart") != nil {
		t.Fatalf("after the restart: %v", err)
	} else {
		c.Close()
	}
	// B runs no smcrd: the connection through smcrd above put it in the
	// negative cache, which is pinned too, so this one went direct.
	if st, err = s.ctl.Stats(context.Background()); err != nil || st.Programs["redirected"] != 0 || st.Programs["skip_negative"] != 1 {
		t.Errorf("after a restart and one connection, programs' counters %v, %v: want 1 left direct for the negative cache, none redirected", st.Programs, err)
	}
}

// TestApplicationPortTaken: smcrd connects from the port the application sees
// as its own; where that port is taken on the interface's address (here by
// direct connections holding every ephemeral port), from another port.
func TestApplicationPortTaken(t *testing.T) {
	h := newTestHost(t)
	for _, port := range []string{":80", ":5201"} { // 80: not a listed port
		ln, err := h.pair.B.Listen("tcp", port)
		if err != nil {
			t.Fatal(err)
		}
		echoServer(t, ln)
	}
	s := h.start(filepath.Join(h.dir, "smcrd.sock"))
	s.serving(t)
	// After smcrd bound its listeners: connect() skips the ports bind() took.
	if err := h.pair.A.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("40000 40001"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // 198.18.0.1:40000 and :40001, direct
		c, err := h.dialFromA(fmt.Sprintf("%s:80", h.pair.B.Addr4()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	c, err := h.dialFromA(fmt.Sprintf("%s:5201", h.pair.B.Addr4()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echoes(c, "through smcrd from another port"); err != nil {
		t.Fatal(err)
	}
	st, err := s.ctl.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Connections.Handled != 1 {
		t.Errorf("smcrd handled %d connections, want 1", st.Connections.Handled)
	}
	s.waitLog(t, "connect from the application's port")
}

// TestApplicationPortShared: the application's port, taken on the
// interface's address by a connection that allows sharing it (SO_REUSEADDR,
// as smcrd's own connections to local servers have), is still the port smcrd
// connects from: the server sees the port the client's application sees.
// Without SO_REUSEADDR on smcrd's socket, bind refused it.
func TestApplicationPortShared(t *testing.T) {
	h := newTestHost(t)
	direct, err := h.pair.B.Listen("tcp", ":80") // not a listed port
	if err != nil {
		t.Fatal(err)
	}
	echoServer(t, direct)
	ln, err := h.pair.B.Listen("tcp", ":5201")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	seen := make(chan netip.AddrPort, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		ap := c.RemoteAddr().(*net.TCPAddr).AddrPort()
		seen <- netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		io.Copy(c, c)
	}()
	s := h.start(filepath.Join(h.dir, "smcrd.sock"))
	s.serving(t)
	if err := h.pair.A.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("40000 40000"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	var held net.Conn
	if err := h.pair.A.Do(func() error { // 198.18.0.1:40000, direct, shareable
		d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
			return serr
		}}
		var err error
		held, err = d.Dial("tcp", fmt.Sprintf("%s:80", h.pair.B.Addr4()))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	c, err := h.dialFromA(fmt.Sprintf("%s:5201", h.pair.B.Addr4()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echoes(c, "through smcrd from the application's port"); err != nil {
		t.Fatal(err)
	}
	app := c.LocalAddr().(*net.TCPAddr).AddrPort() // as the programs show it
	select {
	case got := <-seen:
		if got != app {
			t.Errorf("the server sees %v, the client's application %v", got, app)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server accepted nothing")
	}
	if strings.Contains(s.out.String(), "connect from the application's port") {
		t.Errorf("smcrd could not bind the application's port:\n%s", s.out.String())
	}
}

// TestControlSocketFailureReleases: smcrd that cannot open its control socket
// after it set up exits 1 and releases what it set up; its shm rendezvous
// socket is not left behind. Before, each such start left one in the shm
// directory.
func TestControlSocketFailureReleases(t *testing.T) {
	h := newTestHost(t)
	sock := filepath.Join(h.dir, "control")
	if err := os.WriteFile(sock, nil, 0o644); err != nil { // not a socket: refused
		t.Fatal(err)
	}
	s := h.start(sock)
	if code := s.exit(t, 15*time.Second); code != 1 {
		t.Fatalf("smcrd exited %d, want 1:\n%s", code, s.out.String())
	}
	if out := s.out.String(); !strings.Contains(out, "is not a socket") {
		t.Fatalf("smcrd did not fail on the control socket:\n%s", out)
	}
	left, _ := filepath.Glob(filepath.Join(h.dir, "*.sock"))
	if len(left) > 0 {
		t.Errorf("smcrd left %v behind", left)
	}
}

// TestNoDeviceGoesDirect: an smcrd whose providers opened no device redirects
// nothing. Each connection it carried would fall back to TCP through its relay,
// at a third of TCP's throughput, for nothing: connections go direct, as
// without smcrd, and smcrd says why.
func TestNoDeviceGoesDirect(t *testing.T) {
	h := newTestHost(t)
	h.conf = []string{"providers = rdma"} // this test's smcrd is built without the ibv tag
	s := h.goesDirect(t)
	s.waitLog(t, "smcrd serving with no device")
}

// goesDirect starts smcrd in A and checks that an IPv4 connection from A to an
// echo server in B works and that smcrd did not handle it. It returns smcrd.
func (h *testHost) goesDirect(t *testing.T) *smcrd {
	t.Helper()
	ln, err := h.pair.B.Listen("tcp", ":5201")
	if err != nil {
		t.Fatal(err)
	}
	echoServer(t, ln)
	s := h.start(filepath.Join(h.dir, "smcrd.sock"))
	s.serving(t)
	c, err := h.dialFromA(fmt.Sprintf("%s:5201", h.pair.B.Addr4()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echoes(c, "direct"); err != nil {
		t.Fatal(err)
	}
	if got := c.RemoteAddr().String(); got != fmt.Sprintf("%s:5201", h.pair.B.Addr4()) {
		t.Errorf("connected to %s", got)
	}
	st, err := s.ctl.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Connections.Handled != 0 {
		t.Errorf("smcrd handled %d connections, want 0 (direct)", st.Connections.Handled)
	}
	return s
}
