// status: is smcrd running, since when, enabled or not, with which providers.

package cli

import (
	"strings"

	"github.com/smcr-io/smcr/control"
)

var statusCmd = &command{
	name:  "status",
	short: "show whether smcrd runs, is enabled, and with which providers",
	long: `Prints smcrd's version, its state (serving, or draining once it was told to
stop: new connections then go direct while open ones finish), process id,
uptime, whether matching connections are redirected (enabled), the RDMA
providers in use, the configuration file and how many SMC-R connections and
link groups are open.

Options:
  --json  print the status as JSON

Examples:
  smcrctl status
  smcrctl status --json | jq .enabled`,
	flags: jsonFlag,
	run: func(e *env, o *options, args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		st, err := e.client.Status(e.ctx)
		if err != nil {
			return err
		}
		if o.json {
			return writeJSON(e.stdout, st)
		}
		enabled := "no (new connections are plain TCP)"
		if st.Enabled {
			enabled = "yes"
		}
		tw := table(e.stdout)
		row(tw, "smcrd:", st.Version)
		row(tw, "state:", stateText(st.State))
		row(tw, "pid:", st.PID)
		row(tw, "uptime:", seconds(st.UptimeSeconds))
		row(tw, "enabled:", enabled)
		providers := strings.Join(st.Providers, ",")
		if providers == "" {
			// Nothing opened a device at start: worth saying what it means.
			providers = "none (no device opened: smcrd redirects nothing, connections go direct; its log says why)"
		}
		row(tw, "providers:", providers)
		row(tw, "config file:", orDash(st.ConfigFile))
		row(tw, "connections:", st.Connections)
		row(tw, "link groups:", st.LinkGroups)
		return tw.Flush()
	},
}

// stateText says what smcrd's state means for the connections.
func stateText(s string) string {
	switch s {
	case control.StateStarting:
		return "starting (new connections go direct until it serves)"
	case control.StateDraining:
		return "draining (stopping: new connections go direct, open ones finish)"
	}
	return orDash(s) // serving, or an older smcrd that does not say
}
