/* smcr_abi.h: the direct mode's ABI between smcrd and libsmcr-preload.so, version 5.
 * The Go side of the same layout is rmb/shared.go; rmb's tests compile this header
 * and compare every offset. Documented in docs/direct.md. */
#pragma once

#include <stdint.h>
#include <stdatomic.h>

#define SMCR_ABI_VERSION 5

/* ---- The channel: one SOCK_SEQPACKET connection to smcrd's direct socket per
 * accelerated socket (and per registered listener), one message per packet, host
 * byte order. File descriptors travel as SCM_RIGHTS beside the message. */

#define SMCR_MSG_MAGIC 0x44434d53u /* "SMCD" */

enum smcr_msg_type {
	/* library -> smcrd */
	/* CLIENT and ACCEPTED bring three fds: the socket, then the process's eventfd and
	 * its wake page (struct smcr_wake), one pair for all of the process's connections:
	 * smcrd passes both to the peer library on the same host, and whoever publishes
	 * to a connection whose lib_pollers is nonzero bumps the page's pub and writes
	 * the eventfd while the page counts sleepers */
	SMCR_MSG_CLIENT = 1,     /* fds: a TCP socket about to connect(), the process's eventfd,
	                          * its wake page */
	SMCR_MSG_CONNECTING = 2, /* no fd: connect() was called (0 or EINPROGRESS) */
	SMCR_MSG_LISTENER = 3,   /* fd: a TCP socket about to listen() */
	SMCR_MSG_ACCEPTED = 4,   /* fds: a socket accept() returned from a registered listener,
	                          * the process's eventfd, its wake page */
	/* smcrd -> library */
	SMCR_MSG_REPLY = 16,   /* to CLIENT, LISTENER, ACCEPTED: status 0 (go on) or negative errno */
	SMCR_MSG_DECIDED = 17, /* to CONNECTING and ACCEPTED (after REPLY 0): mode */
};

enum smcr_mode {
	/* fds: memfd (struct smcr_shared + rings), efd_dtx, efd_drx; with
	 * SMCR_RING_FILES in the area, then tx_file and rx_file, the rings' own files */
	SMCR_MODE_SMCR = 1,
	SMCR_MODE_TCP = 2,    /* plain TCP from here on; len bytes of payload come first (read ahead by CLC) */
	SMCR_MODE_FAILED = 3, /* connect failed: status is the negative errno (SO_ERROR) */
	/* As SMCR, and the peer is a library on this host: fds memfd, efd_dtx, efd_drx,
	 * peer_memfd, peer_efd_lib (the peer process's eventfd), peer_wake (that
	 * eventfd's wake page). The library writes into
	 * the peer's receive ring and publishes its words itself (docs/direct.md, "Same
	 * host"). */
	SMCR_MODE_SHM = 4,
};

struct smcr_msg {
	uint32_t magic;   /* SMCR_MSG_MAGIC */
	uint16_t version; /* SMCR_ABI_VERSION */
	uint16_t type;    /* enum smcr_msg_type */
	int32_t status;   /* REPLY, DECIDED(FAILED): 0 or a negative errno */
	uint32_t mode;    /* DECIDED: enum smcr_mode */
	uint32_t len;     /* bytes of payload after this header */
	uint32_t reserved;
};

#define SMCR_MSG_MAX_PAYLOAD 65536

/* ---- The connection's shared area: a memfd smcrd makes, sealed against
 * resizing, mapped MAP_SHARED by both. Page 0 is struct smcr_shared; the rings
 * follow at tx_off and rx_off. Cursors are absolute byte counts (uint64); a
 * cursor's place in its ring is cursor % size. Publishing: copy the bytes, then
 * store the cursor with release order; reading: load the cursor with acquire
 * order, then copy. */

#define SMCR_SHARED_MAGIC 0x53434d53u /* "SMCS" */

/* ring_files: where the rings are */
#define SMCR_RING_FILES 1u /* in files of their own, which DECIDED passes after the eventfds
                            * (send ring's, receive ring's): tx_off and rx_off are offsets in
                            * those files, and this area is the control page alone (map_size).
                            * smcrd passes the engine's own buffers so. Never with SHM. */

