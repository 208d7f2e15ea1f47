// Policy: the configuration put into the programs' maps (enabled, port_range_list,
// ip_addr_list), at start and whenever smcrctl changes it, so the next connection
// already follows the new policy. Which connections try SMC-R at all is this
// project's operator policy around RFC 7609, after AIX's smcrr0 attributes.

package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/bpf"
	"github.com/smcr-io/smcr/config"
	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/smcr"
)

// noEffect are attributes this engine accepts but does not use, with why.
var noEffect = map[string]string{
	"sndbuf_size": "a send buffer mirrors the peer's RMB, so its size is the peer's rmb_size",
}

// errNoFile refuses to persist when smcrd runs without a configuration file.
var errNoFile = errors.New("nothing to persist to: smcrd runs on its embedded default configuration, " +
	"without a file; to keep changes, start smcrd with -config FILE " +
	"(smcrd -print-default-config > FILE writes one to start from)")

// policyMaps is where the policy goes (a *bpf.Loader).
type policyMaps interface {
	SetInterfaces(names []string) error
	SetPorts(ranges []bpf.PortRange) error
}

// applyPolicy writes c into the programs' maps; names are c's resolved
// interfaces. The caller holds cfgMu, or is New.
func (d *Daemon) applyPolicy(c config.Config, names []string) error {
	// Disabled, nothing is redirected or steered whatever the interfaces are:
	// turning off must not fail on them (one gone since, a failed change).
	// Ports first, so that nothing is redirected while interfaces change.
	if !c.Enabled {
		if err := d.maps.SetPorts(nil); err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
	}
	if !slices.Equal(names, d.ifaces) || !d.ifacesOK && c.Enabled {
		if err := d.maps.SetInterfaces(names); err != nil {
			d.ifacesOK = false
			return fmt.Errorf("daemon: %w", err)
		}
		d.ifaces, d.ifacesOK = names, true
	}
	if c.Enabled {
		var ports []bpf.PortRange
		for _, r := range c.PortRanges {
			ports = append(ports, bpf.PortRange{Lo: r.First, Hi: r.Last})
		}
		if err := d.maps.SetPorts(ports); err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
	}
	if d.direct != nil {
		d.direct.SetPolicy(&c, interfaceAddrs(names))
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
	if err := startable(old, n); err != nil {
		return control.SetConfigResult{}, err
	}
	var file *config.File
	if req.Persist {
		if file, err = d.fileWith(req.Assignments); err != nil {
			return control.SetConfigResult{}, err
		}
	}
	return d.commit(old, n, file, assigns(req.Assignments, "ip_addr_list"))
}

// assigns reports whether assignments set attribute attr.
func assigns(assignments []string, attr string) bool {
	return slices.ContainsFunc(assignments, func(a string) bool {
		name, _, _ := strings.Cut(a, "=")
		return strings.TrimSpace(name) == attr
	})
}

// SetEnabled turns redirection and steering on or off for new connections.
func (d *Daemon) SetEnabled(ctx context.Context, enabled, persist bool) error {
	a := "enabled=no"
	if enabled {
		a = "enabled=yes"
	}
	_, err := d.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{a}, Persist: persist})
	return err
}

// fileWith is the configuration file as it is now with only assignments
// applied: what -P writes. Writing the configuration in effect instead would
// make permanent every change made without -P since (a disable meant to last
// until restart), and undo edits made to the file by hand. The lines of the
// named attributes are edited in place; the operator's comments stay.
func (d *Daemon) fileWith(assignments []string) (*config.File, error) {
	if d.opts.ConfigFile == "" {
		return nil, fmt.Errorf("%w: %w", control.ErrInvalid, errNoFile)
	}
	saved, err := config.LoadFile(d.opts.ConfigFile)
	if err != nil {
		return nil, fmt.Errorf("%w: -P reads the configuration file as it is now, and it does not load, so nothing changed: %w", control.ErrInvalid, err)
	}
	n, err := saved.Set(assignments...)
	if err != nil {
		return nil, fmt.Errorf("%w: -P: in the configuration file as it is now: %w", control.ErrInvalid, err)
	}
	// The value in effect may be the same and yet gone since (a cgroup removed).
	if err := startable(saved.Config, n.Config); err != nil {
		return nil, err
	}
	return n, nil
}

