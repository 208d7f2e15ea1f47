// show config: every attribute with its value and description (AIX lsattr -E).

package cli

import (
	"slices"

	"github.com/smcr-io/smcr/control"
)

var showCmd = &command{
	name:     "show",
	synopsis: "config [ATTRIBUTE...] [--json]",
	short:    "show the configuration attributes (like AIX lsattr -E)",
	long: `'show config' prints every attribute smcrd knows with its current value and its
description, like AIX lsattr -E, or only the attributes named, like lsattr -a;
'smcrctl set' changes them. The value is the one in effect: an attribute smcrd
reads only at start, set since, shows the value the next start takes as pending.

Options:
  --json  print the attributes as JSON (name, value, default, description, and
          pending where set)

Examples:
  smcrctl show config
  smcrctl show config rmb_size port_range_list
  smcrctl show config --json | jq -r '.[] | select(.value != .default) | .name'`,
	flags: jsonFlag,
	run: func(e *env, o *options, args []string) error {
		if len(args) == 0 || args[0] != "config" {
			return usagef("want 'show config [ATTRIBUTE...]'")
		}
		attrs, err := e.client.Config(e.ctx)
		if err != nil {
			return err
		}
		if names := args[1:]; len(names) > 0 {
			if attrs, err = only(attrs, names); err != nil {
				return err
			}
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

// only is attrs' attributes named in names, in the order named.
func only(attrs []control.Attribute, names []string) ([]control.Attribute, error) {
	var out []control.Attribute
	for _, n := range names {
		i := slices.IndexFunc(attrs, func(a control.Attribute) bool { return a.Name == n })
		if i < 0 {
			return nil, usagef("unknown attribute %q ('smcrctl show config' lists them)", n)
		}
		out = append(out, attrs[i])
	}
	return out, nil
}
