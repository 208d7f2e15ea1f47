package preload

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/smcr-io/smcr/daemon"
)

// helperSmcrd serves daemon.NewDirectServer at path until killed.
func helperSmcrd(path string) {
	s, err := daemon.NewDirectServer(daemon.DirectOptions{Path: path})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("serving")
	for {
		time.Sleep(500 * time.Millisecond)
		s.Beat()
	}
}

// runReset runs reset under the library with smcrd at sock, calls end when
// the connection is up, and returns reset's output.
func runReset(t *testing.T, sock string, end func()) string {
	t.Helper()
	dir := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "reset"))
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+filepath.Join(dir, "libsmcr-preload.so"), "SMCR_DIRECT_SOCKET="+sock)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	r := bufio.NewReader(outPipe)
	for {
		line, err := r.ReadString('\n')
		out.WriteString(line)
		if err != nil {
			cmd.Wait()
			t.Fatalf("reset: no ready line: %v\n%s\n%s", err, out.String(), stderr.String())
		}
		if line == "ready\n" {
			break
		}
	}
	end()
	io.WriteString(in, "go\n")
	rest, _ := io.ReadAll(r)
	out.Write(rest)
	if err := cmd.Wait(); err != nil {
		t.Errorf("reset: %v\nstderr: %s", err, stderr.String())
	}
	return out.String()
}

func checkReset(t *testing.T, out string) {
	t.Helper()
	for _, want := range []string{
		"accel 1 1\n",
		"rcvtimeo -1 Resource temporarily unavailable\n",
		"waited-enough 1\n",
		"eintr -1 Interrupted system call\n",
		"eintr-timeo -1 Interrupted system call\n",
		"restarted 4 \n",
		"poll err-or-hup 1\n",
		"read -1 Connection reset by peer\n",
		"write fails 1\n",
		"read-again 0 \n",
		"so_error-after 0\n",
		"new accel 0 0\n",
		"done\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("reset: no %q in\n%s", want, out)
		}
	}
}

// TestSmcrdAborts: smcrd ends its connections (shutdown): programs read a
// reset, and new connections are plain TCP.
func TestSmcrdAborts(t *testing.T) {
	build(t)
	path := filepath.Join(t.TempDir(), "direct.sock")
	s, err := daemon.NewDirectServer(daemon.DirectOptions{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	out := runReset(t, path, func() { s.Close() })
	checkReset(t, out)
}

// TestSmcrdKilled: smcrd dies (kill -9): the channels hang up, programs read a
// reset, never a clean EOF, and new connections are plain TCP.
func TestSmcrdKilled(t *testing.T) {
	build(t)
	path := filepath.Join(t.TempDir(), "direct.sock")
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), "SMCR_PRELOAD_TEST_SMCRD="+path)
	stdout, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	helper.Stderr = os.Stderr
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	defer helper.Process.Kill()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "serving\n" {
		t.Fatalf("fake smcrd: %q %v", line, err)
	}
	out := runReset(t, path, func() {
		helper.Process.Kill()
		helper.Wait()
		// A killed smcrd leaves its socket and its policy page (fresh for
		// 3 s more): the library finds no one at the socket and passes
		// new connections through.
	})
	checkReset(t, out)
}
