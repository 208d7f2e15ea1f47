// smcrctl is the operator's command line for smcrd: enable/disable, set and show
// the configuration, list link groups, links, devices, connections and peers, show
// and reset the statistics. Everything is in package cli; this main only runs it.
package main

import (
	"os"

	"github.com/smcr-io/smcr/cmd/smcrctl/cli"
)

func main() {
	os.Exit(cli.Run(os.Args[1:], os.Stdout, os.Stderr))
}