// startable refuses a changed attribute that smcrd reads at start and would
// fail on, checked as start checks it: saved, it would fail every start (and
// systemd's Restart=on-failure would loop it). Only a change is checked, so a
// cgroup or group removed since start blocks no other change.
func startable(old, n config.Config) error {
	if n.Cgroup != old.Cgroup {
		if _, err := cgroupPath(n.Cgroup); err != nil {
			return fmt.Errorf("%w: %w: smcrd could not start with it", control.ErrInvalid, err)
		}
	}
	if n.ControlGroup != old.ControlGroup {
		if _, err := control.LookupGroup(n.ControlGroup); err != nil {
			return fmt.Errorf("%w: %w: smcrd could not start with it", control.ErrInvalid, err)
		}
	}
	if n.MonitorGroup != old.MonitorGroup {
		if _, err := control.LookupGroup(n.MonitorGroup); err != nil {
			return fmt.Errorf("%w: %w: smcrd could not start with it", control.ErrInvalid, err)
		}
	}
	return nil
}

// commit makes n the configuration in effect and, unless file is nil, saves
// file as the configuration file; setIfaces says the change names
// ip_addr_list. The caller holds cfgMu.
func (d *Daemon) commit(old, n config.Config, file *config.File, setIfaces bool) (control.SetConfigResult, error) {
	var res control.SetConfigResult
	persist := file != nil
	// Interfaces are looked up only when ip_addr_list is set: one renamed or
	// removed since must not block every other change, disable included. Set,
	// even to the value in effect, every name must exist: -P would otherwise
	// save one the next start fails on.
	oldNames, names := d.ifaces, d.ifaces
	if setIfaces || !slices.Equal(n.Interfaces, old.Interfaces) {
		ifaces, err := resolveInterfaces(n.Interfaces)
		if err != nil {
			return res, fmt.Errorf("%w: %w", control.ErrInvalid, err)
		}
		names = ifaceNames(ifaces)
	}
	prev := d.engine.Settings()
	if err := applyEngine(d.engine, old, n); err != nil {
		restoreEngine(d.engine, prev)
		return res, fmt.Errorf("%w: %w", control.ErrInvalid, err)
	}
	if err := d.applyPolicy(n, names); err != nil {
		d.rollback(old, oldNames, prev)
		return res, err
	}
	// Saved before it is stored: a change that cannot be persisted when asked
	// to be is not made at all. Save replaces the file in one rename, so a
	// failed one leaves it as it was.
	if persist {
		if err := file.Save(d.opts.ConfigFile); err != nil {
			d.rollback(old, oldNames, prev)
			return res, fmt.Errorf("daemon: %w", err)
		}
		res.Persisted, res.File = true, d.opts.ConfigFile
	}
	d.cfg.Store(&n)
	res.Changed, res.Notes = changes(old, n, persist)
	for _, a := range res.Changed {
		d.log.Info("attribute changed", "attr", a.Name, "value", a.Value)
	}
	for _, note := range res.Notes {
		d.log.Warn("attribute change not applied now", "note", note)
	}
	return res, nil
}

// rollback puts the maps and the engine back as they were before a change
// that failed; oldNames are the interfaces of old. A failed SetInterfaces left
// ifacesOK false, so the old interfaces are set again even though d.ifaces
// still names them.
func (d *Daemon) rollback(old config.Config, oldNames []string, prev smcr.Settings) {
	if err := d.applyPolicy(old, oldNames); err != nil {
		d.log.Error("policy: restoring after a failed change", "err", err)
	}
	restoreEngine(d.engine, prev)
	d.engine.SetUEIDs(old.UserEIDs) // valid: they were in effect
}

