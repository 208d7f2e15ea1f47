/* conn.c: a socket offered to smcrd: its states (conn.h), the DECIDED message, the
 * readiness of each state, and the end of the connection at the program's last close. */
#include "conn.h"

#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "channel.h"
#include "ready.h"
#include "real.h"
#include "ring.h"

/* fork_gen changes in both processes at every fork: a connection made before it is
 * shared with another process, and its end is then the channel's close (smcrd sees
 * that when the last process closes it), not SMCR_LIB_CLOSED. */
atomic_uint smcr_fork_gen;

static void conn_last_close(struct obj *o);
static void conn_free(struct obj *o);
static int conn_own_fds(struct obj *o, int *out);

const struct obj_ops conn_ops = {.last_close = conn_last_close, .free = conn_free, .own_fds = conn_own_fds};

static int conn_own_fds(struct obj *o, int *out)
{
	struct conn *c = conn_of(o);
	int v[] = {c->chan,        c->memfd,        c->efd_lib, c->wake_fd, c->efd_dtx, c->efd_drx,
		   c->peer_memfd, c->peer_efd_lib, c->tx_file, c->rx_file};
	_Static_assert(sizeof(v) / sizeof(v[0]) <= OBJ_MAX_OWN_FDS, "own fds");
	int n = 0;
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		if (v[i] >= 0)
			out[n++] = v[i];
	return n;
}

struct conn_ext {
	struct conn c;
	unsigned fork_gen;
};

struct conn *conn_new(int chan, int user_nonblock, int oob_inline)
{
	struct conn_ext *x = calloc(1, sizeof(*x));
	if (!x)
		return NULL;
	struct conn *c = &x->c;
	obj_init(&c->o, OBJ_CONN, &conn_ops);
	pthread_mutex_init(&c->mu, NULL);
	atomic_init(&c->state, CS_PENDING);
	c->chan = chan;
	atomic_init(&c->user_nonblock, user_nonblock);
	atomic_init(&c->oob_inline, !!oob_inline);
	c->memfd = c->efd_dtx = c->efd_drx = c->peer_memfd = c->peer_efd_lib = -1;
	c->tx_file = c->rx_file = -1;
	/* the pair the offer passes */
	const struct proc_wake *w = channel_proc_wake();
	c->efd_lib = w ? w->efd : -1;
	c->wake_fd = w ? w->page_fd : -1;
	c->wake = w ? w->page : NULL;
	x->fork_gen = atomic_load(&smcr_fork_gen);
	return c;
}

void conn_restore_flags(struct conn *c, int fd)
{
	int fl = R(fcntl)(fd, F_GETFL);
	if (fl < 0)
		return;
	if (atomic_load(&c->user_nonblock))
		fl |= O_NONBLOCK;
	else
		fl &= ~O_NONBLOCK;
	R(fcntl)(fd, F_SETFL, fl);
}

void conn_restore_oobinline(struct conn *c, int fd)
{
	int v = atomic_load(&c->oob_inline);
	R(setsockopt)(fd, SOL_SOCKET, SO_OOBINLINE, &v, sizeof(v));
}

int conn_oob_inline_of(int fd)
{
	int v = 0;
	socklen_t l = sizeof(v);
	if (R(getsockopt)(fd, SOL_SOCKET, SO_OOBINLINE, &v, &l) < 0)
		return 0;
	return v != 0;
}

uint64_t conn_pidns(void)
{
	static _Atomic uint64_t ns;
	uint64_t v = atomic_load_explicit(&ns, memory_order_relaxed);
	struct stat st;
	if (!v && stat("/proc/self/ns/pid", &st) == 0) {
		v = (uint64_t)st.st_ino;
		atomic_store_explicit(&ns, v, memory_order_relaxed);
	}
	return v;
}

void conn_note_owner(struct conn *c, int fd)
{
	int owner = R(fcntl)(fd, F_GETOWN);
	atomic_store(&c->sh->lib_pidns, conn_pidns());
	atomic_store(&c->sh->lib_owner, owner > 0 || owner < -1 ? owner : 0);
}

