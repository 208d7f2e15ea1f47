// run: start a program with the direct mode's library, libsmcr-preload.so, as
// Linux's smc_run starts one with AF_SMC: its TCP connections that smcrd
// accepts for SMC-R then carry their bytes through memory shared with smcrd
// (docs/direct.md).

package cli

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/smcr-io/smcr/config"
)

// PreloadLib is the library's file name.
const PreloadLib = "libsmcr-preload.so"

var runCmd = &command{
	name:      "run",
	synopsis:  "[--direct-socket PATH] [--] PROGRAM [ARGS...]",
	short:     "run a program with its TCP connections accelerated in the direct mode",
	stopAtArg: true,
	long: `Runs PROGRAM with libsmcr-preload.so preloaded (LD_PRELOAD), as Linux's smc_run
does: its connections that smcrd accepts for SMC-R (port_range_list, enabled)
move their bytes through memory shared with smcrd instead of through smcrd's
relay. The program's sockets stay its own TCP sockets. Without smcrd, or for
connections smcrd does not take, the library passes every call through.

The direct socket is direct.sock beside smcrd's control socket (-s), where
smcrd serves it unless direct_mode is no. When smcrd does not answer, the
program runs all the same.

The library is looked for in $SMCR_PRELOAD_LIB, then beside smcrctl
(../lib/smcr/ and its own directory). For a whole host, put its path in
/etc/ld.so.preload; for a container, set LD_PRELOAD and SMCR_DIRECT_SOCKET
in its environment and bind-mount the direct socket's directory
(docs/direct.md). SMCR_DIRECT=0 turns the library off for one program.

Options:
  --direct-socket PATH  smcrd's direct socket (default: direct.sock beside
                        the control socket smcrd says it has)

Examples:
  smcrctl run iperf3 -c 10.0.0.2
  smcrctl run -- redis-server --port 6379`,
	flags: func(fs *flag.FlagSet, o *options) { fs.StringVar(&o.directSocket, "direct-socket", "", "") },
	run:   runProgram,
}

func runProgram(e *env, o *options, args []string) error {
	if len(args) == 0 {
		return usagef("no program to run")
	}
	lib, err := findPreload()
	if err != nil {
		return err
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	sock := o.directSocket
	if sock == "" {
		c := config.Default()
		c.ControlSocket = o.socket
		sock = c.DirectSocket()
	}
	attrs, err := e.client.Config(e.ctx)
	switch {
	case err != nil:
		fmt.Fprintf(e.stderr, "smcrctl run: smcrd does not answer (%v); %s passes through until smcrd serves %s\n", err, PreloadLib, sock)
	case attrValue(attrs, "direct_mode") == "no":
		fmt.Fprintf(e.stderr, "smcrctl run: smcrd's direct_mode is no: %s's connections stay plain TCP\n", args[0])
	}
	env := setEnv(os.Environ(), "LD_PRELOAD", lib, true)
	if sock != "" {
		env = setEnv(env, "SMCR_DIRECT_SOCKET", sock, false)
	}
	e.client.Close()
	return syscall.Exec(path, args, env)
}

// findPreload finds the library: $SMCR_PRELOAD_LIB, or beside the executable.
func findPreload() (string, error) {
	if p := os.Getenv("SMCR_PRELOAD_LIB"); p != "" {
		return filepath.Abs(p)
	}
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find %s: %w", PreloadLib, err)
	}
	dir := filepath.Dir(self)
	tried := []string{filepath.Join(dir, "..", "lib", "smcr", PreloadLib), filepath.Join(dir, PreloadLib)}
	for _, p := range tried {
		if _, err := os.Stat(p); err == nil {
			return filepath.Clean(p), nil
		}
	}
	return "", errors.New("cannot find " + PreloadLib + " (tried " + strings.Join(tried, ", ") + "; set SMCR_PRELOAD_LIB)")
}

// setEnv sets key in env; with prepend, a value already there stays after ours
// (LD_PRELOAD lists libraries separated by spaces or colons).
func setEnv(env []string, key, val string, prepend bool) []string {
	for i, kv := range env {
		if old, ok := strings.CutPrefix(kv, key+"="); ok {
			if prepend && old != "" {
				val += ":" + old
			}
			env[i] = key + "=" + val
			return env
		}
	}
	return append(env, key+"="+val)
}

func attrValue(attrs []config.Attribute, name string) string {
	for _, a := range attrs {
		if a.Name == name {
			return a.Value
		}
	}
	return ""
}
