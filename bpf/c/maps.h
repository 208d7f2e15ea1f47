/* Maps shared by all smcr eBPF programs, and the small helpers around them.
 * Part of the transparent path (RFC 7609 section 3.3 "TCP options", 4.1 setup): the
 * policy smcrd fills in and the per-connection facts the programs leave for smcrd.
 * Every map is pinned by name under smcrd's pin directory so a restarted smcrd takes
 * them over. Layouts are mirrored in ../maps.go; change both together. */
#pragma once

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define AF_INET 2
#define AF_INET6 10
#define SOCK_STREAM 1
#define SOL_IP 0
#define SOL_IPV6 41
#define SOL_SOCKET 1
#define SOL_TCP 6
#define SO_KEEPALIVE 9
#define SO_PRIORITY 12
#define SO_ORIGINAL_DST 80      /* linux/netfilter_ipv4.h */
#define IP6T_SO_ORIGINAL_DST 80 /* linux/netfilter_ipv6/ip6_tables.h */

/* The SMC-R TCP option (RFC 7609 3.3): experimental kind 254 with the
 * 4-byte ExID 0xE2D4C3D9 ("SMCR" in EBCDIC), 6 bytes in all. */
#define SMC_OPT_KIND 254
#define SMC_OPT_LEN 6

/* config.flags */
#define CFG_CHECK_PREFIX 1 /* redirect only destinations the prefix tries allow */

struct config {
	__u64 netns_cookie; /* the network namespace this smcrd serves */
	__u32 flags;
	__u32 redir4_addr;    /* redirect listener, network order; port 0: none */
	__u32 redir6_addr[4];
	__u16 redir4_port; /* network order */
	__u16 redir6_port; /* network order */
	__u32 _pad;
};

/* A socket's tag. smcrd writes SK_OWN|... from user space (key: the socket's fd)
 * before connect() or listen(); connect4/6 writes SK_REDIRECTED on sockets it
 * redirects, with the original destination. */
#define SK_OWN 1        /* smcrd's socket: never redirected */
#define SK_OPTION 2     /* write the SMC option on SYN / echo it on SYN-ACK (listener) */
#define SK_SHOW_PEER 4  /* the peer of this connection's other end is addr:port */
#define SK_REDIRECTED 8 /* set by connect4/6: addr:port is the original destination */
#define SK_PEER 16      /* set by sockops on an application's socket accepted from smcrd
			 * (SK_SHOW_PEER): addr:port is the peer getpeername shows */
#define SK_UNREACH 32   /* set by connect4/6 on a socket left direct because smcrd
			 * could not reach its destination (smcr_unreach): sockops
			 * follows whether it connects */
#define SK_SYN_OPT 64   /* set by sockops on a socket accepted from a listener of the
			 * direct mode (smcr_direct_ports) whose SYN had the option */

struct sk_state {
	__u32 flags;
	__u32 family; /* of addr */
	__u32 addr[4];
	__u32 src[4]; /* SK_REDIRECTED: local address getsockname shows (0: unchanged) */
	__u16 port;   /* network order */
	__u16 _pad;
};

/* A connection as one of its ends sees it; ports in host order. */
struct tuple {
	__u32 family;
	__u32 laddr[4];
	__u32 raddr[4];
	__u16 lport;
	__u16 rport;
};

struct addr_port {
	__u32 family;
	__u32 addr[4];
	__u16 port; /* network order */
	__u16 _pad;
};

/* app_opts.have */
#define OPT_TOS 1          /* tos */
#define OPT_PRIORITY 2     /* priority */
#define OPT_KEEPALIVE 4    /* SO_KEEPALIVE on, with keepidle, keepintvl, keepcnt */
#define OPT_USER_TIMEOUT 8 /* user_timeout */