static void set_linger0(int fd)
{
	struct linger l = {.l_onoff = 1, .l_linger = 0};
	R(setsockopt)(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
}

void conn_mark_reset(struct conn *c, int fd)
{
	/* a channel that hung up after smcrd released the connection (SHM: at the
	 * peer's ask, the program idle meanwhile) ends no stream: the socket has it */
	if (atomic_load(&c->state) == CS_ACCEL && conn_follow_release(c, fd))
		return;
	if (atomic_exchange(&c->reset, 1))
		return;
	set_linger0(fd);
	ring_wake_local(c);
	ready_conn_changed(c);
}

void conn_note_close(struct conn *c, int fd)
{
	if (atomic_load(&c->state) != CS_ACCEL || atomic_load(&c->reset))
		return;
	struct linger l = {0};
	socklen_t len = sizeof(l);
	int linger0 = R(getsockopt)(fd, SOL_SOCKET, SO_LINGER, &l, &len) == 0 && l.l_onoff && l.l_linger == 0;
	if (linger0 || ring_rx_avail(c) > 0)
		atomic_store(&c->aborted, 1);
}

int conn_check_reset(struct conn *c, int fd)
{
	if (atomic_load_explicit(&c->reset, memory_order_relaxed))
		return 1;
	if (atomic_load(&c->state) != CS_ACCEL || c->chan < 0 || conn_follow_release(c, fd))
		return 0;
	struct pollfd p = {.fd = c->chan, .events = POLLIN};
	if (R(poll)(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR | POLLIN)))
		conn_mark_reset(c, fd);
	return atomic_load(&c->reset);
}

/* map_area maps a shared area from memfd and checks its header as the ABI says: the
 * mapping (*size bytes), or NULL. The fd stays open. */
static struct smcr_shared *map_area(int memfd, size_t *size)
{
	struct stat st;
	if (fstat(memfd, &st) < 0 || st.st_size < (off_t)sizeof(struct smcr_shared) ||
	    st.st_size > (off_t)0x7fffffff)
		return NULL;
	size_t n = (size_t)st.st_size;
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (p == MAP_FAILED)
		return NULL;
	struct smcr_shared *sh = p;
	uint64_t ms = sh->map_size, to = sh->tx_off, ts = sh->tx_size, ro = sh->rx_off, rs = sh->rx_size;
	int ok = sh->magic == SMCR_SHARED_MAGIC && sh->version == SMCR_ABI_VERSION && ms <= n &&
		 ms >= sizeof(struct smcr_shared) && ts > 0 && rs > 0;
	if (ok && sh->ring_files == 0)
		ok = to >= sizeof(struct smcr_shared) && ro >= sizeof(struct smcr_shared) && to + ts <= ms &&
		     ro + rs <= ms && (to + ts <= ro || ro + rs <= to);
	else if (ok)
		ok = sh->ring_files == SMCR_RING_FILES;
	if (!ok) {
		munmap(p, n);
		return NULL;
	}
	*size = n;
	return sh;
}

/* map_ring maps size bytes at off in fd, a ring's own file (SMCR_RING_FILES): the
 * ring, with the mapping, which starts at the page below it, in *map and *map_size;
 * or NULL. The file must hold the ring and be sealed against shrinking, so that no
 * access to the ring can fault. The fd stays open. */
static unsigned char *map_ring(int fd, uint64_t off, uint64_t size, void **map, size_t *map_size)
{
	struct stat st;
	int seals = R(fcntl)(fd, F_GET_SEALS);
	if (fstat(fd, &st) < 0 || seals < 0 || !(seals & F_SEAL_SHRINK) || off + size > (uint64_t)st.st_size)
		return NULL;
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), base = off & ~(page - 1);
	size_t n = (size_t)(off - base + size);
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)base);
	if (p == MAP_FAILED)
		return NULL;
	*map = p;
	*map_size = n;
	return (unsigned char *)p + (off - base);
}

/* efd_nonblock: the library writes the peer's efd_lib: that may not block (a library
 * makes its process eventfd EFD_NONBLOCK) */
