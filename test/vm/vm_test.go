// The VM tests: the ibv provider's own suite (verbstest included), two smcr
// engines over the provider, the transparent path end to end with smcrd on
// rdma, and the eBPF programs on Debian's kernel, on soft-RoCE inside qemu, run
// by plain `go test ./...` on the host.

package vm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// requireVM fails when the VM cannot run, so CI never passes without the real
// RDMA tests; SMCR_SKIP_VM=1 (never set in CI) skips them on purpose.
func requireVM(t *testing.T) {
	t.Helper()
	if os.Getenv("SMCR_SKIP_VM") == "1" {
		t.Skip("SMCR_SKIP_VM=1: soft-RoCE VM tests disabled")
	}
	if err := Available(); err != nil {
		t.Fatalf("%v\n(the real-RDMA tests need the qemu VM; set SMCR_SKIP_VM=1 to skip them on purpose)", err)
	}
}

// buildTest compiles a package's tests with extra build flags into a directory
// the guest can see.
func buildTest(t *testing.T, pkg string, flags ...string) string {
	t.Helper()
	dir, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, filepath.Base(pkg)+".test")
	args := append([]string{"test", "-c", "-o", bin}, flags...)
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = filepath.Join(Dir(), "..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %v: %v\n%s", args, err, out)
	}
	return bin
}

var (
	passRE = regexp.MustCompile(`(?m)^\s*--- PASS: `)
	skipRE = regexp.MustCompile(`(?m)^\s*--- SKIP: .*`)
)

// runSuite runs a Go test binary in the guest and requires it to pass with no
// test skipped.
func runSuite(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	return runSuiteEnv(t, bin, nil, args...)
}

// runSuiteEnv is runSuite with VAR=value pairs added to the guest's environment.
func runSuiteEnv(t *testing.T, bin string, env []string, args ...string) []byte {
	t.Helper()
	return runSuiteIn(t, bin, filepath.Dir(bin), env, args...)
}

// runSuiteIn is runSuiteEnv in the working directory dir (a host path).
func runSuiteIn(t *testing.T, bin, dir string, env []string, args ...string) []byte {
	t.Helper()
	// TCG's speed varies from day to day (a 64 B round trip over rxe took
	// some 11 ms on 2026-11-29, when a suite ran out of 5 minutes): room
	// for a slow day.
	ctx, cancel := context.WithTimeout(context.Background(), 11*time.Minute)
	defer cancel()
	res, err := Run(ctx, Options{
		Args:     append([]string{bin, "-test.v", "-test.count=1", "-test.timeout=7m"}, args...),
		Dir:      dir,
		Env:      append([]string{"SMCR_IBV_REQUIRE=1", "SMCR_IBV_INTERFACE=" + Netdev, "SMCR_IBV_INTERFACE2=" + Netdev2}, env...),
		Timeout:  8 * time.Minute,
		MemoryMB: 3072,
	})
	t.Logf("guest ran %s in %v (exit %d)", filepath.Base(bin), res.Elapsed.Round(time.Second), res.ExitCode)
	if err != nil {
		t.Fatalf("%v\n%s", err, res.Output)
	}
	if res.ExitCode != 0 {
		t.Fatalf("guest suite failed (exit %d):\n%s", res.ExitCode, res.Output)
	}
	if s := skipRE.FindAll(res.Output, -1); len(s) > 0 {
		t.Fatalf("guest suite skipped tests on real RDMA:\n%s", bytes.Join(s, []byte("\n")))
	}
	if len(passRE.FindAll(res.Output, -1)) == 0 {
		t.Fatalf("guest suite ran no test:\n%s", res.Output)
	}
	return res.Output
}

func TestIBVProviderOnSoftRoCE(t *testing.T) {
	requireVM(t)
	bin := buildTest(t, "./smcr/verbs/ibv", "-tags", "ibv")
	out := runSuite(t, bin)
	t.Logf("%d tests passed on rxe", len(passRE.FindAll(out, -1)))
}

// TestEngineOnSoftRoCE runs two smcr engines over rxe in the guest (package
// test/vm/engine): SMC-R agreed, data both ways, half-close, link-group reuse,
// and a second link on a second device that fails and comes back.
func TestEngineOnSoftRoCE(t *testing.T) {
	requireVM(t)
	bin := buildTest(t, "./test/vm/engine", "-tags", "ibv")
	out := runSuite(t, bin, "-test.run", "^(TestEngineOverRDMA|TestTwoLinksOverRDMA)$")
	for _, name := range []string{"TestEngineOverRDMA", "TestTwoLinksOverRDMA"} {
		if !bytes.Contains(out, []byte("--- PASS: "+name)) {
			t.Fatalf("%s did not pass in the guest:\n%s", name, out)
		}
	}
	for _, l := range engineRE.FindAll(out, -1) {
		t.Logf("guest: %s", bytes.TrimSpace(l))
	}
}

