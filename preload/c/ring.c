/* ring.c: copies into the send ring and out of the receive ring with absolute cursors
 * (position = cursor % size), release/acquire publishing, and the blocking waits. */
#include "ring.h"

#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include "channel.h"
#include "real.h"

/* SHM: cursors move in chunks of at most this many bytes, so that the peer copies
 * out of the ring while this side still copies in (a whole ring at once makes the
 * two copies take turns: 1.9x TCP at 1 MiB writes, chunked 4-8x) */
#define SHM_CHUNK 65536u
#define NAP_NS 500000000ull /* futex waits are cut to this, to notice a dead smcrd */

struct iovc {
	const struct iovec *iov;
	int cnt, i;
	size_t off;
};

static size_t iov_total(const struct iovec *iov, int cnt)
{
	size_t n = 0;
	for (int i = 0; i < cnt; i++)
		n += iov[i].iov_len;
	return n;
}

/* ring -> program buffers: n bytes from ring position pos */
static void copy_out(struct iovc *v, const unsigned char *ring, size_t size, size_t pos, size_t n)
{
	while (n > 0 && v->i < v->cnt) {
		size_t room = v->iov[v->i].iov_len - v->off;
		if (room == 0) {
			v->i++;
			v->off = 0;
			continue;
		}
		size_t k = n < room ? n : room;
		size_t tail = size - pos;
		if (k > tail)
			k = tail;
		memcpy((unsigned char *)v->iov[v->i].iov_base + v->off, ring + pos, k);
		v->off += k;
		n -= k;
		pos += k;
		if (pos == size)
			pos = 0;
	}
}

/* program buffers -> ring */
static void copy_in(struct iovc *v, unsigned char *ring, size_t size, size_t pos, size_t n)
{
	while (n > 0 && v->i < v->cnt) {
		size_t room = v->iov[v->i].iov_len - v->off;
		if (room == 0) {
			v->i++;
			v->off = 0;
			continue;
		}
		size_t k = n < room ? n : room;
		size_t tail = size - pos;
		if (k > tail)
			k = tail;
		memcpy(ring + pos, (const unsigned char *)v->iov[v->i].iov_base + v->off, k);
		v->off += k;
		n -= k;
		pos += k;
		if (pos == size)
			pos = 0;
	}
}

void ring_kick(int efd)
{
	uint64_t one = 1;
	if (efd >= 0)
		(void)!R(write)(efd, &one, sizeof(one));
}

size_t ring_rx_avail(struct conn *c)
{
	uint64_t p = atomic_load_explicit(&c->sh->rx_prod, memory_order_acquire);
	uint64_t q = atomic_load_explicit(&c->sh->rx_cons, memory_order_relaxed);
	uint64_t a = p - q;
	return a > c->rx_size ? c->rx_size : (size_t)a;
}

size_t ring_tx_queued(struct conn *c)
{
	uint64_t p = atomic_load_explicit(c->tx_prod, memory_order_relaxed);
	uint64_t q = atomic_load_explicit(c->tx_cons, memory_order_acquire);
	uint64_t u = p - q;
	return u > c->tx_size ? c->tx_size : (size_t)u;
}

/* urg_ahead: the peer's urgent mark (just past its urgent byte) if the reader at
 * cons has not passed it, else 0. Loaded after rx_prod: smcrd stores the mark
 * before the rx_prod that covers its byte. */
static uint64_t urg_ahead(struct conn *c, uint64_t cons)
{
	uint64_t u = atomic_load_explicit(&c->sh->rx_urg, memory_order_acquire);
	return u > cons ? u : 0;
}

size_t ring_rx_readable(struct conn *c)
{
	uint64_t q = atomic_load_explicit(&c->sh->rx_cons, memory_order_relaxed);
	size_t a = ring_rx_avail(c);
	if (a > 0 && urg_ahead(c, q) == q + 1 && !atomic_load_explicit(&c->oob_inline, memory_order_relaxed))
		a--;
	return a;
}

