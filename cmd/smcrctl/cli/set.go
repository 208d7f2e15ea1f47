// set: change configuration attributes at run time, all or none, optionally
// persisted (AIX chdev, with and without -P).

package cli

import (
	"flag"
	"fmt"
	"strings"

	"github.com/smcr-io/smcr/config"
	"github.com/smcr-io/smcr/control"
)

var setCmd = &command{
	name:     "set",
	synopsis: "ATTRIBUTE=VALUE... [-P]",
	short:    "change configuration attributes (like AIX chdev)",
	long: `Changes one or more attributes. Every value is checked first: if any is wrong,
nothing changes and the error names the attribute and the problem. Changes apply to
new connections at once, except those smcrd reads only at start:
` + wrapList(config.RestartOnly()) + `
For these a note says they apply when smcrd restarts, so set them with -P.
Without -P changes last until smcrd restarts; with -P the attributes named here,
and only those, are also written to the configuration file as it is now (earlier
changes made without -P stay temporary), which needs an smcrd started with
-config FILE.
'smcrctl show config' lists the attributes.

Options:
  -P  also write the change to the configuration file (like AIX chdev -P)

Examples:
  smcrctl set port_range_list=5201,6379
  smcrctl set ip_addr_list=eth0,eth1 max_memory=512 -P
  smcrctl set enabled=no`,
	flags: func(fs *flag.FlagSet, o *options) { persistFlag(fs, o) },
	run: func(e *env, o *options, args []string) error {
		if len(args) == 0 {
			return usagef("no ATTRIBUTE=VALUE given")
		}
		for _, a := range args {
			if !strings.Contains(a, "=") {
				return usagef("%q is not ATTRIBUTE=VALUE", a)
			}
		}
		res, err := e.client.SetConfig(e.ctx, control.SetConfigRequest{Assignments: args, Persist: o.persist})
		if err != nil {
			return err
		}
		if len(res.Changed) == 0 {
			fmt.Fprintln(e.stdout, "nothing changed: the attributes already have these values")
		}
		tw := table(e.stdout)
		for _, a := range res.Changed {
			row(tw, a.Name, "=", a.Value)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, n := range res.Notes {
			fmt.Fprintln(e.stdout, "note:", n)
		}
		switch {
		case res.Persisted:
			fmt.Fprintf(e.stdout, "written to %s\n", res.File)
		case len(res.Changed) > 0:
			fmt.Fprintln(e.stdout, "in effect until smcrd restarts (-P to write the configuration file)")
		}
		return nil
	},
}

// wrapList lays names out as a comma-separated list in lines of at most 80
// columns, each indented by two spaces.
func wrapList(names []string) string {
	var b strings.Builder
	line := " "
	for i, n := range names {
		item := " " + n
		if i < len(names)-1 {
			item += ","
		}
		if len(line)+len(item) > 80 {
			b.WriteString(line + "\n")
			line = " "
		}
		line += item
	}
	return b.String() + line
}
