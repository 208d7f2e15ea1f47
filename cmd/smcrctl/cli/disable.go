// disable: turn redirection off, so every new connection is plain TCP.

package cli

import "flag"

var disableCmd = &command{
	name:     "disable",
	synopsis: "[-P]",
	short:    "stop accelerating: new connections are plain TCP",
	long: `Turns SMC-R off: new connections are plain TCP, untouched by smcrd. Connections
already on SMC-R go on until they close. Without -P the change lasts until smcrd
restarts.

Options:
  -P  also write enabled=no to the configuration file (like AIX chdev -P)

Examples:
  smcrctl disable
  smcrctl disable -P`,
	flags: func(fs *flag.FlagSet, o *options) { persistFlag(fs, o) },
	run:   func(e *env, o *options, args []string) error { return switchEnabled(e, o, args, false) },
}
