/* channel.h: the daemon side of the direct mode: the policy page smcrd keeps current,
 * and the SOCK_SEQPACKET channel to smcrd's direct socket (one per offered socket). */
#pragma once

#include <stdint.h>

#include "smcr_abi.h"

extern int smcr_disabled; /* SMCR_DIRECT=0 */

/* smcr_vforked: this is the child of a vfork (or posix_spawn's clone), which runs in
 * its parent's memory until it execs or exits: its closes must not touch the
 * library's tables, which are the parent's. smcr_pid is the process's own, set at
 * start and in a fork's child. */
extern int smcr_pid;
int smcr_vforked(void);

void channel_init(void);

/* policy_allows reports whether a connection to (client) or a listener on (server)
 * port, host byte order, is to be offered to smcrd: the policy page exists, its
 * heartbeat is fresh, smcrd is enabled and the port is in its range. */
int policy_allows(uint16_t port);

/* fd_park moves one of the library's own fds (channels, eventfds, memfds) above
 * the program's, and returns its new number (fd itself where it cannot move). */
int fd_park(int fd);

/* policy_lists_addrs: the policy page limits the local addresses (ip_addr_list);
 * policy_local_allows: local (an IP socket address) is one of them, or the wildcard
 * (a listener's: its accepted sockets are checked one by one). */
int policy_lists_addrs(void);
struct sockaddr;
int policy_local_allows(const struct sockaddr *local);

/* channel_open connects a new channel to smcrd: the fd, or -1. */
int channel_open(void);
/* channel_proc_wake: the process's eventfd and wake page (struct smcr_wake), made
 * at their first use: one pair for all its connections, passed to smcrd beside CLIENT
 * and ACCEPTED. smcrd, and a peer library on the same host, bump the page's pub after
 * a publish while the connection's lib_pollers is nonzero, and write the eventfd only
 * while the page counts sleepers (ready.c counts them). Nobody drains the eventfd:
 * every write is an edge for each epoll instance that holds it (the program's sets, a
 * thread's poll set in ready.c). NULL if they cannot be made.
 * channel_peek_proc_wake: the pair if made, else NULL (makes none).
 * channel_forked_child: a child after fork makes its own for its new connections.
 * channel_adopt_proc_wake: an exec's new image takes the old image's as its own.
 * channel_map_wake: the mapping of an inherited wake page fd, made once per fd (a
 * few at most); NULL if fd holds none.
 * channel_wake_page_map: a new mapping of the wake page fd (a peer's), NULL if it holds
 * none; munmap SMCR_WAKE_SIZE bytes. */
struct smcr_wake;
struct proc_wake {
	int efd, page_fd;
	struct smcr_wake *page;
};
const struct proc_wake *channel_proc_wake(void);
const struct proc_wake *channel_peek_proc_wake(void);
void channel_forked_child(void);
void channel_adopt_proc_wake(int efd, int page_fd);
struct smcr_wake *channel_map_wake(int fd);
struct smcr_wake *channel_wake_page_map(int fd);

/* channel_send sends one message of type with fd (or -1) beside it: 0 or -1. */
int channel_send(int ch, int type, int fd);
/* channel_request sends type with fd and waits for the REPLY: its status (0 or a
 * negative errno), or -EPIPE if the channel failed. */
int channel_request(int ch, int type, int fd);

struct channel_msg {
	struct smcr_msg h;
	int fds[6]; /* SMCR_MODE_SHM brings six */
	int nfds;
	unsigned char *payload; /* malloc'd, h.len bytes, or NULL */
};

/* channel_recv receives one message; flags is 0 or MSG_DONTWAIT. 0, or -errno
 * (-EAGAIN: nothing yet; -EPIPE: the channel is closed or broken or the message is
 * malformed). */
int channel_recv(int ch, struct channel_msg *m, int flags);
void channel_msg_free(struct channel_msg *m);

uint64_t now_ns(void);