// engine is what SetConfig changes in the engine (an *smcr.Engine).
type engine interface {
	SetMaxMemory(int64) error
	SetRMBSize(int) error
	SetCLCTimeout(time.Duration) error
	SetReadSpin(time.Duration) error
	SetTestLinkInterval(time.Duration) error
	SetUEIDs([]string) error
}

// applyEngine hands the engine the attributes that changed from old to n and
// that it applies to new connections.
func applyEngine(e engine, old, n config.Config) error {
	if n.MaxMemory != old.MaxMemory {
		if err := e.SetMaxMemory(n.MaxMemory); err != nil {
			return fmt.Errorf("max_memory: %w", err)
		}
	}
	if n.RMBSize != old.RMBSize {
		if err := e.SetRMBSize(n.RMBSize); err != nil {
			return fmt.Errorf("rmb_size: %w", err)
		}
	}
	if n.CLCTimeout != old.CLCTimeout {
		if err := e.SetCLCTimeout(n.CLCTimeout); err != nil {
			return fmt.Errorf("clc_timeout: %w", err)
		}
	}
	if n.ReadSpin != old.ReadSpin {
		if err := e.SetReadSpin(readSpin(n.ReadSpin)); err != nil {
			return fmt.Errorf("read_spin: %w", err)
		}
	}
	if n.TestLinkTime != old.TestLinkTime {
		if err := e.SetTestLinkInterval(testLinkTime(n.TestLinkTime)); err != nil {
			return fmt.Errorf("test_link_time: %w", err)
		}
	}
	if !slices.Equal(n.UserEIDs, old.UserEIDs) {
		if err := e.SetUEIDs(n.UserEIDs); err != nil {
			return fmt.Errorf("ueid_list: %w", err)
		}
	}
	return nil
}

// restoreEngine puts back settings taken with Settings, which are valid.
func restoreEngine(e engine, s smcr.Settings) {
	e.SetMaxMemory(s.MaxMemory)
	e.SetRMBSize(s.RMBSize)
	e.SetCLCTimeout(s.CLCTimeout)
	e.SetReadSpin(s.ReadSpin)
	e.SetTestLinkInterval(s.TestLinkInterval)
}

// changes lists the attributes whose value differs from old to n, and a note for
// each of them that does not take effect at once. Those config.AtRestart names
// are read only when smcrd starts: a change is kept (and persisted when asked)
// but applies when smcrd restarts. The others apply to new connections at once:
// the policy ones through the programs' maps, max_memory, rmb_size,
// clc_timeout, read_spin, test_link_time and ueid_list through the engine's setters
// (read_spin to every Read from then on, test_link_time to every link at its
// next look), and peer_cache_ttl when the next peer is cached.
func changes(old, n config.Config, persist bool) (changed []control.Attribute, notes []string) {
	oldAttrs := old.Attributes()
	for i, a := range n.Attributes() {
		if a.Value == oldAttrs[i].Value {
			continue
		}
		changed = append(changed, a)
		if why := config.AtRestart(a.Name); why != "" {
			note := fmt.Sprintf("%s: applies when smcrd restarts (%s)", a.Name, why)
			if !persist {
				note += "; without -P a restart also forgets it: set it with -P"
			}
			notes = append(notes, note)
		}
		if why, ok := noEffect[a.Name]; ok {
			notes = append(notes, fmt.Sprintf("%s: kept, but no effect on connections (%s)", a.Name, why))
		}
		// The programs follow ip_addr_list at once; the devices of the
		// providers that open one per interface were opened at start.
		if a.Name == "ip_addr_list" && slices.ContainsFunc(n.Providers, func(p string) bool { return p == "rdma" || p == "soft" }) {
			note := "ip_addr_list: redirection and steering follow at once; the rdma and soft devices (one per interface) follow when smcrd restarts"
			if !persist {
				note += "; without -P a restart also forgets it: set it with -P"
			}
			notes = append(notes, note)
		}
	}
	return changed, notes
}

// refreshEvery is the least time between two refreshes of followInterfaces: on
// a host whose routes churn (a node adding a route per container), the
// programs follow once a second, not once per route.
const refreshEvery = time.Second

