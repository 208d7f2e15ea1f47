/* sockops: writes the SMC-R TCP option on smcrd's SYNs, echoes it on the SYN-ACKs of
 * smcrd's steering listener, and records what was seen (RFC 7609 3.3, 4.1). It also
 * copies the per-socket tags of redirected and smcrd-made connections into maps keyed
 * by 4-tuple, once connect() has chosen the local address. */
#pragma once

#include "maps.h"

#define TCPHDR_SYN 0x02
#define TCPHDR_ACK 0x10

static __always_inline int netns_ok_ops(struct bpf_sock_ops *skops)
{
	struct config *cfg = config();

	return cfg && bpf_get_netns_cookie(skops) == cfg->netns_cookie;
}

/* own: the connection as this socket sees it. */
static __always_inline void ops_tuple(struct bpf_sock_ops *skops, struct tuple *t, int own)
{
	__u32 lport = skops->local_port, rport = bpf_ntohl(skops->remote_port);

	t->family = skops->family;
	if (t->family == AF_INET) {
		__u32 l = skops->local_ip4, r = skops->remote_ip4;

		t->laddr[0] = own ? l : r;
		t->raddr[0] = own ? r : l;
	} else {
		t->laddr[0] = own ? skops->local_ip6[0] : skops->remote_ip6[0];
		t->laddr[1] = own ? skops->local_ip6[1] : skops->remote_ip6[1];
		t->laddr[2] = own ? skops->local_ip6[2] : skops->remote_ip6[2];
		t->laddr[3] = own ? skops->local_ip6[3] : skops->remote_ip6[3];
		t->raddr[0] = own ? skops->remote_ip6[0] : skops->local_ip6[0];
		t->raddr[1] = own ? skops->remote_ip6[1] : skops->local_ip6[1];
		t->raddr[2] = own ? skops->remote_ip6[2] : skops->local_ip6[2];
		t->raddr[3] = own ? skops->remote_ip6[3] : skops->local_ip6[3];
	}
	t->lport = own ? lport : rport;
	t->rport = own ? rport : lport;
	tuple_unmap(t);
}

static __always_inline void seen_or(struct bpf_sock_ops *skops, __u32 flags)
{
	struct tuple t = {};
	__u32 *v;

	ops_tuple(skops, &t, 1);
	v = bpf_map_lookup_elem(&smcr_seen, &t);
	if (v) {
		__sync_fetch_and_or(v, flags);
		return;
	}
	bpf_map_update_elem(&smcr_seen, &t, &flags, BPF_NOEXIST);
	v = bpf_map_lookup_elem(&smcr_seen, &t);
	if (v)
		__sync_fetch_and_or(v, flags);
}

static __always_inline void set_cb_flags(struct bpf_sock_ops *skops, __u32 set, __u32 clear)
{
	bpf_sock_ops_cb_flags_set(skops, (skops->bpf_sock_ops_cb_flags | set) & ~clear);
}

static __always_inline int syn_had_option(struct bpf_sock_ops *skops)
{
	__u8 opt[8] = SMC_OPT_INIT;

	return bpf_load_hdr_opt(skops, opt, sizeof(opt), BPF_LOAD_HDR_OPT_TCP_SYN) == SMC_OPT_LEN;
}

/* read_app_opts reads what of the options of the application's socket its connection
 * on the wire would carry (struct app_opts). A kernel whose bpf_getsockopt does
 * not answer one leaves it unflagged. */
