// Package vm runs commands inside a throw-away qemu VM that has a real verbs stack
// (soft-RoCE, rdma_rxe, on the Debian kernel) while the host kernel has none: the
// way the ibv provider, and later the engine's data path, are tested on real RDMA
// (RFC 7609 runs over RoCE). The VM itself is scripted in run.sh and init.sh.
package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Guest facts the tests can rely on (init.sh sets them up).
const (
	// Netdev carries rxe0 and has GuestIP.
	Netdev = "dummy0"
	// GuestIP is Netdev's address; rxe0's RoCE v2 GID encodes it.
	GuestIP = "10.99.0.1"
	// Device is the soft-RoCE device on Netdev; rxe1 is on lo.
	Device = "rxe0"
	// Netdev2 carries rxe2, a second device for a link group's second link.
	Netdev2 = "dummy1"
)

// ErrNoVM is returned when this machine cannot run the VM (no qemu, busybox...).
var ErrNoVM = errors.New("vm: cannot run the soft-RoCE VM here")

// ErrTimeout is returned when the VM ran out of time.
var ErrTimeout = errors.New("vm: timed out")

// Options describe one command to run in the guest.
type Options struct {
	// Args is the command and its arguments. Binaries must lie in this repository
	// (bound into the guest even when it is checked out under /tmp) or outside /tmp,
	// /run and /dev, which the guest mounts afresh (see BinDir).
	Args []string
	// Dir is the working directory, a host path; the caller's by default.
	Dir string
	// Env adds VAR=value pairs to the guest's minimal environment.
	Env []string
	// Timeout bounds the whole VM run, boot included (default 5 minutes).
	Timeout time.Duration
	// MemoryMB is the guest memory (default 2048).
	MemoryMB int
	// Output receives the guest console as it comes, besides Result.Output.
	Output io.Writer
}

// Result is what the guest did.
type Result struct {
	ExitCode int
	Output   []byte // the guest's console: the command's output and kernel messages
	Elapsed  time.Duration
}

// Dir returns the directory of the harness scripts.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

// BinDir returns a fresh directory, visible in the guest, for test binaries;
// the caller removes it.
func BinDir() (string, error) {
	base := filepath.Join(Dir(), "cache", "bin")
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", fmt.Errorf("vm: bin dir: %w", err)
	}
	return os.MkdirTemp(base, "run.")
}

// Available reports whether the VM can run here, with what is missing.
func Available() error {
	for _, tool := range []string{"qemu-system-x86_64", "busybox", "cpio", "depmod", "modprobe", "apt-get", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%w: %s not found (scripts/deps.sh installs qemu-system-x86 busybox-static kmod cpio)", ErrNoVM, tool)
		}
	}
	return nil
}

// Run boots the VM, runs o.Args in it and returns the guest's exit code and
// output. A hang ends at o.Timeout with ErrTimeout. The first run downloads and
// unpacks the Debian kernel into test/vm/cache (kernel.sh).
func Run(ctx context.Context, o Options) (Result, error) {
	if len(o.Args) == 0 {
		return Result{}, errors.New("vm: no command")
	}
	if err := Available(); err != nil {
		return Result{}, err
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	args := []string{"-t", strconv.Itoa(int(o.Timeout.Seconds()))}
	if o.MemoryMB > 0 {
		args = append(args, "-m", strconv.Itoa(o.MemoryMB))
	}
	for _, e := range o.Env {
		args = append(args, "-e", e)
	}
	args = append(args, "--")
	args = append(args, o.Args...)
	// run.sh enforces the timeout; the context is the caller's own bound, with
	// room for the kernel download on a first run.
	cmd := exec.CommandContext(ctx, filepath.Join(Dir(), "run.sh"), args...)
	cmd.Dir = o.Dir
	var out bytes.Buffer
	w := io.Writer(&out)
	if o.Output != nil {
		w = io.MultiWriter(&out, o.Output)
	}
	cmd.Stdout, cmd.Stderr = w, w
	start := time.Now()
	err := cmd.Run()
	res := Result{Output: out.Bytes(), Elapsed: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return res, nil
	case errors.As(err, &ee):
		res.ExitCode = ee.ExitCode()
		switch res.ExitCode {
		case 124:
			return res, fmt.Errorf("%w after %v", ErrTimeout, o.Timeout)
		case 125:
			return res, fmt.Errorf("vm: the guest did not run the command: %s", lastLines(res.Output, 5))
		}
		return res, nil
	}
	return res, fmt.Errorf("vm: run: %w", err)
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
