// peers: the peer capability cache, which decides whether a connection to a peer
// tries SMC-R (RFC 7609 §3.7: a declined peer is reached over TCP for a while).

package cli

import (
	"flag"
	"fmt"
	"net/netip"
	"time"

	"github.com/smcr-io/smcr/control"
)

var peersCmd = &command{
	name:     "peers",
	synopsis: "[--json] | --forget [ADDR[:PORT]...]",
	short:    "list the peer cache: SMC-R capable or not, until when",
	long: `Lists the peer capability cache. A peer is a destination, address and port: a
server host may offer SMC-R on some ports and not others. A peer that declined
SMC-R (or never answered the SMC option) is connected to as plain TCP, without
redirection, until its entry expires (peer_cache_ttl; a few seconds, doubling,
for one that had SMC-R lately: its smcrd was most likely restarting); then
SMC-R is tried again. The same host's other ports are not affected. Only
destinations this host's applications connect to are listed: smcrd keeps no
entries for the clients it serves.

Columns: PEER (address and port), SMC-R (yes or no), EXPIRES (time left), HITS
(connections decided by the entry), REASON (why not SMC-R).

An entry whose reason says unreachable is a destination smcrd could not connect
to (refused, unreachable, timed out): connections to it go direct, so that
applications see the refusal or timeout themselves, for as long as they keep
failing; the first that connects ends the entry.

The cache outlives smcrd (its programs keep it), so a peer that declined while
its own smcrd was restarting stays plain TCP until the entry expires: --forget
takes it out at once.

Options:
  --json    print the cache as JSON
  --forget  take the named peers out of the cache (an address alone: every
            port of it; none named: every entry): their next connections
            try SMC-R again

Examples:
  smcrctl peers
  smcrctl peers --json | jq -r '.[] | select(.capable | not) | .addr'
  smcrctl peers --forget 192.0.2.7
  smcrctl peers --forget 192.0.2.7:6379 [2001:db8::7]:443
  smcrctl peers --forget`,
	flags: func(fs *flag.FlagSet, o *options) {
		jsonFlag(fs, o)
		fs.BoolVar(&o.forget, "forget", false, "")
	},
	run: func(e *env, o *options, args []string) error {
		if o.forget {
			return forgetPeers(e, args)
		}
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
			peer := p.Addr
			if a, err := netip.ParseAddr(p.Addr); err == nil && p.Port != 0 {
				peer = netip.AddrPortFrom(a, p.Port).String()
			}
			row(tw, peer, capable, exp, p.Hits, orDash(p.Reason))
		}
		return tw.Flush()
	},
}

func forgetPeers(e *env, args []string) error {
	for _, a := range args {
		if _, err := control.ParsePeer(a); err != nil {
			return usagef("%v", err)
		}
	}
	n, err := e.client.ForgetPeers(e.ctx, args...)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(e.stdout, "%d %s forgotten: new connections to them try SMC-R\n", n, map[bool]string{true: "peer cache entry", false: "peer cache entries"}[n == 1])
	return err
}
