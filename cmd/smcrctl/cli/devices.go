// devices: the RDMA devices smcrd can build links on (RFC 7609 §2.1 RNICs), after
// `smcr device`.

package cli

var devicesCmd = &command{
	name:     "devices",
	synopsis: "[--json]",
	short:    "list RDMA devices: provider, port, state, interface, GID, MTU, use",
	long: `Lists the devices smcrd can build links on: RDMA hardware (rdma provider),
same-host shared memory (shm) and the software emulation (soft).

Columns: DEVICE, PROVIDER, PORT, STATE, IF (network interface), GID, MAC, MTU,
LGS (link groups using it), LINKS.

Options:
  --json  print the devices as JSON

Examples:
  smcrctl devices
  smcrctl devices --json | jq -r '.[].name'`,
	flags: jsonFlag,
	run: func(e *env, o *options, args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		ds, err := e.client.Devices(e.ctx)
		if err != nil {
			return err
		}
		if o.json {
			return writeJSON(e.stdout, ds)
		}
		tw := table(e.stdout)
		row(tw, "DEVICE", "PROVIDER", "PORT", "STATE", "IF", "GID", "MAC", "MTU", "LGS", "LINKS")
		for _, d := range ds {
			row(tw, d.Name, d.Provider, d.Port, d.State, orDash(d.Interface), orDash(d.GID), orDash(d.MAC), d.MTU, d.LinkGroups, d.Links)
		}
		return tw.Flush()
	},
}
