// peers: the peer capability cache, which decides whether a connection to a peer
// tries SMC-R (RFC 7609 §3.7: a declined peer is reached over TCP for a while).

package cli

import "time"

var peersCmd = &command{
	name:     "peers",
	synopsis: "[--json]",
	short:    "list the peer cache: SMC-R capable or not, until when",
	long: `Lists the peer capability cache. A peer that declined SMC-R (or never answered the
SMC option) is connected to as plain TCP, without redirection, until its entry
expires (peer_cache_ttl); then SMC-R is tried again.

Columns: PEER (IP address), SMC-R (yes or no), EXPIRES (time left), HITS
(connections decided by the entry), REASON (why not SMC-R).

Options:
  --json  print the cache as JSON

Examples:
  smcrctl peers
  smcrctl peers --json | jq -r '.[] | select(.capable | not) | .addr'`,
	flags: jsonFlag,
	run: func(e *env, o *options, args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		ps, err := e.client.Peers(e.ctx)
		if err != nil {
			return err
		}
		if o.json {
			return writeJSON(e.stdout, ps)
		}
		tw := table(e.stdout)
		row(tw, "PEER", "SMC-R", "EXPIRES", "HITS", "REASON")
		for _, p := range ps {
			capable := "no"
			if p.Capable {
				capable = "yes"
			}
			exp := (time.Duration(p.ExpiresInSeconds * float64(time.Second))).Round(time.Second).String()
			row(tw, p.Addr, capable, exp, p.Hits, orDash(p.Reason))
		}
		return tw.Flush()
	},
}
