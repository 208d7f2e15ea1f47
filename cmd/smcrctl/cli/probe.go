// probe: whether a connection to a destination would be tried over SMC-R now,
// and which check stops it, after smc-tools' smc_chk.

package cli

import "fmt"

var probeCmd = &command{
	name:     "probe",
	synopsis: "ADDR:PORT [--json]",
	short:    "say whether a connection to ADDR:PORT would go SMC-R, and why not (like smc_chk)",
	long: `Runs, from smcrd's view, the checks its programs make on a program's connect to
ADDR:PORT: smcrd enabled, the port in port_range_list, a device to build links
on, the route through an interface of ip_addr_list, the peer cache (a
destination without SMC-R is connected to directly for a while), and no failed
connect on record. A connection passes them all only from a program in the
cgroup smcrd serves (shown); the peer's smcrd then decides at the connect (a
server whose port it does not list, or without SMC-R, gets plain TCP). Exit
code 0 either way: the answer is in the output.

Options:
  --json  print the checks as JSON

Examples:
  smcrctl probe 192.0.2.7:6379
  smcrctl probe [2001:db8::7]:443 --json | jq .smcr`,
	flags: jsonFlag,
	run: func(e *env, o *options, args []string) error {
		if len(args) != 1 {
			return usagef("want one destination, ADDR:PORT")
		}
		p, err := e.client.Probe(e.ctx, args[0])
		if err != nil {
			return err
		}
		if o.json {
			return writeJSON(e.stdout, p)
		}
		verdict := "SMC-R is tried"
		if !p.SMCR {
			verdict = "plain TCP"
		}
		cgroup := p.Cgroup
		if cgroup == "" {
			cgroup = "/ (every program)"
		}
		fmt.Fprintf(e.stdout, "%s from a program in cgroup %s: %s\n\n", p.Dst, cgroup, verdict)
		tw := table(e.stdout)
		row(tw, "CHECK", "OK", "DETAIL")
		for _, c := range p.Checks {
			ok := "no"
			if c.OK {
				ok = "yes"
			}
			row(tw, c.Check, ok, c.Detail)
		}
		return tw.Flush()
	},
}
