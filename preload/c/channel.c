/* channel.c: the policy page (mapped read-only, lazily, once per process) and the
 * channel to smcrd: CLIENT / LISTENER / ACCEPTED with the socket as SCM_RIGHTS, REPLY,
 * CONNECTING, DECIDED. The protocol is smcr_abi.h's. */
#include "channel.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/eventfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "real.h"

int smcr_disabled;
int smcr_pid;

int smcr_vforked(void)
{
	return getpid() != smcr_pid;
}

static struct sockaddr_un sock_addr;
static socklen_t sock_addr_len;
static char policy_path[sizeof(sock_addr.sun_path) + 8];

static _Atomic(const struct smcr_policy *) policy;
static _Atomic uint64_t policy_ino;
static _Atomic uint64_t policy_last_try;
static pthread_mutex_t policy_mu = PTHREAD_MUTEX_INITIALIZER;

#define POLICY_RETRY_NS 1000000000ull

uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void channel_init(void)
{
	const char *e = getenv("SMCR_DIRECT");
	if (e && strcmp(e, "0") == 0)
		smcr_disabled = 1;
	const char *p = getenv("SMCR_DIRECT_SOCKET");
	if (!p || !*p)
		p = "/run/smcr/direct.sock";
	size_t n = strlen(p);
	if (n >= sizeof(sock_addr.sun_path)) {
		smcr_disabled = 1;
		return;
	}
	sock_addr.sun_family = AF_UNIX;
	memcpy(sock_addr.sun_path, p, n);
	sock_addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
	if (p[0] == '@') { /* abstract name */
		sock_addr.sun_path[0] = 0;
		sock_addr_len--;
	}
	memcpy(policy_path, p, n);
	memcpy(policy_path + n, ".policy", 8);
}

/* policy_try_open maps the policy page if it is not mapped, or maps it again if the
 * file was replaced (smcrd restarted); at most once a second. Serialized: a thread
 * that finds the page unmapped while another thread maps it waits for that mapping,
 * rather than passing its socket through (to the relay) meanwhile. */
