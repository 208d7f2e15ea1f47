// Package setup tests the project's own set-up: the Makefile and the scripts
// behind the README's two commands, on the conditions of a fresh machine.
package setup

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
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

// TestDepsInstallsGo: on a machine without Go, scripts/deps.sh installs the
// version go.mod names from the toolchain module on the Go module proxy, then
// downloads the modules with it. Stand-ins answer for dpkg-query (every package
// installed) and curl (a fake toolchain archive, its checksum given).
func TestDepsInstallsGo(t *testing.T) {
	for _, dir := range filepath.SplitList(basePATH) {
		if _, err := os.Stat(filepath.Join(dir, "go")); err == nil {
			t.Skipf("a go in %s, on Debian's PATH: deps.sh would use it", dir)
		}
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	want := string(m[1])
	stubs, state, dest := t.TempDir(), t.TempDir(), t.TempDir()
	arch := map[string]string{"amd64": "amd64", "arm64": "arm64"}[runtime.GOARCH]
	if arch == "" {
		t.Skipf("deps.sh installs Go for amd64 and arm64, not %s", runtime.GOARCH)
	}
	prefix := "golang.org/toolchain@v0.0.1-go" + want + ".linux-" + arch + "/"
	var zb bytes.Buffer
	zw := zip.NewWriter(&zb)
	for name, body := range map[string]string{
		"VERSION": "go" + want + "\n",
		"bin/go": "#!/bin/sh\ncase $1 in env) echo go" + want + " ;; " +
			"mod) echo \"$@\" >>\"$STUB_STATE/go.log\" ;; esac\n",
		"pkg/tool/linux_" + arch + "/compile": "#!/bin/sh\n",
	} {
		w, err := zw.Create(prefix + name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(body))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(state, "go.zip")
	if err := os.WriteFile(archive, zb.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"dpkg-query": "#!/bin/sh\nprintf 'install ok installed'\n",
		"curl": "#!/bin/sh\nwhile [ $# -gt 1 ]; do [ \"$1\" = -o ] && cp \"$STUB_STATE/go.zip\" \"$2\"; shift; done\n" +
			"echo \"$1\" >\"$STUB_STATE/url\"\n",
	} {
		if err := os.WriteFile(filepath.Join(stubs, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	goroot := filepath.Join(dest, "go")
	sum := sha256.Sum256(zb.Bytes())
	run := func() {
		t.Helper()
		cmd := exec.Command(filepath.Join(root, "scripts", "deps.sh"))
		cmd.Env = append(os.Environ(), "PATH="+stubs+":"+basePATH, "STUB_STATE="+state,
			"SMCR_GOROOT="+goroot, "SMCR_GO_SHA256="+hex.EncodeToString(sum[:]), "GOPROXY=https://proxy.example")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("deps.sh: %v\n%s", err, out)
		}
	}
	run()
	if url, _ := os.ReadFile(filepath.Join(state, "url")); strings.TrimSpace(string(url)) !=
		"https://proxy.example/golang.org/toolchain/@v/v0.0.1-go"+want+".linux-"+arch+".zip" {
		t.Errorf("fetched %q", url)
	}
	if log, _ := os.ReadFile(filepath.Join(state, "go.log")); string(log) != "mod download\n" {
		t.Fatalf("the installed go ran %q, want mod download", log)
	}
	// A second run finds it and fetches nothing.
	os.Remove(filepath.Join(state, "url"))
	run()
	if _, err := os.Stat(filepath.Join(state, "url")); err == nil {
		t.Fatal("the second run fetched Go again")
	}
}

// TestDemo runs the main job, scripts/demo.sh (make demo), on freshly built
// smcrd and smcrctl: iperf3 between two namespaces, through SMC-R.
func TestDemo(t *testing.T) {
	bin := demoBin(t)
	out, err := runDemo(bin)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	for _, want := range []string{"direct mode (smcrctl run, shm provider):", "relay (smcrd, shm provider):", "SMCR  direct"} {
		if !strings.Contains(out, want) {
			t.Fatalf("demo printed no %q:\n%s", want, out)
		}
	}
}

// TestDemoFailsWithoutSMCR: a demo whose iperf3 did not go through SMC-R shows
// nothing of what it claims, and must say so and fail. An smcrd whose
// port_range_list leaves out the demo's port redirects nothing.
func TestDemoFailsWithoutSMCR(t *testing.T) {
	bin := demoBin(t)
	real := filepath.Join(bin, "smcrd.real")
	if err := os.Rename(filepath.Join(bin, "smcrd"), real); err != nil {
		t.Fatal(err)
	}
	wrapper := "#!/bin/sh\n[ \"$1\" = -config ] && sed -i 's/^port_range_list = .*/port_range_list = 6000/' \"$2\"\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "smcrd"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := runDemo(bin)
	if err == nil || !strings.Contains(out, "did not go through SMC-R") {
		t.Fatalf("demo without SMC-R: %v, want a failure saying so:\n%s", err, out)
	}
}

// demoBin builds smcrd, smcrctl and the direct mode's library for the demo
// into a directory of the test's.
func demoBin(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, cgroups and BPF")
	}
	bin := t.TempDir()
	for _, pkg := range []string{"./cmd/smcrd", "./cmd/smcrctl"} {
		cmd := exec.Command("go", "build", "-o", bin+"/", pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	if out, err := exec.Command("make", "-s", "-C", filepath.Join(root, "preload"), "BIN="+bin).CombinedOutput(); err != nil {
		t.Fatalf("make preload: %v\n%s", err, out)
	}
	return bin
}

func runDemo(bin string) (string, error) {
	cmd := exec.Command(filepath.Join(root, "scripts", "demo.sh"))
	cmd.Env = append(os.Environ(), "SMCR_DEMO_BIN="+bin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestFuzzFailsOnBrokenPackage: scripts/fuzz.sh (make fuzz) fails when a
// package's tests do not build, rather than fuzzing the others and passing.
func TestFuzzFailsOnBrokenPackage(t *testing.T) {
	mod := t.TempDir()
	for name, body := range map[string]string{
		"go.mod":                "module fuzzcheck\n\ngo 1.22\n",
		"good/good.go":          "package good\n",
		"good/good_test.go":     "package good\n\nimport \"testing\"\n\nfunc FuzzGood(f *testing.F) { f.Fuzz(func(t *testing.T, b []byte) {}) }\n",
		"broken/broken.go":      "package broken\n",
		"broken/broken_test.go": "package broken\n\nimport \"testing\"\n\nfunc FuzzBroken(f *testing.F) { undefined() }\n",
	} {
		path := filepath.Join(mod, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	script, err := os.ReadFile(filepath.Join(root, "scripts", "fuzz.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(mod, "scripts"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mod, "scripts", "fuzz.sh"), script, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(mod, "scripts", "fuzz.sh"), "1s")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("fuzz.sh passed with a package whose tests do not build:\n%s", out)
	}
	if !strings.Contains(string(out), "broken") {
		t.Fatalf("fuzz.sh failed without naming the broken package (%v):\n%s", err, out)
	}
}

// TestDemoAfterDeps: make demo builds only after scripts/deps.sh is done (it
// may install Go), under -j too, as from a MAKEFLAGS=-j in the environment.
// Stand-in recipes: deps takes a while and leaves a mark, build needs it.
func TestDemoAfterDeps(t *testing.T) {
	dir := t.TempDir()
	mark := filepath.Join(dir, "deps-done")
	stand := filepath.Join(dir, "stand-ins.mk") // read after the Makefile: its recipes win
	if err := os.WriteFile(stand, []byte("deps: ; @sleep 0.5; touch "+mark+"\n"+
		"build: ; @test -e "+mark+" || { echo build before deps; exit 1; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("make", "-s", "-j4", "-C", root, "-f", "Makefile", "-f", stand, "demo")
	cmd.Env = append(os.Environ(), "MAKEFLAGS=", "MAKELEVEL=", "SMCR_DEMO_BIN="+t.TempDir())
	out, _ := cmd.CombinedOutput()
	// The demo itself then finds no smcrd in its empty bin directory.
	if strings.Contains(string(out), "build before deps") || !strings.Contains(string(out), "demo: run make build first") {
		t.Fatalf("make -j4 demo:\n%s", out)
	}
}

// TestServiceUnit: the systemd unit does not restart smcrd on a configuration
// error (it looped until the start limit), keeps the capability the relay needs
// to make connections as the application's user, and stays as hardened as
// docs/operations.md says (it was 7.2).
func TestServiceUnit(t *testing.T) {
	unit, err := os.ReadFile(filepath.Join(root, "configs/smcrd.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nRestartPreventExitStatus=2\n", " CAP_SETUID "} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("the unit lacks %q", strings.TrimSpace(want))
		}
	}
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("no systemd-analyze to rate the unit's hardening")
	}
	// --offline takes the unit's file name as its name.
	file := filepath.Join(t.TempDir(), "smcrd.service")
	if err := os.WriteFile(file, unit, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("systemd-analyze", "security", "--offline=yes", "--no-pager", file).CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for smcrd.service: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	if score, _ := strconv.ParseFloat(string(m[1]), 64); score > 5.4 {
		t.Errorf("systemd-analyze security rates the unit %s, docs/operations.md says 5.4", m[1])
	}
	if strings.Contains(string(out), "Unknown") {
		t.Errorf("systemd-analyze does not know some of the unit's settings:\n%s", out)
	}
}

// TestNoBuildOutputTracked: no program built from the tree is committed (a
// 5.4 MB cmd/verbsbench/verbsbench was), and what `go build` leaves in a
// command's directory or the root is ignored. The committed BPF object is
// relocatable, not a program.
func TestNoBuildOutputTracked(t *testing.T) {
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		f, err := os.Open(filepath.Join(root, name))
		if err != nil {
			continue // deleted in the work tree
		}
		var hdr [18]byte
		n, _ := f.Read(hdr[:])
		f.Close()
		// ELF, e_type ET_EXEC (2) or ET_DYN (3), little-endian.
		if n == len(hdr) && string(hdr[:4]) == "\x7fELF" && (hdr[16] == 2 || hdr[16] == 3) {
			t.Errorf("%s is a built program, committed", name)
		}
	}
	cmds, err := filepath.Glob(filepath.Join(root, "cmd", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var outputs []string
	for _, c := range cmds {
		b := filepath.Base(c)
		outputs = append(outputs, filepath.Join("cmd", b, b), b)
	}
	outputs = append(outputs, "test/e2e/testapp/testapp")
	for _, p := range outputs {
		if err := exec.Command("git", "-C", root, "check-ignore", "-q", "--no-index", p).Run(); err != nil {
			t.Errorf("%s, what go build leaves, is not ignored", p)
		}
	}
}

// TestGotestSummary: scripts/gotest.sh prints what go test does without -v,
// and the tests that skipped with their reasons, which go test shows only
// with -v.
func TestGotestSummary(t *testing.T) {
	cmd := exec.Command("scripts/gotest.sh", "go", "-count=1", "./test/setup/testdata/skipper")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "SMCR_TEST_SKIPS=")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("gotest.sh passed a failing test:\n%s", out)
	}
	for _, want := range []string{"--- FAIL: TestFails", "the widget broke", "skipped tests (1):", "TestSkips: skipper_test.go:9: no widget on this machine"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("gotest.sh's output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "only -v shows") {
		t.Errorf("gotest.sh printed a passing test's log, as go test -v would:\n%s", out)
	}
}

// TestMakeTestSummary: make test ends with each phase's time and every test
// skipped, with its reason; a phase that fails stops the others, and says so.
func TestMakeTestSummary(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "make")
	// Each phase passes; test-unit runs the fixture's passing and skipping tests.
	script := "#!/bin/sh\ncase \"$2\" in\n" +
		"test-unit) exec scripts/gotest.sh go -count=1 -run 'TestPasses|TestSkips' ./test/setup/testdata/skipper;;\n" +
		"lint) [ -z \"$FAIL_LINT\" ];;\nesac\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(env ...string) (string, error) {
		cmd := exec.Command("scripts/test.sh", fake, "1s") // relative to Dir
		cmd.Dir = root
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run()
	if err != nil {
		t.Fatalf("test.sh: %v\n%s", err, out)
	}
	_, summary, _ := strings.Cut(out, "make test: the phases\n")
	for _, phase := range []string{"lint", "check-generate", "test-unit", "test-race", "fuzz"} {
		if !regexp.MustCompile(`(?m)^  ` + phase + ` +[0-9]+s$`).MatchString(summary) {
			t.Errorf("the summary does not time %s:\n%s", phase, out)
		}
	}
	if !strings.Contains(summary, "make test: 1 tests skipped") || !strings.Contains(summary, "TestSkips: skipper_test.go:9: no widget on this machine") {
		t.Errorf("the summary does not list the skipped test and why:\n%s", out)
	}
	out, err = run("FAIL_LINT=1")
	if err == nil || !strings.Contains(out, "lint") || !strings.Contains(out, "FAILED") || strings.Contains(out, "check-generate") {
		t.Errorf("a failing lint: %v, want a failure that stops the phases after it:\n%s", err, out)
	}
}

// TestManPagesFresh: the committed man pages are what smcrd and smcrctl make
// of their own help (make man), and every verb is in smcrctl's. There were
// none.
func TestManPagesFresh(t *testing.T) {
	for _, p := range []struct {
		file string
		args []string
	}{
		{"docs/man/smcrd.8", []string{"./cmd/smcrd", "-man", "smcrd"}},
		{"docs/man/smcrd.conf.5", []string{"./cmd/smcrd", "-man", "smcrd.conf"}},
		{"docs/man/smcrctl.8", []string{"./cmd/smcrctl", "help", "--man"}},
	} {
		cmd := exec.Command("go", append([]string{"run"}, p.args...)...)
		cmd.Dir = root
		want, err := cmd.Output()
		if err != nil {
			t.Fatalf("go run %v: %v", p.args, err)
		}
		got, err := os.ReadFile(filepath.Join(root, p.file))
		if err != nil {
			t.Fatalf("%v (make man writes it)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what %v writes: run make man", p.file, p.args)
		}
		if p.file == "docs/man/smcrctl.8" {
			for _, verb := range []string{"status", "set", "show", "links", "listeners", "stats"} {
				if !strings.Contains(string(got), "Usage: smcrctl "+verb) {
					t.Errorf("smcrctl.8 lacks the verb %s", verb)
				}
			}
		}
	}
}
