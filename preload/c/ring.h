/* ring.h: the data path of an accelerated connection: copies between the program's
 * buffers and the rings of struct smcr_shared, cursor publishing, and the waits of
 * blocking calls (brief spin, then a futex on d_seq). No allocation, no lock. */
#pragma once

#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "conn.h"

/* How long a waiting call spins before it sleeps: a blocking read or write on a
 * connection through smcrd, and (SHM_) one whose peer is another program, or an
 * epoll_wait on a set with accelerated members. SHM: spin longer, and after the
 * first 2 µs let other threads of this CPU run (sched_yield) while spinning: on a
 * machine of 2 busy cores the writer that would wake this reader may be waiting for
 * this very CPU (measured in BenchmarkDirect/shm: a 20 µs pure spin made the 64-byte
 * round trip 60 µs under load, 3 spins; yielding, 15 µs, and 1.3 µs on idle CPUs). */
#define SPIN_NS 20000ull
#define SHM_SPIN_NS 50000ull
#define SHM_YIELD_NS 2000ull

/* cpu_relax: a spin loop's pause, where the CPU has one */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

/* wake_published counts a publish to a polled connection in its process's wake
 * page (smcr_abi.h) and says whether to write the process's eventfd: only while a
 * thread of it sleeps there */
static inline int wake_published(struct smcr_wake *w)
{
	if (!w)
		return 1;
	atomic_fetch_add_explicit(&w->pub, 1, memory_order_seq_cst);
	return atomic_load_explicit(&w->sleepers, memory_order_seq_cst) != 0;
}

/* ring_recv / ring_send: the read and write families on an ACCEL connection; flags
 * are MSG_* flags (MSG_DONTWAIT, MSG_PEEK, MSG_WAITALL, MSG_TRUNC, MSG_NOSIGNAL,
 * MSG_OOB). Bytes, or -1 with errno. */
ssize_t ring_recv(struct conn *c, int fd, const struct iovec *iov, int iovcnt, int flags);
ssize_t ring_send(struct conn *c, int fd, const struct iovec *iov, int iovcnt, int flags);

/* ring_send_space: bytes free in the send ring (waiting for some if blocking and none
 * is free): >0, or -1 with errno. For sendfile and splice. */
ssize_t ring_send_space(struct conn *c, int fd, int flags);

/* ring_call_deadline: when a blocking call on fd gives up, from its SO_RCVTIMEO or
 * SO_SNDTIMEO (opt): CLOCK_MONOTONIC ns, 0 for never. */
uint64_t ring_call_deadline(int fd, int opt);

size_t ring_rx_avail(struct conn *c);
size_t ring_tx_queued(struct conn *c);

/* Urgent data (TCP's MSG_OOB) on the receive side, as Linux's TCP has it: the
 * peer's latest mark (rx_urg) lies ahead until the reader passes it.
 * ring_rx_readable: the bytes a read would find now, ring_rx_avail less the
 * urgent byte when it is next and out of line (a read skips it, and the kernel's
 * poll does not count it); ring_urgent_pending: an urgent byte that
 * recv(MSG_OOB) has not taken lies ahead (POLLPRI; inline too, as the kernel);
 * ring_at_mark: the urgent byte is next (SIOCATMARK). */
size_t ring_rx_readable(struct conn *c);
/* ring_rx_inq: FIONREAD, as Linux's tcp_inq: with an out-of-line urgent byte ahead,
 * the bytes before it */
size_t ring_rx_inq(struct conn *c);
int ring_urgent_pending(struct conn *c);
int ring_at_mark(struct conn *c);

/* ring_shutdown_wr publishes the program's shutdown(SHUT_WR); ring_wake_local wakes
 * this process's threads blocked on the connection. */
void ring_shutdown_wr(struct conn *c);

/* ring_release asks smcrd to hand the connection back to the kernel socket
 * (SMCR_LIB_RELEASE: every byte the program wrote is in tx_prod, rx_cons is
 * final) and waits for the answer, RELEASE_WAIT_NS at most (smcrd waits for the
 * peer's resync, its CLC timeout or 5 s): 0 once released (SMCR_D_RELEASED), -1
 * when not (refused, failed, no answer, smcrd gone). Not with SHM. */
#define RELEASE_WAIT_NS 30000000000ull
/* RELEASE_OTHERS_NS: how long a release waits for the copies under way in other
 * processes that hold the connection (conn_release) */
#define RELEASE_OTHERS_NS 1000000000ull
int ring_release(struct conn *c, int fd);
void ring_wake_local(struct conn *c);
void ring_kick(int efd);

/* SHM: ring_wake_peer wakes the peer library's threads and pollers after a move of
 * its words (its d_seq, futex, efd_lib); ring_peer_eof ends the peer's receive
 * stream (its d_flags EOF, after the last rx_prod) and wakes it. */
void ring_wake_peer(struct conn *c);
void ring_peer_eof(struct conn *c);
/* ring_peer_reset: the program aborted: the peer's reads and writes fail with
 * ECONNRESET (its d_flags ERROR) and it wakes. */
void ring_peer_reset(struct conn *c);

/* ring_tx_closed: writes fail with EPIPE: the peer reads no more (smcrd's
 * TX_CLOSED in df, own d_flags; with SHM also the peer program's close). */
static inline int ring_tx_closed(struct conn *c, uint32_t df)
{
	return (df & SMCR_D_TX_CLOSED) ||
	       (c->peer && (atomic_load_explicit(&c->peer->lib_flags, memory_order_acquire) & SMCR_LIB_CLOSED));
}
