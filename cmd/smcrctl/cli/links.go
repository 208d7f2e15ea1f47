// links: every link (RC queue pair) of every link group with its traffic, errors
// and TEST_LINK round trip (RFC 7609 §3.3, §3.6 keepalive), after
// `smcr linkgroup link-show`.

package cli

import (
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/smcr-io/smcr/control"
)

var linksCmd = &command{
	name:     "links",
	synopsis: "[--json]",
	short:    "list links: state, interface, device, GIDs, QPNs, traffic, errors, RTT",
	long: `Lists every link of every link group. A link is one RC queue pair between a local
and a peer RDMA device; a link group has one or two.

Columns: LG (link group ID), LINK (number), ROLE, STATE, IF (network interface),
DEVICE, GID and PEER-GID, QPN and PEER-QPN, CONNS, TX-BYTES, TX-WR (work requests
posted: RDMA WRITEs and SENDs), RX-BYTES, RX-WR (messages received: the peer's
SENDs), ERRORS (failed work completions, remote access errors) and RTT (the last
TEST_LINK round trip; "-" before the first).

Options:
  -d      after the table, each link's errors by kind, like entstat -d: the work
          completions' statuses (remote access error, transport retry exceeded,
          ...) and protocol errors (malformed messages from the peer)
  --json  print the links as JSON (errors_by_kind holds the split)

Examples:
  smcrctl links
  smcrctl links -d
  smcrctl links --json | jq '.[] | select(.errors > 0)'`,
	flags: func(fs *flag.FlagSet, o *options) {
		jsonFlag(fs, o)
		fs.BoolVar(&o.detail, "d", false, "")
	},
	run: func(e *env, o *options, args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		links, err := e.client.Links(e.ctx)
		if err != nil {
			return err
		}
		if o.json {
			return writeJSON(e.stdout, links)
		}
		tw := table(e.stdout)
		row(tw, "LG", "LINK", "ROLE", "STATE", "IF", "DEVICE", "GID", "PEER-GID", "QPN", "PEER-QPN", "CONNS",
			"TX-BYTES", "TX-WR", "RX-BYTES", "RX-WR", "ERRORS", "RTT")
		for _, l := range links {
			row(tw, l.LinkGroup, l.Num, l.Role, l.State, orDash(l.Interface), orDash(l.Device), orDash(l.LocalGID), orDash(l.PeerGID),
				control.QPN(l.LocalQPN), control.QPN(l.PeerQPN), l.Conns, l.TX.Bytes, l.TX.WorkRequests, l.RX.Bytes, l.RX.WorkRequests, l.Errors, rtt(l.RTTMicros))
		}
		if err := tw.Flush(); err != nil || !o.detail {
			return err
		}
		for _, l := range links {
			if len(l.ErrorsByKind) == 0 {
				continue
			}
			fmt.Fprintf(e.stdout, "\nerrors of link %d/%d:\n", l.LinkGroup, l.Num)
			tw := table(e.stdout)
			for _, kind := range slices.Sorted(maps.Keys(l.ErrorsByKind)) {
				row(tw, "  "+kind, l.ErrorsByKind[kind])
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
		return nil
	},
}

func rtt(us float64) string {
	if us <= 0 {
		return "-"
	}
	return strconv.FormatFloat(us, 'f', 1, 64) + "us"
}

func itoa(n int) string { return strconv.Itoa(n) }