/* lib_flags: the program's side, set by the library */
#define SMCR_LIB_SHUT_WR 1u /* shutdown(SHUT_WR): after the bytes up to tx_prod, send FIN */
#define SMCR_LIB_CLOSED 2u  /* close(): the program is gone from this connection */
#define SMCR_LIB_ABORT 4u   /* the program's end (CLOSED, or the channel's close) is an abort,
                             * as TCP's RST (SO_LINGER {1, 0}, bytes left unread, an exec into
                             * an image without the library): the peer reads ECONNRESET */
#define SMCR_LIB_RELEASE 8u /* after the bytes up to tx_prod, with rx_cons final: hand the
                             * connection back to the kernel socket, which the library uses as
                             * plain TCP from SMCR_D_RELEASED on (smcrd has the peer resend what
                             * the program did not take from the receive ring); answered by
                             * SMCR_D_RELEASED or SMCR_D_NO_RELEASE (or SMCR_D_ERROR) */

/* d_flags: smcrd's side */
#define SMCR_D_EOF 1u       /* the peer sent its last byte: rx_prod is final */
#define SMCR_D_ERROR 2u     /* the connection failed: d_errno (positive) for reads and writes */
#define SMCR_D_TX_CLOSED 4u /* the peer will read no more: writes fail with EPIPE */
#define SMCR_D_RELEASED 8u  /* answer to SMCR_LIB_RELEASE: the kernel socket carries the rest
                             * of the stream both ways; smcrd has let go of the connection */
#define SMCR_D_NO_RELEASE 16u /* answer to SMCR_LIB_RELEASE: not possible here (the peer cannot
                               * continue over TCP, a same-host peer closed, bytes left in the receive ring
                               * that smcrd took off the socket): the connection goes on as it was */
#define SMCR_D_PEER_RELEASE 32u /* SHM: the peer library released the connection: this library
                                 * copies no more into the peer's ring (its writes wait); smcrd waits
                                 * for lib_sending 0, resends over TCP what the peer's program did not
                                 * take from its ring, then sets SMCR_D_RELEASED: this library reads
                                 * the rest of its own receive ring, then the kernel socket, and
                                 * writes to the kernel socket (docs/direct.md, "Release") */

struct smcr_shared {
	/* set once by smcrd before it passes the memfd */
	uint32_t magic;    /* SMCR_SHARED_MAGIC */
	uint32_t version;  /* SMCR_ABI_VERSION */
	uint32_t tx_size;  /* bytes in the send ring */
	uint32_t rx_size;  /* bytes in the receive ring */
	uint32_t tx_off;   /* offset of the send ring in the mapping (or its file) */
	uint32_t rx_off;   /* offset of the receive ring (or in its file) */
	uint32_t map_size;   /* bytes to map: the whole memfd */
	uint32_t ring_files; /* 0: the rings are in this area; SMCR_RING_FILES */
	uint8_t pad0[32];

	/* written by the library only (offset 64) */
	_Atomic uint64_t tx_prod;      /* bytes the program wrote into the send ring */
	_Atomic uint64_t rx_cons;      /* bytes the program took out of the receive ring */
	_Atomic uint32_t lib_flags;    /* SMCR_LIB_* */
	_Atomic uint32_t lib_seq;      /* bumped after every publish above */
	_Atomic uint32_t lib_waiters;  /* threads blocked in a futex wait on d_seq */
	_Atomic uint32_t lib_pollers;  /* poll/epoll sets holding the connection: a publish
	                                * then wakes through the process's wake page */
	_Atomic uint64_t tx_urg;       /* urgent data (send with MSG_OOB): the stream position just
	                                * past the program's latest urgent byte, 0 none; stored
	                                * before the tx_prod that covers the byte. Only the latest
	                                * counts, as TCP's one urgent pointer */
	_Atomic uint64_t rx_oob;       /* the library's own: the rx_urg whose byte recv(MSG_OOB)
	                                * took (smcrd ignores it) */
	_Atomic int32_t lib_owner;     /* SHM: the socket's owner (F_SETOWN: a pid, or minus a
	                                * process group), 0 none: the peer library that moves
	                                * rx_urg sends it SIGURG, as the kernel's TCP would */
	_Atomic uint32_t lib_sending;  /* SHM: threads copying into the peer's receive ring; a
	                                * copy counts itself, then looks for SMCR_D_PEER_RELEASE
	                                * (both seq_cst): smcrd waits for 0 after setting it */
	_Atomic uint64_t lib_pidns;    /* SHM: the pid namespace lib_owner is in (the inode of
	                                * /proc/self/ns/pid): no SIGURG from another */

