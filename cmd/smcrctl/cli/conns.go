// conns: every connection smcrd handles, SMC-R or fallen back to TCP with the
// decline reason (RFC 7609 §3.7 decline), with cursors (§4.4.2) on -d; after smcss.

package cli

import (
	"flag"
	"strconv"

	"github.com/smcr-io/smcr/control"
)

var connsCmd = &command{
	name:     "conns",
	synopsis: "[-d] [--json]",
	short:    "list connections like smcss: addresses, mode, decline reason, buffers",
	long: `Lists the connections smcrd handles, like smcss. MODE is SMCR, or TCP for a
connection that fell back; REASON then says which side declined (local or peer),
the CLC decline code and its meaning. SNDBUF and RMB are the local send and receive
buffer sizes.

Options:
  -d      details: the alert tokens (TOKEN ours, PEER-TOKEN the peer's), the
          peer's RMB size, bytes each way, and the cursors (wrap:count):
          TX-PROD how far we wrote into the peer's RMB, TX-CONS how far the peer
          says it read there; RX-PROD how far the peer wrote into ours, RX-CONS
          how far we read
  --json  print the connections as JSON (cursors always included)

Examples:
  smcrctl conns
  smcrctl conns -d
  smcrctl conns --json | jq '[.[] | select(.mode == "TCP")] | length'`,
	flags: func(fs *flag.FlagSet, o *options) {
		jsonFlag(fs, o)
		fs.BoolVar(&o.detail, "d", false, "")
	},
	run: func(e *env, o *options, args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		cs, err := e.client.Conns(e.ctx)
		if err != nil {
			return err
		}
		if o.json {
			return writeJSON(e.stdout, cs)
		}
		tw := table(e.stdout)
		head := []any{"STATE", "ROLE", "LOCAL", "REMOTE", "MODE", "LG", "SNDBUF", "RMB"}
		if o.detail {
			head = append(head, "TOKEN", "PEER-TOKEN", "PEER-RMB", "TX-BYTES", "RX-BYTES", "TX-PROD", "TX-CONS", "RX-PROD", "RX-CONS")
		}
		row(tw, append(head, "REASON")...)
		for _, c := range cs {
			cells := []any{c.State, c.Role, c.Local, c.Remote, c.Mode, lg(c), size(c.SndBufSize), size(c.RMBSize)}
			if o.detail {
				smc := c.Mode == control.ModeSMCR
				cells = append(cells, token(smc, c.ID), token(smc, c.PeerToken), size(c.PeerRMBSize), c.TxBytes, c.RxBytes,
					cursor(smc, c.TxProd), cursor(smc, c.TxCons), cursor(smc, c.RxProd), cursor(smc, c.RxCons))
			}
			row(tw, append(cells, reason(c))...)
		}
		return tw.Flush()
	},
}

func lg(c control.Conn) string {
	if c.Mode != control.ModeSMCR {
		return "-"
	}
	return strconv.FormatUint(uint64(c.LinkGroup), 10)
}

func size(n int) string {
	if n <= 0 {
		return "-"
	}
	return control.FormatSize(uint64(n))
}

func token(smc bool, t uint32) string {
	if !smc {
		return "-"
	}
	return hexCode(t)
}

func cursor(smc bool, c control.Cursor) string {
	if !smc {
		return "-"
	}
	return c.String()
}

func reason(c control.Conn) string {
	if c.Mode == control.ModeSMCR {
		return "-"
	}
	if c.DeclineSide == "" && c.DeclineCode == 0 {
		return orDash(c.DeclineReason)
	}
	return c.DeclineSide + " " + hexCode(c.DeclineCode) + " " + c.DeclineReason
}
