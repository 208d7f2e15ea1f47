package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smcr-io/smcr/internal/cgroupfs"
)

func TestDefaultProcs(t *testing.T) {
	for _, tc := range []struct {
		maxprocs int
		fromEnv  bool
		want     int
	}{
		{1, false, 1},
		{2, false, 1},
		{3, false, 1},
		{16, false, 8},
		{2, true, 2}, // GOMAXPROCS=2 in the environment
		{1, true, 1},
	} {
		if got := defaultProcs(tc.maxprocs, tc.fromEnv); got != tc.want {
			t.Errorf("defaultProcs(%d, %v) = %d, want %d", tc.maxprocs, tc.fromEnv, got, tc.want)
		}
	}
}

func TestProcsFlagRejectsZero(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"-procs", "0"}, &out, &errOut); code != 2 {
		t.Fatalf("exit %d, want 2 (usage)", code)
	}
	if !strings.Contains(errOut.String(), "-procs 0: must be at least 1") {
		t.Errorf("stderr %q does not say why", errOut.String())
	}
}

// TestFlagErrors: values smcrd cannot run with are usage errors that say why,
// before anything starts. A -liveness-ttl under 3ns made the heartbeat's ticker
// panic; a negative -drain-timeout meant the default.
func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		// A missing -config keeps smcrd from starting if a check is missed.
		{[]string{"-config", "/nonexistent", "-liveness-ttl", "1ns"}, "smcrd: -liveness-ttl 1ns: must be at least 100ms\n"},
		{[]string{"-config", "/nonexistent", "-liveness-ttl", "0"}, "smcrd: -liveness-ttl 0s: must be at least 100ms\n"},
		{[]string{"-config", "/nonexistent", "-drain-timeout", "-1s"}, "smcrd: -drain-timeout -1s: must not be negative (0: abort at once)\n"},
		{[]string{"-nope"}, "smcrd: flag provided but not defined: -nope\nRun 'smcrd -help' for usage.\n"},
		{[]string{"extra"}, "smcrd: unexpected argument \"extra\"\nRun 'smcrd -help' for usage.\n"},
	} {
		var out, errOut bytes.Buffer
		if code := run(tc.args, &out, &errOut); code != 2 {
			t.Errorf("%q: exit %d, want 2 (usage)", tc.args, code)
		}
		if errOut.String() != tc.want || out.Len() != 0 {
			t.Errorf("%q: stderr %q, stdout %q; want stderr %q", tc.args, errOut.String(), out.String(), tc.want)
		}
	}
}

// TestHelp: -help and -h write the usage to stdout and exit 0, as smcrctl
// --help does, and each default shows once.
func TestHelp(t *testing.T) {
	for _, arg := range []string{"-help", "-h", "--help"} {
		var out, errOut bytes.Buffer
		if code := run([]string{arg}, &out, &errOut); code != 0 {
			t.Errorf("%s: exit %d, want 0", arg, code)
		}
		if errOut.Len() != 0 || !strings.Contains(out.String(), "Usage:\n  smcrd [-config FILE] [flags]") {
			t.Fatalf("%s: stdout %q, stderr %q", arg, out.String(), errOut.String())
		}
		for _, line := range strings.Split(out.String(), "\n") {
			if strings.Count(line, "(default") > 1 || strings.Contains(line, ") (") {
				t.Errorf("%s: %q says its default twice", arg, line)
			}
		}
	}
}

// TestCgroupMissingIsConfigError: a cgroup that does not exist is a
// configuration error (exit 2) with the file and line, and the path as
// written: the mount's own path, given where one relative to it is meant, was
// reported with its slash stripped, and smcrd exited 1.
func TestCgroupMissingIsConfigError(t *testing.T) {
	mnt, err := cgroupfs.Mount()
	if err != nil {
		t.Skipf("no cgroup2 mount: %v", err)
	}
	file := filepath.Join(t.TempDir(), "smcrd.conf")
	if err := os.WriteFile(file, []byte("enabled = yes\ncgroup = "+mnt+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"-config", file, "-pin-dir", filepath.Join(t.TempDir(), "pins")}, &out, &errOut); code != 2 {
		t.Fatalf("exit %d, want 2 (configuration):\n%s", code, errOut.String())
	}
	if want := fmt.Sprintf("smcrd: %s:2: cgroup: %q is not a cgroup", file, mnt); !strings.Contains(errOut.String(), want) {
		t.Errorf("stderr %q, want %q", errOut.String(), want)
	}
}