static __always_inline void read_app_opts(struct bpf_sock_ops *skops, __u32 dst_family, struct app_opts *o)
{
	int v = 0;

	/* A dual-stack socket's IPv4 traffic takes IP_TOS, which bpf_getsockopt
	 * answers for IPv4 sockets only: left as smcrd's. */
	if (skops->family == AF_INET) {
		if (!bpf_getsockopt(skops, SOL_IP, IP_TOS, &v, sizeof(v)) && v) {
			o->tos = v;
			o->have |= OPT_TOS;
		}
	} else if (dst_family == AF_INET6) {
		if (!bpf_getsockopt(skops, SOL_IPV6, IPV6_TCLASS, &v, sizeof(v)) && v > 0) {
			o->tos = v;
			o->have |= OPT_TOS;
		}
	}
	v = 0;
	if (!bpf_getsockopt(skops, SOL_SOCKET, SO_PRIORITY, &v, sizeof(v)) && v) {
		o->priority = v;
		o->have |= OPT_PRIORITY;
	}
	/* The timings whether keepalive is on or not: an SO_KEEPALIVE that comes
	 * after the connect (smcr_setsockopt) turns them on as they are. */
	v = 0;
	if (!bpf_getsockopt(skops, SOL_TCP, TCP_KEEPIDLE, &v, sizeof(v)))
		o->keepidle = v;
	v = 0;
	if (!bpf_getsockopt(skops, SOL_TCP, TCP_KEEPINTVL, &v, sizeof(v)))
		o->keepintvl = v;
	v = 0;
	if (!bpf_getsockopt(skops, SOL_TCP, TCP_KEEPCNT, &v, sizeof(v)))
		o->keepcnt = v;
	v = 0;
	if (!bpf_getsockopt(skops, SOL_SOCKET, SO_KEEPALIVE, &v, sizeof(v)) && v && o->keepidle && o->keepintvl && o->keepcnt)
		o->have |= OPT_KEEPALIVE;
	v = 0;
	if (!bpf_getsockopt(skops, SOL_TCP, TCP_USER_TIMEOUT, &v, sizeof(v)) && v) {
		o->user_timeout = v;
		o->have |= OPT_USER_TIMEOUT;
	}
}

/* emit_inherited passes on to smcrd the options an application's socket
 * accepted from smcrd inherited from its listener, for the steered connection
 * on the wire (from a client of family dst_family) to take. Those it sets later
 * go through smcr_setsockopt. */
static __always_inline void emit_inherited(struct bpf_sock_ops *skops, __u32 dst_family)
{
	struct app_opts o = {};
	struct tuple t = {};

	read_app_opts(skops, dst_family, &o);
	if (!o.have)
		return;
	ops_tuple(skops, &t, 0); /* as smcrd's connection to the application sees it */
	if (o.have & OPT_TOS) {
		if (skops->family == AF_INET)
			emit_sockopt(&t, SOL_IP, IP_TOS, o.tos);
		else
			emit_sockopt(&t, SOL_IPV6, IPV6_TCLASS, o.tos);
	}
	if (o.have & OPT_PRIORITY)
		emit_sockopt(&t, SOL_SOCKET, SO_PRIORITY, o.priority);
	if (o.have & OPT_KEEPALIVE) {
		emit_sockopt(&t, SOL_TCP, TCP_KEEPIDLE, o.keepidle);
		emit_sockopt(&t, SOL_TCP, TCP_KEEPINTVL, o.keepintvl);
		emit_sockopt(&t, SOL_TCP, TCP_KEEPCNT, o.keepcnt);
		emit_sockopt(&t, SOL_SOCKET, SO_KEEPALIVE, 1);
	}
	if (o.have & OPT_USER_TIMEOUT)
		emit_sockopt(&t, SOL_TCP, TCP_USER_TIMEOUT, o.user_timeout);
}

