// listeners: the TCP listeners of smcrd's network namespace and whether smcrd
// steers their SMC-R connections (RFC 7609 §3.3: the server side of the SMC
// option), after `smcss -l`.

package cli

import "strconv"

var listenersCmd = &command{
	name:     "listeners",
	synopsis: "[--json]",
	short:    "list the TCP listeners and whether smcrd steers their connections (like smcss -l)",
	long: `Lists the TCP sockets listening in smcrd's network namespace (smcrd's own
left out) and whether smcrd steers the connections that come to them with the
SMC option: smcrd accepts those, runs SMC-R with the client's smcrd and carries
the bytes to the listener. A listener that is not steered gets its connections
as plain TCP, and REASON says why: smcrd disabled, the port not in
port_range_list, no device to build links on, or a listener on loopback only.

Columns: ADDRESS, PORT, STEERED (yes or no), REASON.

Options:
  --json  print the listeners as JSON

Examples:
  smcrctl listeners
  smcrctl listeners --json | jq -r '.[] | select(.steered) | .port'`,
	flags: jsonFlag,
	run: func(e *env, o *options, args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		ls, err := e.client.Listeners(e.ctx)
		if err != nil {
			return err
		}
		if o.json {
			return writeJSON(e.stdout, ls)
		}
		tw := table(e.stdout)
		row(tw, "ADDRESS", "PORT", "STEERED", "REASON")
		for _, l := range ls {
			steered := "no"
			if l.Steered {
				steered = "yes"
			}
			row(tw, l.Addr, strconv.Itoa(int(l.Port)), steered, orDash(l.Reason))
		}
		return tw.Flush()
	},
}