static void efd_nonblock(int efd)
{
	int fl = R(fcntl)(efd, F_GETFL);
	if (fl >= 0 && !(fl & O_NONBLOCK))
		R(fcntl)(efd, F_SETFL, fl | O_NONBLOCK);
}

int conn_attach(struct conn *c, int mode, const int *fds, int nfds)
{
	int shm = mode == SMCR_MODE_SHM;
	if (nfds != 3 && nfds != 5 && nfds != 6)
		return -1;
	size_t size, psize = 0;
	struct smcr_shared *sh = map_area(fds[0], &size), *peer = NULL;
	if (!sh)
		return -1;
	int files = sh->ring_files == SMCR_RING_FILES;
	struct smcr_wake *peer_wake = NULL;
	/* (an exec's new image brings no peer wake page: -1) */
	if (nfds != (shm ? 6 : files ? 5 : 3) || (shm && files) ||
	    (shm && fds[5] >= 0 && !(peer_wake = channel_wake_page_map(fds[5])))) {
		munmap(sh, size);
		return -1;
	}
	if (shm && !(peer = map_area(fds[3], &psize))) {
		if (peer_wake)
			munmap(peer_wake, SMCR_WAKE_SIZE);
		munmap(sh, size);
		return -1;
	}
	unsigned char *tx = (unsigned char *)sh + sh->tx_off, *rx = (unsigned char *)sh + sh->rx_off;
	if (files) {
		rx = map_ring(fds[4], sh->rx_off, sh->rx_size, &c->rx_map, &c->rx_map_size);
		tx = rx ? map_ring(fds[3], sh->tx_off, sh->tx_size, &c->tx_map, &c->tx_map_size) : NULL;
		if (!tx) {
			if (rx)
				munmap(c->rx_map, c->rx_map_size);
			c->rx_map = NULL;
			munmap(sh, size);
			return -1;
		}
		c->tx_file = fds[3];
		c->rx_file = fds[4];
	}
	c->sh = sh;
	c->map_size = size;
	c->rx = rx;
	c->rx_size = sh->rx_size;
	if (peer) {
		c->peer = peer;
		c->peer_map_size = psize;
		c->tx = (unsigned char *)peer + peer->rx_off;
		c->tx_size = peer->rx_size;
		c->tx_prod = &peer->rx_prod;
		c->tx_cons = &peer->rx_cons;
		c->tx_urg = &peer->rx_urg;
		c->peer_memfd = fds[3];
		c->peer_efd_lib = fds[4];
		efd_nonblock(c->peer_efd_lib);
		c->peer_wake = peer_wake;
		if (fds[5] >= 0)
			R(close)(fds[5]); /* mapped: one fd less per connection */
	} else {
		c->tx = tx;
		c->tx_size = sh->tx_size;
		c->tx_prod = &sh->tx_prod;
		c->tx_cons = &sh->tx_cons;
		c->tx_urg = &sh->tx_urg;
	}
	c->memfd = fds[0];
	c->efd_dtx = fds[1];
	c->efd_drx = fds[2];
	return 0;
}

int conn_shared(struct conn *c)
{
	return ((struct conn_ext *)c)->fork_gen != atomic_load(&smcr_fork_gen);
}

void conn_set_shared(struct conn *c)
{
	((struct conn_ext *)c)->fork_gen = atomic_load(&smcr_fork_gen) - 1;
}

static void close_chan(struct conn *c)
{
	if (c->chan >= 0) {
		R(close)(c->chan);
		c->chan = -1;
	}
}

