// Command smcrd is the smcr daemon: it gives unmodified TCP applications SMC-R
// (RFC 7609) through eBPF redirection and steering. The logic is in package daemon;
// this is flags, logging, the control socket, signals and sd_notify.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/smcr-io/smcr/bpf"
	"github.com/smcr-io/smcr/config"
	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/daemon"
	"github.com/smcr-io/smcr/internal/manpage"
	"github.com/smcr-io/smcr/internal/sdnotify"
	"github.com/smcr-io/smcr/internal/version"
)

const usage = `smcrd: transparent SMC-R (RFC 7609) for unmodified TCP applications.

smcrd loads smcr's eBPF programs into a cgroup v2 (the root by default), so that
TCP connections to the ports in port_range_list are tried over SMC-R: the client
side is redirected through smcrd, which proposes SMC-R to the peer's smcrd; peers
without SMC-R get plain TCP and are remembered for peer_cache_ttl. If smcrd stops,
connections go direct again within the liveness TTL. Operate it with smcrctl.

Usage:
  smcrd [-config FILE] [flags]

Examples:
  smcrd                                 # embedded defaults (see -print-default-config)
  smcrd -config /etc/smcr/smcrd.conf    # a configuration file; smcrctl set -P writes it
  smcrd -print-default-config > /etc/smcr/smcrd.conf

Signals: SIGTERM/SIGINT drain the connections smcrd holds and exit, and a second
one aborts those still open at once; SIGUSR1 logs the link groups, links and
connections.

Flags:
`

// defaultProcs is smcrd's GOMAXPROCS: half the CPUs the runtime would use
// (maxprocs, which follows the cgroup's CPU limit), at least 1, unless the
// environment set GOMAXPROCS. smcrd shares the host with the applications whose
// bytes it carries, and each relayed byte costs them a system call as well:
// with a P per CPU, smcrd's threads wake each other across CPUs the
// applications need. On a 2-CPU VM one P instead of two gave 22% more
// throughput through two smcrds and a 20% lower 64 B p50 (docs/benchmarks-log.md).
func defaultProcs(maxprocs int, fromEnv bool) int {
	if fromEnv {
		return maxprocs
	}
	return max(1, maxprocs/2)
}

