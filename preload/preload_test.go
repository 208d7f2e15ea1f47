package preload

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// lib is the library built once for the package's tests, and the directory
// of the compiled test programs.
var (
	buildOnce sync.Once
	buildErr  error
	buildDir  string
)

func build(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc is missing: the library and its test programs are C")
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "smcr-preload-test")
		if buildErr != nil {
			return
		}
		out, err := exec.Command("make", "-s", "-C", ".", "BIN="+buildDir, "all", "ubsan", "asan").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("make: %v\n%s", err, out)
			return
		}
		for _, p := range []string{"ready", "echo", "prefix", "reset", "fork", "forkwait", "multi", "exec", "abort", "sndtimeo", "passfd", "uring", "vfork", "oob", "oobfull", "epollfds", "epollwake", "spawn", "sharedrelease", "ready-fortify"} {
			src, flags := p, []string{}
			if p == "ready-fortify" { // the _chk entry points (__poll_chk, __read_chk, ...)
				src, flags = "ready", []string{"-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=2"}
			}
			args := append([]string{"-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O2", "-pthread"}, flags...)
			args = append(args, "-o", filepath.Join(buildDir, p), filepath.Join("testdata", src+".c"))
			out, err := exec.Command("gcc", args...).CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("gcc %s: %v\n%s", p, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

func TestMain(m *testing.M) {
	if path := os.Getenv("SMCR_PRELOAD_TEST_SMCRD"); path != "" {
		helperSmcrd(path) // a fake smcrd in a process of its own, to be killed
		return
	}
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// mode is how a test program runs: without the library, or with it (and
// which smcrd it finds).
type mode struct {
	name   string
	lib    string // "", "libsmcr-preload.so" or a sanitizer variant
	socket string // SMCR_DIRECT_SOCKET
	env    []string
}

// run runs a test program; it returns stdout and stderr.
func run(t *testing.T, m mode, prog string, args ...string) (string, string, error) {
	t.Helper()
	dir := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, prog), args...)
	cmd.Env = append(os.Environ(), m.env...)
	if m.lib != "" {
		preload := filepath.Join(dir, m.lib)
		if strings.Contains(m.lib, "asan") {
			// ASan's runtime must come first; the test programs' own
			// leaks (never-closed epoll sets) are not the library's.
			out, err := exec.Command("gcc", "-print-file-name=libasan.so").Output()
			if err != nil {
				t.Skipf("no libasan: %v", err)
			}
			preload = strings.TrimSpace(string(out)) + ":" + preload
			cmd.Env = append(cmd.Env, "ASAN_OPTIONS=detect_leaks=0")
		}
		cmd.Env = append(cmd.Env, "LD_PRELOAD="+preload)
	}
	sock := m.socket
	if sock == "" {
		sock = filepath.Join(t.TempDir(), "no-smcrd.sock")
	}
	cmd.Env = append(cmd.Env, "SMCR_DIRECT_SOCKET="+sock)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// closedPort is a loopback port nothing listens on: a socket bound to it
// without listening holds it for the test, so that no connect takes it as
// its own ephemeral port (a connect to itself would succeed).
func closedPort(t *testing.T) string {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(sa.(*unix.SockaddrInet4).Port)
}

// kernelTranscript is ready's transcript on plain kernel sockets.
func kernelTranscript(t *testing.T, refused string) string {
	out, errOut, err := run(t, mode{name: "kernel"}, "ready", refused)
	if err != nil {
		t.Fatalf("ready without the library: %v\n%s%s", err, out, errOut)
	}
	return out
}

// compareReady runs ready (and its _FORTIFY_SOURCE build) under m and compares
// its transcript with the kernel's.
func compareReady(t *testing.T, m mode, wantAccel bool) {
	t.Helper()
	compareReadyProg(t, m, wantAccel, "ready")
	compareReadyProg(t, m, wantAccel, "ready-fortify")
}

func compareReadyProg(t *testing.T, m mode, wantAccel bool, prog string) {
	t.Helper()
	refused := closedPort(t)
	want := kernelTranscript(t, refused)
	got, errOut, err := run(t, m, prog, refused)
	if err != nil {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", prog, m.name, err, got, errOut)
	}
	if got != want {
		t.Errorf("%s %s: transcript differs from the kernel's\n%s", prog, m.name, diff(want, got))
	}
	for _, who := range []string{"client", "server"} {
		accel := strings.Contains(errOut, who+" accel=1")
		if accel != wantAccel {
			t.Errorf("%s %s: %s accelerated %v, want %v (stderr: %q)", prog, m.name, who, accel, wantAccel, errOut)
		}
	}
}

func diff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		mark := " "
		if wl != gl {
			mark = "!"
		}
		fmt.Fprintf(&b, "%s kernel: %s\n%s lib:    %s\n", mark, wl, mark, gl)
	}
	return b.String()
}

var echoCases = [][]string{
	{"block", "none"},
	{"block", "poll"},
	{"block", "epoll"},
	{"block", "select"},
	{"block", "sendfile"},
	{"block", "splice"},
	{"nonblock", "none"},
	{"nonblock", "poll"},
	{"nonblock", "epoll"},
	{"nonblock", "epoll-early"},
	{"nonblock", "select"},
}

// echoAll runs the echo matrix under m, sizes small and large.
func echoAll(t *testing.T, m mode, wantAccel bool) {
	t.Helper()
	for _, c := range echoCases {
		for _, size := range []string{"1", "3000000"} {
			out, errOut, err := run(t, m, "echo", c[0], c[1], size)
			if err != nil {
				t.Errorf("echo %s %v %s: %v\nstdout: %s\nstderr: %s", m.name, c, size, err, out, errOut)
				continue
			}
			if c[0] == "block" && strings.Contains(errOut, "client accel=1") != wantAccel {
				t.Errorf("echo %s %v: client accelerated %v, want %v", m.name, c, !wantAccel, wantAccel)
			}
		}
	}
}

// TestPassThrough: without smcrd the library changes nothing a program sees.
func TestPassThrough(t *testing.T) {
	for _, m := range []mode{
		{name: "no-smcrd", lib: "libsmcr-preload.so"},
		{name: "no-smcrd-ubsan", lib: "libsmcr-preload-ubsan.so"},
		{name: "no-smcrd-asan", lib: "libsmcr-preload-asan.so"},
		{name: "disabled", lib: "libsmcr-preload.so", env: []string{"SMCR_DIRECT=0"}},
	} {
		t.Run(m.name, func(t *testing.T) {
			compareReady(t, m, false)
			echoAll(t, m, false)
		})
	}
}
