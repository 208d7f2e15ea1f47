package bpf

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

func TestParseMonotonicOffset(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"monotonic           0         0\nboottime            0         0\n", 0},
		{"monotonic      100000         5\nboottime            0         0\n", 100000e9 + 5},
		{"boottime 7 0\nmonotonic -3 500000000\n", -3e9 + 5e8},
		{"", 0},
		{"monotonic x 0\n", 0},
		{"monotonic 1\n", 0},
	} {
		if got := parseMonotonicOffset(c.in); got != c.want {
			t.Errorf("parseMonotonicOffset(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

// TestMonotonicInTimeNamespace: smcrd in a time namespace writes deadlines on
// the host's clock, the one the programs read. The test binary runs again in a
// time namespace whose monotonic clock is 100000 s ahead and prints monotonic();
// the value must lie between this process's readings before and after.
func TestMonotonicInTimeNamespace(t *testing.T) {
	if os.Getenv("SMCR_PRINT_MONOTONIC") != "" {
		fmt.Println(monotonic())
		return
	}
	if _, err := os.Stat("/proc/self/timens_offsets"); err != nil {
		t.Skipf("kernel without time namespaces: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: unshare --time")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skipf("unshare (util-linux) not installed: %v", err)
	}
	before := monotonic()
	// --fork: some kernels (Debian 12's 6.1 among them) leave an exec'd program
	// outside the namespace it unshared, where creating a thread fails
	// (EINVAL) and the Go runtime aborts; a forked child is inside it.
	cmd := exec.Command("unshare", "--time", "--fork", "--monotonic", "100000", "--", os.Args[0],
		"-test.run", "^TestMonotonicInTimeNamespace$")
	cmd.Env = append(os.Environ(), "SMCR_PRINT_MONOTONIC=1")
	out, err := cmd.Output()
	after := monotonic()
	var ee *exec.ExitError
	if errors.As(err, &ee) && strings.Contains(string(ee.Stderr), "unrecognized option") {
		t.Skipf("unshare cannot make time namespaces: %s", ee.Stderr)
	}
	if err != nil {
		var stderr []byte
		if ee != nil {
			stderr = ee.Stderr
		}
		t.Fatalf("%v: %s %s", err, out, stderr)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	got, err := strconv.ParseUint(first, 10, 64)
	if err != nil {
		t.Fatalf("child printed %q", out)
	}
	if got < before || got > after {
		t.Errorf("monotonic() in the time namespace = %d, outside this process's %d..%d (off by %.0f s)",
			got, before, after, float64(int64(got-before))/1e9)
	}
}