size_t ring_rx_inq(struct conn *c)
{
	uint64_t p = atomic_load_explicit(&c->sh->rx_prod, memory_order_acquire);
	uint64_t q = atomic_load_explicit(&c->sh->rx_cons, memory_order_relaxed);
	uint64_t u = urg_ahead(c, q);
	size_t a = ring_rx_avail(c);
	if (u && u <= p && !atomic_load_explicit(&c->oob_inline, memory_order_relaxed) && u - 1 - q < a)
		a = (size_t)(u - 1 - q);
	return a;
}

int ring_urgent_pending(struct conn *c)
{
	uint64_t p = atomic_load_explicit(&c->sh->rx_prod, memory_order_acquire);
	uint64_t q = atomic_load_explicit(&c->sh->rx_cons, memory_order_relaxed);
	uint64_t u = urg_ahead(c, q);
	return u && u <= p && u != atomic_load_explicit(&c->sh->rx_oob, memory_order_relaxed);
}

int ring_at_mark(struct conn *c)
{
	uint64_t q = atomic_load_explicit(&c->sh->rx_cons, memory_order_relaxed);
	return urg_ahead(c, q) == q + 1;
}

static int rx_ready(struct conn *c)
{
	return ring_rx_readable(c) > 0 ||
	       (atomic_load_explicit(&c->sh->d_flags, memory_order_acquire) & (SMCR_D_EOF | SMCR_D_ERROR | SMCR_D_RELEASED)) ||
	       atomic_load_explicit(&c->reset, memory_order_relaxed) ||
	       atomic_load_explicit(&c->shut_rd, memory_order_relaxed);
}

/* peer_releasing: SHM, the peer released the connection and smcrd resends its unread
 * bytes over TCP: writes wait for SMCR_D_RELEASED, then go to the kernel socket */
static inline int peer_releasing(struct conn *c, uint32_t df)
{
	return c->peer && (df & (SMCR_D_PEER_RELEASE | SMCR_D_RELEASED)) == SMCR_D_PEER_RELEASE;
}

static int tx_ready(struct conn *c)
{
	uint32_t df = atomic_load_explicit(&c->sh->d_flags, memory_order_acquire);
	if (peer_releasing(c, df))
		return atomic_load_explicit(&c->reset, memory_order_relaxed);
	return ring_tx_queued(c) < c->tx_size || (df & (SMCR_D_ERROR | SMCR_D_RELEASED)) || ring_tx_closed(c, df) ||
	       atomic_load_explicit(&c->reset, memory_order_relaxed) ||
	       atomic_load_explicit(&c->shut_wr, memory_order_relaxed);
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
	return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

void ring_wake_local(struct conn *c)
{
	if (c->sh)
		futex(&c->sh->d_seq, FUTEX_WAKE, 0x7fffffff, NULL);
}

void ring_wake_peer(struct conn *c)
{
	struct smcr_shared *p = c->peer;
	atomic_fetch_add_explicit(&p->d_seq, 1, memory_order_seq_cst);
	if (atomic_load_explicit(&p->lib_waiters, memory_order_seq_cst))
		futex(&p->d_seq, FUTEX_WAKE, 0x7fffffff, NULL); /* shared: another process */
	if (atomic_load_explicit(&p->lib_pollers, memory_order_seq_cst) && wake_published(c->peer_wake))
		ring_kick(c->peer_efd_lib);
}

void ring_peer_eof(struct conn *c)
{
	atomic_fetch_or_explicit(&c->peer->d_flags, SMCR_D_EOF, memory_order_seq_cst);
	ring_wake_peer(c);
}

void ring_peer_reset(struct conn *c)
{
	struct smcr_shared *p = c->peer;
	if (!(atomic_load(&p->d_flags) & SMCR_D_ERROR)) {
		atomic_store(&p->d_errno, ECONNRESET);
		atomic_fetch_or_explicit(&p->d_flags, SMCR_D_ERROR, memory_order_seq_cst);
	}
	ring_wake_peer(c);
}

uint64_t ring_call_deadline(int fd, int opt)
{
	struct timeval tv = {0};
	socklen_t l = sizeof(tv);
	if (R(getsockopt)(fd, SOL_SOCKET, opt, &tv, &l) < 0 || (tv.tv_sec == 0 && tv.tv_usec == 0))
		return 0;
	return now_ns() + (uint64_t)tv.tv_sec * 1000000000ull + (uint64_t)tv.tv_usec * 1000ull;
}

/* all_restart reports whether every caught signal restarts system calls
 * (SA_RESTART): a wait a signal interrupted then goes on, as the kernel's would;
 * otherwise the call fails with EINTR. Asked only after an interruption. */
static int all_restart(void)
{
	for (int sig = 1; sig < NSIG; sig++) {
		struct sigaction sa;
		if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &sa) < 0)
			continue;
		if (!(sa.sa_flags & SA_SIGINFO) && (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN))
			continue;
		if (!(sa.sa_flags & SA_RESTART))
			return 0;
	}
	return 1;
}