/* decide_locked applies one DECIDED (or the channel's failure); c->mu held. */
static void decide_locked(struct conn *c, int fd, struct channel_msg *m, int r)
{
	int old_chan = c->chan;
	if (r < 0 || m->h.type != SMCR_MSG_DECIDED) {
		atomic_store(&c->state, CS_RESET);
		atomic_store(&c->reset, 1);
		set_linger0(fd);
	} else if (m->h.mode == SMCR_MODE_SMCR || m->h.mode == SMCR_MODE_SHM) {
		if (conn_attach(c, (int)m->h.mode, m->fds, m->nfds) == 0) {
			m->nfds = 0;
			conn_note_owner(c, fd);
			/* SHM: urgent data that came before the owner was noted here had
			 * no SIGURG from the peer library: send it now. (The peer stores
			 * the mark, then reads the owner; this stored the owner, then
			 * reads the mark: one of the two sees the other.) */
			int owner = atomic_load(&c->sh->lib_owner);
			if (c->peer && owner && atomic_load(&c->sh->rx_urg) > atomic_load(&c->sh->rx_cons))
				kill(owner, SIGURG);
			atomic_store(&c->state, CS_ACCEL);
		} else {
			atomic_store(&c->state, CS_RESET);
			atomic_store(&c->reset, 1);
			set_linger0(fd);
		}
	} else if (m->h.mode == SMCR_MODE_TCP) {
		conn_restore_flags(c, fd);
		conn_restore_oobinline(c, fd);
		if (m->h.len) {
			c->prefix = m->payload;
			c->prefix_len = m->h.len;
			m->payload = NULL;
			atomic_store(&c->state, CS_PREFIX);
		} else {
			atomic_store(&c->state, CS_TCP);
		}
	} else if (m->h.mode == SMCR_MODE_FAILED) {
		int e = -m->h.status;
		atomic_store(&c->pending_err, e > 0 ? e : ECONNREFUSED);
		conn_restore_flags(c, fd);
		conn_restore_oobinline(c, fd);
		atomic_store(&c->state, CS_FAILED);
	} else {
		atomic_store(&c->state, CS_RESET);
		atomic_store(&c->reset, 1);
		set_linger0(fd);
	}
	ready_decided(c, old_chan);
	if (atomic_load(&c->state) != CS_ACCEL)
		close_chan(c);
}

static int decide(struct conn *c, int fd, int block, uint64_t deadline);

int conn_decide(struct conn *c, int fd, int block)
{
	return conn_decide_by(c, fd, block, 0);
}

int conn_decide_by(struct conn *c, int fd, int block, uint64_t deadline)
{
	if (atomic_load(&c->state) != CS_PENDING)
		return 0;
	if (!block)
		return decide(c, fd, 0, 0);
	/* a blocking wait holds the connection: another thread may close it */
	obj_get(&c->o);
	int r = decide(c, fd, 1, deadline);
	int e = errno;
	obj_put(&c->o);
	errno = e;
	return r;
}

static int decide(struct conn *c, int fd, int block, uint64_t deadline)
{
	for (;;) {
		if (atomic_load(&c->state) != CS_PENDING)
			return 0;
		if (block) {
			/* timed, to notice another thread's close of the socket */
			int ms = 1000;
			if (deadline) {
				uint64_t now = now_ns();
				if (now >= deadline) {
					errno = EINPROGRESS; /* as the kernel's connect on SO_SNDTIMEO */
					return -1;
				}
				if ((deadline - now) / 1000000 + 1 < (uint64_t)ms)
					ms = (int)((deadline - now) / 1000000 + 1);
			}
			struct pollfd p = {.fd = c->chan, .events = POLLIN};
			R(poll)(&p, 1, ms);
			if (atomic_load(&c->state) != CS_PENDING)
				return 0;
			if (atomic_load(&c->closed)) {
				errno = EBADF;
				return -1;
			}
			if (p.revents == 0)
				continue;
		}
		if (block)
			pthread_mutex_lock(&c->mu);
		else if (pthread_mutex_trylock(&c->mu) != 0) {
			errno = EAGAIN;
			return -1;
		}
		if (atomic_load(&c->state) != CS_PENDING) {
			pthread_mutex_unlock(&c->mu);
			return 0;
		}
		struct channel_msg m;
		int r = channel_recv(c->chan, &m, MSG_DONTWAIT);
		if (r == -EAGAIN) {
			pthread_mutex_unlock(&c->mu);
			if (!block) {
				errno = EAGAIN;
				return -1;
			}
			continue;
		}
		decide_locked(c, fd, &m, r);
		if (r == 0)
			channel_msg_free(&m);
		pthread_mutex_unlock(&c->mu);
		return 0;
	}
}

