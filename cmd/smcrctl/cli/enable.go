// enable: turn redirection of matching connections to SMC-R on (RFC 7609 §3.1's
// "SMC-R enabled" host state).

package cli

import "flag"

var enableCmd = &command{
	name:     "enable",
	synopsis: "[-P]",
	short:    "accelerate matching new connections with SMC-R",
	long: `Turns SMC-R on: new TCP connections that match port_range_list and ip_addr_list
are tried over SMC-R (peers without SMC-R fall back to TCP). Open connections are
not touched. Without -P the change lasts until smcrd restarts.

Options:
  -P  also write enabled=yes to the configuration file (like AIX chdev -P)

Examples:
  smcrctl enable
  smcrctl enable -P`,
	flags: func(fs *flag.FlagSet, o *options) { persistFlag(fs, o) },
	run:   func(e *env, o *options, args []string) error { return switchEnabled(e, o, args, true) },
}

func switchEnabled(e *env, o *options, args []string, on bool) error {
	if err := noArgs(args); err != nil {
		return err
	}
	var err error
	if on {
		err = e.client.Enable(e.ctx, o.persist)
	} else {
		err = e.client.Disable(e.ctx, o.persist)
	}
	if err != nil {
		return err
	}
	msg := "SMC-R enabled: matching new connections are accelerated"
	if !on {
		msg = "SMC-R disabled: new connections are plain TCP; open connections go on as they are"
	}
	if o.persist {
		msg += " (written to the configuration file)"
	} else {
		msg += " (until smcrd restarts; -P to keep it)"
	}
	_, err = e.stdout.Write([]byte(msg + "\n"))
	return err
}