/* wait_dir blocks until the direction is ready (or something ends the wait): 0 to
 * look again, -1 with errno EAGAIN when the socket's timeout expired. */
static int wait_dir(struct conn *c, int fd, int tx, uint64_t *deadline, int *have_deadline)
{
	int (*ready)(struct conn *) = tx ? tx_ready : rx_ready;
	uint64_t t0 = now_ns();
	for (unsigned i = 0;; i++) {
		if (ready(c))
			return 0;
		if ((i & 63) == 63) {
			uint64_t t = now_ns() - t0;
			if (t > (c->peer ? SHM_SPIN_NS : SPIN_NS))
				break;
			if (c->peer && t > SHM_YIELD_NS)
				sched_yield();
		}
		cpu_relax();
	}
	if (!*have_deadline) {
		*deadline = ring_call_deadline(fd, tx ? SO_SNDTIMEO : SO_RCVTIMEO);
		*have_deadline = 1;
	}
	for (;;) {
		uint64_t wait = NAP_NS;
		if (*deadline) {
			uint64_t now = now_ns();
			if (now >= *deadline) {
				errno = EAGAIN;
				return -1;
			}
			if (*deadline - now < wait)
				wait = *deadline - now;
		}
		atomic_fetch_add(&c->sh->lib_waiters, 1);
		uint32_t seen = atomic_load(&c->sh->d_seq);
		if (ready(c)) {
			atomic_fetch_sub(&c->sh->lib_waiters, 1);
			return 0;
		}
		struct timespec ts = {.tv_sec = (time_t)(wait / 1000000000ull), .tv_nsec = (long)(wait % 1000000000ull)};
		long fr = futex(&c->sh->d_seq, FUTEX_WAIT, seen, &ts);
		int fe = errno;
		atomic_fetch_sub(&c->sh->lib_waiters, 1);
		/* as the kernel: a socket timeout makes every interruption EINTR */
		if (fr < 0 && fe == EINTR && !ready(c) && (*deadline || !all_restart())) {
			errno = EINTR;
			return -1;
		}
		if (ready(c) || conn_check_reset(c, fd))
			return 0;
		if (atomic_load(&c->closed)) { /* another thread closed the socket */
			errno = EBADF;
			return -1;
		}
	}
}

/* wait_held: wait_dir, the connection held from the first wait to the end of the
 * call (ring_recv and ring_send drop it): another thread may close the socket */
static int wait_held(struct conn *c, int fd, int tx, uint64_t *deadline, int *have_deadline, int *held)
{
	if (!*held) {
		obj_get(&c->o);
		*held = 1;
	}
	return wait_dir(c, fd, tx, deadline, have_deadline);
}

static ssize_t unhold(struct conn *c, int held, ssize_t r)
{
	if (held) {
		int e = errno;
		obj_put(&c->o);
		errno = e;
	}
	return r;
}

/* after_rx_publish: rx_cons moved from cons (before) to cons + n. With SHM the peer's
 * writer waits (or polls for POLLOUT) only on a full ring: it is woken only if the
 * ring was full before this read. The writer stores rx_prod, then looks at rx_cons;
 * this side stores rx_cons, then looks at rx_prod (both seq_cst): either it sees
 * the space, or this side sees the full ring. */