// TestLinuxSMCv2OnSoftRoCE runs Linux's own SMC-R version 2 against itself in the
// guest (package test/vm/linuxsmc): a User EID and a PNET entry set over generic
// netlink, rxefix.ko (built here by rxefix.sh against the guest kernel's headers)
// working around 6.1's rxe, and 4 MiB through AF_SMC over rxe1 on lo. Then the
// smcr engine against it, both ways, over SMC-R version 2: Linux's client to
// smcr's server (TestLinuxClientSMCRServer) and smcr's client to Linux's server
// (TestSMCRClientLinuxServer), with data checked by hash, link group reuse,
// Linux's smc_diag view, TEST_LINK answered both ways, and aborts; and tshark
// decodes the captured CLC of version 2 (TestLinuxCaptureDecodes).
func TestLinuxSMCv2OnSoftRoCE(t *testing.T) {
	requireVM(t)
	script := func(name string) string {
		out, err := exec.Command(filepath.Join(Dir(), name)).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				t.Fatalf("%s: %v\n%s", name, err, ee.Stderr)
			}
			t.Fatalf("%s: %v", name, err)
		}
		return strings.TrimSpace(string(out))
	}
	ko := script("rxefix.sh")
	// The guest runs in the host's / (init.sh), whose /lib/modules is not its
	// kernel's: it loads smc from the unpacked kernel tree (kernel.sh).
	cache := os.Getenv("SMCR_VM_CACHE")
	if cache == "" {
		cache = filepath.Join(Dir(), "cache")
	}
	kernelRoot := filepath.Join(cache, "kernel-"+script("kernel.sh"))
	bin := buildTest(t, "./test/vm/linuxsmc", "-tags", "linuxsmc,ibv")
	tests := []string{"TestLinuxSMCv2OverRxe", "TestLinuxClientSMCRServer", "TestSMCRClientLinuxServer", "TestLinuxCaptureDecodes", "TestLinuxNoCommonEID"}
	guest := runSuiteEnv(t, bin, []string{"SMCR_RXEFIX=" + ko, "SMCR_KERNEL_ROOT=" + kernelRoot},
		"-test.run", "^("+strings.Join(tests, "|")+")$")
	for _, name := range tests {
		if !bytes.Contains(guest, []byte("--- PASS: "+name+" ")) {
			t.Fatalf("%s did not pass in the guest:\n%s", name, guest)
		}
	}
	for _, l := range linuxSMCRE.FindAll(guest, -1) {
		t.Logf("guest: %s", bytes.TrimSpace(l))
	}
}

// linuxSMCRE picks the guest test's summary line.
var linuxSMCRE = regexp.MustCompile(`(?m)^.*(linux smc-r v2 over |smc-r v2 over |connection \d+: connect|stream: |idle |aborted: |smc_diag: |tshark: |no common eid: ).*$`)

// engineRE picks the guest test's own summary lines.
var engineRE = regexp.MustCompile(`(?m)^.*(connection: |connection in |connection across |link group \d+ over |link \d+ over |links added ).*$`)

// TestBPFOnDebianKernel runs the eBPF programs' tests on the guest's kernel,
// Debian 12's 6.1: an older verifier than the host's, and no tcx, so tc ingress
// goes in as a cls_bpf filter.
func TestBPFOnDebianKernel(t *testing.T) {
	requireVM(t)
	bin := buildTest(t, "./bpf")
	out := runSuite(t, bin, "-test.run", "^Test")
	t.Logf("%d tests passed on the guest's kernel", len(passRE.FindAll(out, -1)))
}

// TestTransparentOnSoftRoCE runs the end-to-end suite of test/e2e in the guest:
// two hosts in network namespaces, each with its own smcrd built with the ibv
// provider, carry unmodified programs over rxe (TestTransparent, and nginx and
// redis in TestServers, on rdma), and the fallback, negative cache, unlisted
// port, kill, runtime configuration and socket option tests run their eBPF programs on
// Debian's kernel, older than the host's (no tcx there).
// That kernel has AF_SMC too: smcrd meets Linux's own SMC-R as client and server.
// The tests that size their transfers for a native CPU (drain, stress) stay on
// the host.
func TestTransparentOnSoftRoCE(t *testing.T) {
	requireVM(t)
	bin, env := buildE2E(t)
	tests := []string{"TestTransparent", "TestServers", "TestFallbackAndNegativeCache", "TestPortNotListed", "TestKill",
		"TestRuntimeConfig", "TestOperatorView", "TestLinuxSMCServer", "TestLinuxSMCClient", "TestUrgentData", "TestSocketOptions"}
	out := runE2E(t, bin, env, tests, "TestTransparent/rdma", "TestServers/rdma")
	for _, l := range iperfRE.FindAll(out, -1) {
		t.Logf("guest: %s", bytes.TrimSpace(l))
	}
}