// The rtnetlink groups whose messages say that an interface, an address or a
// route came or went (RTMGRP_* of linux/rtnetlink.h).
const rtGroups = unix.RTMGRP_LINK | unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR |
	unix.RTMGRP_IPV4_ROUTE | unix.RTMGRP_IPV6_ROUTE

// followInterfaces keeps the programs on ip_addr_list's interfaces as the host
// changes under them, until stop is closed; done is closed when it returns.
// SetInterfaces takes the interfaces and their routes as they are when it runs,
// and nothing else follows them: an interface that goes away and comes back (a
// driver reloaded, a VLAN or bond made again) is a new device, which the tc
// program attached to the old one is not on, so no connection arriving on it
// was steered to smcrd until it restarted; and the destinations a route
// added later sends through a listed interface were never redirected. Any
// change of an interface, an address or a route in smcrd's namespace
// (d.netns) now applies SetInterfaces again, at most once per refreshEvery.
func (d *Daemon) followInterfaces(stop <-chan struct{}) (done <-chan struct{}) {
	c := make(chan struct{})
	go func() {
		defer close(c)
		// Never unlocked: a thread moved into d.netns goes with this goroutine.
		runtime.LockOSThread()
		if cur, err := netns.Get(); err == nil {
			same := cur.Equal(d.netns)
			cur.Close()
			if !same {
				if err := netns.Set(d.netns); err != nil {
					d.log.Warn("interfaces: not followed (changes apply when smcrd restarts)", "err", err)
					return
				}
			}
		}
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
		if err == nil {
			err = unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: rtGroups})
			if err != nil {
				unix.Close(fd)
			}
		}
		if err != nil {
			d.log.Warn("interfaces: not followed (changes apply when smcrd restarts)", "err", err)
			return
		}
		defer unix.Close(fd)
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 250000})
		// What changed between New's SetInterfaces and the subscription is
		// taken by a first refresh.
		dirty, last := true, time.Time{}
		buf := make([]byte, 64<<10)
		for {
			select {
			case <-stop:
				return
			default:
			}
			// Any message, or ENOBUFS (messages lost): something changed.
			// The messages themselves are not read: SetInterfaces looks again.
			if _, _, err := unix.Recvfrom(fd, buf, 0); err == nil || errors.Is(err, unix.ENOBUFS) {
				dirty = true
			}
			if dirty && time.Since(last) >= refreshEvery {
				dirty, last = false, time.Now()
				d.refreshInterfaces()
			}
		}
	}()
	return c
}

// refreshInterfaces applies SetInterfaces again to ip_addr_list's interfaces,
// those of them that exist now: an interface gone takes its tc program and its
// routes with it, and gets them back when it returns. With none of them there,
// nothing is done: SetInterfaces with no interface would lift the restriction
// to destinations routed through them.
func (d *Daemon) refreshInterfaces() {
	d.cfgMu.Lock()
	defer d.cfgMu.Unlock()
	var present []string
	for _, n := range d.ifaces {
		if _, err := net.InterfaceByName(n); err == nil {
			present = append(present, n)
		}
	}
	if len(present) == 0 {
		return
	}
	if err := d.maps.SetInterfaces(present); err != nil {
		// Once per error: the next change of the host tries again.
		if msg := err.Error(); msg != d.refreshErr {
			d.log.Warn("interfaces changed: the programs could not follow", "interfaces", present, "err", err)
			d.refreshErr = msg
		}
		return
	}
	d.refreshErr = ""
	if len(present) == len(d.ifaces) {
		d.ifacesOK = true
	}
}

// interfaceAddrs are the addresses of the interfaces named: the local
// addresses a direct connection may have (nil, any, if they cannot be listed).
func interfaceAddrs(names []string) []netip.Addr {
	host, err := config.HostInterfaces()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, i := range host {
		if slices.Contains(names, i.Name) {
			for _, p := range i.Addrs {
				out = append(out, p.Addr())
			}
		}
	}
	return out
}
