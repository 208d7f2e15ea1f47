// Package cli is smcrctl: a verb per file, all talking to smcrd through the typed
// control client. Not part of RFC 7609; the verbs and their output follow AIX
// (chdev, lsattr -E) and Linux smc-tools (smcss, smcr stats, smcr linkgroup).
//
// Exit codes, for scripts:
//
//	0  success
//	1  smcrd answered with an error (a refused value, a failure inside smcrd)
//	2  usage error (unknown verb or flag, missing argument)
//	3  smcrd is not running (no control socket, or nothing listening on it)
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/smcr-io/smcr/config"
	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/internal/manpage"
	smcrversion "github.com/smcr-io/smcr/internal/version"
)

// Exit codes (see the package doc).
const (
	ExitOK         = 0
	ExitError      = 1
	ExitUsage      = 2
	ExitNotRunning = 3
)

// Version, when set, is the version smcrctl reports (tests); the build stamps
// it in package version.
var Version = ""

func version() string {
	if Version != "" {
		return Version
	}
	return smcrversion.String()
}

// timeout bounds every call to smcrd: a wedged daemon must not hang a script.
const timeout = 10 * time.Second

// command is one verb.
type command struct {
	name     string
	synopsis string // arguments after the verb, for the usage line
	short    string // one line for the verb list
	long     string // what it does, options and examples, for --help
	// flags defines the verb's own flags on fs; nil for none.
	flags func(fs *flag.FlagSet, o *options)
	// stopAtArg: the first argument ends the flags (a program's own follow).
	stopAtArg bool
	// run does the work; args are the positional arguments.
	run func(e *env, o *options, args []string) error
}

// options are every verb's flags in one place; each verb defines the ones it takes.
type options struct {
	socket  string
	json    bool
	detail  bool
	reset   bool
	persist bool
	forget  bool

	directSocket string
}

// env is what a verb runs with.
type env struct {
	ctx    context.Context
	stdout io.Writer
	stderr io.Writer
	client *control.Client
}

// usageError makes Run exit with ExitUsage.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// commands in the order `smcrctl --help` lists them.
var commands = []*command{
	statusCmd, enableCmd, disableCmd, setCmd, showCmd,
	linkgroupsCmd, linksCmd, devicesCmd, connsCmd, historyCmd, peersCmd, listenersCmd, probeCmd, statsCmd, runCmd, versionCmd,
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

const globalUsage = `smcrctl: the operator's command line for smcrd (SMC-R, RFC 7609).

Usage: smcrctl [-s SOCKET] [--json] VERB [OPTIONS] [ARGS]

Verbs:
%s
Options for every verb:
  -s, --socket PATH  smcrd's control socket (default %s)
  -h, --help         explain the verb, with examples

Every show verb takes --json for scripts, before the verb or after it.

Exit codes:
  0  success
  1  smcrd answered with an error
  2  usage error
  3  smcrd is not running

Run 'smcrctl VERB --help' for a verb's options and examples; 'smcrctl help --man'
writes this manual as a man page (smcrctl.8).
`

func writeGlobalUsage(w io.Writer) {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.short)
	}
	tw.Flush()
	fmt.Fprintf(w, globalUsage, b.String(), defaultSocket())
}

func defaultSocket() string { return config.Default().ControlSocket }

// Run runs smcrctl with args (without the program name) and returns the exit code.
func Run(args []string, stdout, stderr io.Writer) int {
	var o options
	gfs := flag.NewFlagSet("smcrctl", flag.ContinueOnError)
	gfs.SetOutput(io.Discard)
	socketFlags(gfs, &o)
	jsonFlag(gfs, &o) // also before the verb: smcrctl --json status
	help := gfs.Bool("h", false, "")
	gfs.BoolVar(help, "help", false, "")
	if err := gfs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			writeGlobalUsage(stdout)
			return ExitOK
		}
		fmt.Fprintf(stderr, "smcrctl: %v\nRun 'smcrctl --help' for usage.\n", err)
		return ExitUsage
	}
	rest := gfs.Args()
	if *help {
		writeGlobalUsage(stdout)
		return ExitOK
	}
	if len(rest) == 0 {
		writeGlobalUsage(stderr)
		return ExitUsage
	}
	verb, rest := rest[0], rest[1:]
	if verb == "help" {
		return runHelp(rest, stdout, stderr)
	}
	cmd := lookup(verb)
	if cmd == nil {
		fmt.Fprintf(stderr, "smcrctl: unknown verb %q\nRun 'smcrctl --help' for the list.\n", verb)
		return ExitUsage
	}

	fs := flag.NewFlagSet("smcrctl "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	socketFlags(fs, &o)
	jsonBefore := o.json
	if cmd.flags != nil {
		cmd.flags(fs, &o) // defining --json again sets it false
	}
	if jsonBefore && fs.Lookup("json") == nil {
		fmt.Fprintf(stderr, "smcrctl %s: --json: the verb prints nothing to format\nRun 'smcrctl %s --help' for usage.\n", cmd.name, cmd.name)
		return ExitUsage
	}
	var pos []string
	var err error
	if cmd.stopAtArg {
		err = fs.Parse(rest)
		pos = fs.Args()
	} else {
		pos, err = parseInterleaved(fs, rest)
	}
	o.json = o.json || jsonBefore
	if errors.Is(err, flag.ErrHelp) {
		writeCommandHelp(stdout, cmd)
		return ExitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "smcrctl %s: %v\nRun 'smcrctl %s --help' for usage.\n", cmd.name, err, cmd.name)
		return ExitUsage
	}

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	e := &env{ctx: ctx, stdout: stdout, stderr: stderr, client: control.NewClient(o.socket)}
	defer e.client.Close()
	err = cmd.run(e, &o, pos)
	return exitFor(err, cmd, stderr)
}