/* connect(): the local address is chosen; the socket's tag becomes 4-tuple entries. */
static __always_inline void on_connect(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	struct sk_state *st;
	struct orig o = {};
	struct tuple t = {};
	__u32 set = 0;

	if (!sk)
		return;
	st = bpf_sk_storage_get(&smcr_sk, sk, 0, 0);
	if (!st)
		return;
	ops_tuple(skops, &t, 0);
	o.dst.family = st->family;
	o.dst.addr[0] = st->addr[0];
	o.dst.addr[1] = st->addr[1];
	o.dst.addr[2] = st->addr[2];
	o.dst.addr[3] = st->addr[3];
	o.dst.port = st->port;
	if (st->flags & SK_REDIRECTED) {
		read_app_opts(skops, st->family, &o.opts);
		o.at = bpf_ktime_get_ns();
		/* BPF_ANY: replaces a leftover of an earlier connection on this
		 * 4-tuple. No close callback: smcrd deletes the entry (maps.h). */
		bpf_map_update_elem(&smcr_origdst, &t, &o, BPF_ANY);
	} else if (st->flags & SK_SHOW_PEER) {
		bpf_map_update_elem(&smcr_peers, &t, &o.dst, BPF_ANY);
		set |= BPF_SOCK_OPS_STATE_CB_FLAG;
	}
	if (st->flags & SK_OPTION)
		set |= BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG | BPF_SOCK_OPS_STATE_CB_FLAG;
	if (st->flags & SK_UNREACH)
		set |= BPF_SOCK_OPS_STATE_CB_FLAG; /* to see it fail (on_state) */
	if (set)
		set_cb_flags(skops, set, 0);
}

static __always_inline void on_listen(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	struct sk_state *st;

	if (!sk)
		return;
	st = bpf_sk_storage_get(&smcr_sk, sk, 0, 0);
	if (st && (st->flags & SK_OPTION)) {
		int one = 1;

		/* A retransmitted SYN-ACK (lost, or the SYN came again) is built
		 * without the SYN; only a saved copy tells it to echo the option. */
		bpf_setsockopt(skops, SOL_TCP, TCP_SAVE_SYN, &one, sizeof(one));
		set_cb_flags(skops, BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG, 0);
	}
}

/* The header option callbacks are the socket's, and other sockops programs
 * may ask for them too (Katran's TCP packet routing does, on every socket):
 * the option goes only on the SYN of a socket smcrd tagged SK_OPTION, ... */
static __always_inline int own_syn(struct bpf_sock_ops *skops)
{
	struct sk_state *st;

	if (!skops->sk)
		return 0;
	st = bpf_sk_storage_get(&smcr_sk, skops->sk, 0, 0);
	return st && (st->flags & SK_OPTION);
}

/* ... and on the SYN-ACK of a connection sk_lookup steered to smcrd's steering
 * listener or left to a listener of the direct mode (a request socket, without
 * storage of its own): any other application's listener that echoed it would
 * have smcrd's client send it a CLC Proposal. */
static __always_inline int steered_synack(struct bpf_sock_ops *skops)
{
	struct tuple t = {};
	__u64 *mark;

	ops_tuple(skops, &t, 1);
	mark = bpf_map_lookup_elem(&smcr_synmark, &t);
	return mark && (*mark & MARK_FLAGS);
}

/* Room for the option: on our SYN always, on a SYN-ACK only when the SYN had it,
 * and there for the SMCX option too. */
static __always_inline void on_hdr_len(struct bpf_sock_ops *skops)
{
	__u8 f = skops->skb_tcp_flags;
	__u32 len = SMC_OPT_LEN;

	if (!(f & TCPHDR_SYN))
		return;
	if (f & TCPHDR_ACK) {
		if (!steered_synack(skops) || !syn_had_option(skops))
			return;
		len += SMC_OPT_LEN;
	} else if (!own_syn(skops)) {
		return;
	}
	if (bpf_reserve_hdr_opt(skops, len, 0)) {
		/* Other options (timestamps, MD5, AO...) took the 40 bytes: the
		 * connection goes on without the hint, and smcrd learns why. */
		count(STAT_OPT_NO_SPACE);
		if (!(f & TCPHDR_ACK))
			seen_or(skops, SEEN_NO_SPACE);
	}
}

