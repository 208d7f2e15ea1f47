// linkgroups: the link groups (RFC 7609 §3.3), one line each, after
// `smcr linkgroup show`.

package cli

var linkgroupsCmd = &command{
	name:     "linkgroups",
	synopsis: "[--json]",
	short:    "list link groups: role, peer, provider, state, links, connections",
	long: `Lists the link groups: the set of links (RC queue pairs) to one peer that its
SMC-R connections share. A link group is created by a peer's first connection
("first contact") and kept a while after its last connection closes.

Columns: ID, ROLE (client or server), PEER (SMC peer ID), PEER-ADDR, PROVIDER
(rdma, shm, soft), STATE, LINKS (active/most: the most links the group has had
at once, so 1/2 is a group that lost a path and has not got it back), CONNS.

Options:
  --json  print the link groups with all their links as JSON

Examples:
  smcrctl linkgroups
  smcrctl linkgroups --json | jq '.[] | {id, conns}'`,
	flags: jsonFlag,
	run: func(e *env, o *options, args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		lgs, err := e.client.LinkGroups(e.ctx)
		if err != nil {
			return err
		}
		if o.json {
			return writeJSON(e.stdout, lgs)
		}
		tw := table(e.stdout)
		row(tw, "ID", "ROLE", "PEER", "PEER-ADDR", "PROVIDER", "STATE", "LINKS", "CONNS")
		for _, lg := range lgs {
			active := 0
			for _, l := range lg.Links {
				if l.State == "active" {
					active++
				}
			}
			most := max(lg.MostLinks, len(lg.Links))
			row(tw, lg.ID, lg.Role, lg.Peer, orDash(lg.PeerAddr), lg.Provider, lg.State, itoa(active)+"/"+itoa(most), lg.Conns)
		}
		return tw.Flush()
	},
}
