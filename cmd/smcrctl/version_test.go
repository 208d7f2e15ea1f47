package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestVersionStamped: smcrctl and smcrd built with the Makefile's ldflags say
// which release and commit they are (they said "(devel)" and "dev").
func TestVersionStamped(t *testing.T) {
	if testing.Short() {
		t.Skip("builds both binaries; runs without -short")
	}
	flags, err := exec.Command("make", "-s", "-C", "../..", "ldflags").Output()
	if err != nil {
		t.Fatalf("make ldflags: %v", err)
	}
	commit, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse: %v", err)
	}
	release, err := os.ReadFile("../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimSpace(string(release)) + " (commit " + strings.TrimSpace(string(commit))
	dir := t.TempDir()
	for _, c := range []struct{ pkg, bin string }{{".", "smcrctl"}, {"../smcrd", "smcrd"}} {
		bin := filepath.Join(dir, c.bin)
		if out, err := exec.Command("go", "build", "-ldflags", strings.TrimSpace(string(flags)), "-o", bin, c.pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", c.pkg, err, out)
		}
		arg := "version" // exits 3 when no smcrd answers, after its own line
		if c.bin == "smcrd" {
			arg = "-version"
		}
		out, _ := exec.Command(bin, arg).Output()
		if first, _, _ := strings.Cut(string(out), "\n"); !strings.HasPrefix(first, c.bin+" "+want) {
			t.Errorf("%s %s: %q, want it to begin %q", c.bin, arg, first, c.bin+" "+want)
		}
	}
}