/* The options of a redirected application's socket that shape a connection on
 * the wire and would otherwise stay on its loopback leg, as its connect() found
 * them (sockops) and as it changed them since (smcr_setsockopt): smcrd sets them
 * on its own connection to the destination, as Linux's SMC passes an SMC
 * socket's options on to its CLC socket. Only what differs from a new socket's
 * defaults is flagged; the keepalive timings are kept either way. */
struct app_opts {
	__u32 have;
	__u32 tos;      /* IP_TOS; IPV6_TCLASS for an IPv6 destination */
	__u32 priority; /* SO_PRIORITY */
	__u32 keepidle; /* TCP_KEEPIDLE, s */
	__u32 keepintvl;
	__u32 keepcnt;
	__u32 user_timeout; /* TCP_USER_TIMEOUT, ms */
};

/* A redirected connection's original destination and its application's
 * options. */
struct orig {
	struct addr_port dst;
	struct app_opts opts;
	__u64 at; /* the connect (bpf_ktime_get_ns); older records are another's */
};

/* An option an application set on its socket (redirected, after its connect;
 * accepted from smcrd, inherited or set after), for smcrd to set on its
 * connection on the wire too (smcr_sockopts). */
struct sockopt_event {
	struct tuple conn; /* as smcrd's accepted socket sees it */
	__u32 level;
	__u32 optname;
	__s32 value;
	__u32 _pad;
	__u64 at; /* bpf_ktime_get_ns: when it was set (or, inherited, emitted) */
};

struct lpm4_key {
	__u32 prefixlen;
	__u32 addr;
};

struct lpm6_key {
	__u32 prefixlen;
	__u32 addr[4];
};

struct prefix_val {
	__u32 allow;  /* route leaves through a listed interface */
	__u32 src[4]; /* that interface's address, for getsockname */
};

struct ports {
	__u64 bits[1024]; /* bit p set: port p is in port_range_list */
};

/* smcr_seen flags: what sockops saw on a connection smcrd opened. (4 and 8
 * were the passive side's, no longer recorded: maps.h, smcr_seen.) */
#define SEEN_SENT_SYN_OPT 1    /* our SYN carried the option */
#define SEEN_PEER_ECHOED 2     /* the SYN-ACK carried it back */
#define SEEN_NO_SPACE 16       /* no TCP option space left for it */
#define SEEN_ESTABLISHED 32    /* the handshake completed */
#define SEEN_PEER_SMCX 64      /* the SYN-ACK carried smcr's extension option too */

enum stat {
	STAT_REDIRECTED,
	STAT_SKIP_DEAD,
	STAT_SKIP_NEGATIVE,
	STAT_SKIP_PREFIX,
	STAT_SYN_OPT_SENT,
	STAT_SYNACK_OPT_SENT,
	STAT_OPT_NO_SPACE,
	STAT_PEER_ECHOED,
	STAT_SYN_MARKED,
	STAT_STEERED,
	STAT_STEER_NO_LISTENER,
	STAT_STEER_FAILED,
	STAT_ORIG_DST_ANSWERED,
	STAT_SKIP_UNREACHABLE,
	STAT_SOCKOPT_LOST,
	STAT_DIRECT, /* a marked SYN left to a listener of the direct mode */
	STAT_MAX,
};

#define PIN __uint(pinning, LIBBPF_PIN_BY_NAME)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
	PIN;
} smcr_config SEC(".maps");

/* Liveness: CLOCK_MONOTONIC ns until which smcrd counts as alive. smcrd moves it
 * forward as a heartbeat; a dead or hung smcrd lets it lapse and everything fails
 * open. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	PIN;
} smcr_alive SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ports);
	PIN;
} smcr_ports SEC(".maps");

/* Destination rules, one per route (policy.go). Room for the routing tables of
 * large hosts, twice over: rules are replaced new before old. NO_PREALLOC:
 * capacity costs nothing until used. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm4_key);
	__type(value, struct prefix_val);
	PIN;
} smcr_prefix4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm6_key);
	__type(value, struct prefix_val);
	PIN;
} smcr_prefix6 SEC(".maps");

/* Destinations smcrd could not connect to (refused, unreachable, timed out):
 * connect4/6 leave the connections to them direct, so that the application gets
 * the kernel's own answer (a refusal, say) rather than a connection to smcrd
 * that smcrd then resets. Each such direct connect that fails too keeps the
 * entry for another ttl; the first that connects removes it (sockops). */
