// The VM tests: the ibv provider's own suite (verbstest included) and two smcr
// engines over the provider, on soft-RoCE inside qemu, run by plain `go test
// ./...` on the host.

package vm

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	res, err := Run(ctx, Options{
		Args:    append([]string{bin, "-test.v", "-test.count=1", "-test.timeout=5m"}, args...),
		Dir:     filepath.Dir(bin),
		Env:     []string{"SMCR_IBV_REQUIRE=1", "SMCR_IBV_INTERFACE=" + Netdev},
		Timeout: 6 * time.Minute,
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
// test/vm/engine): SMC-R agreed, data both ways, half-close, link-group reuse.
func TestEngineOnSoftRoCE(t *testing.T) {
	requireVM(t)
	bin := buildTest(t, "./test/vm/engine", "-tags", "ibv")
	out := runSuite(t, bin, "-test.run", "^TestEngineOverRDMA$")
	if !bytes.Contains(out, []byte("--- PASS: TestEngineOverRDMA")) {
		t.Fatalf("TestEngineOverRDMA did not pass in the guest:\n%s", out)
	}
	for _, l := range engineRE.FindAll(out, -1) {
		t.Logf("guest: %s", bytes.TrimSpace(l))
	}
}

// engineRE picks the guest test's own summary lines.
var engineRE = regexp.MustCompile(`(?m)^.*(connection: |connection in |link group \d+ over ).*$`)

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