static void after_rx_publish(struct conn *c, uint64_t cons)
{
	atomic_fetch_add_explicit(&c->sh->lib_seq, 1, memory_order_seq_cst);
	if (atomic_load_explicit(&c->sh->d_rxwait, memory_order_seq_cst))
		ring_kick(c->efd_drx);
	if (c->peer && atomic_load_explicit(&c->sh->rx_prod, memory_order_seq_cst) - cons >= c->rx_size)
		ring_wake_peer(c);
}

static void after_tx_publish(struct conn *c)
{
	if (c->peer) {
		ring_wake_peer(c);
		return;
	}
	atomic_fetch_add_explicit(&c->sh->lib_seq, 1, memory_order_seq_cst);
	if (atomic_load_explicit(&c->sh->d_txwait, memory_order_seq_cst))
		ring_kick(c->efd_dtx);
}

/* failed_read / failed_write: what a read or write returns on a
 * connection that failed (reset, or d_errno): the error once (as the kernel's
 * sk_err), then end of file for reads and EPIPE for writes. */
static ssize_t failed_read(struct conn *c, int err)
{
	if (atomic_exchange(&c->err_taken, 1))
		return 0;
	errno = err > 0 ? err : ECONNRESET;
	return -1;
}

static ssize_t epipe(int flags);

static ssize_t failed_write(struct conn *c, int err, int flags)
{
	if (atomic_exchange(&c->err_taken, 1))
		return epipe(flags);
	errno = err > 0 ? err : ECONNRESET;
	return -1;
}

/* ring_enter: a copy through the rings begins, which ring_leave ends: 0 or 1 (pass it
 * to ring_leave); or -1 while a release runs, after waiting for its outcome (the caller
 * looks again: the connection may be the kernel socket's now). A release waits for the
 * copies under way: a cursor moved after smcrd took it would lose or repeat bytes. The
 * copies of this process count in ring_ops; where other processes may hold the
 * connection (conn_shared), also in the area's lib_ring_ops, beside its lib_releasing,
 * so that a release in any of them waits for all (returns 1). */
static int ring_enter(struct conn *c)
{
	struct smcr_shared *sh = c->sh;
	int shared = conn_shared(c);
	atomic_fetch_add(&c->ring_ops, 1);
	if (shared)
		atomic_fetch_add_explicit(&sh->lib_ring_ops, 1, memory_order_seq_cst);
	if (__builtin_expect(!atomic_load(&c->releasing) &&
				     !(shared && atomic_load_explicit(&sh->lib_releasing, memory_order_seq_cst)),
			     1))
		return shared;
	if (shared)
		atomic_fetch_sub_explicit(&sh->lib_ring_ops, 1, memory_order_seq_cst);
	atomic_fetch_sub(&c->ring_ops, 1);
	/* another process's release ends in SMCR_D_RELEASED (this one follows), or it
	 * clears lib_releasing; one that died meanwhile gave up within RELEASE_WAIT_NS */
	struct timespec ms = {0, 1000000};
	uint64_t end = now_ns() + 2 * RELEASE_WAIT_NS;
	while (atomic_load(&c->state) == CS_ACCEL &&
	       (atomic_load(&c->releasing) ||
		(shared && atomic_load(&sh->lib_releasing) && !(atomic_load(&sh->d_flags) & SMCR_D_RELEASED) &&
		 now_ns() < end)))
		nanosleep(&ms, NULL);
	return -1;
}

static inline void ring_leave(struct conn *c, int entered)
{
	if (entered)
		atomic_fetch_sub_explicit(&c->sh->lib_ring_ops, 1, memory_order_seq_cst);
	atomic_fetch_sub(&c->ring_ops, 1);
}

/* recv_oob: recv(MSG_OOB), as Linux's tcp_recv_urg: the urgent byte that lies ahead,
 * once (MSG_PEEK leaves it); EINVAL when there is none, it was taken, or the program
 * keeps urgent bytes inline; never a wait. */