static __always_inline void on_write_hdr(struct bpf_sock_ops *skops)
{
	__u8 opt[8] = SMC_OPT_INIT;
	__u8 f = skops->skb_tcp_flags;
	long err;

	if (!(f & TCPHDR_SYN))
		return;
	if ((f & TCPHDR_ACK) ? !steered_synack(skops) || !syn_had_option(skops) : !own_syn(skops))
		return;
	err = bpf_store_hdr_opt(skops, opt, SMC_OPT_LEN, 0);
	if (err == -17 /* EEXIST: a retransmission already has it */)
		err = 0;
	if (!err && (f & TCPHDR_ACK)) {
		__u8 x[8] = SMCX_OPT_INIT;

		err = bpf_store_hdr_opt(skops, x, SMC_OPT_LEN, 0);
		if (err == -17)
			err = 0;
	}
	if (err)
		count(STAT_OPT_NO_SPACE);
	else
		count((f & TCPHDR_ACK) ? STAT_SYNACK_OPT_SENT : STAT_SYN_OPT_SENT);
	if (!(f & TCPHDR_ACK))
		seen_or(skops, err ? SEEN_NO_SPACE : SEEN_SENT_SYN_OPT);
}

/* dest_key: the destination of an application's connection, as connect4/6 keyed
 * it in smcr_unreach (IPv4-mapped as IPv4). */
static __always_inline void dest_key(struct bpf_sock_ops *skops, struct addr_port *k)
{
	k->port = bpf_htons((__u16)bpf_ntohl(skops->remote_port));
	if (skops->family == AF_INET) {
		k->family = AF_INET;
		k->addr[0] = skops->remote_ip4;
		return;
	}
	if (!skops->remote_ip6[0] && !skops->remote_ip6[1] && skops->remote_ip6[2] == bpf_htonl(0xffff)) {
		k->family = AF_INET;
		k->addr[0] = skops->remote_ip6[3];
		return;
	}
	k->family = AF_INET6;
	k->addr[0] = skops->remote_ip6[0];
	k->addr[1] = skops->remote_ip6[1];
	k->addr[2] = skops->remote_ip6[2];
	k->addr[3] = skops->remote_ip6[3];
}

/* unreach_outcome: an application's direct connect to a destination smcrd could
 * not reach (SK_UNREACH) ended: connected, the destination is reachable again
 * and the next connections go through smcrd; failed, it stays direct for
 * another ttl. Only an entry still there is kept. */
static __always_inline void unreach_outcome(struct bpf_sock_ops *skops, int connected)
{
	struct sk_state *st;
	struct addr_port k = {};
	struct unreach *u;

	if (!skops->sk)
		return;
	st = bpf_sk_storage_get(&smcr_sk, skops->sk, 0, 0);
	if (!st || !(st->flags & SK_UNREACH))
		return;
	st->flags &= ~SK_UNREACH;
	dest_key(skops, &k);
	if (connected) {
		bpf_map_delete_elem(&smcr_unreach, &k);
		return;
	}
	u = bpf_map_lookup_elem(&smcr_unreach, &k);
	if (u)
		u->until = bpf_ktime_get_ns() + u->ttl;
}

