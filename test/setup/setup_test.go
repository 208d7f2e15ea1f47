// Package setup tests the project's own set-up: the Makefile and the scripts
// behind the README's two commands, on the conditions of a fresh machine.
package setup

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// root is the repository root: go test runs a package's tests in its directory.
const root = "../.."

// basePATH is the PATH of a root shell without a login profile, as under sudo
// (its secure_path) or cron: Debian's directories, no /usr/local/go/bin.
const basePATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// TestMakeFindsGo: the Makefile's recipes find the Go toolchain in /usr/local/go,
// where these machines have it and scripts/deps.sh looks, when PATH lacks it.
func TestMakeFindsGo(t *testing.T) {
	if _, err := os.Stat("/usr/local/go/bin/go"); err != nil {
		t.Skipf("no Go in /usr/local/go on this machine: %v", err)
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make is not installed: %v", err)
	}
	for _, dir := range filepath.SplitList(basePATH) {
		if _, err := os.Stat(filepath.Join(dir, "go")); err == nil {
			t.Skipf("a go in %s, on Debian's PATH: nothing to find", dir)
		}
	}
	// The recipe's shell and the Makefile's own $(shell $(GO) ...) both need it.
	cmd := exec.Command("make", "-s", "-C", root, "--eval",
		"which-go: ; @command -v go; echo $(firstword $(RACE_PKGS))", "which-go")
	cmd.Env = append(os.Environ(), "PATH="+basePATH, "MAKEFLAGS=", "MAKELEVEL=")
	out, err := cmd.CombinedOutput()
	want := "/usr/local/go/bin/go\ngithub.com/smcr-io/smcr/"
	if err != nil || !strings.HasPrefix(string(out), want) {
		t.Fatalf("make found go and the race packages as %q (%v), want %q...", out, err, want)
	}
}