static ssize_t recv_oob(struct conn *c, const struct iovec *iov, int iovcnt, int flags)
{
	struct smcr_shared *sh = c->sh;
	uint64_t prod = atomic_load_explicit(&sh->rx_prod, memory_order_acquire);
	uint64_t cons = atomic_load_explicit(&sh->rx_cons, memory_order_acquire);
	uint64_t u = urg_ahead(c, cons);
	if (atomic_load(&c->oob_inline) || !u || u == atomic_load(&sh->rx_oob)) {
		errno = EINVAL;
		return -1;
	}
	if (u > prod) { /* the mark came before its byte (never from smcrd) */
		errno = EAGAIN;
		return -1;
	}
	unsigned char b = c->rx[(u - 1) % c->rx_size];
	/* another thread's read may have passed it meanwhile: then it is gone */
	if (atomic_load_explicit(&sh->rx_cons, memory_order_acquire) >= u) {
		errno = EINVAL;
		return -1;
	}
	if (!(flags & MSG_PEEK))
		atomic_store(&sh->rx_oob, u);
	if (iov_total(iov, iovcnt) == 0)
		return 0;
	if (!(flags & MSG_TRUNC)) {
		struct iovc v = {.iov = iov, .cnt = iovcnt};
		copy_out(&v, &b, 1, 0, 1);
	}
	return 1;
}

/* skip_urgent: a read at the mark takes the urgent byte out of the stream, when it
 * is out of line: cons moves past it, as the kernel's copied_seq does */
static void skip_urgent(struct conn *c, uint64_t cons)
{
	atomic_store_explicit(&c->sh->rx_cons, cons + 1, memory_order_seq_cst);
	after_rx_publish(c, cons);
}

static ssize_t recv_inner(struct conn *c, int fd, const struct iovec *iov, int iovcnt, int flags, int *held)
{
	if (flags & MSG_OOB)
		return recv_oob(c, iov, iovcnt, flags);
	size_t want = iov_total(iov, iovcnt);
	int nonblock = (flags & MSG_DONTWAIT) || atomic_load_explicit(&c->user_nonblock, memory_order_relaxed);
	struct iovc v = {.iov = iov, .cnt = iovcnt};
	size_t done = 0;
	uint64_t deadline = 0;
	int have_deadline = 0;
	struct smcr_shared *sh = c->sh;

	if (want == 0)
		return 0;
	for (;;) {
		if (atomic_load_explicit(&c->reset, memory_order_relaxed)) {
			if (done)
				return (ssize_t)done;
			return failed_read(c, ECONNRESET);
		}
		if (atomic_load_explicit(&c->state, memory_order_relaxed) != CS_ACCEL ||
		    ((atomic_load_explicit(&sh->d_flags, memory_order_relaxed) & SMCR_D_RELEASED) &&
		     conn_follow_release(c, fd))) { /* released meanwhile: the kernel's socket */
			if (done)
				return (ssize_t)done;
			/* SHM: what the receive ring held comes first */
			if (atomic_load(&c->state) == CS_PREFIX && !(flags & MSG_OOB)) {
				ssize_t r = conn_prefix_recv(c, iov, iovcnt, flags);
				if (r != -2)
					return r;
			}
			struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt};
			return R(recvmsg)(fd, &mh, flags);
		}
		uint64_t prod = atomic_load_explicit(&sh->rx_prod, memory_order_acquire);
		uint64_t cons = atomic_load_explicit(&sh->rx_cons, memory_order_relaxed);
		uint64_t avail = prod - cons;
		if (avail > c->rx_size) { /* smcrd broke the ring: end the connection */
			conn_mark_reset(c, fd);
			continue;
		}
		/* the urgent mark, as Linux's tcp_recvmsg: a read stops before the
		 * urgent byte; one that starts at it skips it (out of line) or takes it
		 * with what follows (SO_OOBINLINE) */
		uint64_t urg = avail > 0 ? urg_ahead(c, cons) : 0;
		uint64_t skip = 0;
		if (urg == cons + 1) {
			if (done)
				return (ssize_t)done;
			if (!atomic_load_explicit(&c->oob_inline, memory_order_relaxed)) {
				if (!(flags & MSG_PEEK)) {
					skip_urgent(c, cons);
					continue;
				}
				skip = 1; /* a peek looks past it */
				avail--;
			}
		} else if (urg && urg - 1 - cons < avail) {
			avail = urg - 1 - cons;
		}
		if (avail > 0) {
			int entered = ring_enter(c);
			if (entered < 0)
				continue;
			size_t n = want - done < avail ? want - done : (size_t)avail;
			if (flags & MSG_PEEK) {
				if (!(flags & MSG_TRUNC))
					copy_out(&v, c->rx, c->rx_size, (size_t)((cons + skip) % c->rx_size), n);
				ring_leave(c, entered);
				return (ssize_t)(done + n);
			}
			/* SHM: give the space back in chunks, so that the peer's
			 * writer fills the ring while this side still copies */
			size_t chunk = c->peer ? SHM_CHUNK : n;
			for (size_t k = 0; k < n;) {
				size_t m = n - k < chunk ? n - k : chunk;
				if (!(flags & MSG_TRUNC))
					copy_out(&v, c->rx, c->rx_size, (size_t)((cons + k) % c->rx_size), m);
				atomic_store_explicit(&sh->rx_cons, cons + k + m, memory_order_seq_cst);
				after_rx_publish(c, cons + k);
				k += m;
			}
			ring_leave(c, entered);
			done += n;
			if (done == want || !(flags & MSG_WAITALL))
				return (ssize_t)done;
			continue;
		}
		/* after shutdown(SHUT_RD), as TCP: the bytes buffered are read, then 0 */
		if (atomic_load_explicit(&c->shut_rd, memory_order_relaxed))
			return (ssize_t)done;
		uint32_t df = atomic_load_explicit(&sh->d_flags, memory_order_acquire);
		/* the flags are set after the last rx_prod: look at the ring once more */
		if (df & (SMCR_D_EOF | SMCR_D_ERROR)) {
			if (atomic_load_explicit(&sh->rx_prod, memory_order_acquire) != prod)
				continue;
			if (done || (df & SMCR_D_EOF && !(df & SMCR_D_ERROR)))
				return (ssize_t)done;
			return failed_read(c, atomic_load(&sh->d_errno));
		}
		if (nonblock) {
			if (done)
				return (ssize_t)done;
			errno = EAGAIN;
			return -1;
		}
		if (wait_held(c, fd, 0, &deadline, &have_deadline, held) < 0) {
			if (done)
				return (ssize_t)done;
			return -1;
		}
	}
}