struct unreach {
	__u64 until; /* CLOCK_MONOTONIC ns */
	__u64 ttl;   /* ns */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct addr_port); /* IPv4-mapped addresses as IPv4 */
	__type(value, struct unreach);
	PIN;
} smcr_unreach SEC(".maps");

/* Negative peer cache: destination (address and port) that answered without
 * SMC-R -> CLOCK_MONOTONIC ns when the entry expires. By port, not by host: a
 * server host may offer SMC-R on some ports only (its port_range_list, or
 * Linux's SMC for some applications), and one port without must not take the
 * others off SMC-R. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct addr_port); /* IPv4-mapped addresses as IPv4 */
	__type(value, __u64);
	PIN;
} smcr_negative SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sk_state);
	PIN;
} smcr_sk SEC(".maps");

/* Original destination of a redirected connection, and its application's socket
 * options, keyed by the connection as smcrd's accepted socket sees it; read by
 * the getsockopt program and smcrd.
 * The entry outlives the application's socket: an application that writes and
 * closes at once is gone before smcrd accepts, and its bytes still wait there.
 * smcrd deletes the entry once it has read it; the LRU evicts what a crashed
 * smcrd never read. A leftover is harmless: a new redirected connection on the
 * same 4-tuple overwrites it at connect, and the key names smcrd's loopback
 * listener, so only a local process can meet one, and that process could dial
 * the destination itself. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct tuple);
	__type(value, struct orig);
	PIN;
} smcr_origdst SEC(".maps");

/* Peer to show on the server host: keyed by the connection as the application's
 * accepted socket sees it (smcrd connected to it with SK_SHOW_PEER). Only until
 * that socket is established: sockops then moves the entry into the socket's
 * storage (SK_PEER), which lives as long as the application's socket does,
 * however early smcrd's end closes. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct tuple);
	__type(value, struct addr_port);
	PIN;
} smcr_peers SEC(".maps");

/* What sockops saw of the connections smcrd opened, keyed as smcrd's socket
 * sees them; smcrd reads it to decide whether to propose SMC-R. Not those
 * steered to it: smcrd runs CLC on each anyway, and nothing but the LRU would
 * remove the entry of a steered handshake that never completes, so a flood of
 * SYNs carrying the option would push out the entries smcrd's connects wait
 * to read (their connections then carried as plain TCP). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct tuple);
	__type(value, __u32);
	PIN;
} smcr_seen SEC(".maps");

/* SYNs that carried the SMC option, keyed as the receiving host sees the
 * connection: bpf_ktime_get_ns of the SYN, with MARK_STEERED once sk_lookup
 * steered the connection to smcrd. Written by tc ingress, read by sk_lookup,
 * deleted by sockops once smcrd's steering listener completed the handshake
 * (or by tc on a later SYN of the 4-tuple without the option). */
#define MARK_STEERED (1ULL << 63)
/* MARK_DIRECT: sk_lookup left the SYN to a listener of the direct mode, whose
 * SYN-ACK echoes the option as the steering listener's does. */
#define MARK_DIRECT (1ULL << 62)
#define MARK_FLAGS (MARK_STEERED | MARK_DIRECT)

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct tuple);
	__type(value, __u64);
	PIN;
} smcr_synmark SEC(".maps");

/* Options applications set on their redirected sockets after connect(), and on
 * their sockets accepted from smcrd, in the order they set them (struct
 * sockopt_event); smcrd reads them. Full (smcrd gone, or far behind), one is
 * counted lost. */