// procsUsage is -procs' help, naming its default here, n, unless n < 0 (the
// man page, the same on every machine).
func procsUsage(n int) string {
	here := ""
	if n >= 0 {
		here = fmt.Sprintf(" %d here", n)
	}
	return fmt.Sprintf("run Go code on at most `n` CPUs at once (default%s: half of those smcrd may use, at least 1, or GOMAXPROCS from the environment)", here)
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("smcrd", flag.ContinueOnError)
	// Help goes to stdout and exits 0, errors to stderr with a pointer to it,
	// as smcrctl does.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	cfgFile := fs.String("config", "", "configuration `file` (default: the embedded defaults)")
	printDefault := fs.Bool("print-default-config", false, "print the embedded default configuration and exit")
	pinDir := fs.String("pin-dir", bpf.DefaultPinDir, "bpf filesystem `directory` for the pinned programs and maps, one per network namespace")
	shmDir := fs.String("shm-dir", "", "`directory` of the shm provider's rendezvous sockets, shared by the smcrds of one host (default $TMPDIR/smcr-shm)")
	liveness := fs.Duration("liveness-ttl", 3*time.Second, fmt.Sprintf("after a crash, connections go direct again within this `duration`, at least %v", daemon.MinLivenessTTL))
	sameHost := fs.Bool("direct-same-host", true, "over shm, programs with the direct mode's library on one host write into each other's rings; false: their bytes go through smcrd and SMC-R as between hosts")
	drain := fs.Duration("drain-timeout", 10*time.Second, "on SIGTERM, wait this `duration` for the connections smcrd holds before aborting them; 0 aborts them at once")
	showVersion := fs.Bool("version", false, "print the version and exit")
	man := fs.String("man", "", "write the manual `page` smcrd (smcrd.8) or smcrd.conf (smcrd.conf.5), made of this help and of the attributes' own text, and exit")
	_, envProcs := os.LookupEnv("GOMAXPROCS")
	autoProcs := defaultProcs(runtime.GOMAXPROCS(0), envProcs)
	// The flag's own default stays 0, so that the help shows the default once,
	// with where it comes from.
	procs := fs.Int("procs", 0, procsUsage(autoProcs))
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(stderr, "smcrd: %v\nRun 'smcrd -help' for usage.\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "smcrd: unexpected argument %q\nRun 'smcrd -help' for usage.\n", fs.Arg(0))
		return 2
	}
	if *man != "" {
		if err := writeMan(stdout, *man, fs); err != nil {
			fmt.Fprintf(stderr, "smcrd: -man: %v\n", err)
			return 2
		}
		return 0
	}
	if *showVersion {
		fmt.Fprintln(stdout, "smcrd", version.String())
		return 0
	}
	if *printDefault {
		stdout.Write(config.Default().Format())
		return 0
	}
	procsSet := false
	fs.Visit(func(f *flag.Flag) { procsSet = procsSet || f.Name == "procs" })
	if !procsSet {
		*procs = autoProcs
	}
	if *procs < 1 {
		fmt.Fprintf(stderr, "smcrd: -procs %d: must be at least 1\n", *procs)
		return 2
	}
	if *liveness < daemon.MinLivenessTTL {
		fmt.Fprintf(stderr, "smcrd: -liveness-ttl %v: must be at least %v\n", *liveness, daemon.MinLivenessTTL)
		return 2
	}
	if *drain < 0 {
		fmt.Fprintf(stderr, "smcrd: -drain-timeout %v: must not be negative (0: abort at once)\n", *drain)
		return 2
	}
	drainTimeout := *drain
	if drainTimeout == 0 {
		drainTimeout = -1 // daemon's 0 is its default; negative is no drain
	}
	runtime.GOMAXPROCS(*procs)
	cfg, err := config.Load(*cfgFile)
	if err != nil {
		fmt.Fprintf(stderr, "smcrd: %v\n", err)
		return 2
	}
	log := newLogger(cfg, stderr)
	log.Info("smcrd starting", "version", version.String(), "procs", *procs, "cpus", runtime.NumCPU())

	// NewServer looks the group up too, but only after daemon.New has loaded
	// and attached the programs: an unknown group must fail before that.
	for _, g := range []string{cfg.ControlGroup, cfg.MonitorGroup} {
		if _, err := control.LookupGroup(g); err != nil {
			log.Error("control socket", "err", err)
			return 1
		}
	}
	d, err := daemon.New(daemon.Options{
		Config: cfg, ConfigFile: *cfgFile, PinDir: *pinDir, ShmDir: *shmDir,
		LivenessTTL: *liveness, DrainTimeout: drainTimeout, Version: version.String(), Logger: log,
		NoSameHostBypass: !*sameHost,
	})
	var cfgErr *config.Error
	if errors.As(err, &cfgErr) { // a value the file loaded with, found wrong at start
		fmt.Fprintf(stderr, "smcrd: %v\n", cfgErr)
		return 2
	}
	if err != nil {
		log.Error("smcrd cannot start", "err", err)
		return 1
	}
	srv, err := control.NewServer(cfg.ControlSocket, cfg.ControlGroup, cfg.MonitorGroup, d, log)
	if err != nil {
		log.Error("control socket", "err", err)
		if err := d.Close(); err != nil {
			log.Error("release", "err", err)
		}
		return 1
	}
	stopMetrics, err := serveMetrics(cfg.MetricsAddress, d, log)
	if err != nil {
		fmt.Fprintf(stderr, "smcrd: %v\n", config.AttrError(*cfgFile, "metrics_address", err.Error()))
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		srv.Close(cctx)
		cancel()
		if err := d.Close(); err != nil {
			log.Error("release", "err", err)
		}
		return 1
	}

	// The first SIGTERM or SIGINT drains, a second one aborts what is left.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	go func() {
		s := <-sigs
		log.Info("signal received", "signal", s)
		sdnotify.Notify(sdnotify.Stopping, sdnotify.Status("draining"))
		stop()
		s = <-sigs
		log.Warn("second signal: stopping at once", "signal", s)
		d.Abort()
	}()
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		for range usr1 {
			d.LogState()
		}
	}()
	err = d.Run(ctx, func() {
		// The control socket answers once smcrd serves (its liveness set, its
		// listeners accepting): a script that waits for `smcrctl status` and
		// then starts its applications finds their connections redirected.
		// Requests made before wait in the socket's queue.
		go func() {
			if err := srv.Serve(); err != nil {
				log.Error("control socket", "err", err)
			}
		}()
		if _, err := sdnotify.Notify(sdnotify.Ready, sdnotify.Status("serving")); err != nil {
			log.Warn("sd_notify", "err", err)
		}
	})
	cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	srv.Close(cctx)
	stopMetrics(cctx)
	cancel()
	if err != nil {
		log.Error("shutdown", "err", err)
		return 1
	}
	log.Info("smcrd stopped")
	return 0
}

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var lvl slog.Level
	lvl.UnmarshalText([]byte(cfg.LogLevel)) // validated by config
	opts := &slog.HandlerOptions{Level: lvl}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// writeMan writes the manual page page: smcrd's (its help), or its
// configuration file's (the default configuration with every attribute's
// description, and when a change applies).
func writeMan(w io.Writer, page string, fs *flag.FlagSet) error {
	switch page {
	case "smcrd":
		var flags strings.Builder
		fs.Lookup("procs").Usage = procsUsage(-1)
		fs.SetOutput(&flags)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
		return manpage.Write(w, "smcrd", "8", "transparent SMC-R (RFC 7609) for unmodified TCP applications",
			manpage.Section{Title: "DESCRIPTION", Text: usage + flags.String()},
			manpage.Section{Title: "SEE ALSO", Text: "smcrctl(8), smcrd.conf(5); docs/operations.md (/usr/local/share/doc/smcr/operations.md)"})
	case "smcrd.conf":
		var restart strings.Builder
		for _, a := range config.RestartOnly() {
			fmt.Fprintf(&restart, "  %s: %s\n", a, config.AtRestart(a))
		}
		return manpage.Write(w, "smcrd.conf", "5", "smcrd's configuration file",
			manpage.Section{Title: "DESCRIPTION", Text: confFormat},
			manpage.Section{Title: "ATTRIBUTES", Text: "As smcrd -print-default-config writes them, each with its description and default:\n\n" + string(config.Default().Format())},
			manpage.Section{Title: "WHEN A CHANGE APPLIES", Text: "smcrctl set applies a change at once, but for these, read only when smcrd starts:\n\n" + restart.String()},
			manpage.Section{Title: "SEE ALSO", Text: "smcrd(8), smcrctl(8)"})
	}
	return fmt.Errorf("no page %q: smcrd or smcrd.conf", page)
}

// confFormat is smcrd.conf(5)'s description of the file.
const confFormat = `One attribute = value per line, as AIX attributes are written; # starts a
comment, lists are comma-separated, an attribute not set keeps its default.
smcrd -config FILE reads it (/etc/smcr/smcrd.conf under systemd); every error
names the file, the line and what is wrong, and a file with any error is
refused whole (exit 2). smcrctl set changes attributes of the running smcrd,
and with -P writes them into the file, keeping its comments and layout.
`
