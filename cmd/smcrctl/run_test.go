package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun runs a program through smcrctl run, as a user would: it gets the
// library in LD_PRELOAD (before one it had) and the direct socket beside the
// control socket, its own flags untouched; without smcrd it runs all the same.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "smcrctl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	lib := filepath.Join(dir, "libsmcr-preload.so")
	// Any shared object serves: the program only prints its environment.
	real, err := filepath.Glob("/lib/x86_64-linux-gnu/libm.so.6")
	if err != nil || len(real) == 0 {
		t.Skip("no libm to stand in for the library")
	}
	data, err := os.ReadFile(real[0])
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(lib, data, 0o755)
	ctl := filepath.Join(dir, "run", "smcrd.sock")
	for _, args := range [][]string{
		{"-s", ctl, "run", "sh", "-c", `echo "$LD_PRELOAD|$SMCR_DIRECT_SOCKET|$0"`, "-x"},
		{"-s", ctl, "run", "--", "sh", "-c", `echo "$LD_PRELOAD|$SMCR_DIRECT_SOCKET|$0"`, "-x"},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "LD_PRELOAD=", "SMCR_PRELOAD_LIB=")
		cmd.Env = append(cmd.Env, "LD_PRELOAD="+real[0])
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, stderr.String())
		}
		want := lib + ":" + real[0] + "|" + filepath.Join(dir, "run", "direct.sock") + "|-x\n"
		if stdout.String() != want {
			t.Errorf("%v: the program saw %q, want %q", args, stdout.String(), want)
		}
		if !strings.Contains(stderr.String(), "smcrd does not answer") {
			t.Errorf("%v: no word that smcrd is not running: %q", args, stderr.String())
		}
	}
	cmd := exec.Command(bin, "run")
	if err := cmd.Run(); err == nil || cmd.ProcessState.ExitCode() != 2 {
		t.Errorf("run without a program: %v, want exit 2", err)
	}
	cmd = exec.Command(bin, "-s", ctl, "run", "no-such-program-here")
	if out, err := cmd.CombinedOutput(); err == nil || cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "no-such-program-here") {
		t.Errorf("run of a missing program: %v, %q", err, out)
	}
}