// TestDirectOnSoftRoCE runs the direct mode's end-to-end tests in the guest:
// programs with libsmcr-preload.so on both hosts (Python asyncio and threads,
// memcached, socat forking per connection), their bytes through the rings the
// library shares with smcrd, which posts them as RDMA WRITEs over rxe.
func TestDirectOnSoftRoCE(t *testing.T) {
	requireVM(t)
	bin, env := buildE2E(t)
	runE2E(t, bin, env, []string{"TestDirect", "TestDirectProgramsMemcached", "TestDirectProgramsSocat"},
		"TestDirect/rdma", "TestDirectProgramsMemcached/rdma", "TestDirectProgramsSocat/rdma")
}

// buildE2E builds test/e2e's test binary and, beside it, what its TestMain
// takes from SMCR_E2E_BIN: smcrd with the ibv provider, the static testapp,
// the direct mode's library and its C benchmark peer. It returns the binary
// and the guest's environment for it.
func buildE2E(t *testing.T) (bin string, env []string) {
	t.Helper()
	bin = buildTest(t, "./test/e2e")
	dir := filepath.Dir(bin)
	root := filepath.Join(Dir(), "..", "..")
	for _, b := range []struct {
		name string
		env  []string
		args []string
	}{
		{"smcrd", nil, []string{"go", "build", "-o", filepath.Join(dir, "smcrd"), "-tags", "ibv", "./cmd/smcrd"}},
		{"testapp", []string{"CGO_ENABLED=0"}, []string{"go", "build", "-o", filepath.Join(dir, "testapp"), "./test/e2e/testapp"}},
		{"libsmcr-preload.so", nil, []string{"make", "-s", "-C", "preload", "BIN=" + dir}},
		{"ddbench", nil, []string{"gcc", "-O2", "-Wall", "-Werror", "-o", filepath.Join(dir, "ddbench"), "test/e2e/testdata/ddbench.c", "-lpthread"}},
	} {
		cmd := exec.Command(b.args[0], b.args[1:]...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), b.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", b.name, err, out)
		}
	}
	return bin, []string{"SMCR_E2E_BIN=" + dir, "SMCR_E2E_PROVIDERS=rdma", "SMCR_E2E_RDMA_DEVICE=rxe0"}
}

// runE2E runs the named tests of test/e2e in the guest, in test/e2e's source
// directory (the tests start programs from its testdata), and requires each of
// them, and each of the subtests named in subtests, to pass: one renamed in
// test/e2e would otherwise drop out unseen.
func runE2E(t *testing.T, bin string, env, tests []string, subtests ...string) []byte {
	t.Helper()
	src := filepath.Join(Dir(), "..", "e2e")
	out := runSuiteIn(t, bin, src, env, "-test.run", "^("+strings.Join(tests, "|")+")$")
	for _, want := range append(tests, subtests...) {
		if !bytes.Contains(out, []byte("--- PASS: "+want+" (")) {
			t.Fatalf("%s did not pass in the guest:\n%s", want, out)
		}
	}
	return out
}

var iperfRE = regexp.MustCompile(`(?m)^.*iperf3 through smcrd.*$`)

// TestRunReportsExitCode checks the harness itself: the guest's status comes back.
func TestRunReportsExitCode(t *testing.T) {
	requireVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := Run(ctx, Options{
		Args:    []string{"sh", "-c", "rdma link show " + Device + "/1; exit 7"},
		Timeout: 3 * time.Minute,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, res.Output)
	}
	if res.ExitCode != 7 || !bytes.Contains(res.Output, []byte("state ACTIVE")) {
		t.Fatalf("exit %d, output:\n%s", res.ExitCode, res.Output)
	}
}

// TestRunBootsAgain checks the harness's second boot: a guest that has not
// started the command within SMCR_VM_BOOT_TIMEOUT (here 1 s, shorter than any
// boot) is stopped and booted again, and the command runs once, in the second.
func TestRunBootsAgain(t *testing.T) {
	requireVM(t)
	t.Setenv("SMCR_VM_BOOT_TIMEOUT", "1")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := Run(ctx, Options{Args: []string{"sh", "-c", "echo ran-the-command; exit 5"}, Timeout: 3 * time.Minute})
	if err != nil {
		t.Fatalf("%v\n%s", err, res.Output)
	}
	out := string(res.Output)
	if res.ExitCode != 5 || !strings.Contains(out, "booting it again") || strings.Count(out, "ran-the-command") != 1 {
		t.Fatalf("exit %d, want 5 after a second boot that ran the command once; output:\n%s", res.ExitCode, out)
	}
}
