// Version 2.1 negotiation: release, connections and links per link group, features.
// Implements the rules of Linux's smc_clc_srv_v2x_features_validate,
// smc_clc_clnt_v2x_features_validate and smc_clc_v2x_features_confirm_check.

package clc

import "fmt"

// Releases of SMC version 2, in the v2 extension's release nibble.
const (
	Release20 = 0 // version 2.0
	Release21 = 1 // version 2.1: max conns, max links and the feature mask
)

// Limits of release 2.1's negotiation (Linux smc_core.h).
const (
	MinConnsPerLinkGroup = 16  // SMC_CONN_PER_LGR_MIN
	MaxConnsPerLinkGroup = 255 // SMC_CONN_PER_LGR_MAX, also release 2.0's value
	MinLinksPerLinkGroup = 1   // SMC_LINKS_ADD_LNK_MIN
	MaxLinksPerLinkGroup = 2   // SMC_LINKS_ADD_LNK_MAX, also release 2.0's value
)

// V2Terms are the terms of a version-2 link group: what one side offers, or what
// the two agreed.
type V2Terms struct {
	Release     uint8
	MaxConns    uint8
	MaxLinks    uint8
	FeatureMask uint16
}

// v20Terms are release 2.0's fixed terms, which carry no negotiation.
func v20Terms() V2Terms {
	return V2Terms{Release: Release20, MaxConns: MaxConnsPerLinkGroup, MaxLinks: MaxLinksPerLinkGroup}
}

// ServerTerms is the server's choice from a version-2 Proposal and its own offer:
// the lower release; in 2.1 the lower max conns and max links, declined below the
// minimum, and the features both have. The Accept's first-contact extension
// carries the result.
func ServerTerms(prop *ProposalV2, own V2Terms) (V2Terms, error) {
	if prop == nil {
		return V2Terms{}, &DeclineError{Code: DeclineNoV2Extension, Local: true}
	}
	release := min(prop.Release, own.Release)
	if release < Release21 {
		return v20Terms(), nil
	}
	t := V2Terms{Release: release,
		MaxConns:    min(prop.MaxConns, own.MaxConns),
		MaxLinks:    min(prop.MaxLinks, own.MaxLinks),
		FeatureMask: prop.FeatureMask & own.FeatureMask,
	}
	if t.MaxConns < MinConnsPerLinkGroup {
		return V2Terms{}, fmt.Errorf("clc: max conns %d < %d: %w", t.MaxConns, MinConnsPerLinkGroup, &DeclineError{Code: DeclineMaxConnsMismatch, Local: true})
	}
	if t.MaxLinks < MinLinksPerLinkGroup {
		return V2Terms{}, fmt.Errorf("clc: max links %d < %d: %w", t.MaxLinks, MinLinksPerLinkGroup, &DeclineError{Code: DeclineMaxLinksMismatch, Local: true})
	}
	return t, nil
}

// ClientTerms checks an Accept's first-contact extension against what the client
// offered: a release above its own is declined, and in 2.1 the server's max conns
// must be at least the minimum and its max links within 1..MaxLinksPerLinkGroup.
// The features are those both have. The Confirm echoes the result.
func ClientTerms(fce *FirstContactExt, own V2Terms) (V2Terms, error) {
	if fce.Release > own.Release {
		return V2Terms{}, fmt.Errorf("clc: server release %d > ours %d: %w", fce.Release, own.Release, &DeclineError{Code: DeclineReleaseMismatch, Local: true})
	}
	if fce.Release < Release21 {
		return v20Terms(), nil
	}
	if fce.MaxConns < MinConnsPerLinkGroup {
		return V2Terms{}, fmt.Errorf("clc: server max conns %d < %d: %w", fce.MaxConns, MinConnsPerLinkGroup, &DeclineError{Code: DeclineMaxConnsMismatch, Local: true})
	}
	if fce.MaxLinks < MinLinksPerLinkGroup || fce.MaxLinks > MaxLinksPerLinkGroup {
		return V2Terms{}, fmt.Errorf("clc: server max links %d outside %d..%d: %w", fce.MaxLinks, MinLinksPerLinkGroup, MaxLinksPerLinkGroup, &DeclineError{Code: DeclineMaxLinksMismatch, Local: true})
	}
	return V2Terms{Release: fce.Release, MaxConns: fce.MaxConns, MaxLinks: fce.MaxLinks,
		FeatureMask: fce.FeatureMask & own.FeatureMask}, nil
}

// CheckConfirmTerms checks a first-contact Confirm's extension against the terms
// the server sent in its Accept: the same release, and in 2.1 the same max conns
// and max links. It returns the features the client confirmed.
func CheckConfirmTerms(fce *FirstContactExt, agreed V2Terms) (uint16, error) {
	if fce.Release != agreed.Release {
		return 0, fmt.Errorf("clc: confirm release %d, accepted %d: %w", fce.Release, agreed.Release, &DeclineError{Code: DeclineReleaseMismatch, Local: true})
	}
	if fce.Release < Release21 {
		return 0, nil
	}
	if fce.MaxConns != agreed.MaxConns {
		return 0, fmt.Errorf("clc: confirm max conns %d, accepted %d: %w", fce.MaxConns, agreed.MaxConns, &DeclineError{Code: DeclineMaxConnsMismatch, Local: true})
	}
	if fce.MaxLinks != agreed.MaxLinks {
		return 0, fmt.Errorf("clc: confirm max links %d, accepted %d: %w", fce.MaxLinks, agreed.MaxLinks, &DeclineError{Code: DeclineMaxLinksMismatch, Local: true})
	}
	return fce.FeatureMask, nil
}

// MatchEID returns the first of the peer's User EIDs that is also ours, as Linux's
// smc_clc_match_eid picks it; none is a Decline with DeclineNoUEID.
func MatchEID(peer, own []EID) (EID, error) {
	for _, p := range peer {
		for _, o := range own {
			if p == o {
				return p, nil
			}
		}
	}
	return EID{}, &DeclineError{Code: DeclineNoUEID, Local: true}
}