#define SOCKOPT_RING (256 * 1024)

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, SOCKOPT_RING);
	PIN;
} smcr_sockopts SEC(".maps");

/* Ports on which a program with the direct mode's library listens (the key,
 * host order): the number of its listeners there. sk_lookup leaves their
 * marked SYNs to them instead of steering them to smcrd. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u16);
	__type(value, __u32);
	PIN;
} smcr_direct_ports SEC(".maps");

/* smcrd's steering listeners: 0 IPv4, 1 IPv6. */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
	PIN;
} smcr_steer SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	PIN;
} smcr_stats SEC(".maps");

static __always_inline void count(enum stat s)
{
	__u32 k = s;
	__u64 *v = bpf_map_lookup_elem(&smcr_stats, &k);

	if (v)
		*v += 1;
}

/* emit_sockopt passes an application's socket option on to smcrd, for the
 * connection t (as smcrd's socket sees it): smcr_sockopts. Without waking smcrd,
 * which reads the ring every SockoptPoll (bpf/sockopts.go): a wake-up per record
 * cost a tenth of the connection setup rate. Unless the ring is half full. */
static __always_inline void emit_sockopt(struct tuple *t, __u32 level, __u32 optname, __s32 value)
{
	struct sockopt_event *e = bpf_ringbuf_reserve(&smcr_sockopts, sizeof(*e), 0);
	__u64 wake = BPF_RB_NO_WAKEUP;

	if (!e) {
		count(STAT_SOCKOPT_LOST);
		return;
	}
	e->conn = *t;
	e->level = level;
	e->optname = optname;
	e->value = value;
	e->_pad = 0;
	e->at = bpf_ktime_get_ns();
	if (bpf_ringbuf_query(&smcr_sockopts, BPF_RB_AVAIL_DATA) > SOCKOPT_RING / 2)
		wake = BPF_RB_FORCE_WAKEUP;
	bpf_ringbuf_submit(e, wake);
}

static __always_inline struct config *config(void)
{
	__u32 k = 0;

	return bpf_map_lookup_elem(&smcr_config, &k);
}

static __always_inline int alive(void)
{
	__u32 k = 0;
	__u64 *until = bpf_map_lookup_elem(&smcr_alive, &k);

	return until && *until > bpf_ktime_get_ns();
}

static __always_inline int port_listed(__u16 port)
{
	__u32 k = 0;
	struct ports *p = bpf_map_lookup_elem(&smcr_ports, &k);

	if (!p)
		return 0;
	return (p->bits[(port >> 6) & 1023] >> (port & 63)) & 1;
}

/* A dual-stack IPv6 socket carrying IPv4 sees IPv4-mapped addresses; key such
 * connections as IPv4, as the packet-level programs and smcrd's Go side do. */
static __always_inline void tuple_unmap(struct tuple *t)
{
	if (t->family != AF_INET6 || t->laddr[0] || t->laddr[1] || t->laddr[2] != bpf_htonl(0xffff))
		return;
	t->family = AF_INET;
	t->laddr[0] = t->laddr[3];
	t->raddr[0] = t->raddr[3];
	t->laddr[1] = t->laddr[2] = t->laddr[3] = 0;
	t->raddr[1] = t->raddr[2] = t->raddr[3] = 0;
}

/* The SMC option as bpf_load_hdr_opt searches for it and bpf_store_hdr_opt writes it. */
#define SMC_OPT_INIT {SMC_OPT_KIND, SMC_OPT_LEN, 0xe2, 0xd4, 0xc3, 0xd9, 0, 0}
/* smcr's own option beside it on a SYN-ACK: kind 254, ExID "SMCX" in ASCII. It
 * tells smcrd's client that the server is smcrd too, so its Proposal may carry
 * offers a Linux or z/OS server would refuse (docs/protocol.md, "Linux peers"). */
#define SMCX_OPT_INIT {SMC_OPT_KIND, SMC_OPT_LEN, 'S', 'M', 'C', 'X', 0, 0}