static ssize_t epipe(int flags)
{
	if (!(flags & MSG_NOSIGNAL))
		raise(SIGPIPE);
	errno = EPIPE;
	return -1;
}

static ssize_t space_inner(struct conn *c, int fd, int flags, int *held)
{
	int nonblock = (flags & MSG_DONTWAIT) || atomic_load_explicit(&c->user_nonblock, memory_order_relaxed);
	uint64_t deadline = 0;
	int have_deadline = 0;
	for (;;) {
		if (atomic_load_explicit(&c->reset, memory_order_relaxed))
			return failed_write(c, ECONNRESET, flags);
		uint32_t df = atomic_load_explicit(&c->sh->d_flags, memory_order_acquire);
		if (df & SMCR_D_ERROR)
			return failed_write(c, atomic_load(&c->sh->d_errno), flags);
		if (ring_tx_closed(c, df) || atomic_load_explicit(&c->shut_wr, memory_order_relaxed))
			return epipe(flags);
		size_t fr = c->tx_size - ring_tx_queued(c);
		if (fr > 0 && !peer_releasing(c, df))
			return (ssize_t)fr;
		if (nonblock) {
			errno = EAGAIN;
			return -1;
		}
		if (wait_held(c, fd, 1, &deadline, &have_deadline, held) < 0)
			return -1;
	}
}

/* peer_sigurg: SHM: the peer's socket's owner gets SIGURG for the new mark, as from
 * the kernel's tcp_check_urg, before the cursor that covers the byte (so a
 * program that sees the byte has had the signal); only in this pid namespace,
 * where the owner's number means that process */
static void peer_sigurg(struct conn *c)
{
	int owner = atomic_load(&c->peer->lib_owner);
	uint64_t ns = atomic_load(&c->peer->lib_pidns);
	if (owner != 0 && ns != 0 && ns == conn_pidns())
		kill(owner, SIGURG); /* negative: the process group */
}

