// Command smcrbench runs smcr's benchmarks beside their baselines and writes the
// report: report.md, report.json and PNG plots (RFC 7609 SMC-R against TCP).
// The scenarios and figures are package bench's; this is flags and files.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/smcr-io/smcr/bench"
)

const usage = `smcrbench: measure smcr beside TCP and memcpy on this machine, and write a report.

Usage:
  smcrbench [-out DIR] [-quick] [flags]

Writes DIR/report.md, DIR/report.json, DIR/throughput.png, DIR/latency.png and
DIR/setup.png. Needs root (network namespaces, cgroups, BPF for the transparent
path). The default run takes under 10 minutes on a 2-core VM; -quick under 2.

Flags:
`

func main() {
	if bench.IsPeer() {
		bench.RunPeer() // this binary re-executed as a benchmark peer; does not return
	}
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("smcrbench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	out := fs.String("out", "bench-out", "`directory` for the report and plots")
	quick := fs.Bool("quick", false, "the short form for CI: fewer repeats, smaller transfers")
	repeats := fs.Int("repeats", 0, "runs of each figure (default 5, quick 2)")
	providers := fs.String("providers", "shm,soft", "comma-separated verbs `providers` to measure")
	smcrd := fs.String("smcrd", "", "smcrd `binary` for the transparent path (default: go build ./cmd/smcrd)")
	noTransparent := fs.Bool("no-transparent", false, "skip the transparent path (smcrd)")
	profile := fs.String("profile", "", "`directory` for the peers' CPU, mutex and block profiles, one set per job (go tool pprof)")
	rmbKiB := fs.Int("rmb-kib", 0, "the RMB each engine peer offers, in `KiB` (default: the engine's)")
	verbose := fs.Bool("v", false, "log progress to stderr")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if *rmbKiB < 0 {
		fmt.Fprintln(os.Stderr, "smcrbench: -rmb-kib must not be negative")
		return 2
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := bench.Run(ctx, bench.Options{
		Quick: *quick, Repeats: *repeats, Providers: strings.Split(*providers, ","),
		Smcrd: *smcrd, NoTransparent: *noTransparent, ProfileDir: *profile, RMBSize: *rmbKiB << 10,
		Command: "go run ./cmd/smcrbench " + strings.Join(args, " "), Logger: log,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "smcrbench:", err)
		return 1
	}
	files, err := bench.WriteAll(rep, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "smcrbench:", err)
		return 1
	}
	for _, f := range files {
		fmt.Println(f)
	}
	return 0
}
