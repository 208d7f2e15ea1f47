// Policy: the configuration put into the programs' maps (enabled, port_range_list,
// ip_addr_list), at start and whenever smcrctl changes it, so the next connection
// already follows the new policy. Which connections try SMC-R at all is this
// project's operator policy around RFC 7609, after AIX's smcrr0 attributes.

package daemon

import (
	"context"
	"fmt"
	"slices"

	"github.com/smcr-io/smcr/bpf"
	"github.com/smcr-io/smcr/config"
	"github.com/smcr-io/smcr/control"
)

// engineAttrs are read when the engine is made: a change applies at restart.
var engineAttrs = []string{"max_memory", "rmb_size", "sndbuf_size", "providers", "clc_timeout",
	"cgroup", "control_socket", "control_group", "metrics_address", "log_level", "log_format"}

// applyPolicy writes c into the programs' maps. ifaces are c's resolved interfaces.
// The caller holds cfgMu, or is New.
func (d *Daemon) applyPolicy(c config.Config, ifaces []config.Interface) error {
	names := ifaceNames(ifaces)
	if !slices.Equal(names, d.ifaces) {
		if err := d.loader.SetInterfaces(names); err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
		d.ifaces = names
	}
	var ports []bpf.PortRange
	if c.Enabled {
		for _, r := range c.PortRanges {
			ports = append(ports, bpf.PortRange{Lo: r.First, Hi: r.Last})
		}
	}
	if err := d.loader.SetPorts(ports); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	d.log.Info("policy", "enabled", c.Enabled, "port_range_list", c.PortRanges.String(), "interfaces", names)
	return nil
}

// SetConfig applies attribute=value assignments: all or none, into the programs
// at once, and into the file when persist is set (like AIX chdev with -P).
func (d *Daemon) SetConfig(_ context.Context, req control.SetConfigRequest) (control.SetConfigResult, error) {
	d.cfgMu.Lock()
	defer d.cfgMu.Unlock()
	old := d.CurrentConfig()
	n, err := old.Set(req.Assignments...)
	if err != nil {
		return control.SetConfigResult{}, fmt.Errorf("%w: %w", control.ErrInvalid, err)
	}
	return d.commit(old, n, req.Persist)
}

// SetEnabled turns redirection and steering on or off for new connections.
func (d *Daemon) SetEnabled(_ context.Context, enabled, persist bool) error {
	d.cfgMu.Lock()
	defer d.cfgMu.Unlock()
	old := d.CurrentConfig()
	n := old
	n.Enabled = enabled
	_, err := d.commit(old, n, persist)
	return err
}

// commit makes n the configuration in effect. The caller holds cfgMu.
func (d *Daemon) commit(old, n config.Config, persist bool) (control.SetConfigResult, error) {
	var res control.SetConfigResult
	if persist && d.opts.ConfigFile == "" {
		return res, fmt.Errorf("%w: smcrd runs on its embedded default configuration (no -config file): nothing to persist to", control.ErrInvalid)
	}
	ifaces, err := resolveInterfaces(n.Interfaces)
	if err != nil {
		return res, fmt.Errorf("%w: %w", control.ErrInvalid, err)
	}
	if err := d.applyPolicy(n, ifaces); err != nil {
		// Put the maps back as they were; the old interfaces resolved before.
		if oldIfs, rerr := resolveInterfaces(old.Interfaces); rerr == nil {
			d.applyPolicy(old, oldIfs)
		}
		return res, err
	}
	d.cfg.Store(&n)
	oldAttrs := old.Attributes()
	for i, a := range n.Attributes() {
		if a.Value != oldAttrs[i].Value {
			res.Changed = append(res.Changed, a)
			if slices.Contains(engineAttrs, a.Name) {
				d.log.Warn("attribute changed; it takes effect when smcrd restarts", "attr", a.Name, "value", a.Value)
			} else {
				d.log.Info("attribute changed", "attr", a.Name, "value", a.Value)
			}
		}
	}
	if persist {
		if err := n.Save(d.opts.ConfigFile); err != nil {
			return res, err
		}
		res.Persisted, res.File = true, d.opts.ConfigFile
	}
	return res, nil
}