	/* written by smcrd only (offset 128) */
	_Atomic uint64_t tx_cons;  /* bytes smcrd took from the send ring: free again */
	_Atomic uint64_t rx_prod;  /* bytes smcrd put into the receive ring */
	_Atomic uint32_t d_flags;  /* SMCR_D_* */
	_Atomic int32_t d_errno;   /* with SMCR_D_ERROR: ECONNRESET, ETIMEDOUT, ... */
	_Atomic uint32_t d_seq;    /* bumped after every publish above; futex word */
	_Atomic uint32_t d_txwait; /* smcrd sleeps until tx_prod or lib_flags move: write efd_dtx */
	_Atomic uint32_t d_rxwait; /* smcrd sleeps until rx_cons moves: write efd_drx */
	uint32_t pad2;
	_Atomic uint64_t rx_urg;   /* the peer's urgent data: the stream position just past its
	                            * latest urgent byte, 0 none; stored before the rx_prod that
	                            * covers the byte (SHM: by the peer library) */
	uint8_t pad3[16];

	/* the library's own, shared by the processes that hold the connection since a
	 * fork or an exec (smcrd ignores them; offset 192) */
	_Atomic uint32_t lib_ring_ops;  /* copies through the rings under way in those
	                                 * processes: a release waits for 0 */
	_Atomic uint32_t lib_releasing; /* a process releases the connection: the
	                                 * others' copies wait for the outcome */
	uint8_t pad4[56];
};

/* ---- The wake page: a process's eventfd comes with a memfd of SMCR_WAKE_SIZE bytes,
 * sealed against shrinking and growing, mapped MAP_SHARED by the library, smcrd and
 * a peer library on the same host. A publish to a connection whose lib_pollers is
 * nonzero bumps pub, then writes the eventfd only if sleepers is nonzero. A waiter
 * counts itself in sleepers before its last look at pub (and the connections) and
 * sleeps only if pub did not move: a publish is seen by one or the other. An epoll
 * set waited on from outside the library (in poll, select, another set) counts as a
 * sleeper for good: nobody can tell when its waiter sleeps. */

#define SMCR_WAKE_MAGIC 0x57434d53u /* "SMCW" */
#define SMCR_WAKE_SIZE 4096

struct smcr_wake {
	uint32_t magic;   /* SMCR_WAKE_MAGIC */
	uint32_t version; /* SMCR_ABI_VERSION */
	_Atomic uint32_t sleepers; /* threads of the process asleep on the eventfd, and sets
	                            * waited on from outside */
	uint32_t reserved;
	_Atomic uint64_t pub; /* bumped by every publish to a polled connection */
};

/* ---- The policy page: the file <direct socket path>.policy, world-readable,
 * kept current by smcrd. A library maps it read-only and decides there, with no
 * round trip, which connections to offer smcrd. */

#define SMCR_POLICY_MAGIC 0x50434d53u /* "SMCP" */
#define SMCR_POLICY_STALE_NS 3000000000ull /* heartbeat older than this: smcrd is gone */
#define SMCR_POLICY_MAX_ADDRS 16

struct smcr_policy {
	uint32_t magic;   /* SMCR_POLICY_MAGIC */
	uint32_t version; /* SMCR_ABI_VERSION */
	_Atomic uint64_t heartbeat_ns; /* CLOCK_MONOTONIC of smcrd's last beat (every second) */
	_Atomic uint32_t enabled;      /* smcrd's `enabled` */
	uint32_t reserved;
	_Atomic uint64_t ports[1024];  /* bit p of word p/64: port p is in port_range_list */
	_Atomic uint64_t max_memory;   /* smcrd's max_memory in bytes, 0 unlimited */
	_Atomic uint64_t mem_used;     /* bytes smcrd holds now: none offered while >= max_memory */
	_Atomic uint32_t naddrs;       /* local addresses listed below; 0: any */
	uint32_t reserved1;
	/* the local addresses of ip_addr_list's interfaces, 8-byte words of the 16 bytes
	 * (IPv4 as ::ffff:a.b.c.d): a connection with another is not offered */
	_Atomic uint64_t addrs[SMCR_POLICY_MAX_ADDRS][2];
};
