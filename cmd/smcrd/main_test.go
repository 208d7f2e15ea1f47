package main

import (
	"bytes"
	"strings"
	"testing"
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
