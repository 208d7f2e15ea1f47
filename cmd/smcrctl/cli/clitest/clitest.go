// Package clitest runs smcrctl verbs in process against a control socket and
// compares what they print and their exit code with golden files. The socket may be
// served by a fake backend (controltest) or by a real smcrd in a network namespace;
// Normalize hides what a real daemon varies (uptimes, addresses, ports).
package clitest

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/smcr-io/smcr/cmd/smcrctl/cli"
)

// Update rewrites the golden files instead of comparing: go test -run Golden -update.
var Update = flag.Bool("update", false, "rewrite the golden files with the current output")

// Case is one smcrctl invocation.
type Case struct {
	Name string   // golden file: Dir/Name.golden
	Args []string // after "smcrctl -s SOCKET"
	Exit int      // the exit code it must return
}

// Harness runs cases against one socket.
type Harness struct {
	Dir    string // where the golden files are, usually "testdata"
	Socket string // the control socket
	// SocketName is what the golden files show for Socket ("SOCKET" when empty).
	// One of the same length keeps tables that print the path aligned.
	SocketName string
	Replace    map[string]string // further literal replacements (temporary paths)
	Normalize  func(string) string
}

// Result is what one run printed.
type Result struct {
	Stdout, Stderr string
	Exit           int
}

// Exec runs smcrctl with args against the harness's socket.
func (h Harness) Exec(args ...string) Result {
	var out, errb bytes.Buffer
	code := cli.Run(append([]string{"-s", h.Socket}, args...), &out, &errb)
	return Result{Stdout: out.String(), Stderr: errb.String(), Exit: code}
}

// Run executes c and checks its exit code and output against the golden file.
func (h Harness) Run(t *testing.T, c Case) Result {
	t.Helper()
	r := h.Exec(c.Args...)
	if r.Exit != c.Exit {
		t.Errorf("smcrctl %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(c.Args, " "), r.Exit, c.Exit, r.Stdout, r.Stderr)
	}
	got := h.render(c, r)
	path := filepath.Join(h.Dir, c.Name+".golden")
	if *Update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return r
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("smcrctl %s: output differs from %s (-update rewrites it)\ngot:\n%s\nwant:\n%s", strings.Join(c.Args, " "), path, got, want)
	}
	return r
}

// render lays out one run as a golden file: the command, stdout, stderr, exit code.
func (h Harness) render(c Case, r Result) string {
	var b strings.Builder
	b.WriteString("$ smcrctl " + strings.Join(c.Args, " ") + "\n")
	b.WriteString(r.Stdout)
	if r.Stderr != "" {
		b.WriteString("--- stderr\n" + r.Stderr)
	}
	b.WriteString("--- exit " + strconv.Itoa(r.Exit) + "\n")
	name := h.SocketName
	if name == "" {
		name = "SOCKET"
	}
	s := strings.ReplaceAll(b.String(), h.Socket, name)
	for old, repl := range h.Replace {
		s = strings.ReplaceAll(s, old, repl)
	}
	if h.Normalize != nil {
		s = h.Normalize(s)
	}
	return s
}
