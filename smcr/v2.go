// SMC-R version 2 in the handshake: User EIDs, the server's choice of version 2
// from a Proposal, its Accept with the first-contact extension, and the checks of
// the Confirm. IBM's "SMC Version 2" (2.0 and 2.1) on top of RFC 7609 §3.7, as
// Linux's af_smc.c and smc_clc.c run it (smc_listen_find_device, smc_clc_send_accept).

package smcr

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"github.com/smcr-io/smcr/smcr/clc"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// v2Offer is what this engine offers in a version-2 link group: release 2.1's
// terms with one link, since a version-2 link group of this engine never adds a
// second (it rejects ADD_LINK, as a Linux peer with one device does).
var v2Offer = clc.V2Terms{Release: clc.Release21, MaxConns: clc.MaxConnsPerLinkGroup, MaxLinks: 1}

// connV2 is what a version-2 handshake agreed, kept on the Conn until it ends.
type connV2 struct {
	eid   clc.EID
	terms clc.V2Terms
}

// parseUEIDs checks and pads the configured User EIDs.
func parseUEIDs(list []string) ([]clc.EID, error) {
	if len(list) > clc.MaxUEIDs {
		return nil, fmt.Errorf("%w: %d user eids, at most %d", ErrConfig, len(list), clc.MaxUEIDs)
	}
	out := make([]clc.EID, 0, len(list))
	for _, s := range list {
		e, err := clc.ParseEID(s)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// SetUEIDs replaces the User EIDs (Config.UEIDs) for connections set up from now.
func (e *Engine) SetUEIDs(list []string) error {
	ueids, err := parseUEIDs(list)
	if err != nil {
		return err
	}
	e.setMu.Lock()
	defer e.setMu.Unlock()
	e.ueids.Store(&ueids)
	e.log.Info("smcr: user eids set", "count", len(ueids))
	return nil
}

// UEIDs returns the User EIDs in effect, without their padding.
func (e *Engine) UEIDs() []string {
	var out []string
	for _, u := range *e.ueids.Load() {
		out = append(out, u.String())
	}
	return out
}

func (e *Engine) userEIDs() []clc.EID { return *e.ueids.Load() }

// rdmaDevice is the index of the first rdma device, -1 without one: version 2
// runs over RoCE v2 only.
func (e *Engine) rdmaDevice() int {
	for i, d := range e.cfg.Devices {
		if d.Kind() == verbs.KindRDMA {
			return i
		}
	}
	return -1
}

// hostname is the first-contact extension's, blank-padded as Linux's
// (utsname()->nodename, cut at 32 bytes).
func hostname() [clc.HostnameLen]byte {
	var h [clc.HostnameLen]byte
	n, _ := os.Hostname()
	for i := range h {
		h[i] = ' '
	}
	copy(h[:], n)
	return h
}

// gidAddr is the IPv4 (or IPv6) address a RoCE v2 GID encodes.
func gidAddr(g [16]byte) netip.Addr { return netip.AddrFrom16(g).Unmap() }

// v2Direct reports whether the peer whose RoCE v2 GID is peer is reached without
// a gateway: its address is in the subnet of our local address (local), as
// Linux's smc_ib_find_route says when the route has no gateway.
func v2Direct(peer [16]byte, local netip.Prefix) bool {
	a := gidAddr(peer)
	return local.IsValid() && a.IsValid() && (local.Contains(a) || a.IsLoopback())
}

// wantsV2 reports whether the server answers prop with version 2: prop offers
// SMC-R version 2, and we have User EIDs and an rdma device. Linux's server
// tries version 2 before version 1 (smc_listen_find_device) and so does this.
func (e *Engine) wantsV2(prop *clc.Proposal) bool {
	return prop.HasSMCRv2() && len(e.userEIDs()) > 0 && e.rdmaDevice() >= 0
}

// serverTermsV2 is the server's decision on a version-2 Proposal: the EID both
// have and the release and limits of the link group, or the Decline's code.
func (e *Engine) serverTermsV2(prop *clc.Proposal) (*connV2, DeclineCode, error) {
	eid, err := clc.MatchEID(prop.V2.UEIDs, e.userEIDs())
	if err != nil {
		return nil, declineCode(err), fmt.Errorf("proposal v2: %w", err)
	}
	terms, err := clc.ServerTerms(prop.V2, v2Offer)
	if err != nil {
		return nil, declineCode(err), fmt.Errorf("proposal v2: %w", err)
	}
	if prop.V2.RoCEGID == ([16]byte{}) {
		return nil, clc.DeclineNoRoute, errors.New("proposal v2: no roce v2 gid")
	}
	return &connV2{eid: eid, terms: terms}, 0, nil
}

// declineCode is the code of the *clc.DeclineError in err, DeclineConfigError
// without one.
func declineCode(err error) DeclineCode {
	var d *clc.DeclineError
	if errors.As(err, &d) {
		return d.Code
	}
	return clc.DeclineConfigError
}

// acceptV2 is the version-2 part of the server's Accept: the EID and, on first
// contact, the extension with the agreed terms.
func (e *Engine) acceptV2(v *connV2, first bool, peerGID [16]byte, local netip.Prefix) *clc.LinkInfoV2 {
	out := &clc.LinkInfoV2{EID: v.eid}
	if first {
		out.FirstContact = fceFor(v.terms, v2Direct(peerGID, local))
	}
	return out
}

// fceFor is a first-contact extension carrying terms: release 2.0 carries no
// limits (Linux sends zeros there).
func fceFor(t clc.V2Terms, direct bool) clc.FirstContactExt {
	f := clc.FirstContactExt{Direct: direct, OSType: clc.OSLinux, Release: t.Release, Hostname: hostname()}
	if t.Release >= clc.Release21 {
		f.MaxConns, f.MaxLinks, f.FeatureMask = t.MaxConns, t.MaxLinks, t.FeatureMask
	}
	return f
}

// checkConfirmV2 checks a Confirm against the version-2 Accept we sent: version
// 2 again, the same EID, and on first contact the same terms.
func checkConfirmV2(conf *clc.Confirm, v *connV2) (DeclineCode, error) {
	if conf.V2 == nil {
		return clc.DeclineVersionMismatch, errors.New("clc: version 1 confirm to a version 2 accept")
	}
	if conf.V2.EID != v.eid {
		return clc.DeclineNoUEID, fmt.Errorf("clc: confirm eid %q, accepted %q", conf.V2.EID, v.eid)
	}
	if conf.FirstContact {
		if _, err := clc.CheckConfirmTerms(&conf.V2.FirstContact, v.terms); err != nil {
			return declineCode(err), err
		}
	}
	return 0, nil
}

// proposeV2 adds version 2 to a Proposal for a standard server, beside its
// version 1, as Linux's client offers both where it can: with our User EIDs and
// the RoCE v2 GID of the rdma device o (the one the Proposal's own fields
// name), and release 2.1's terms. It returns what the Accept is checked
// against, nil when the engine proposes version 1 only: it has no User EID,
// or the connection is not IPv4 (pfx, the local subnet) or the GID not
// IPv4-mapped, since SMC-R version 2 routes on IPv4 addresses (Linux's server
// takes the peer's from the GID, smc_ib_gid_to_ipv4).
func (e *Engine) proposeV2(p *clc.Proposal, o offer, pfx netip.Prefix) *connV2 {
	ueids := e.userEIDs()
	if len(ueids) == 0 || o.Kind != verbs.KindRDMA || !pfx.Addr().Is4() || !netip.AddrFrom16(o.GID).Is4In6() {
		return nil
	}
	p.Version, p.SMCTypeV2 = clc.Version2, clc.SMCTypeR
	p.SkipArea, p.Ext = nil, nil // a version-2 Proposal has no room for ours
	p.V2 = &clc.ProposalV2{Release: v2Offer.Release, RoCEGID: o.GID,
		MaxConns: v2Offer.MaxConns, MaxLinks: v2Offer.MaxLinks, UEIDs: ueids}
	return &connV2{terms: v2Offer}
}

// clientAcceptV2 checks a version-2 Accept against our Proposal: an EID of
// ours, and on first contact terms we can keep (clc.ClientTerms), which the
// Confirm echoes.
func (e *Engine) clientAcceptV2(c *Conn, acc *clc.Accept) (DeclineCode, error) {
	v := acc.V2
	if !slices.Contains(e.userEIDs(), v.EID) {
		return clc.DeclineNoUEID, fmt.Errorf("clc: accept names eid %q, not ours", v.EID)
	}
	c.v2.eid = v.EID
	if !acc.FirstContact {
		return 0, nil
	}
	terms, err := clc.ClientTerms(&v.FirstContact, v2Offer)
	if err != nil {
		return declineCode(err), err
	}
	c.v2.terms = terms
	return 0, nil
}
