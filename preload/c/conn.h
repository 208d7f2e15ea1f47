/* conn.h: one TCP socket offered to smcrd, from the offer to its last close: the state
 * machine of the direct mode on the library's side.
 *
 *   offer (CLIENT / ACCEPTED, REPLY 0)
 *        |
 *     PENDING --DECIDED(SMCR or SHM)--> ACCEL --(smcrd gone)--> ACCEL + reset
 *        |   \--DECIDED(TCP, prefix)--> PREFIX --prefix read--> TCP (pass-through)
 *        |    \-DECIDED(TCP)---------------------------------> TCP
 *        |-----DECIDED(FAILED)--> FAILED (pending SO_ERROR, then the kernel's)
 *        \-----channel broken---> RESET
 */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "fdtable.h"
#include "smcr_abi.h"

enum conn_state {
	CS_PENDING = 1,
	CS_ACCEL = 2,
	CS_PREFIX = 3,
	CS_TCP = 4,
	CS_FAILED = 5,
	CS_RESET = 6,
};

struct member;

struct conn {
	struct obj o;
	pthread_mutex_t mu; /* state transitions and close */
	_Atomic int state;
	int chan;                /* the channel to smcrd, or -1 */
	atomic_int user_nonblock; /* the program's O_NONBLOCK while PENDING / ACCEL */
	atomic_int shut_rd, shut_wr;
	atomic_int reset;       /* smcrd is gone: the connection is reset */
	atomic_int pending_err; /* FAILED: SO_ERROR not yet read (positive errno) */
	atomic_int closed;      /* the program closed its last alias */
	atomic_int aborted;     /* that close was an abort (conn_note_close) */
	atomic_int err_taken;   /* ACCEL: the connection's error was returned once (SO_ERROR) */
	atomic_int oob_inline;  /* the program's SO_OOBINLINE while PENDING / ACCEL: the kernel
	                         * socket's is smcrd's then (its engine keeps urgent bytes inline
	                         * for a continuation over TCP) */
	atomic_int ring_ops;    /* ACCEL: threads copying through the rings (ring.c's ring_enter) */
	atomic_int releasing;   /* conn_release runs: copies wait for its outcome */

	/* ACCEL */
	struct smcr_shared *sh;
	size_t map_size;
	unsigned char *tx, *rx;
	uint32_t tx_size, rx_size;
	int memfd; /* the area's memfd, kept for an exec's new image (exec.c) */
	/* the process's eventfd and wake page (channel_proc_wake) of the offer: not the
	 * connection's */
	int efd_lib, wake_fd;
	struct smcr_wake *wake;
	int efd_dtx, efd_drx;
	/* SMCR_RING_FILES: the rings' own files (kept for an exec too) and their
	 * mappings, which start at the page below each ring */
	int tx_file, rx_file;
	void *tx_map, *rx_map;
	size_t tx_map_size, rx_map_size;
	/* The send side, chosen at DECIDED: with SMCR, sh's send ring (tx_prod,
	 * tx_cons) that smcrd's pump empties; with SHM, the peer library's receive
	 * ring (its rx_prod, rx_cons), which this library fills itself. tx and
	 * tx_size above are that ring. */
	_Atomic uint64_t *tx_prod, *tx_cons;
	/* where send(MSG_OOB) marks its last byte: sh's tx_urg, or with SHM the peer
	 * library's rx_urg */
	_Atomic uint64_t *tx_urg;
	/* SHM: the peer library's area (NULL with SMCR), its efd_lib and wake page
	 * (mapped, its fd closed: an exec's new image goes without it and writes
	 * efd_lib after every publish while the peer polls) */
	struct smcr_shared *peer;
	size_t peer_map_size;
	int peer_memfd, peer_efd_lib;
	struct smcr_wake *peer_wake;

	/* PREFIX: bytes CLC read ahead, served before the kernel's */
	unsigned char *prefix;
	size_t prefix_len;
	_Atomic size_t prefix_off;

	struct member *members; /* epoll memberships, under ready.c's lock */
};

extern const struct obj_ops conn_ops;
extern atomic_uint smcr_fork_gen;

static inline struct conn *conn_of(struct obj *o)
{
	return (o && o->kind == OBJ_CONN) ? (struct conn *)o : 0;
}

/* conn_new: a connection offered on channel chan; user_nonblock and oob_inline are the
 * program's O_NONBLOCK and SO_OOBINLINE, read before the offer (smcrd changes the
 * socket's). */
struct conn *conn_new(int chan, int user_nonblock, int oob_inline);

/* conn_attach maps the shared area of a DECIDED of mode SMCR (3 fds: memfd, efd_dtx,
 * efd_drx; 5 with SMCR_RING_FILES: then tx_file, rx_file) or SHM (5: then peer_memfd,
 * peer_efd_lib, the peer process's eventfd) and takes the fds: 0, or -1 if the area is
 * not what the ABI says (the fds are then still the caller's). */