uint32_t conn_revents(struct conn *c, int fd)
{
	struct pollfd p;
	switch (atomic_load_explicit(&c->state, memory_order_acquire)) {
	case CS_PENDING:
		return 0;
	case CS_ACCEL: {
		if (conn_follow_release(c, fd))
			return conn_revents(c, fd);
		if (atomic_load_explicit(&c->reset, memory_order_relaxed))
			return POLLIN | POLLRDNORM | POLLOUT | POLLWRNORM | POLLHUP | POLLRDHUP |
			       (atomic_load_explicit(&c->err_taken, memory_order_relaxed) ? 0 : POLLERR);
		uint32_t r = 0;
		uint32_t df = atomic_load_explicit(&c->sh->d_flags, memory_order_acquire);
		int shr = atomic_load_explicit(&c->shut_rd, memory_order_relaxed);
		int shw = atomic_load_explicit(&c->shut_wr, memory_order_relaxed);
		if (ring_rx_readable(c) > 0 || (df & (SMCR_D_EOF | SMCR_D_ERROR)) || shr)
			r |= POLLIN | POLLRDNORM;
		if (ring_urgent_pending(c))
			r |= POLLPRI;
		if ((df & SMCR_D_EOF) || shr)
			r |= POLLRDHUP;
		if (df & SMCR_D_ERROR)
			r |= (atomic_load_explicit(&c->err_taken, memory_order_relaxed) ? 0 : POLLERR) | POLLHUP;
		int txc = ring_tx_closed(c, df);
		if (((df & SMCR_D_EOF) || shr) && (txc || shw))
			r |= POLLHUP;
		if ((ring_tx_queued(c) < c->tx_size && !(c->peer && (df & SMCR_D_PEER_RELEASE))) || (df & SMCR_D_ERROR) ||
		    txc || shw)
			r |= POLLOUT | POLLWRNORM;
		return r;
	}
	case CS_PREFIX:
		p = (struct pollfd){.fd = fd, .events = POLLIN | POLLOUT | POLLRDHUP | POLLPRI};
		if (R(poll)(&p, 1, 0) != 1)
			p.revents = 0;
		if (atomic_load(&c->prefix_off) < c->prefix_len)
			p.revents |= POLLIN | POLLRDNORM;
		return (uint16_t)p.revents;
	case CS_TCP:
		p = (struct pollfd){.fd = fd, .events = POLLIN | POLLOUT | POLLRDHUP | POLLPRI};
		if (R(poll)(&p, 1, 0) != 1)
			p.revents = 0;
		return (uint16_t)p.revents;
	case CS_FAILED:
		return POLLIN | POLLRDNORM | POLLOUT | POLLWRNORM | POLLHUP | POLLRDHUP |
		       (atomic_load(&c->pending_err) ? POLLERR : 0);
	default:
		return POLLIN | POLLRDNORM | POLLOUT | POLLWRNORM | POLLHUP | POLLERR | POLLRDHUP;
	}
}

int conn_error(struct conn *c)
{
	if (atomic_load(&c->reset))
		return ECONNRESET;
	if (atomic_load(&c->sh->d_flags) & SMCR_D_ERROR) {
		int e = atomic_load(&c->sh->d_errno);
		return e > 0 ? e : ECONNRESET;
	}
	return 0;
}

int conn_wait_fd(struct conn *c)
{
	switch (atomic_load(&c->state)) {
	case CS_PENDING:
		return c->chan;
	case CS_ACCEL:
		return atomic_load(&c->reset) ? -1 : c->efd_lib;
	default:
		return -1;
	}
}

uint64_t conn_seq(struct conn *c)
{
	uint64_t s = (uint64_t)atomic_load(&c->state) << 56;
	if (atomic_load(&c->state) == CS_ACCEL)
		s |= ((uint64_t)atomic_load(&c->reset) << 48) | atomic_load(&c->sh->d_seq) |
		     ((uint64_t)(atomic_load(&c->shut_rd) | atomic_load(&c->shut_wr) << 1) << 40);
	else if (atomic_load(&c->state) == CS_PREFIX)
		s |= atomic_load(&c->prefix_off);
	return s;
}