static void policy_try_open(void)
{
	pthread_mutex_lock(&policy_mu);
	uint64_t now = now_ns();
	uint64_t last = atomic_load(&policy_last_try);
	if ((last && now - last < POLICY_RETRY_NS) || policy_path[0] == '@' || !policy_path[0])
		goto out;
	atomic_store(&policy_last_try, now);
	int fd = open(policy_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		goto out;
	struct stat st;
	if (fstat(fd, &st) < 0 || st.st_size < (off_t)sizeof(struct smcr_policy) ||
	    (atomic_load(&policy) && (uint64_t)st.st_ino == atomic_load(&policy_ino))) {
		close(fd);
		goto out;
	}
	void *m = mmap(NULL, sizeof(struct smcr_policy), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		goto out;
	atomic_store(&policy_ino, (uint64_t)st.st_ino);
	/* An old mapping is left mapped: another thread may be reading it. */
	atomic_store(&policy, (const struct smcr_policy *)m);
out:
	pthread_mutex_unlock(&policy_mu);
}

int policy_allows(uint16_t port)
{
	if (smcr_disabled)
		return 0;
	const struct smcr_policy *p = atomic_load_explicit(&policy, memory_order_acquire);
	if (!p) {
		policy_try_open();
		p = atomic_load_explicit(&policy, memory_order_acquire);
		if (!p)
			return 0;
	}
	uint64_t hb = atomic_load_explicit(&((struct smcr_policy *)p)->heartbeat_ns, memory_order_acquire);
	uint64_t now = now_ns();
	if (p->magic != SMCR_POLICY_MAGIC || p->version != SMCR_ABI_VERSION ||
	    now - hb >= SMCR_POLICY_STALE_NS) {
		/* stale: smcrd is gone, or a new smcrd wrote a new file */
		policy_try_open();
		p = atomic_load_explicit(&policy, memory_order_acquire);
		hb = atomic_load_explicit(&((struct smcr_policy *)p)->heartbeat_ns, memory_order_acquire);
		if (p->magic != SMCR_POLICY_MAGIC || p->version != SMCR_ABI_VERSION ||
		    now - hb >= SMCR_POLICY_STALE_NS)
			return 0;
	}
	struct smcr_policy *w = (struct smcr_policy *)p;
	if (!atomic_load_explicit(&w->enabled, memory_order_relaxed))
		return 0;
	uint64_t max = atomic_load_explicit(&w->max_memory, memory_order_relaxed);
	if (max && atomic_load_explicit(&w->mem_used, memory_order_relaxed) >= max)
		return 0;
	uint64_t bits = atomic_load_explicit(&w->ports[port / 64], memory_order_relaxed);
	return (bits >> (port % 64)) & 1;
}

/* The lowest number fd_park moves fds to: half the fd limit, at most 1024. A
 * connection brings the library up to six fds; left among the program's, they
 * would push its own sockets to numbers it does not expect: wrk sizes its event
 * loop by its connections (fds past it fail as connect errors), select stops at
 * FD_SETSIZE. 0: not known yet; -1: no room to park. */
static _Atomic int park_base;

int fd_park(int fd)
{
	int base = atomic_load_explicit(&park_base, memory_order_relaxed);
	if (!base) {
		struct rlimit rl;
		base = -1;
		if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur >= 64)
			base = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur / 2 > 1024 ? 1024 : (int)(rl.rlim_cur / 2);
		atomic_store_explicit(&park_base, base, memory_order_relaxed);
	}
	if (fd < 0 || base < 0 || fd >= base)
		return fd;
	int moved = R(fcntl)(fd, F_DUPFD_CLOEXEC, base);
	if (moved < 0)
		return fd; /* no free number up there: it stays where it is */
	R(close)(fd);
	return moved;
}

/* addr16: a's address as 16 bytes (IPv4 mapped): 1, or 0 if a is not IP; *any is
 * set for the wildcard address */
static int addr16(const struct sockaddr *a, unsigned char out[16], int *any)
{
	static const unsigned char zero[16];
	if (a->sa_family == AF_INET) {
		memset(out, 0, 10);
		out[10] = out[11] = 0xff;
		memcpy(out + 12, &((const struct sockaddr_in *)a)->sin_addr, 4);
		*any = ((const struct sockaddr_in *)a)->sin_addr.s_addr == 0;
		return 1;
	}
	if (a->sa_family == AF_INET6) {
		memcpy(out, &((const struct sockaddr_in6 *)a)->sin6_addr, 16);
		*any = memcmp(out, zero, 16) == 0;
		return 1;
	}
	return 0;
}

int policy_lists_addrs(void)
{
	const struct smcr_policy *p = atomic_load_explicit(&policy, memory_order_acquire);
	return p && atomic_load_explicit(&((struct smcr_policy *)p)->naddrs, memory_order_acquire) > 0;
}

int policy_local_allows(const struct sockaddr *local)
{
	struct smcr_policy *p = (struct smcr_policy *)atomic_load_explicit(&policy, memory_order_acquire);
	if (!p)
		return 0;
	uint32_t n = atomic_load_explicit(&p->naddrs, memory_order_acquire);
	if (n == 0)
		return 1;
	unsigned char a[16];
	int any;
	if (!addr16(local, a, &any))
		return 0;
	if (any)
		return 1;
	for (uint32_t i = 0; i < n && i < SMCR_POLICY_MAX_ADDRS; i++) {
		uint64_t w[2] = {atomic_load_explicit(&p->addrs[i][0], memory_order_relaxed),
				 atomic_load_explicit(&p->addrs[i][1], memory_order_relaxed)};
		if (memcmp(w, a, 16) == 0)
			return 1;
	}
	return 0;
}

int channel_open(void)
{
	int ch = fd_park(R(socket)(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
	if (ch < 0)
		return -1;
	int r;
	do
		r = R(connect)(ch, (struct sockaddr *)&sock_addr, sock_addr_len);
	while (r < 0 && errno == EINTR);
	if (r < 0) {
		R(close)(ch);
		return -1;
	}
	/* REPLY comes at once from a live smcrd; a hung one must not hang the program
	 * (DECIDED is waited for with poll, not with this timeout). */
	struct timeval tv = {.tv_sec = 10};
	R(setsockopt)(ch, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return ch;
}

/* The process's eventfd and wake page, made together at the first offer. A child
 * after fork makes its own; the parent's pair stays valid for the connections it
 * inherited (the page is MAP_SHARED). */
static _Atomic(struct proc_wake *) proc_wake;

/* wake_page_make: a sealed memfd of SMCR_WAKE_SIZE bytes with the page laid out */
static int wake_page_make(struct smcr_wake **page)
{
	int fd = fd_park(memfd_create("smcr-wake", MFD_CLOEXEC | MFD_ALLOW_SEALING));
	if (fd < 0)
		return -1;
	if (ftruncate(fd, SMCR_WAKE_SIZE) < 0 ||
	    R(fcntl)(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		R(close)(fd);
		return -1;
	}
	void *p = mmap(NULL, SMCR_WAKE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		R(close)(fd);
		return -1;
	}
	*page = p;
	(*page)->magic = SMCR_WAKE_MAGIC;
	(*page)->version = SMCR_ABI_VERSION;
	return fd;
}

struct smcr_wake *channel_wake_page_map(int fd)
{
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0 || st.st_size < SMCR_WAKE_SIZE)
		return NULL;
	void *p = mmap(NULL, SMCR_WAKE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return NULL;
	if (((struct smcr_wake *)p)->magic != SMCR_WAKE_MAGIC) {
		munmap(p, SMCR_WAKE_SIZE);
		return NULL;
	}
	return p;
}

/* One mapping per wake page fd: an exec's new image maps the pages of the
 * connections it inherits, which share one or a few. */
static struct {
	int fd;
	struct smcr_wake *page;
} wake_maps[8];
static pthread_mutex_t wake_maps_mu = PTHREAD_MUTEX_INITIALIZER;

struct smcr_wake *channel_map_wake(int fd)
{
	if (fd < 0)
		return NULL;
	struct smcr_wake *w = NULL;
	pthread_mutex_lock(&wake_maps_mu);
	size_t i;
	for (i = 0; i < sizeof(wake_maps) / sizeof(wake_maps[0]) && wake_maps[i].page; i++)
		if (wake_maps[i].fd == fd) {
			w = wake_maps[i].page;
			break;
		}
	if (!w && i < sizeof(wake_maps) / sizeof(wake_maps[0]) && (w = channel_wake_page_map(fd))) {
		wake_maps[i].fd = fd;
		wake_maps[i].page = w;
	}
	pthread_mutex_unlock(&wake_maps_mu);
	return w;
}

const struct proc_wake *channel_proc_wake(void)
{
	struct proc_wake *w = atomic_load(&proc_wake);
	if (w)
		return w;
	struct proc_wake *made = malloc(sizeof(*made));
	if (!made)
		return NULL;
	made->page_fd = wake_page_make(&made->page);
	made->efd = made->page_fd < 0 ? -1 : fd_park(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
	if (made->efd < 0) {
		if (made->page_fd >= 0) {
			munmap(made->page, SMCR_WAKE_SIZE);
			R(close)(made->page_fd);
		}
		free(made);
		return NULL;
	}
	if (atomic_compare_exchange_strong(&proc_wake, &w, made))
		return made;
	/* another thread made them first */
	munmap(made->page, SMCR_WAKE_SIZE);
	R(close)(made->page_fd);
	R(close)(made->efd);
	free(made);
	return w;
}

const struct proc_wake *channel_peek_proc_wake(void)
{
	return atomic_load(&proc_wake);
}

void channel_adopt_proc_wake(int efd, int page_fd)
{
	struct smcr_wake *page = channel_map_wake(page_fd);
	if (efd < 0 || !page || atomic_load(&proc_wake))
		return;
	struct proc_wake *w = malloc(sizeof(*w)), *none = NULL;
	if (!w)
		return;
	*w = (struct proc_wake){.efd = efd, .page_fd = page_fd, .page = page};
	if (!atomic_compare_exchange_strong(&proc_wake, &none, w))
		free(w);
}

void channel_forked_child(void)
{
	/* the parent's stay open: the connections made before the fork wake by them */
	atomic_store(&proc_wake, NULL);
}

int channel_send(int ch, int type, int fd)
{
	struct smcr_msg h = {
		.magic = SMCR_MSG_MAGIC,
		.version = SMCR_ABI_VERSION,
		.type = (uint16_t)type,
	};
	struct iovec iov = {.iov_base = &h, .iov_len = sizeof(h)};
	union {
		struct cmsghdr c;
		char buf[CMSG_SPACE(3 * sizeof(int))];
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (fd >= 0) {
		/* a connection's offer brings the process's eventfd and wake page */
		int fds[3] = {fd, -1, -1}, n = 1;
		if (type == SMCR_MSG_CLIENT || type == SMCR_MSG_ACCEPTED) {
			const struct proc_wake *w = channel_proc_wake();
			if (!w)
				return -1;
			fds[1] = w->efd;
			fds[2] = w->page_fd;
			n = 3;
		}
		memset(&u, 0, sizeof(u));
		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE((size_t)n * sizeof(int));
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN((size_t)n * sizeof(int));
		memcpy(CMSG_DATA(c), fds, (size_t)n * sizeof(int));
	}
	ssize_t n;
	do
		n = R(sendmsg)(ch, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n == (ssize_t)sizeof(h) ? 0 : -1;
}

void channel_msg_free(struct channel_msg *m)
{
	for (int i = 0; i < m->nfds; i++)
		R(close)(m->fds[i]);
	m->nfds = 0;
	free(m->payload);
	m->payload = NULL;
}

int channel_recv(int ch, struct channel_msg *m, int flags)
{
	unsigned char *buf = malloc(sizeof(struct smcr_msg) + SMCR_MSG_MAX_PAYLOAD);
	if (!buf)
		return -ENOMEM;
	struct iovec iov = {.iov_base = buf, .iov_len = sizeof(struct smcr_msg) + SMCR_MSG_MAX_PAYLOAD};
	union {
		struct cmsghdr c;
		char buf[CMSG_SPACE(8 * sizeof(int))];
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
	ssize_t n;
	do
		n = R(recvmsg)(ch, &mh, flags | MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	memset(m, 0, sizeof(*m));
	if (n < 0) {
		int e = errno;
		free(buf);
		return e == EAGAIN ? -EAGAIN : -EPIPE;
	}
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		for (int i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (m->nfds < (int)(sizeof(m->fds) / sizeof(m->fds[0])))
				m->fds[m->nfds++] = fd_park(fd);
			else
				R(close)(fd);
		}
	}
	int bad = n < (ssize_t)sizeof(struct smcr_msg) || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC));
	if (!bad) {
		memcpy(&m->h, buf, sizeof(m->h));
		bad = m->h.magic != SMCR_MSG_MAGIC || m->h.version != SMCR_ABI_VERSION ||
		      m->h.len > SMCR_MSG_MAX_PAYLOAD || (size_t)n != sizeof(struct smcr_msg) + m->h.len;
	}
	if (bad) {
		free(buf);
		channel_msg_free(m);
		return -EPIPE;
	}
	if (m->h.len) {
		memmove(buf, buf + sizeof(struct smcr_msg), m->h.len);
		m->payload = buf;
	} else {
		free(buf);
	}
	return 0;
}

int channel_request(int ch, int type, int fd)
{
	if (channel_send(ch, type, fd) < 0)
		return -EPIPE;
	struct channel_msg m;
	int r = channel_recv(ch, &m, 0);
	if (r < 0)
		return -EPIPE;
	int st = m.h.type == SMCR_MSG_REPLY ? m.h.status : -EPROTO;
	channel_msg_free(&m);
	if (st > 0)
		st = -EPROTO;
	return st;
}