static __always_inline void on_active_established(struct bpf_sock_ops *skops)
{
	__u8 opt[8] = SMC_OPT_INIT;
	__u32 seen = SEEN_ESTABLISHED;

	if (skops->bpf_sock_ops_cb_flags & BPF_SOCK_OPS_STATE_CB_FLAG)
		unreach_outcome(skops, 1);
	if (!(skops->bpf_sock_ops_cb_flags & BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG) || !own_syn(skops))
		return;
	/* skb is the SYN-ACK here. */
	if (bpf_load_hdr_opt(skops, opt, sizeof(opt), 0) == SMC_OPT_LEN) {
		__u8 x[8] = SMCX_OPT_INIT;

		seen |= SEEN_PEER_ECHOED;
		count(STAT_PEER_ECHOED);
		if (bpf_load_hdr_opt(skops, x, sizeof(x), 0) == SMC_OPT_LEN)
			seen |= SEEN_PEER_SMCX;
	}
	seen_or(skops, seen);
	/* Only SYNs carry the option: no per-segment callbacks from now on. */
	set_cb_flags(skops, 0, BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
}

/* An application's socket accepted from smcrd (SK_SHOW_PEER): the peer to show
 * moves from smcr_peers into the socket's storage. smcrd's end may close (and
 * forget the map entry) before the application accepts or asks getpeername. */
static __always_inline void adopt_peer(struct bpf_sock_ops *skops, struct tuple *t)
{
	struct addr_port *ap = bpf_map_lookup_elem(&smcr_peers, t);
	struct sk_state *st;

	if (!ap || !skops->sk)
		return;
	st = bpf_sk_storage_get(&smcr_sk, skops->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st)
		return; /* the map entry serves until smcrd's end closes */
	st->flags = SK_PEER;
	st->family = ap->family;
	__builtin_memcpy(st->addr, ap->addr, sizeof(st->addr));
	st->port = ap->port;
	bpf_map_delete_elem(&smcr_peers, t);
	emit_inherited(skops, st->family);
}

static __always_inline void on_passive_established(struct bpf_sock_ops *skops)
{
	struct tuple t = {};
	__u64 *mark;

	ops_tuple(skops, &t, 1);
	mark = bpf_map_lookup_elem(&smcr_synmark, &t);
	if (!mark || !(*mark & MARK_FLAGS)) {
		adopt_peer(skops, &t);
		return;
	}
	if (*mark & MARK_DIRECT) {
		/* For smcrd, which the library asks whether to run CLC on the
		 * socket its program accepted. */
		struct sk_state *st = skops->sk ? bpf_sk_storage_get(&smcr_sk, skops->sk, 0, BPF_SK_STORAGE_GET_F_CREATE) : 0;

		if (st)
			st->flags |= SK_SYN_OPT;
	}
	/* Steered to smcrd or to the direct mode: only SYN-ACKs carry the option (nothing recorded,
	 * smcr_seen). The mark has done its work: from now on the connection's
	 * segments find this socket before any sk_lookup. Left in the map, it
	 * would steer a later connection on the 4-tuple whose SYN tc cannot
	 * read to clear it (steer.h). */
	set_cb_flags(skops, 0, BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
	bpf_map_delete_elem(&smcr_synmark, &t);
}

/* A tracked connection closed: forget it, so a later connection reusing the
 * 4-tuple is not mistaken for it. Not smcr_origdst: smcrd may not have read it
 * yet (maps.h). */
static __always_inline void on_state(struct bpf_sock_ops *skops)
{
	struct tuple t = {};

	if (skops->args[1] != BPF_TCP_CLOSE)
		return;
	if (skops->args[0] == BPF_TCP_SYN_SENT)
		unreach_outcome(skops, 0);
	ops_tuple(skops, &t, 0);
	bpf_map_delete_elem(&smcr_peers, &t);
	ops_tuple(skops, &t, 1);
	bpf_map_delete_elem(&smcr_seen, &t);
}

SEC("sockops")
int smcr_sockops(struct bpf_sock_ops *skops)
{
	if (skops->family != AF_INET && skops->family != AF_INET6)
		return 1;
	if (!netns_ok_ops(skops))
		return 1;
	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
		on_connect(skops);
		break;
	case BPF_SOCK_OPS_TCP_LISTEN_CB:
		on_listen(skops);
		break;
	case BPF_SOCK_OPS_HDR_OPT_LEN_CB:
		on_hdr_len(skops);
		break;
	case BPF_SOCK_OPS_WRITE_HDR_OPT_CB:
		on_write_hdr(skops);
		break;
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		on_active_established(skops);
		break;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		on_passive_established(skops);
		break;
	case BPF_SOCK_OPS_STATE_CB:
		on_state(skops);
		break;
	}
	return 1;
}