ssize_t conn_prefix_recv(struct conn *c, const struct iovec *iov, int cnt, int flags)
{
	size_t off = atomic_load(&c->prefix_off);
	if (off >= c->prefix_len) {
		int st = CS_PREFIX;
		atomic_compare_exchange_strong(&c->state, &st, CS_TCP);
		return -2;
	}
	size_t n = 0;
	for (int i = 0; i < cnt && off + n < c->prefix_len; i++) {
		size_t k = c->prefix_len - off - n;
		if (k > iov[i].iov_len)
			k = iov[i].iov_len;
		if (!(flags & MSG_TRUNC))
			memcpy(iov[i].iov_base, c->prefix + off + n, k);
		n += k;
	}
	if (!(flags & MSG_PEEK)) {
		atomic_store(&c->prefix_off, off + n);
		if (off + n >= c->prefix_len) {
			int st = CS_PREFIX;
			atomic_compare_exchange_strong(&c->state, &st, CS_TCP);
		}
	}
	return (ssize_t)n;
}

/* become_tcp: c, released by smcrd, is plain TCP from here on: its channel and the
 * area's descriptors close (the mapping stays until conn_free: another thread may
 * still look at it), its epoll members go to the kernel's sets, its waiters to the
 * socket. */
static void become_tcp(struct conn *c, int fd)
{
	pthread_mutex_lock(&c->mu);
	if (atomic_load(&c->state) != CS_ACCEL) {
		pthread_mutex_unlock(&c->mu);
		return;
	}
	conn_restore_flags(c, fd);
	if (atomic_load(&c->shut_rd))
		R(shutdown)(fd, SHUT_RD); /* the program's, which the rings kept until now */
	/* SHM: the peer released first (SMCR_D_PEER_RELEASE): the bytes it wrote into
	 * the receive ring and the program did not read come before the kernel's */
	uint64_t p = atomic_load(&c->sh->rx_prod), q = atomic_load(&c->sh->rx_cons);
	size_t left = p - q <= c->rx_size ? (size_t)(p - q) : 0;
	if (c->peer && left && (atomic_load(&c->sh->d_flags) & SMCR_D_PEER_RELEASE) && !atomic_load(&c->shut_rd) &&
	    !c->prefix && (c->prefix = malloc(left))) {
		size_t pos = (size_t)(q % c->rx_size), k = c->rx_size - pos < left ? c->rx_size - pos : left;
		memcpy(c->prefix, c->rx + pos, k);
		memcpy(c->prefix + k, c->rx, left - k);
		c->prefix_len = left;
		atomic_store(&c->prefix_off, 0);
		atomic_store(&c->sh->rx_cons, p);
		atomic_store(&c->state, CS_PREFIX);
	} else {
		atomic_store(&c->state, CS_TCP);
	}
	close_chan(c);
	int *fds[] = {&c->memfd, &c->efd_dtx, &c->efd_drx, &c->tx_file, &c->rx_file}; /* efd_lib is the process's */
	for (int i = 0; i < 5; i++)
		if (*fds[i] >= 0) {
			R(close)(*fds[i]);
			*fds[i] = -1;
		}
	pthread_mutex_unlock(&c->mu);
	ready_released(c);
	ring_wake_local(c);
}