/* mark_urgent: send(MSG_OOB) wrote up to pos: its last byte is urgent, as TCP's
 * urgent pointer (the latest mark counts). Stored before the tx_prod that covers
 * it, so that whoever sees the cursor sees the mark. */
static void mark_urgent(struct conn *c, uint64_t pos)
{
	atomic_store_explicit(c->tx_urg, pos, memory_order_seq_cst);
	if (c->peer)
		peer_sigurg(c);
}

/* sent_part: a send that wrote done bytes and ends early (a signal, a timeout, an
 * error); with MSG_OOB the last byte written is urgent, as the kernel's partial
 * send marks it (late: smcrd may have taken the bytes already, and then they go
 * unmarked; a non-blocking send that fills the ring marks in time) */
static ssize_t sent_part(struct conn *c, size_t done, int flags)
{
	if (flags & MSG_OOB) {
		mark_urgent(c, atomic_load(c->tx_prod));
		after_tx_publish(c);
	}
	return (ssize_t)done;
}

static ssize_t send_inner(struct conn *c, int fd, const struct iovec *iov, int iovcnt, int flags, int *held)
{
	size_t want = iov_total(iov, iovcnt);
	int nonblock = (flags & MSG_DONTWAIT) || atomic_load_explicit(&c->user_nonblock, memory_order_relaxed);
	struct iovc v = {.iov = iov, .cnt = iovcnt};
	size_t done = 0;
	uint64_t deadline = 0;
	int have_deadline = 0;
	struct smcr_shared *sh = c->sh;

	for (;;) {
		if (atomic_load_explicit(&c->reset, memory_order_relaxed)) {
			if (done)
				return sent_part(c, done, flags);
			return failed_write(c, ECONNRESET, flags);
		}
		if (atomic_load_explicit(&c->state, memory_order_relaxed) != CS_ACCEL ||
		    ((atomic_load_explicit(&sh->d_flags, memory_order_relaxed) & SMCR_D_RELEASED) &&
		     conn_follow_release(c, fd))) { /* released meanwhile: the kernel's socket */
			if (done)
				return (ssize_t)done;
			struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt};
			return R(sendmsg)(fd, &mh, flags);
		}
		uint32_t df = atomic_load_explicit(&sh->d_flags, memory_order_acquire);
		if (df & SMCR_D_ERROR) {
			if (done)
				return sent_part(c, done, flags);
			return failed_write(c, atomic_load(&sh->d_errno), flags);
		}
		if (ring_tx_closed(c, df) || atomic_load_explicit(&c->shut_wr, memory_order_relaxed)) {
			if (done)
				return sent_part(c, done, flags);
			return epipe(flags);
		}
		if (want == 0)
			return 0;
		if (peer_releasing(c, df)) {
			if (done)
				return sent_part(c, done, flags);
			if (nonblock) {
				errno = EAGAIN;
				return -1;
			}
			if (wait_held(c, fd, 1, &deadline, &have_deadline, held) < 0)
				return -1;
			continue;
		}
		uint64_t prod = atomic_load_explicit(c->tx_prod, memory_order_relaxed);
		uint64_t cons = atomic_load_explicit(c->tx_cons, memory_order_acquire);
		uint64_t used = prod - cons;
		if (used > c->tx_size) {
			conn_mark_reset(c, fd);
			continue;
		}
		size_t fr = c->tx_size - (size_t)used;
		if (fr > 0) {
			int entered = ring_enter(c);
			if (entered < 0)
				continue;
			/* SHM: counted in lib_sending, then a last look for the peer's
			 * release, whose smcrd sets the flag, then waits for 0 (both
			 * seq_cst): either it waits for this copy, or the copy waits */
			if (c->peer) {
				atomic_fetch_add_explicit(&sh->lib_sending, 1, memory_order_seq_cst);
				if (atomic_load_explicit(&sh->d_flags, memory_order_seq_cst) & SMCR_D_PEER_RELEASE) {
					atomic_fetch_sub_explicit(&sh->lib_sending, 1, memory_order_seq_cst);
					ring_leave(c, entered);
					continue;
				}
			}
			size_t n = want - done < fr ? want - done : fr;
			/* SHM: publish in chunks, so that the peer reads while this
			 * side still copies */
			if (c->peer && n > SHM_CHUNK)
				n = SHM_CHUNK;
			/* the call's last chunk: all of it, or a non-blocking one that
			 * fills the ring (MSG_OOB: it ends here, so that its last byte
			 * is marked before smcrd or the peer can take it) */
			int last = done + n == want || ((flags & MSG_OOB) && nonblock && n == fr);
			copy_in(&v, c->tx, c->tx_size, (size_t)(prod % c->tx_size), n);
			if ((flags & MSG_OOB) && last)
				mark_urgent(c, prod + n);
			atomic_store_explicit(c->tx_prod, prod + n, memory_order_seq_cst);
			after_tx_publish(c);
			if (c->peer)
				atomic_fetch_sub_explicit(&sh->lib_sending, 1, memory_order_seq_cst);
			ring_leave(c, entered);
			done += n;
			if (last)
				return (ssize_t)done;
			continue;
		}
		if (nonblock) {
			if (done)
				return sent_part(c, done, flags);
			errno = EAGAIN;
			return -1;
		}
		if (wait_held(c, fd, 1, &deadline, &have_deadline, held) < 0) {
			if (done)
				return sent_part(c, done, flags);
			return -1;
		}
	}
}