int conn_attach(struct conn *c, int mode, const int *fds, int nfds);

/* conn_shared: the connection was made before a fork, so another process may hold
 * it (its end is the channel's close, not SMCR_LIB_CLOSED); conn_set_shared marks
 * one so (an exec's new image inherits the mark). */
int conn_shared(struct conn *c);
void conn_set_shared(struct conn *c);

/* conn_decide processes DECIDED if it has come (block: wait for it). 0 once decided,
 * -1 with errno EAGAIN while pending. */
int conn_decide(struct conn *c, int fd, int block);
/* conn_decide_by: the same, a blocking wait ending at deadline (CLOCK_MONOTONIC ns, 0:
 * none) with errno EINPROGRESS, as a connect under SO_SNDTIMEO. */
int conn_decide_by(struct conn *c, int fd, int block, uint64_t deadline);

/* conn_check_reset looks at the channel of an accelerated connection: if smcrd is
 * gone, the connection becomes reset. Returns c->reset. */
int conn_check_reset(struct conn *c, int fd);
void conn_mark_reset(struct conn *c, int fd);

/* conn_note_close: the program closes fd, c's last alias: an abort, as TCP's RST, if
 * the socket has SO_LINGER {1, 0} or bytes are left unread. */
void conn_note_close(struct conn *c, int fd);

/* conn_release hands an ACCEL connection, fd's, back to the kernel socket, which
 * carries the rest of the stream both ways (SMCR_LIB_RELEASE): 0, and c is plain TCP
 * (CS_TCP) with the program's O_NONBLOCK; -1 where it cannot be (reset, smcrd refused
 * or failed, another process's copy never ended), c unchanged. Call it after the
 * program's last write to fd through the rings. It waits for the copies under way in
 * every process that shares c since a fork or an exec; theirs that come after wait
 * for the outcome, and follow (conn_follow_release). */
int conn_release(struct conn *c, int fd);
/* conn_release_or_abort hands an accelerated connection back to its kernel socket, fd
 * (conn_release), before the socket goes where the library cannot follow it. Where
 * that cannot be (a peer that cannot continue over TCP, a same-host peer that closed),
 * the connection's end, whenever it comes here, is an abort (SMCR_LIB_ABORT), which
 * resets the socket, so that whoever holds it then reads an error rather than wait
 * on a TCP connection that carries nothing; the socket gets the program's O_NONBLOCK
 * back. c may be NULL. */
void conn_release_or_abort(struct conn *c, int fd);
/* conn_prefix_recv serves a PREFIX connection's bytes (CLC's read-ahead, or with SHM
 * what the receive ring held at the release) before the kernel's: the bytes copied, or
 * -2 once they ran out (c is CS_TCP then). */
ssize_t conn_prefix_recv(struct conn *c, const struct iovec *iov, int cnt, int flags);
/* conn_follow_release: smcrd released c at another holder's ask (SMCR_D_RELEASED), or
 * with SHM at the peer's (SMCR_D_PEER_RELEASE, then SMCR_D_RELEASED): c becomes plain
 * TCP here too, with SHM first PREFIX with what its receive ring still held. 1 if it
 * did. */
int conn_follow_release(struct conn *c, int fd);

/* conn_restore_flags gives the kernel socket the program's O_NONBLOCK again. */
void conn_restore_flags(struct conn *c, int fd);
/* conn_restore_oobinline gives it the program's SO_OOBINLINE again (plain TCP). */
void conn_restore_oobinline(struct conn *c, int fd);

/* conn_oob_inline_of: the socket's SO_OOBINLINE as the kernel has it, 0 if unknown */
int conn_oob_inline_of(int fd);

/* conn_note_owner publishes the socket's owner (F_SETOWN) and this process's pid
 * namespace in an ACCEL connection's area, for a peer library that sends SIGURG
 * (SHM); conn_pidns is that namespace's id, 0 if unknown. */
void conn_note_owner(struct conn *c, int fd);
uint64_t conn_pidns(void);

/* conn_revents: the connection's readiness as poll bits (POLLIN ...), for the states
 * the library emulates; fd is one of the program's fds of it. */
uint32_t conn_revents(struct conn *c, int fd);

/* conn_wait_fd: the fd to wait on for a change of the connection's readiness (the
 * channel while PENDING, the process's efd_lib while ACCEL), or -1 (always ready, or
 * the kernel's). */
int conn_wait_fd(struct conn *c);

/* conn_error: an ACCEL connection's error (positive errno), 0 if none */
int conn_error(struct conn *c);

/* a snapshot that changes whenever the connection's readiness may have changed */
uint64_t conn_seq(struct conn *c);
