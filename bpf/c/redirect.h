/* cgroup connect4/6: send the application's connections to listed ports to smcrd's
 * redirect listener; getpeername/getsockname/getsockopt keep every party's view of
 * the addresses (the transparent path around RFC 7609 4.1 connection setup). */
#pragma once

#include "maps.h"

static __always_inline int netns_ok(void *ctx, struct config *cfg)
{
	return bpf_get_netns_cookie(ctx) == cfg->netns_cookie;
}

static __always_inline int is_own(struct bpf_sock *sk)
{
	struct sk_state *st = bpf_sk_storage_get(&smcr_sk, sk, 0, 0);

	return st && (st->flags & SK_OWN);
}

/* negative reports whether destination k is in the negative peer cache and not
 * expired. */
static __always_inline int negative(struct addr_port *k)
{
	__u64 *until = bpf_map_lookup_elem(&smcr_negative, k);

	if (!until)
		return 0;
	if (*until > bpf_ktime_get_ns())
		return 1;
	bpf_map_delete_elem(&smcr_negative, k);
	return 0;
}

/* unreachable reports whether smcrd could not reach the destination k lately
 * (smcr_unreach); if so it tags the socket for sockops to follow. */
static __always_inline int unreachable(struct bpf_sock_addr *ctx, struct addr_port *k)
{
	struct unreach *u = bpf_map_lookup_elem(&smcr_unreach, k);
	struct sk_state *st;

	if (!u)
		return 0;
	if (u->until <= bpf_ktime_get_ns()) {
		bpf_map_delete_elem(&smcr_unreach, k);
		return 0;
	}
	count(STAT_SKIP_UNREACHABLE);
	st = bpf_sk_storage_get(&smcr_sk, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (st)
		st->flags = (st->flags & ~SK_REDIRECTED) | SK_UNREACH;
	return 1;
}

/* direct: this connect goes where the application asked. A socket an earlier
 * connect redirected (and that failed, so the application may connect again)
 * must stop showing that destination to getpeername and getsockname. */
static __always_inline int direct(struct bpf_sock_addr *ctx)
{
	struct sk_state *st;

	if (!ctx->sk)
		return 1;
	st = bpf_sk_storage_get(&smcr_sk, ctx->sk, 0, 0);
	if (st && (st->flags & SK_REDIRECTED))
		st->flags &= ~SK_REDIRECTED;
	return 1;
}

/* set_mapped answers the IPv4 address v4 to a dual-stack socket: mapped. */
static __always_inline void set_mapped(struct bpf_sock_addr *ctx, __u32 v4)
{
	ctx->user_ip6[0] = 0;
	ctx->user_ip6[1] = 0;
	ctx->user_ip6[2] = bpf_htonl(0xffff);
	ctx->user_ip6[3] = v4;
}

/* listening: smcrd's redirect listener at tup's destination is there. A
 * crashed smcrd's listeners go with it at once, while its heartbeat deadline
 * lasts up to the TTL: connects sent there meanwhile would be refused. */
static __always_inline int listening(struct bpf_sock_addr *ctx, struct bpf_sock_tuple *tup, __u32 size)
{
	struct bpf_sock *sk = bpf_sk_lookup_tcp(ctx, tup, size, BPF_F_CURRENT_NETNS, 0);

	if (!sk)
		return 0;
	bpf_sk_release(sk);
	return 1;
}

/* bound: the application bound its socket to an address or a port, chosen
 * for the server to see (an allow-list, NFS's reserved ports); smcrd's own
 * connection would leave from an address and port of its choosing. */
static __always_inline int bound(struct bpf_sock *sk)
{
	if (sk->src_port)
		return 1;
	if (sk->family == AF_INET)
		return sk->src_ip4 != 0;
	return (sk->src_ip6[0] | sk->src_ip6[1] | sk->src_ip6[2] | sk->src_ip6[3]) != 0;
}

/* redirect_ok applies the checks common to both families. */
static __always_inline struct config *redirect_ok(struct bpf_sock_addr *ctx)
{
	struct config *cfg;

	if (ctx->type != SOCK_STREAM || (ctx->protocol != 0 && ctx->protocol != IPPROTO_TCP))
		return 0;
	cfg = config();
	if (!cfg || !netns_ok(ctx, cfg))
		return 0;
	if (!port_listed(bpf_ntohs((__u16)ctx->user_port)))
		return 0;
	if (!alive()) {
		count(STAT_SKIP_DEAD);
		return 0;
	}
	if (!ctx->sk || is_own(ctx->sk))
		return 0;
	/* Bound to a device (SO_BINDTODEVICE, a VRF): no route from there to
	 * smcrd's loopback listener, so the connect would fail. Marked
	 * (SO_MARK): policy routing may send it elsewhere than smcrd's own
	 * connection would go (around a VPN, say). */
	if (ctx->sk->bound_dev_if || ctx->sk->mark || bound(ctx->sk))
		return 0;
	return cfg;
}

/* redirect4: the IPv4 policy, for connect4 and for the IPv4-mapped
 * destinations of dual-stack sockets in connect6. Records daddr as the
 * original destination and returns 1 when it goes to smcrd's IPv4 redirect
 * listener. */
static __always_inline int redirect4(struct bpf_sock_addr *ctx, struct config *cfg, __u32 daddr)
{
	struct addr_port dk = {.family = AF_INET};
	struct bpf_sock_tuple tup = {};
	struct prefix_val *pv = 0;
	struct sk_state *st;

	if (!cfg->redir4_port)
		return 0;
	/* Loopback, and 0.0.0.0, which Linux connects to this host too. */
	if (!daddr || (bpf_ntohl(daddr) >> 24) == 127)
		return 0;
	if (cfg->flags & CFG_CHECK_PREFIX) {
		struct lpm4_key k = {.prefixlen = 32, .addr = daddr};

		pv = bpf_map_lookup_elem(&smcr_prefix4, &k);
		if (!pv || !pv->allow) {
			count(STAT_SKIP_PREFIX);
			return 0;
		}
	}
	dk.addr[0] = daddr;
	dk.port = (__u16)ctx->user_port;
	if (negative(&dk)) {
		count(STAT_SKIP_NEGATIVE);
		return 0;
	}
	if (unreachable(ctx, &dk))
		return 0;
	tup.ipv4.saddr = cfg->redir4_addr;
	tup.ipv4.daddr = cfg->redir4_addr;
	tup.ipv4.dport = cfg->redir4_port;
	if (!listening(ctx, &tup, sizeof(tup.ipv4))) {
		count(STAT_SKIP_DEAD);
		return 0;
	}
	st = bpf_sk_storage_get(&smcr_sk, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st)
		return 0;
	st->flags = SK_REDIRECTED;
	st->family = AF_INET;
	st->addr[0] = daddr;
	st->addr[1] = st->addr[2] = st->addr[3] = 0;
	st->src[0] = pv ? pv->src[0] : 0;
	st->src[1] = st->src[2] = st->src[3] = 0;
	st->port = (__u16)ctx->user_port;
	count(STAT_REDIRECTED);
	return 1;
}

SEC("cgroup/connect4")
int smcr_connect4(struct bpf_sock_addr *ctx)
{
	struct config *cfg = redirect_ok(ctx);

	if (!cfg || !redirect4(ctx, cfg, ctx->user_ip4))
		return direct(ctx);
	ctx->user_ip4 = cfg->redir4_addr;
	ctx->user_port = cfg->redir4_port;
	return 1;
}

SEC("cgroup/connect6")
int smcr_connect6(struct bpf_sock_addr *ctx)
{
	struct addr_port dk = {.family = AF_INET6};
	struct bpf_sock_tuple tup = {};
	struct prefix_val *pv = 0;
	struct sk_state *st;
	struct config *cfg;
	__u32 a0, a1, a2, a3;

	cfg = redirect_ok(ctx);
	if (!cfg)
		return direct(ctx);
	a0 = ctx->user_ip6[0];
	a1 = ctx->user_ip6[1];
	a2 = ctx->user_ip6[2];
	a3 = ctx->user_ip6[3];
	/* IPv4-mapped: a dual-stack socket reaching an IPv4 server, as every
	 * Java application does. The IPv4 policy and listener apply, mapped. */
	if (!a0 && !a1 && a2 == bpf_htonl(0xffff)) {
		if (!redirect4(ctx, cfg, a3))
			return direct(ctx);
		set_mapped(ctx, cfg->redir4_addr);
		ctx->user_port = cfg->redir4_port;
		return 1;
	}
	if (!cfg->redir6_port)
		return direct(ctx);
	/* ::1 and ::, which Linux connects to this host too. */
	if (!a0 && !a1 && !a2 && (!a3 || a3 == bpf_htonl(1)))
		return direct(ctx);
	/* Link-local (fe80::/10): the zone that makes it routable is the socket's
	 * scope id, which smcrd never learns, so it could not dial it. */
	if ((bpf_ntohl(a0) & 0xffc00000) == 0xfe800000)
		return direct(ctx);
	if (cfg->flags & CFG_CHECK_PREFIX) {
		struct lpm6_key k = {.prefixlen = 128, .addr = {a0, a1, a2, a3}};

		pv = bpf_map_lookup_elem(&smcr_prefix6, &k);
		if (!pv || !pv->allow) {
			count(STAT_SKIP_PREFIX);
			return direct(ctx);
		}
	}
	dk.addr[0] = a0;
	dk.addr[1] = a1;
	dk.addr[2] = a2;
	dk.addr[3] = a3;
	dk.port = (__u16)ctx->user_port;
	if (negative(&dk)) {
		count(STAT_SKIP_NEGATIVE);
		return direct(ctx);
	}
	if (unreachable(ctx, &dk))
		return direct(ctx);
	__builtin_memcpy(tup.ipv6.saddr, cfg->redir6_addr, 16);
	__builtin_memcpy(tup.ipv6.daddr, cfg->redir6_addr, 16);
	tup.ipv6.dport = cfg->redir6_port;
	if (!listening(ctx, &tup, sizeof(tup.ipv6))) {
		count(STAT_SKIP_DEAD);
		return direct(ctx);
	}
	st = bpf_sk_storage_get(&smcr_sk, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st)
		return 1;
	st->flags = SK_REDIRECTED;
	st->family = AF_INET6;
	st->addr[0] = a0;
	st->addr[1] = a1;
	st->addr[2] = a2;
	st->addr[3] = a3;
	if (pv) {
		st->src[0] = pv->src[0];
		st->src[1] = pv->src[1];
		st->src[2] = pv->src[2];
		st->src[3] = pv->src[3];
	} else {
		st->src[0] = st->src[1] = st->src[2] = st->src[3] = 0;
	}
	st->port = (__u16)ctx->user_port;
	ctx->user_ip6[0] = cfg->redir6_addr[0];
	ctx->user_ip6[1] = cfg->redir6_addr[1];
	ctx->user_ip6[2] = cfg->redir6_addr[2];
	ctx->user_ip6[3] = cfg->redir6_addr[3];
	ctx->user_port = cfg->redir6_port;
	count(STAT_REDIRECTED);
	return 1;
}

/* sk_tuple: the connection as sk sees it. */
static __always_inline void sk_tuple(struct bpf_sock *sk, struct tuple *t)
{
	t->family = sk->family;
	if (t->family == AF_INET) {
		t->laddr[0] = sk->src_ip4;
		t->raddr[0] = sk->dst_ip4;
	} else {
		t->laddr[0] = sk->src_ip6[0];
		t->laddr[1] = sk->src_ip6[1];
		t->laddr[2] = sk->src_ip6[2];
		t->laddr[3] = sk->src_ip6[3];
		t->raddr[0] = sk->dst_ip6[0];
		t->raddr[1] = sk->dst_ip6[1];
		t->raddr[2] = sk->dst_ip6[2];
		t->raddr[3] = sk->dst_ip6[3];
	}
	t->lport = sk->src_port;
	t->rport = bpf_ntohs(sk->dst_port);
	tuple_unmap(t);
}

#ifndef IPPROTO_MPTCP
#define IPPROTO_MPTCP 262
#endif

/* app_state: the tag of the application's socket sk. An MPTCP socket's connect
 * went through its first subflow, a TCP socket, which connect4/6 redirected
 * and tagged: the MPTCP socket has none, but shows that subflow's addresses,
 * by which it is found. */
static __always_inline struct sk_state *app_state(struct bpf_sock_addr *ctx, struct bpf_sock *sk)
{
	struct sk_state *st = bpf_sk_storage_get(&smcr_sk, sk, 0, 0);
	struct bpf_sock_tuple tup = {};
	struct bpf_sock *sub;
	__u32 size = sizeof(tup.ipv4);

	if (st || sk->protocol != IPPROTO_MPTCP)
		return st;
	/* As a segment from the peer would find the subflow. */
	tup.ipv4.sport = (__u16)sk->dst_port;
	tup.ipv4.dport = bpf_htons((__u16)sk->src_port);
	if (sk->family == AF_INET) {
		tup.ipv4.saddr = sk->dst_ip4;
		tup.ipv4.daddr = sk->src_ip4;
	} else if (!sk->dst_ip6[0] && !sk->dst_ip6[1] && sk->dst_ip6[2] == bpf_htonl(0xffff)) {
		tup.ipv4.saddr = sk->dst_ip6[3]; /* IPv4-mapped: an IPv4 subflow */
		tup.ipv4.daddr = sk->src_ip6[3];
	} else {
		tup.ipv6.sport = (__u16)sk->dst_port;
		tup.ipv6.dport = bpf_htons((__u16)sk->src_port);
		tup.ipv6.saddr[0] = sk->dst_ip6[0];
		tup.ipv6.saddr[1] = sk->dst_ip6[1];
		tup.ipv6.saddr[2] = sk->dst_ip6[2];
		tup.ipv6.saddr[3] = sk->dst_ip6[3];
		tup.ipv6.daddr[0] = sk->src_ip6[0];
		tup.ipv6.daddr[1] = sk->src_ip6[1];
		tup.ipv6.daddr[2] = sk->src_ip6[2];
		tup.ipv6.daddr[3] = sk->src_ip6[3];
		size = sizeof(tup.ipv6);
	}
	sub = bpf_sk_lookup_tcp(ctx, &tup, size, BPF_F_CURRENT_NETNS, 0);
	if (!sub)
		return 0;
	/* The MPTCP socket holds its first subflow, and so the storage. */
	st = bpf_sk_storage_get(&smcr_sk, sub, 0, 0);
	bpf_sk_release(sub);
	return st;
}

/* shown_peer: what getpeername should answer for sk, or 0 to leave it. */
static __always_inline struct addr_port *shown_peer(struct bpf_sock_addr *ctx, struct addr_port *buf)
{
	struct bpf_sock *sk = ctx->sk;
	struct sk_state *st;
	struct addr_port *ap;
	struct config *cfg;
	struct tuple t = {};

	if (!sk)
		return 0;
	/* Client host: the application's redirected socket shows the server it
	 * asked for. Server host: the application's socket accepted from smcrd
	 * shows the client (SK_PEER), or, not yet established, smcr_peers does. */
	st = app_state(ctx, sk);
	if (st && (st->flags & (SK_REDIRECTED | SK_PEER))) {
		buf->family = st->family;
		buf->addr[0] = st->addr[0];
		buf->addr[1] = st->addr[1];
		buf->addr[2] = st->addr[2];
		buf->addr[3] = st->addr[3];
		buf->port = st->port;
		return buf;
	}
	cfg = config();
	if (!cfg || !netns_ok(ctx, cfg))
		return 0;
	sk_tuple(sk, &t);
	ap = bpf_map_lookup_elem(&smcr_peers, &t);
	return ap;
}

SEC("cgroup/getpeername4")
int smcr_getpeername4(struct bpf_sock_addr *ctx)
{
	struct addr_port buf = {};
	struct addr_port *p = shown_peer(ctx, &buf);

	if (p && p->family == AF_INET) {
		ctx->user_ip4 = p->addr[0];
		ctx->user_port = p->port;
	}
	return 1;
}

SEC("cgroup/getpeername6")
int smcr_getpeername6(struct bpf_sock_addr *ctx)
{
	struct addr_port buf = {};
	struct addr_port *p = shown_peer(ctx, &buf);

	if (!p)
		return 1;
	if (p->family == AF_INET6) {
		ctx->user_ip6[0] = p->addr[0];
		ctx->user_ip6[1] = p->addr[1];
		ctx->user_ip6[2] = p->addr[2];
		ctx->user_ip6[3] = p->addr[3];
	} else {
		/* A dual-stack application socket: the IPv4 peer, mapped. */
		set_mapped(ctx, p->addr[0]);
	}
	ctx->user_port = p->port;
	return 1;
}

/* getsockname: a redirected socket's local address is on loopback; show the
 * address of the interface its original route leaves through, when known. */
SEC("cgroup/getsockname4")
int smcr_getsockname4(struct bpf_sock_addr *ctx)
{
	struct sk_state *st;

	if (!ctx->sk)
		return 1;
	st = app_state(ctx, ctx->sk);
	if (st && (st->flags & SK_REDIRECTED) && st->family == AF_INET && st->src[0])
		ctx->user_ip4 = st->src[0];
	return 1;
}

SEC("cgroup/getsockname6")
int smcr_getsockname6(struct bpf_sock_addr *ctx)
{
	struct sk_state *st;

	if (!ctx->sk)
		return 1;
	st = app_state(ctx, ctx->sk);
	if (!st || !(st->flags & SK_REDIRECTED))
		return 1;
	if (st->family == AF_INET) {
		/* A dual-stack socket redirected to an IPv4 server: mapped. */
		if (st->src[0])
			set_mapped(ctx, st->src[0]);
		return 1;
	}
	if (!(st->src[0] | st->src[1] | st->src[2] | st->src[3]))
		return 1;
	ctx->user_ip6[0] = st->src[0];
	ctx->user_ip6[1] = st->src[1];
	ctx->user_ip6[2] = st->src[2];
	ctx->user_ip6[3] = st->src[3];
	return 1;
}

/* sockopt_pass leaves the kernel's answer as it is. A program sees at most a page
 * of it; kernels before 6.5 (without 29ebbba7d461) fail the getsockopt with
 * EFAULT when a program passes on a longer optlen, so every getsockopt in the
 * cgroup answering more than 4096 bytes (iptables-legacy's, say) would fail.
 * optlen 0 tells every kernel to keep its answer untouched
 * (Documentation/bpf/prog_cgroup_sockopt.rst). */
static __always_inline int sockopt_pass(struct bpf_sockopt *ctx)
{
	if (ctx->optlen > 4096)
		ctx->optlen = 0;
	return 1;
}

/* getsockopt(SOL_IP, SO_ORIGINAL_DST) / (SOL_IPV6, IP6T_SO_ORIGINAL_DST) on smcrd's
 * accepted redirect socket answers the application's original destination, as
 * netfilter's REDIRECT would. */
SEC("cgroup/getsockopt")
int smcr_getsockopt(struct bpf_sockopt *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	struct addr_port *ap;
	struct config *cfg;
	struct orig *o;
	struct tuple t = {};
	__u8 *p = ctx->optval, *end = ctx->optval_end;

	if (!((ctx->level == SOL_IP && ctx->optname == SO_ORIGINAL_DST) ||
	      (ctx->level == SOL_IPV6 && ctx->optname == IP6T_SO_ORIGINAL_DST)))
		return sockopt_pass(ctx);
	if (!sk)
		return sockopt_pass(ctx);
	cfg = config();
	if (!cfg || !netns_ok(ctx, cfg))
		return sockopt_pass(ctx);
	sk_tuple(sk, &t);
	o = bpf_map_lookup_elem(&smcr_origdst, &t);
	if (!o)
		return sockopt_pass(ctx);
	ap = &o->dst;
	if (ap->family == AF_INET) {
		struct sockaddr_in *sin = (void *)p;

		if (p + sizeof(*sin) > end)
			return sockopt_pass(ctx);
		__builtin_memset(sin, 0, sizeof(*sin));
		sin->sin_family = AF_INET;
		sin->sin_port = ap->port;
		sin->sin_addr.s_addr = ap->addr[0];
		ctx->optlen = sizeof(*sin);
	} else {
		struct sockaddr_in6 *sin6 = (void *)p;

		if (p + sizeof(*sin6) > end)
			return sockopt_pass(ctx);
		__builtin_memset(sin6, 0, sizeof(*sin6));
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = ap->port;
		sin6->sin6_addr.in6_u.u6_addr32[0] = ap->addr[0];
		sin6->sin6_addr.in6_u.u6_addr32[1] = ap->addr[1];
		sin6->sin6_addr.in6_u.u6_addr32[2] = ap->addr[2];
		sin6->sin6_addr.in6_u.u6_addr32[3] = ap->addr[3];
		ctx->optlen = sizeof(*sin6);
	}
	ctx->retval = 0;
	count(STAT_ORIG_DST_ANSWERED);
	return 1;
}

/* apply_opt records in o what setsockopt(level, optname, v) does to the options
 * smcrd carries; 0 when it is none of them. dst_family: the destination's (a
 * dual-stack socket's IPv4 traffic takes IP_TOS, not IPV6_TCLASS), 0 for any. */
static __always_inline int apply_opt(struct app_opts *o, __u32 dst_family, __u32 level, __u32 optname, __s32 v)
{
	__u32 bit;

	switch (level << 16 | optname) {
	case SOL_IP << 16 | IP_TOS:
		if (dst_family && dst_family != AF_INET)
			return 0;
		o->tos = v;
		bit = OPT_TOS;
		break;
	case SOL_IPV6 << 16 | IPV6_TCLASS:
		if (dst_family && dst_family != AF_INET6)
			return 0;
		o->tos = v < 0 ? 0 : v; /* -1: the default */
		bit = OPT_TOS;
		break;
	case SOL_SOCKET << 16 | SO_PRIORITY:
		o->priority = v;
		bit = OPT_PRIORITY;
		break;
	case SOL_SOCKET << 16 | SO_KEEPALIVE:
		bit = OPT_KEEPALIVE;
		break;
	case SOL_TCP << 16 | TCP_KEEPIDLE:
		o->keepidle = v;
		return 1;
	case SOL_TCP << 16 | TCP_KEEPINTVL:
		o->keepintvl = v;
		return 1;
	case SOL_TCP << 16 | TCP_KEEPCNT:
		o->keepcnt = v;
		return 1;
	case SOL_TCP << 16 | TCP_USER_TIMEOUT:
		o->user_timeout = v;
		bit = OPT_USER_TIMEOUT;
		break;
	default:
		return 0;
	}
	if (v > 0)
		o->have |= bit;
	else
		o->have &= ~bit;
	return 1;
}

/* setsockopt on an application's redirected socket, after its connect (before
 * it, sockops reads the socket's options at the connect), or on its socket
 * accepted from smcrd (sockops passes on what it inherited from the listener):
 * an option its connection on the wire would carry goes to smcrd's connection
 * too, through smcr_sockopts, and on the client side into the
 * original-destination entry while smcrd has not read it. Runs before the
 * kernel's setsockopt, so it passes on what the application asked, whether the
 * kernel takes it or not; smcrd's setsockopt then refuses what the
 * application's refused. */
SEC("cgroup/setsockopt")
int smcr_setsockopt(struct bpf_sockopt *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	__u8 *p = ctx->optval, *end = ctx->optval_end;
	struct app_opts scratch = {};
	struct sk_state *st;
	struct config *cfg;
	struct orig *o;
	struct tuple t = {};
	__u32 laddr[4];
	__u16 lport;
	__s32 v;

	if (!sk || ctx->optlen != sizeof(v) || p + sizeof(v) > end)
		return sockopt_pass(ctx);
	/* From here optlen is 4: the kernel's own setsockopt takes it as it is. */
	v = *(__s32 *)p;
	/* One smcrd carries? (One switch decides that and applies it.) */
	if (!apply_opt(&scratch, 0, ctx->level, ctx->optname, v))
		return 1;
	st = bpf_sk_storage_get(&smcr_sk, sk, 0, 0);
	if (!st || !(st->flags & (SK_REDIRECTED | SK_PEER)))
		return 1;
	cfg = config();
	if (!cfg || !netns_ok(ctx, cfg))
		return 1;
	/* The connection as smcrd's accepted socket sees it: the other way. */
	sk_tuple(sk, &t);
	__builtin_memcpy(laddr, t.laddr, sizeof(laddr));
	__builtin_memcpy(t.laddr, t.raddr, sizeof(laddr));
	__builtin_memcpy(t.raddr, laddr, sizeof(laddr));
	lport = t.lport;
	t.lport = t.rport;
	t.rport = lport;
	if (st->flags & SK_REDIRECTED) {
		o = bpf_map_lookup_elem(&smcr_origdst, &t);
		if (o)
			apply_opt(&o->opts, o->dst.family, ctx->level, ctx->optname, v);
	}
	emit_sockopt(&t, ctx->level, ctx->optname, v);
	return 1;
}