ssize_t ring_recv(struct conn *c, int fd, const struct iovec *iov, int iovcnt, int flags)
{
	int held = 0;
	ssize_t r = recv_inner(c, fd, iov, iovcnt, flags, &held);
	return unhold(c, held, r);
}

ssize_t ring_send(struct conn *c, int fd, const struct iovec *iov, int iovcnt, int flags)
{
	int held = 0;
	ssize_t r = send_inner(c, fd, iov, iovcnt, flags, &held);
	return unhold(c, held, r);
}

ssize_t ring_send_space(struct conn *c, int fd, int flags)
{
	int held = 0;
	ssize_t r = space_inner(c, fd, flags, &held);
	return unhold(c, held, r);
}

int ring_release(struct conn *c, int fd)
{
	struct smcr_shared *sh = c->sh;
	const uint32_t answer = SMCR_D_RELEASED | SMCR_D_NO_RELEASE | SMCR_D_ERROR;
	if (atomic_load(&sh->d_flags) & (SMCR_D_NO_RELEASE | SMCR_D_ERROR))
		return -1; /* refused before, or failed: asked no more */
	atomic_fetch_or(&sh->lib_flags, SMCR_LIB_RELEASE);
	atomic_fetch_add_explicit(&sh->lib_seq, 1, memory_order_seq_cst);
	ring_kick(c->efd_dtx);
	uint64_t end = now_ns() + RELEASE_WAIT_NS;
	for (;;) {
		atomic_fetch_add(&sh->lib_waiters, 1);
		uint32_t seen = atomic_load(&sh->d_seq);
		uint32_t df = atomic_load(&sh->d_flags);
		uint64_t now = now_ns();
		if ((df & answer) || now >= end || conn_check_reset(c, fd)) {
			atomic_fetch_sub(&sh->lib_waiters, 1);
			return (df & SMCR_D_RELEASED) ? 0 : -1;
		}
		uint64_t wait = end - now < NAP_NS ? end - now : NAP_NS;
		struct timespec ts = {.tv_sec = (time_t)(wait / 1000000000ull), .tv_nsec = (long)(wait % 1000000000ull)};
		futex(&sh->d_seq, FUTEX_WAIT, seen, &ts);
		atomic_fetch_sub(&sh->lib_waiters, 1);
	}
}

void ring_shutdown_wr(struct conn *c)
{
	if (c->peer)
		ring_peer_eof(c);
	atomic_fetch_or(&c->sh->lib_flags, SMCR_LIB_SHUT_WR);
	atomic_fetch_add_explicit(&c->sh->lib_seq, 1, memory_order_seq_cst);
	ring_kick(c->efd_dtx);
}