int conn_release(struct conn *c, int fd)
{
	if (atomic_load(&c->state) != CS_ACCEL || !c->sh || atomic_load(&c->reset) ||
	    atomic_load(&c->closed))
		return -1;
	/* No copy through the rings may move a cursor once smcrd took them: the
	 * copies under way end first, in every process that holds the connection,
	 * and new ones wait for the outcome (ring_enter). */
	int shared = conn_shared(c);
	atomic_store(&c->releasing, 1);
	if (shared)
		atomic_store_explicit(&c->sh->lib_releasing, 1, memory_order_seq_cst);
	while (atomic_load(&c->ring_ops))
		sched_yield();
	int r = 0;
	/* another process's copy is a few microseconds; one that died in it
	 * leaves its count behind: give up then */
	for (uint64_t end = now_ns() + RELEASE_OTHERS_NS;
	     shared && atomic_load_explicit(&c->sh->lib_ring_ops, memory_order_seq_cst); sched_yield())
		if (now_ns() >= end) {
			r = -1;
			break;
		}
	if (r == 0)
		r = ring_release(c, fd);
	if (r == 0)
		become_tcp(c, fd);
	if (shared)
		atomic_store(&c->sh->lib_releasing, 0);
	atomic_store(&c->releasing, 0);
	return r;
}

void conn_release_or_abort(struct conn *c, int fd)
{
	if (c && atomic_load(&c->state) == CS_ACCEL && c->sh && conn_release(c, fd) < 0) {
		atomic_fetch_or(&c->sh->lib_flags, SMCR_LIB_ABORT);
		conn_restore_flags(c, fd);
	}
}

int conn_follow_release(struct conn *c, int fd)
{
	if (atomic_load(&c->state) != CS_ACCEL || !c->sh ||
	    !(atomic_load_explicit(&c->sh->d_flags, memory_order_acquire) & SMCR_D_RELEASED))
		return 0;
	if (c->peer) {
		/* the copies out of the receive ring under way end first: the rest of
		 * it is taken once (ring.c's ring_enter) */
		atomic_store(&c->releasing, 1);
		while (atomic_load(&c->ring_ops))
			sched_yield();
	}
	become_tcp(c, fd);
	if (c->peer)
		atomic_store(&c->releasing, 0);
	return 1;
}

static void conn_last_close(struct obj *o)
{
	struct conn *c = (struct conn *)o;
	pthread_mutex_lock(&c->mu);
	atomic_store(&c->closed, 1);
	ready_conn_closed(c);
	if (c->sh && atomic_load(&c->state) == CS_ACCEL) { /* not released (conn_release) */
		if (!conn_shared(c)) {
			/* SHM: the peer reads the end from us, unless the connection
			 * failed (a reset is the peer's smcrd's to tell, never an EOF) */
			int aborted = atomic_load(&c->aborted);
			if (c->peer && !atomic_load(&c->reset) &&
			    !(atomic_load(&c->sh->d_flags) & SMCR_D_ERROR)) {
				if (aborted)
					ring_peer_reset(c);
				else
					ring_peer_eof(c);
			}
			atomic_fetch_or(&c->sh->lib_flags, SMCR_LIB_CLOSED | (aborted ? SMCR_LIB_ABORT : 0));
			atomic_fetch_add(&c->sh->lib_seq, 1);
			if (c->peer)
				ring_wake_peer(c); /* its writers see CLOSED: EPIPE */
			ring_kick(c->efd_dtx);
		}
		ring_wake_local(c);
	}
	close_chan(c);
	int *efds[] = {&c->memfd, &c->efd_dtx, &c->efd_drx, &c->tx_file, &c->rx_file}; /* efd_lib is the process's */
	for (int i = 0; i < 5; i++)
		if (*efds[i] >= 0) {
			R(close)(*efds[i]);
			*efds[i] = -1;
		}
	pthread_mutex_unlock(&c->mu);
}

static void conn_free(struct obj *o)
{
	struct conn *c = (struct conn *)o;
	if (c->sh)
		munmap(c->sh, c->map_size);
	if (c->peer)
		munmap(c->peer, c->peer_map_size);
	if (c->tx_map)
		munmap(c->tx_map, c->tx_map_size);
	if (c->rx_map)
		munmap(c->rx_map, c->rx_map_size);
	if (c->peer_memfd >= 0)
		R(close)(c->peer_memfd);
	if (c->peer_efd_lib >= 0)
		R(close)(c->peer_efd_lib);
	if (c->peer_wake)
		munmap(c->peer_wake, SMCR_WAKE_SIZE);
	free(c->prefix);
	pthread_mutex_destroy(&c->mu);
	free((struct conn_ext *)c);
}
