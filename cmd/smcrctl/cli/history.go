// history: the connections smcrd carried that have ended, newest first: how
// each went (SMC-R, plain TCP and why, or failed in setup), how long it
// lasted, what it carried.

package cli

import "time"

var historyCmd = &command{
	name:     "history",
	synopsis: "[--json]",
	short:    "list the last connections that ended: SMC-R, fallback and why, or failed",
	long: `Lists the last connections smcrd carried that have ended, newest first (smcrd
keeps the last 256): the connections that went SMC-R, those carried as plain
TCP with the reason (the decline, or the peer without the SMC option), and
those that ended while smcrd set them up (FAILED: the destination refused or
could not be reached, or the handshake's TCP connection was lost), which conns
no longer shows.

Columns: ID, ROLE, LOCAL, REMOTE, MODE, ENDED (when), LASTED, TX-BYTES,
RX-BYTES, REASON.

Options:
  --json  print the history as JSON

Examples:
  smcrctl history
  smcrctl history --json | jq -r '.[] | select(.mode != "SMCR") | .remote'`,
	flags: jsonFlag,
	run: func(e *env, o *options, args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		h, err := e.client.History(e.ctx)
		if err != nil {
			return err
		}
		if o.json {
			return writeJSON(e.stdout, h)
		}
		tw := table(e.stdout)
		row(tw, "ID", "ROLE", "LOCAL", "REMOTE", "MODE", "ENDED", "LASTED", "TX-BYTES", "RX-BYTES", "REASON")
		for _, c := range h {
			lasted := time.Duration(c.Seconds * float64(time.Second)).Round(time.Millisecond)
			row(tw, c.ID, c.Role, c.Local, c.Remote, c.Mode, c.Ended.Format(time.RFC3339), lasted, c.TxBytes, c.RxBytes, orDash(c.Reason))
		}
		return tw.Flush()
	},
}
