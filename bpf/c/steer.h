/* tc ingress marks incoming SYNs to listed ports that carry the SMC-R option
 * (RFC 7609 3.3); sk_lookup steers exactly those connections to smcrd's steering
 * listener. Every other SYN reaches the application as always. */
#pragma once

#include "maps.h"

#define TCP_MAX_OPTS 40
/* How far into a frame the TCP header may start (bounds for the verifier):
 * past IPv4 options, or up to IPV6_EXT_MAX IPv6 extension headers. */
#define THOFF_MAX 512
#define IPV6_EXT_MAX 4

/* How long a mark steers. sk_lookup meets it microseconds after tc wrote it, on
 * the SYN, or a round trip or a few retransmissions later, on the handshake's
 * last ACK when the listener answered with a syncookie. sockops deletes it once
 * the handshake completes; an older mark belongs to a handshake that never did,
 * left where tc could not clear it (a SYN it does not parse, such as IPv6 with
 * more extension headers than it steps over). */
#define MARK_TTL_NS (10ULL * 1000000000)

struct optwalk {
	__u8 buf[TCP_MAX_OPTS + 8]; /* slack so 6-byte reads near the end stay in bounds */
	__u32 off;
	__u32 end;
	__u32 found;
};

/* One option per call; a plain loop over 40 bytes exceeds the verifier's budget. */
static long opt_step(__u32 i, void *data)
{
	struct optwalk *w = data;
	__u32 off = w->off;
	__u8 kind, len;

	if (off >= w->end || off >= TCP_MAX_OPTS)
		return 1;
	kind = w->buf[off];
	if (kind == 0) /* end of option list */
		return 1;
	if (kind == 1) { /* NOP */
		w->off = off + 1;
		return 0;
	}
	if (off + 2 > w->end)
		return 1;
	len = w->buf[off + 1];
	if (len < 2 || off + len > w->end)
		return 1; /* malformed: stop, nothing found */
	/* As bpf_load_hdr_opt finds it, so that tc marks exactly the SYNs the
	 * steering listener echoes the option to (sockops.h, syn_had_option):
	 * an experimental option too short for a 4-byte ExID ends the search,
	 * and the first with the SMC-R ExID decides, by its length. */
	if (kind == SMC_OPT_KIND) {
		if (len < SMC_OPT_LEN)
			return 1;
		if (w->buf[off + 2] == 0xe2 && w->buf[off + 3] == 0xd4 && w->buf[off + 4] == 0xc3 &&
		    w->buf[off + 5] == 0xd9) {
			w->found = len == SMC_OPT_LEN;
			return 1;
		}
	}
	w->off = off + len;
	return 0;
}

SEC("tc")
int smcr_tc_ingress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct tuple t = {};
	struct tcphdr *th;
	struct optwalk w = {};
	__u32 thoff, optlen;

	if ((void *)(eth + 1) > end)
		return TC_ACT_UNSPEC;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end || ip->protocol != IPPROTO_TCP)
			return TC_ACT_UNSPEC;
		if (ip->frag_off & bpf_htons(0x3fff)) /* MF or offset: not a whole SYN */
			return TC_ACT_UNSPEC;
		thoff = sizeof(*eth) + ip->ihl * 4;
		t.family = AF_INET;
		t.laddr[0] = ip->daddr;
		t.raddr[0] = ip->saddr;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		__u8 next;

		if ((void *)(ip6 + 1) > end)
			return TC_ACT_UNSPEC;
		thoff = sizeof(*eth) + sizeof(*ip6);
		/* Hop-by-hop, routing and destination options headers before TCP
		 * are stepped over: a SYN behind them must clear an old mark as
		 * much as any. Anything else (a fragment, AH, ESP, more headers)
		 * is no SYN tc can read: it goes to the application (fail open). */
		next = ip6->nexthdr;
