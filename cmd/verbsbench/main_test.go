// Tests of the bench command: the built binary as server and client in two network
// namespaces (so the cross-process path never rots), the rdma refusal without the
// ibv tag, and that verbstest's ping-pong allocates nothing per round trip.

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"go/build"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/smcr-io/smcr/internal/nstest"
	"github.com/smcr-io/smcr/internal/race"
	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/verbstest"
)

// buildCommand compiles this command into a temporary directory.
func buildCommand(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(build.Default.GOROOT, "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "verbsbench")
	out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestTwoNamespaces runs the command as server in namespace B and client in A for
// shm and soft, with tiny sizes, and checks every figure parses and is positive.
func TestTwoNamespaces(t *testing.T) {
	p := nstest.NewPair(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatalf("iproute2's ip runs commands in network namespaces: run scripts/deps.sh (%v)", err)
	}
	bin := buildCommand(t)
	for i, provider := range []string{"shm", "soft"} {
		t.Run(provider, func(t *testing.T) {
			addr := netip.AddrPortFrom(p.B.Addr4(), uint16(7471+i)).String()
			dir := t.TempDir() // both namespaces see it: they share the mount namespace
			common := []string{"-provider", provider, "-addr", addr, "-shm-dir", dir}
			server := p.B.Command(bin, append([]string{"-role", "server", "-once"}, common...)...)
			var serverErr strings.Builder
			server.Stderr = &serverErr
			stdout, err := server.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := server.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				server.Process.Kill()
				server.Wait()
			})
			sc := bufio.NewScanner(stdout)
			if !sc.Scan() || !strings.HasPrefix(sc.Text(), "listening on") {
				t.Fatalf("server did not start: %q %v; stderr: %s", sc.Text(), sc.Err(), serverErr.String())
			}
			go io.Copy(io.Discard, stdout)

			client := p.A.Command(bin, append([]string{"-role", "client", "-baseline",
				"-sizes", "4KiB,64KiB", "-bytes", "1MiB", "-pings", "50", "-runs", "3"}, common...)...)
			out, err := runWithin(client, time.Minute)
			if err != nil {
				t.Fatalf("client: %v\n%s\nserver: %s", err, out, serverErr.String())
			}
			checkReport(t, string(out))
			waited := make(chan error, 1)
			go func() { waited <- server.Wait() }()
			select {
			case err := <-waited:
				if err != nil {
					t.Fatalf("server (-once) exited with %v: %s", err, serverErr.String())
				}
			case <-time.After(10 * time.Second):
				t.Fatal("server (-once) still running after its client finished")
			}
		})
	}
}

// TestMissingIPFails: scripts/deps.sh installs iproute2, so without ip the
// cross-process test must fail, not skip.
func TestMissingIPFails(t *testing.T) {
	nstest.Require(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestTwoNamespaces$", "-test.v")
	cmd.Env = append(os.Environ(), "PATH="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "scripts/deps.sh") {
		t.Fatalf("without ip: err %v, want a failure naming scripts/deps.sh:\n%s", err, out)
	}
}

// runWithin runs cmd, killing it after d, and returns its combined output.
func runWithin(cmd *exec.Cmd, d time.Duration) ([]byte, error) {
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	timer := time.AfterFunc(d, func() { cmd.Process.Kill() })
	defer timer.Stop()
	err := cmd.Wait()
	return []byte(out.String()), err
}

// checkReport parses the client's table and ratios.
func checkReport(t *testing.T, out string) {
	t.Helper()
	want := []string{
		"memcpy/4KiB", "write/4KiB", "tcp/4KiB", "memcpy/64KiB", "write/64KiB", "tcp/64KiB",
		"send-pingpong/64B/busy/p50", "send-pingpong/64B/busy/p99",
		"send-pingpong/64B/wait/p50", "send-pingpong/64B/wait/p99",
		"tcp-pingpong/64B/p50", "tcp-pingpong/64B/p99",
	}
	got := map[string]bool{}
	ratios := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "#") || len(f) > 0 && f[0] == "benchmark":
		case len(f) > 1 && strings.HasSuffix(f[0], ":"):
			ratios++
		case len(f) == 5:
			var v [3]float64
			for i := range v {
				x, err := strconv.ParseFloat(f[1+i], 64)
				if err != nil || x <= 0 {
					t.Errorf("%s: figure %q is not a positive number", f[0], f[1+i])
				}
				v[i] = x
			}
			if v[1] > v[0] || v[0] > v[2] {
				t.Errorf("%s: median %v outside min %v .. max %v", f[0], v[0], v[1], v[2])
			}
			if unit := f[4]; unit != "MB/s" && unit != "µs" {
				t.Errorf("%s: unit %q", f[0], unit)
			}
			got[f[0]] = true
		default:
			t.Errorf("unexpected line %q", line)
		}
	}
	for _, name := range want {
		if !got[name] {
			t.Errorf("no figure %s", name)
		}
	}
	// Two sizes and four ping-pong percentiles, each compared with its baseline.
	if ratios != 6 {
		t.Errorf("%d ratio lines, want 6", ratios)
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}

func TestRDMANeedsTag(t *testing.T) {
	if ibvBuilt {
		t.Skip("built with -tags ibv: rdma is available")
	}
	err := run(options{provider: "rdma", role: "client", addr: "127.0.0.1:1"}, io.Discard)
	if !errors.Is(err, verbs.ErrUnsupported) || !strings.Contains(err.Error(), "-tags ibv") {
		t.Fatalf("run -provider rdma without the tag: %v; want ErrUnsupported naming -tags ibv", err)
	}
}

// TestPingPongAllocations checks that verbstest's ping-pong and echo allocate a
// constant per call, not per round trip (the shm provider allocates nothing).
func TestPingPongAllocations(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates: counts do not hold")
	}
	const rounds, calls = 200, 5
	for _, busy := range []bool{true, false} {
		t.Run(fmt.Sprintf("busy=%v", busy), func(t *testing.T) {
			o := options{provider: "shm", shmDir: t.TempDir()}
			a, b := shmEnd(t, o), shmEnd(t, o)
			var wg sync.WaitGroup
			wg.Add(1)
			var errB error
			go func() { defer wg.Done(); errB = b.connect(a.qp.Attr()) }()
			if err := a.connect(b.qp.Attr()); err != nil {
				t.Fatal(err)
			}
			if wg.Wait(); errB != nil {
				t.Fatal(errB)
			}
			echo, pingPong := verbstest.Echo, verbstest.PingPong
			if busy {
				echo, pingPong = verbstest.BusyEcho, verbstest.BusyPingPong
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			echoed := make(chan error, 1)
			// AllocsPerRun calls the function once more to warm up.
			go func() { echoed <- echo(ctx, b.qp, b.scq, b.rcq, b.mr, verbstest.PingPongSize, (calls+1)*rounds) }()
			var err error
			allocs := testing.AllocsPerRun(calls, func() {
				if err == nil {
					_, err = pingPong(a.qp, a.scq, a.rcq, a.mr, verbstest.PingPongSize, rounds)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := <-echoed; err != nil {
				t.Fatal(err)
			}
			// Per call: the result slice, the work requests and the completion buffer;
			// anything per round trip would be at least rounds.
			if allocs > rounds/10 {
				t.Errorf("%v allocations per ping-pong of %d round trips (with its echo)", allocs, rounds)
			}
		})
	}
}

func shmEnd(t *testing.T, o options) *end {
	t.Helper()
	e, err := newEnd(o, netip.Addr{}, 4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}
