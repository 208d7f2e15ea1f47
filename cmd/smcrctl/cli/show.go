// show config: every attribute with its value and description (AIX lsattr -E).

package cli

var showCmd = &command{
	name:     "show",
	synopsis: "config [--json]",
	short:    "show the configuration attributes (like AIX lsattr -E)",
	long: `'show config' prints every attribute smcrd knows with its current value and its
description, like AIX lsattr -E; 'smcrctl set' changes them. The value is the
one in effect: an attribute smcrd reads only at start, set since, shows the value
the next start takes as pending.

Options:
  --json  print the attributes as JSON (name, value, default, description, and
          pending where set)

Examples:
  smcrctl show config
  smcrctl show config --json | jq -r '.[] | select(.value != .default) | .name'`,
	flags: jsonFlag,
	run: func(e *env, o *options, args []string) error {
		if len(args) != 1 || args[0] != "config" {
			return usagef("want 'show config'")
		}
		attrs, err := e.client.Config(e.ctx)
		if err != nil {
			return err
		}
		if o.json {
			return writeJSON(e.stdout, attrs)
		}
		tw := table(e.stdout)
		row(tw, "ATTRIBUTE", "VALUE", "DESCRIPTION")
		for _, a := range attrs {
			v := a.Value
			if a.Pending != "" {
				v += " (pending: " + a.Pending + ", at restart)"
			}
			row(tw, a.Name, v, a.Description)
		}
		return tw.Flush()
	},
}
