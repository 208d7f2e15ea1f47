// The probe of smcrctl probe (smc-tools' smc_chk): whether a connection to a
// destination, made now by a program in the cgroup smcrd serves, would be
// redirected and tried over SMC-R, and if not, which of the programs' checks
// (bpf/c/redirect.h) stops it. The peer's own smcrd decides the rest, at the
// connect.

package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/smcr-io/smcr/control"
)

// Probe runs the programs' checks on a connection to dst from smcrd's view.
func (d *Daemon) Probe(_ context.Context, dst netip.AddrPort) (control.Probe, error) {
	dst = unmapAP(dst)
	cfg := d.CurrentConfig()
	p := control.Probe{Dst: dst.String(), Cgroup: cfg.Cgroup}
	check := func(name string, ok bool, detail string, args ...any) {
		p.Checks = append(p.Checks, control.ProbeCheck{Check: name, OK: ok, Detail: fmt.Sprintf(detail, args...)})
	}
	if cfg.Enabled {
		check("enabled", true, "enabled = yes")
	} else {
		check("enabled", false, "enabled = no: every connection is plain TCP (smcrctl enable)")
	}
	if cfg.PortRanges.Contains(dst.Port()) {
		check("port", true, "in port_range_list %s", cfg.PortRanges)
	} else {
		check("port", false, "%d not in port_range_list %s", dst.Port(), cfg.PortRanges)
	}
	if len(d.devs) > 0 {
		check("device", true, "providers %s", strings.Join(d.providerNames(), ", "))
	} else {
		check("device", false, "no device: smcrd redirects nothing (providers)")
	}
	if src, ok := d.loader.ShownSource(dst.Addr()); ok {
		check("route", true, "through a listed interface, from %s", src)
	} else {
		check("route", false, "not through a listed interface (ip_addr_list): plain TCP")
	}
	neg, err := d.loader.Negatives()
	if err != nil {
		return p, fmt.Errorf("daemon: probe: %w", err)
	}
	var entry control.Peer
	for _, e := range d.peers.list() {
		if e.Addr == dst.Addr().String() && e.Port == dst.Port() {
			entry = e
		}
	}
	switch ttl, cached := neg[dst]; {
	case cached:
		reason := entry.Reason
		if reason == "" {
			reason = "no SMC-R"
		}
		check("peer cache", false, "without SMC-R (%s), for %v: plain TCP (smcrctl peers --forget)", reason, ttl.Round(time.Second))
	case entry.Capable:
		check("peer cache", true, "had SMC-R lately")
	default:
		check("peer cache", true, "not known: SMC-R will be tried")
	}
	un, err := d.loader.Unreachables()
	if err != nil {
		return p, fmt.Errorf("daemon: probe: %w", err)
	}
	if ttl, ok := un[dst]; ok {
		check("reachable", false, "smcrd could not connect to it: direct for %v, or until a connection succeeds", ttl.Round(time.Second))
	} else {
		check("reachable", true, "no failed connect on record")
	}
	p.SMCR = true
	for _, c := range p.Checks {
		p.SMCR = p.SMCR && c.OK
	}
	return p, nil
}