func exitFor(err error, cmd *command, stderr io.Writer) int {
	var ue *usageError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "smcrctl %s: %v\nRun 'smcrctl %s --help' for usage.\n", cmd.name, err, cmd.name)
		return ExitUsage
	case errors.Is(err, control.ErrNotRunning):
		fmt.Fprintf(stderr, "smcrctl: %v\n", err)
		return ExitNotRunning
	case errors.As(err, new(*control.APIError)):
		// smcrd's own message names what it refused (set: max_memory: ...).
		fmt.Fprintf(stderr, "smcrctl: %v\n", err)
		return ExitError
	}
	fmt.Fprintf(stderr, "smcrctl %s: %v\n", cmd.name, err)
	return ExitError
}

func runHelp(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		writeGlobalUsage(stdout)
		return ExitOK
	}
	if len(args) == 1 && args[0] == "--man" {
		if err := writeMan(stdout); err != nil {
			fmt.Fprintf(stderr, "smcrctl: %v\n", err)
			return ExitError
		}
		return ExitOK
	}
	cmd := lookup(args[0])
	if cmd == nil {
		fmt.Fprintf(stderr, "smcrctl: unknown verb %q\nRun 'smcrctl --help' for the list.\n", args[0])
		return ExitUsage
	}
	writeCommandHelp(stdout, cmd)
	return ExitOK
}

// writeMan writes smcrctl's manual page (smcrctl.8): the global help and
// every verb's, as smcrctl prints them.
func writeMan(w io.Writer) error {
	var global, verbs strings.Builder
	writeGlobalUsage(&global)
	for i, c := range commands {
		if i > 0 {
			verbs.WriteString("\n")
		}
		writeCommandHelp(&verbs, c)
	}
	return manpage.Write(w, "smcrctl", "8", "the operator's command line for smcrd (SMC-R, RFC 7609)",
		manpage.Section{Title: "DESCRIPTION", Text: global.String()},
		manpage.Section{Title: "VERBS", Text: verbs.String()},
		manpage.Section{Title: "SEE ALSO", Text: "smcrd(8), smcrd.conf(5)"})
}

func writeCommandHelp(w io.Writer, cmd *command) {
	fmt.Fprintf(w, "Usage: smcrctl %s", cmd.name)
	if cmd.synopsis != "" {
		fmt.Fprintf(w, " %s", cmd.synopsis)
	}
	fmt.Fprintf(w, "\n\n%s\n\n%s\n", cmd.short, strings.TrimSpace(cmd.long))
	fmt.Fprintf(w, "\nEvery verb also takes:\n  -s, --socket PATH  smcrd's control socket (default %s)\n", defaultSocket())
}

func socketFlags(fs *flag.FlagSet, o *options) {
	if o.socket == "" {
		o.socket = defaultSocket()
	}
	fs.StringVar(&o.socket, "s", o.socket, "")
	fs.StringVar(&o.socket, "socket", o.socket, "")
}

func jsonFlag(fs *flag.FlagSet, o *options) { fs.BoolVar(&o.json, "json", false, "") }

func persistFlag(fs *flag.FlagSet, o *options) { fs.BoolVar(&o.persist, "P", false, "") }

// parseInterleaved lets flags follow arguments (`set a=1 -P`), which package flag
// alone does not; "--" ends the flags.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		// fs.Parse stopped at a non-flag or after "--".
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func noArgs(args []string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q", args[0])
	}
	return nil
}

// writeJSON prints v for scripts: indented, one document.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table writes aligned columns; the caller writes tab-separated cells and Flushes.
func table(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// row writes one tab-separated line.
func row(w io.Writer, cells ...any) {
	for i, c := range cells {
		if i > 0 {
			io.WriteString(w, "\t")
		}
		fmt.Fprint(w, c)
	}
	io.WriteString(w, "\n")
}

// orDash shows an empty cell as "-" so columns stay readable.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func seconds(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(time.Second).String()
}

func hexCode(c uint32) string { return fmt.Sprintf("0x%08x", c) }
