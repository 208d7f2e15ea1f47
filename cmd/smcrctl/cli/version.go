// version: smcrctl's version and smcrd's.

package cli

import (
	"fmt"

	"github.com/smcr-io/smcr/control"
)

var versionCmd = &command{
	name:     "version",
	synopsis: "[--json]",
	short:    "print smcrctl's and smcrd's versions",
	long: `Prints smcrctl's version, then smcrd's. When smcrd is not running, smcrctl's
version is still printed and the exit code is 3.

Options:
  --json  print {"smcrctl": ..., "smcrd": ..., "api": ...} as JSON

Examples:
  smcrctl version`,
	flags: jsonFlag,
	run: func(e *env, o *options, args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		st, err := e.client.Status(e.ctx)
		if o.json {
			v := map[string]string{"smcrctl": version(), "api": control.APIVersion}
			if err == nil {
				v["smcrd"] = st.Version
			}
			if jerr := writeJSON(e.stdout, v); jerr != nil {
				return jerr
			}
			return err
		}
		fmt.Fprintf(e.stdout, "smcrctl %s (control API %s)\n", version(), control.APIVersion)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "smcrd   %s\n", st.Version)
		return nil
	},
}