#pragma unroll
		for (int i = 0; i < IPV6_EXT_MAX; i++) {
			struct ipv6_opt_hdr *h = data + thoff;

			if (next != IPPROTO_HOPOPTS && next != IPPROTO_ROUTING && next != IPPROTO_DSTOPTS)
				break;
			if (thoff > THOFF_MAX || (void *)(h + 1) > end)
				return TC_ACT_UNSPEC;
			next = h->nexthdr;
			thoff += (h->hdrlen + 1) * 8;
		}
		if (next != IPPROTO_TCP)
			return TC_ACT_UNSPEC;
		t.family = AF_INET6;
		__builtin_memcpy(t.laddr, &ip6->daddr, 16);
		__builtin_memcpy(t.raddr, &ip6->saddr, 16);
	} else {
		return TC_ACT_UNSPEC;
	}
	if (thoff > THOFF_MAX)
		return TC_ACT_UNSPEC;
	th = data + thoff;
	if ((void *)(th + 1) > end)
		return TC_ACT_UNSPEC;
	if (!th->syn || th->ack)
		return TC_ACT_UNSPEC;
	t.lport = bpf_ntohs(th->dest);
	t.rport = bpf_ntohs(th->source);
	if (port_listed(t.lport) && alive()) {
		optlen = th->doff * 4;
		optlen = optlen > sizeof(*th) ? optlen - sizeof(*th) : 0;
		/* Two bounds, each tested on the register the helper gets:
		 * verifiers before 6.8 learn nothing from "!= 0", and without the
		 * barrier the compiler merges both tests into one range check on a
		 * copy, leaving the size possibly zero or unbounded (Debian 12's 6.1
		 * rejects the program). */
		if (optlen >= 4) {
			asm volatile("" : "+r"(optlen));
			if (optlen <= TCP_MAX_OPTS &&
			    !bpf_skb_load_bytes(skb, thoff + sizeof(*th), w.buf, optlen)) {
				w.end = optlen;
				bpf_loop(TCP_MAX_OPTS, opt_step, &w, 0);
			}
		}
	}
	if (w.found) {
		__u64 now = bpf_ktime_get_ns();
		__u64 *m = bpf_map_lookup_elem(&smcr_synmark, &t);

		/* A SYN again (retransmitted): it meets its request socket
		 * before any sk_lookup, so the connection stays steered. */
		if (m)
			*m = now | (*m & MARK_FLAGS);
		else
			bpf_map_update_elem(&smcr_synmark, &t, &now, BPF_ANY);
		count(STAT_SYN_MARKED);
	} else if (bpf_map_lookup_elem(&smcr_synmark, &t)) {
		/* A new connection reusing the 4-tuple that this SYN does not mark
		 * (no option, port no longer listed, smcrd dead): the old mark
		 * must not steer it. The lookup spares unmarked SYNs the lock. */
		bpf_map_delete_elem(&smcr_synmark, &t);
	}
	return TC_ACT_UNSPEC;
}

SEC("sk_lookup")
int smcr_sk_lookup(struct bpf_sk_lookup *ctx)
{
	struct tuple t = {};
	struct bpf_sock *sk;
	__u64 *mark;
	__u32 key;
	long err;

	if (ctx->protocol != IPPROTO_TCP)
		return SK_PASS;
	t.family = ctx->family;
	if (t.family == AF_INET) {
		t.laddr[0] = ctx->local_ip4;
		t.raddr[0] = ctx->remote_ip4;
	} else {
		t.laddr[0] = ctx->local_ip6[0];
		t.laddr[1] = ctx->local_ip6[1];
		t.laddr[2] = ctx->local_ip6[2];
		t.laddr[3] = ctx->local_ip6[3];
		t.raddr[0] = ctx->remote_ip6[0];
		t.raddr[1] = ctx->remote_ip6[1];
		t.raddr[2] = ctx->remote_ip6[2];
		t.raddr[3] = ctx->remote_ip6[3];
	}
	t.lport = ctx->local_port;
	t.rport = bpf_ntohs(ctx->remote_port);
	mark = bpf_map_lookup_elem(&smcr_synmark, &t);
	if (!mark)
		return SK_PASS;
	/* MARK_STEERED says what this lookup decides, not what one of an
	 * earlier handshake on the 4-tuple that never completed did: a SYN-ACK
	 * of the application's listener must not echo the option. */
	__sync_fetch_and_and(mark, ~MARK_FLAGS);
	if (bpf_ktime_get_ns() - (*mark & ~MARK_FLAGS) > MARK_TTL_NS)
		return SK_PASS;
	/* As tc decides: a port taken off the list steers nothing, marked or not. */
	if (!port_listed(t.lport) || !alive())
		return SK_PASS;
	/* A program with the direct mode's library listens here: the connection
	 * is its own, and smcrd runs CLC on the socket it accepts. */
	if (bpf_map_lookup_elem(&smcr_direct_ports, &t.lport)) {
		__sync_fetch_and_or(mark, MARK_DIRECT);
		count(STAT_DIRECT);
		return SK_PASS;
	}
	key = t.family == AF_INET6 ? 1 : 0;
	sk = bpf_map_lookup_elem(&smcr_steer, &key);
	if (!sk && t.family == AF_INET) {
		key = 1; /* a dual-stack IPv6 listener takes IPv4 too */
		sk = bpf_map_lookup_elem(&smcr_steer, &key);
	}
	if (!sk) {
		count(STAT_STEER_NO_LISTENER);
		return SK_PASS;
	}
	err = bpf_sk_assign(ctx, sk, 0);
	bpf_sk_release(sk);
	/* For sockops: this connection's SYN-ACK is smcrd's, to echo the option. */
	if (!err)
		__sync_fetch_and_or(mark, MARK_STEERED);
	count(err ? STAT_STEER_FAILED : STAT_STEERED);
	return SK_PASS;
}
