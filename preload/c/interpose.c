/* interpose.c: the calls the library takes over. A call on an fd the library does not
 * know goes straight to the real function after one table lookup; an offered socket's
 * calls follow its state (conn.h). */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "channel.h"
#include "conn.h"
#include "exec.h"
#include "fdtable.h"
#include "ready.h"
#include "real.h"
#include "ring.h"

/* smcr_escaped: the process made an io_uring instance, whose reads and writes of a
 * socket go around the library: its connections were released to their sockets and
 * it accelerates no new ones (uring_escape). */
static atomic_int smcr_escaped;

#define EXPORT __attribute__((visibility("default")))
#define PASS (-2)

extern void __chk_fail(void) __attribute__((noreturn));

static void on_fork_parent(void)
{
	atomic_fetch_add(&smcr_fork_gen, 1);
}

static void on_fork_child(void)
{
	smcr_pid = getpid();
	atomic_fetch_add(&smcr_fork_gen, 1);
	channel_forked_child();
}

__attribute__((constructor)) static void smcr_init(void)
{
	smcr_pid = getpid();
	real_init();
	channel_init();
	if (!smcr_disabled) {
		fdt_init();
		ready_init();
		exec_adopt();
	}
	pthread_atfork(NULL, on_fork_parent, on_fork_child);
}

/* ---- helpers */

static int is_tcp(int fd)
{
	int v = 0;
	socklen_t l = sizeof(v);
	if (R(getsockopt)(fd, SOL_SOCKET, SO_TYPE, &v, &l) < 0 || v != SOCK_STREAM)
		return 0;
	l = sizeof(v);
	if (R(getsockopt)(fd, SOL_SOCKET, SO_PROTOCOL, &v, &l) < 0 || v != IPPROTO_TCP)
		return 0;
	return 1;
}

static int port_of(const struct sockaddr *a, socklen_t len, uint16_t *port)
{
	if (!a || len < sizeof(sa_family_t))
		return 0;
	if (a->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
		*port = ntohs(((const struct sockaddr_in *)a)->sin_port);
		return 1;
	}
	if (a->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
		*port = ntohs(((const struct sockaddr_in6 *)a)->sin6_port);
		return 1;
	}
	return 0;
}

/* local_allowed: the local address fd's connection to dst will have is one the
 * policy lists: fd's own if bound, else the route's source, which a UDP socket
 * connected to dst tells without a packet. */
static int local_allowed(int fd, const struct sockaddr *dst, socklen_t len)
{
	if (!policy_lists_addrs())
		return 1;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	if (R(getsockname)(fd, (struct sockaddr *)&ss, &sl) == 0) {
		uint16_t port;
		if (port_of((struct sockaddr *)&ss, sl, &port) && port != 0)
			return policy_local_allows((struct sockaddr *)&ss);
	}
	int u = R(socket)(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (u < 0)
		return 0;
	sl = sizeof(ss);
	int ok = R(connect)(u, dst, len) == 0 && R(getsockname)(u, (struct sockaddr *)&ss, &sl) == 0 &&
		 policy_local_allows((struct sockaddr *)&ss);
	R(close)(u);
	return ok;
}

static void set_nonblock(int fd, int fl, int on)
{
	R(fcntl)(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

/* the program's view of O_NONBLOCK applies while PENDING or ACCEL */
static int flags_emulated(struct conn *c)
{
	int st = atomic_load(&c->state);
	return st == CS_PENDING || st == CS_ACCEL;
}

static int nonblocking(struct conn *c, int flags)
{
	return (flags & MSG_DONTWAIT) || atomic_load_explicit(&c->user_nonblock, memory_order_relaxed);
}

/* ---- listeners */

struct listener {
	struct obj o;
	int chan;
};

static void listener_last_close(struct obj *o)
{
	struct listener *l = (struct listener *)o;
	if (l->chan >= 0)
		R(close)(l->chan);
	l->chan = -1;
}

static void listener_free(struct obj *o)
{
	free(o);
}

static int listener_own_fds(struct obj *o, int *out)
{
	struct listener *l = (struct listener *)o;
	out[0] = l->chan;
	return l->chan >= 0;
}

static const struct obj_ops listener_ops = {
	.last_close = listener_last_close, .free = listener_free, .own_fds = listener_own_fds};

/* ---- socket, connect, listen, accept */

EXPORT int socket(int domain, int type, int protocol)
{
	int fd = R(socket)(domain, type, protocol);
	if (fd >= 0) {
		ready_forget_fd(fd);
		fdt_forget(fd);
	}
	return fd;
}

static int wait_connect(struct conn *c, int fd)
{
	if (conn_decide_by(c, fd, 1, ring_call_deadline(fd, SO_SNDTIMEO)) < 0)
		return -1;
	switch (atomic_load(&c->state)) {
	case CS_FAILED: {
		int e = atomic_exchange(&c->pending_err, 0);
		errno = e ? e : ECONNABORTED; /* another thread took SO_ERROR */
		return -1;
	}
	case CS_RESET:
		errno = ECONNRESET;
		return -1;
	default:
		return 0;
	}
}

static int connect_again(struct conn *c, int fd, const struct sockaddr *addr, socklen_t len)
{
	switch (atomic_load(&c->state)) {
	case CS_PENDING:
		if (atomic_load(&c->user_nonblock)) {
			if (conn_decide(c, fd, 0) < 0) {
				errno = EALREADY;
				return -1;
			}
			return connect_again(c, fd, addr, len);
		}
		return wait_connect(c, fd);
	case CS_ACCEL: /* the kernel's TCP connection is up: 0 once, then EISCONN */
		return R(connect)(fd, addr, len);
	case CS_FAILED: {
		int e = atomic_exchange(&c->pending_err, 0);
		if (e) {
			errno = e;
			return -1;
		}
		return R(connect)(fd, addr, len);
	}
	case CS_RESET:
		errno = ECONNRESET;
		return -1;
	default:
		return R(connect)(fd, addr, len);
	}
}

static int connect_offer(int fd, const struct sockaddr *addr, socklen_t len)
{
	int fl = R(fcntl)(fd, F_GETFL);
	if (fl < 0)
		return R(connect)(fd, addr, len);
	int ch = channel_open();
	if (ch < 0)
		return R(connect)(fd, addr, len);
	int inl = conn_oob_inline_of(fd); /* before smcrd has the socket */
	set_nonblock(fd, fl, 1);
	int st = channel_request(ch, SMCR_MSG_CLIENT, fd);
	struct conn *c = st == 0 ? conn_new(ch, !!(fl & O_NONBLOCK), inl) : NULL;
	if (!c) {
		R(close)(ch);
		set_nonblock(fd, fl, fl & O_NONBLOCK);
		return R(connect)(fd, addr, len);
	}
	int r = R(connect)(fd, addr, len);
	if (r < 0 && errno != EINPROGRESS) {
		int e = errno;
		c->chan = -1;
		R(close)(ch);
		obj_put(&c->o);
		set_nonblock(fd, fl, fl & O_NONBLOCK);
		errno = e;
		return -1;
	}
	fdt_install(fd, &c->o);
	obj_put(&c->o);
	ready_adopt(c, fd); /* put in an epoll set before connect() */
	channel_send(ch, SMCR_MSG_CONNECTING, -1); /* a failure shows as a broken channel */
	if (fl & O_NONBLOCK) {
		errno = EINPROGRESS;
		return -1;
	}
	return wait_connect(c, fd);
}

EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	struct obj *o = fdt_get(fd);
	if (o) {
		struct conn *c = conn_of(o);
		if (c)
			return connect_again(c, fd, addr, len);
		return R(connect)(fd, addr, len);
	}
	uint16_t port;
	if (smcr_disabled || atomic_load_explicit(&smcr_escaped, memory_order_relaxed) || fd >= smcr_fdt_size ||
	    !port_of(addr, len, &port) || !policy_allows(port) || !is_tcp(fd) || !local_allowed(fd, addr, len))
		return R(connect)(fd, addr, len);
	return connect_offer(fd, addr, len);
}

EXPORT int listen(int fd, int backlog)
{
	if (smcr_disabled || atomic_load_explicit(&smcr_escaped, memory_order_relaxed) || fdt_get(fd) ||
	    fd >= smcr_fdt_size)
		return R(listen)(fd, backlog);
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	uint16_t port;
	if (R(getsockname)(fd, (struct sockaddr *)&ss, &sl) < 0 || !port_of((struct sockaddr *)&ss, sl, &port) ||
	    port == 0 || !policy_allows(port) || !policy_local_allows((struct sockaddr *)&ss) || !is_tcp(fd))
		return R(listen)(fd, backlog);
	int ch = channel_open();
	if (ch < 0)
		return R(listen)(fd, backlog);
	struct listener *l = NULL;
	if (channel_request(ch, SMCR_MSG_LISTENER, fd) != 0 || !(l = calloc(1, sizeof(*l)))) {
		R(close)(ch);
		return R(listen)(fd, backlog);
	}
	int r = R(listen)(fd, backlog);
	if (r < 0) {
		int e = errno;
		R(close)(ch);
		free(l);
		errno = e;
		return -1;
	}
	obj_init(&l->o, OBJ_LISTENER, &listener_ops);
	l->chan = ch;
	fdt_install(fd, &l->o);
	obj_put(&l->o);
	return r;
}

static void accepted_offer(int nfd, int nonblock)
{
	if (nfd >= smcr_fdt_size)
		return;
	if (policy_lists_addrs()) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		if (R(getsockname)(nfd, (struct sockaddr *)&ss, &sl) < 0 ||
		    !policy_local_allows((struct sockaddr *)&ss))
			return;
	}
	int fl = R(fcntl)(nfd, F_GETFL);
	if (fl < 0)
		return;
	int ch = channel_open();
	if (ch < 0)
		return;
	int inl = conn_oob_inline_of(nfd); /* the listener's, before smcrd has the socket */
	set_nonblock(nfd, fl, 1);
	int st = channel_request(ch, SMCR_MSG_ACCEPTED, nfd);
	struct conn *c = st == 0 ? conn_new(ch, nonblock, inl) : NULL;
	if (!c) {
		R(close)(ch);
		set_nonblock(nfd, fl, nonblock);
		return;
	}
	fdt_install(nfd, &c->o);
	obj_put(&c->o);
}

static int do_accept(int fd, struct sockaddr *addr, socklen_t *len, int flags, int four)
{
	struct obj *o = fdt_get(fd);
	int nfd = four ? R(accept4)(fd, addr, len, flags) : R(accept)(fd, addr, len);
	if (nfd < 0)
		return nfd;
	int e = errno;
	ready_forget_fd(nfd);
	fdt_forget(nfd);
	if (o && o->kind == OBJ_LISTENER) {
		/* offered even once escaped: the peer runs CLC on the connection, which
		 * smcrd answers; then it is released at once */
		accepted_offer(nfd, !!(flags & SOCK_NONBLOCK));
		struct conn *c = conn_of(fdt_get(nfd));
		if (c && atomic_load(&smcr_escaped)) {
			conn_decide(c, nfd, 1);
			conn_release_or_abort(c, nfd);
		}
	}
	errno = e;
	return nfd;
}

EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
	return do_accept(fd, addr, len, 0, 0);
}

EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	return do_accept(fd, addr, len, flags, 1);
}

/* ---- close, shutdown, dup */

EXPORT int close(int fd)
{
	if (fdt_get(fd) && smcr_vforked())
		return R(close)(fd); /* the parent's fd, in its table, stays */
	ready_forget_fd(fd);
	struct obj *o = fdt_take(fd);
	if (o) {
		struct conn *c = conn_of(o);
		if (c && atomic_load(&o->fdrefs) == 1)
			conn_note_close(c, fd);
		fdt_release(o);
	}
	return R(close)(fd);
}

EXPORT int shutdown(int fd, int how)
{
	struct conn *c = conn_of(fdt_get(fd));
	if (!c)
		return R(shutdown)(fd, how);
	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) {
		errno = EINVAL;
		return -1;
	}
	if (atomic_load(&c->state) == CS_PENDING)
		conn_decide(c, fd, 1);
	switch (atomic_load(&c->state)) {
	case CS_ACCEL:
		if (how != SHUT_WR) {
			atomic_store(&c->shut_rd, 1);
			ring_wake_local(c);
		}
		if (how != SHUT_RD && !atomic_exchange(&c->shut_wr, 1))
			ring_shutdown_wr(c);
		ready_conn_changed(c);
		return 0;
	case CS_RESET:
		errno = ENOTCONN;
		return -1;
	default:
		return R(shutdown)(fd, how);
	}
}

static void dup_done(int oldfd, int newfd)
{
	ready_forget_fd(newfd);
	fdt_forget(newfd);
	struct obj *o = fdt_get(oldfd);
	if (o)
		fdt_install(newfd, o);
}

EXPORT int dup(int fd)
{
	int r = R(dup)(fd);
	if (r >= 0)
		dup_done(fd, r);
	return r;
}

EXPORT int dup2(int oldfd, int newfd)
{
	int r = R(dup2)(oldfd, newfd);
	if (r >= 0 && oldfd != newfd)
		dup_done(oldfd, r);
	return r;
}

EXPORT int dup3(int oldfd, int newfd, int flags)
{
	int r = R(dup3)(oldfd, newfd, flags);
	if (r >= 0)
		dup_done(oldfd, r);
	return r;
}

/* ---- the read family */

/* waitall_rest: MSG_WAITALL after the read-ahead bytes ran out: the rest from the
 * kernel. Bytes added (0 when none came, or on an error: the bytes already read
 * are returned first, as TCP does). */
static size_t waitall_rest(struct conn *c, int fd, const struct iovec *iov, int cnt, size_t done, int flags)
{
	struct iovec rest[64];
	int k = 0;
	if (atomic_load(&c->state) != CS_TCP || cnt > 64)
		return 0;
	for (int i = 0; i < cnt; i++) {
		if (done >= iov[i].iov_len) {
			done -= iov[i].iov_len;
			continue;
		}
		rest[k].iov_base = (char *)iov[i].iov_base + done;
		rest[k].iov_len = iov[i].iov_len - done;
		done = 0;
		k++;
	}
	if (k == 0)
		return 0;
	struct msghdr mh = {.msg_iov = rest, .msg_iovlen = (size_t)k};
	int e = errno;
	ssize_t more = R(recvmsg)(fd, &mh, flags);
	errno = e;
	return more > 0 ? (size_t)more : 0;
}

static ssize_t conn_recv(struct conn *c, int fd, const struct iovec *iov, int cnt, int flags)
{
	for (;;) {
		switch (atomic_load_explicit(&c->state, memory_order_acquire)) {
		case CS_ACCEL:
			return ring_recv(c, fd, iov, cnt, flags);
		case CS_PENDING:
			if (conn_decide(c, fd, !nonblocking(c, flags)) < 0)
				return -1;
			continue;
		case CS_PREFIX: {
			if (flags & MSG_OOB)
				return PASS; /* the urgent byte is the kernel's: CLC stops before it */
			ssize_t r = conn_prefix_recv(c, iov, cnt, flags);
			if (r == PASS)
				continue;
			if (r > 0 && (flags & MSG_WAITALL) && !(flags & MSG_PEEK))
				r += waitall_rest(c, fd, iov, cnt, (size_t)r, flags);
			return r;
		}
		case CS_RESET:
			errno = ECONNRESET;
			return -1;
		default:
			return PASS;
		}
	}
}

static ssize_t conn_send(struct conn *c, int fd, const struct iovec *iov, int cnt, int flags)
{
	for (;;) {
		switch (atomic_load_explicit(&c->state, memory_order_acquire)) {
		case CS_ACCEL:
			return ring_send(c, fd, iov, cnt, flags);
		case CS_PENDING:
			if (conn_decide(c, fd, !nonblocking(c, flags)) < 0)
				return -1;
			continue;
		case CS_RESET:
			errno = ECONNRESET;
			return -1;
		default:
			return PASS;
		}
	}
}

EXPORT ssize_t read(int fd, void *buf, size_t n)
{
	struct conn *c = conn_of(fdt_get(fd));
	if (__builtin_expect(!c, 1))
		return R(read)(fd, buf, n);
	struct iovec v = {buf, n};
	ssize_t r = conn_recv(c, fd, &v, 1, 0);
	return r == PASS ? R(read)(fd, buf, n) : r;
}

EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
	if (n > buflen)
		__chk_fail();
	return read(fd, buf, n);
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
	struct conn *c = conn_of(fdt_get(fd));
	if (__builtin_expect(!c, 1))
		return R(readv)(fd, iov, cnt);
	if (cnt < 0 || cnt > IOV_MAX) {
		errno = EINVAL;
		return -1;
	}
	ssize_t r = conn_recv(c, fd, iov, cnt, 0);
	return r == PASS ? R(readv)(fd, iov, cnt) : r;
}

EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags)
{
	struct conn *c = conn_of(fdt_get(fd));
	if (__builtin_expect(!c, 1))
		return R(recv)(fd, buf, n, flags);
	struct iovec v = {buf, n};
	ssize_t r = conn_recv(c, fd, &v, 1, flags);
	return r == PASS ? R(recv)(fd, buf, n, flags) : r;
}

EXPORT ssize_t __recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags)
{
	if (n > buflen)
		__chk_fail();
	return recv(fd, buf, n, flags);
}

EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *addr, socklen_t *alen)
{
	struct conn *c = conn_of(fdt_get(fd));
	if (__builtin_expect(!c, 1))
		return R(recvfrom)(fd, buf, n, flags, addr, alen);
	struct iovec v = {buf, n};
	ssize_t r = conn_recv(c, fd, &v, 1, flags);
	if (r == PASS)
		return R(recvfrom)(fd, buf, n, flags, addr, alen);
	if (r >= 0 && addr && alen)
		*alen = 0; /* as TCP: no source address */
	return r;
}

EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags, struct sockaddr *addr,
			      socklen_t *alen)
{
	if (n > buflen)
		__chk_fail();
	return recvfrom(fd, buf, n, flags, addr, alen);
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	struct conn *c = conn_of(fdt_get(fd));
	if (__builtin_expect(!c, 1))
		return R(recvmsg)(fd, msg, flags);
	ssize_t r = conn_recv(c, fd, msg->msg_iov, (int)msg->msg_iovlen, flags);
	if (r == PASS)
		return R(recvmsg)(fd, msg, flags);
	if (r >= 0) {
		msg->msg_namelen = 0;
		msg->msg_controllen = 0;
		msg->msg_flags = flags & MSG_OOB; /* as the kernel's: the urgent byte is marked */
	}
	return r;
}

EXPORT int recvmmsg(int fd, struct mmsghdr *vec, unsigned int vlen, int flags, struct timespec *timeout)
{
	struct conn *c = conn_of(fdt_get(fd));
	if (__builtin_expect(!c, 1))
		return R(recvmmsg)(fd, vec, vlen, flags, timeout);
	unsigned int i;
	for (i = 0; i < vlen; i++) {
		int f = flags & ~MSG_WAITFORONE;
		if (i > 0 && (flags & MSG_WAITFORONE))
			f |= MSG_DONTWAIT;
		ssize_t r = conn_recv(c, fd, vec[i].msg_hdr.msg_iov, (int)vec[i].msg_hdr.msg_iovlen, f);
		if (r == PASS)
			return i ? (int)i : R(recvmmsg)(fd, vec + i, vlen - i, flags, timeout);
		if (r < 0)
			return i ? (int)i : -1;
		vec[i].msg_len = (unsigned int)r;
		vec[i].msg_hdr.msg_namelen = 0;
		vec[i].msg_hdr.msg_controllen = 0;
		vec[i].msg_hdr.msg_flags = 0;
		if (r == 0)
			return (int)i + 1;
	}
	return (int)i;
}

/* ---- the write family */

EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
	struct conn *c = conn_of(fdt_get(fd));
	if (__builtin_expect(!c, 1))
		return R(write)(fd, buf, n);
	struct iovec v = {(void *)buf, n};
	ssize_t r = conn_send(c, fd, &v, 1, 0);
	return r == PASS ? R(write)(fd, buf, n) : r;
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
	struct conn *c = conn_of(fdt_get(fd));
	if (__builtin_expect(!c, 1))
		return R(writev)(fd, iov, cnt);
	if (cnt < 0 || cnt > IOV_MAX) {
		errno = EINVAL;
		return -1;
	}
	ssize_t r = conn_send(c, fd, iov, cnt, 0);
	return r == PASS ? R(writev)(fd, iov, cnt) : r;
}

EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags)
{
	struct conn *c = conn_of(fdt_get(fd));
	if (__builtin_expect(!c, 1))
		return R(send)(fd, buf, n, flags);
	struct iovec v = {(void *)buf, n};
	ssize_t r = conn_send(c, fd, &v, 1, flags);
	return r == PASS ? R(send)(fd, buf, n, flags) : r;
}

EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *addr, socklen_t alen)
{
	struct conn *c = conn_of(fdt_get(fd));
	if (__builtin_expect(!c, 1))
		return R(sendto)(fd, buf, n, flags, addr, alen);
	struct iovec v = {(void *)buf, n};
	ssize_t r = conn_send(c, fd, &v, 1, flags);
	return r == PASS ? R(sendto)(fd, buf, n, flags, addr, alen) : r;
}

/* note_passed_fds: an accelerated socket sent to another process (SCM_RIGHTS) is one
 * the library there cannot follow: it is released before the message goes, so that
 * the other process reads and writes the rest of the stream on it as plain TCP. */
static void note_passed_fds(const struct msghdr *msg)
{
	for (struct cmsghdr *h = CMSG_FIRSTHDR(msg); h; h = CMSG_NXTHDR((struct msghdr *)msg, h)) {
		if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int pfd;
			memcpy(&pfd, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
			conn_release_or_abort(conn_of(fdt_get(pfd)), pfd);
		}
	}
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	if (msg && msg->msg_control && msg->msg_controllen >= sizeof(struct cmsghdr) && smcr_fdt)
		note_passed_fds(msg);
	struct conn *c = conn_of(fdt_get(fd));
	if (__builtin_expect(!c, 1))
		return R(sendmsg)(fd, msg, flags);
	ssize_t r = conn_send(c, fd, msg->msg_iov, (int)msg->msg_iovlen, flags);
	return r == PASS ? R(sendmsg)(fd, msg, flags) : r;
}

EXPORT int sendmmsg(int fd, struct mmsghdr *vec, unsigned int vlen, int flags)
{
	for (unsigned int i = 0; vec && smcr_fdt && i < vlen; i++) {
		const struct msghdr *m = &vec[i].msg_hdr;
		if (m->msg_control && m->msg_controllen >= sizeof(struct cmsghdr))
			note_passed_fds(m);
	}
	struct conn *c = conn_of(fdt_get(fd));
	if (__builtin_expect(!c, 1))
		return R(sendmmsg)(fd, vec, vlen, flags);
	unsigned int i;
	for (i = 0; i < vlen; i++) {
		ssize_t r = conn_send(c, fd, vec[i].msg_hdr.msg_iov, (int)vec[i].msg_hdr.msg_iovlen, flags);
		if (r == PASS)
			return i ? (int)i : R(sendmmsg)(fd, vec, vlen, flags);
		if (r < 0)
			return i ? (int)i : -1;
		vec[i].msg_len = (unsigned int)r;
	}
	return (int)i;
}

/* ---- io_uring: its operations on a socket go around the library, so a process
 * that makes an instance has its accelerated connections released to their sockets
 * first (pending ones decided, then released; where a release cannot be, marked for
 * an abort as a socket passed away), and accelerates no new ones: connect and listen
 * offer nothing more, a listener's accepted sockets are released as soon as decided.
 * Seen: the io_uring_setup system call through libc's syscall(), and liburing's
 * entry points (Debian's liburing makes its system calls itself). */

static void uring_escape(void)
{
	if (!smcr_fdt || smcr_disabled || atomic_exchange(&smcr_escaped, 1))
		return;
	int high = atomic_load(&smcr_fdt_high);
	for (int fd = 0; fd < high; fd++) {
		struct conn *c = conn_of(fdt_get(fd));
		if (!c)
			continue;
		if (atomic_load(&c->state) == CS_PENDING)
			conn_decide(c, fd, 1);
		conn_release_or_abort(c, fd);
	}
}

EXPORT long syscall(long n, ...)
{
	va_list ap;
	va_start(ap, n);
	long a[6];
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	if (n == SYS_io_uring_setup)
		uring_escape();
	return R(syscall)(n, a[0], a[1], a[2], a[3], a[4], a[5]);
}

/* next_fn: the definition after the library's of sym (liburing's), or NULL */
static void *next_fn(const char *sym)
{
	return dlsym(RTLD_NEXT, sym);
}

struct io_uring;
struct io_uring_params;

EXPORT int io_uring_setup(unsigned entries, struct io_uring_params *p)
{
	uring_escape();
	int (*f)(unsigned, struct io_uring_params *) = (int (*)(unsigned, struct io_uring_params *))next_fn("io_uring_setup");
	if (!f)
		return (int)R(syscall)(SYS_io_uring_setup, (long)entries, (long)p);
	return f(entries, p);
}

EXPORT int io_uring_queue_init(unsigned entries, struct io_uring *ring, unsigned flags)
{
	uring_escape();
	int (*f)(unsigned, struct io_uring *, unsigned) =
		(int (*)(unsigned, struct io_uring *, unsigned))next_fn("io_uring_queue_init");
	return f ? f(entries, ring, flags) : -ENOSYS;
}

EXPORT int io_uring_queue_init_params(unsigned entries, struct io_uring *ring, struct io_uring_params *p)
{
	uring_escape();
	int (*f)(unsigned, struct io_uring *, struct io_uring_params *) =
		(int (*)(unsigned, struct io_uring *, struct io_uring_params *))next_fn("io_uring_queue_init_params");
	return f ? f(entries, ring, p) : -ENOSYS;
}

/* ---- sendfile and splice: copies through the rings for accelerated sockets */

#define COPY_CHUNK 16384

static int accel_ready(struct conn *c, int fd, int nonblock)
{
	if (atomic_load(&c->state) == CS_PENDING && conn_decide(c, fd, !nonblock) < 0)
		return -1;
	return atomic_load(&c->state) == CS_ACCEL ? 1 : 0;
}

static ssize_t sendfile_copy(struct conn *c, int out, int in, off_t *off, size_t count)
{
	unsigned char buf[COPY_CHUNK];
	size_t total = 0;
	while (total < count) {
		ssize_t space = ring_send_space(c, out, total ? MSG_DONTWAIT : 0);
		if (space < 0) {
			if (total && errno == EAGAIN)
				break;
			if (total)
				break;
			return -1;
		}
		size_t chunk = count - total;
		if (chunk > (size_t)space)
			chunk = (size_t)space;
		if (chunk > sizeof(buf))
			chunk = sizeof(buf);
		ssize_t n = off ? pread(in, buf, chunk, *off) : R(read)(in, buf, chunk);
		if (n < 0)
			return total ? (ssize_t)total : -1;
		if (n == 0)
			break;
		struct iovec v = {buf, (size_t)n};
		ssize_t w = ring_send(c, out, &v, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w < 0)
			w = 0;
		if (w < n && !off)
			lseek(in, -(off_t)(n - w), SEEK_CUR);
		if (off)
			*off += w;
		total += (size_t)w;
		if (w < n)
			break;
		if (atomic_load(&c->user_nonblock) && total < count)
			continue;
	}
	return (ssize_t)total;
}

static ssize_t do_sendfile(int out, int in, off_t *off, size_t count, int is64)
{
	struct conn *c = conn_of(fdt_get(out));
	if (c) {
		int a = accel_ready(c, out, atomic_load(&c->user_nonblock));
		if (a < 0)
			return -1;
		if (a)
			return sendfile_copy(c, out, in, off, count);
		if (atomic_load(&c->state) == CS_RESET) {
			errno = ECONNRESET;
			return -1;
		}
	}
	return is64 ? R(sendfile64)(out, in, off, count) : R(sendfile)(out, in, off, count);
}

EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t count)
{
	return do_sendfile(out, in, off, count, 0);
}

EXPORT ssize_t sendfile64(int out, int in, off_t *off, size_t count)
{
	return do_sendfile(out, in, off, count, 1);
}

/* pipe_nowait: whether a read (POLLIN) or write (POLLOUT) of a pipe can go
 * without blocking. SPLICE_F_NONBLOCK makes splice's pipe side nonblocking
 * whatever the pipe's own O_NONBLOCK (haproxy's pipes are blocking); a
 * readable pipe has a byte, a writable one a free slot, which takes PIPE_BUF
 * bytes at least. */
static int pipe_nowait(int fd, short ev)
{
	struct pollfd p = {.fd = fd, .events = ev};
	if (R(poll)(&p, 1, 0) == 1 && (p.revents & (ev | POLLERR | POLLHUP)))
		return 1;
	errno = EAGAIN;
	return 0;
}

/* pipe_write_nowait writes up to n bytes to a pipe without blocking: -1 with
 * EAGAIN when it is full. */
static ssize_t pipe_write_nowait(int fd, const void *buf, size_t n)
{
	struct iovec v = {(void *)buf, n};
	ssize_t w = pwritev2(fd, &v, 1, -1, RWF_NOWAIT);
	if (w >= 0 || (errno != EOPNOTSUPP && errno != EINVAL))
		return w;
	/* a kernel whose pipes take no RWF_NOWAIT */
	if (!pipe_nowait(fd, POLLOUT))
		return -1;
	return R(write)(fd, buf, n < PIPE_BUF ? n : PIPE_BUF);
}

EXPORT ssize_t splice(int in, loff_t *off_in, int out, loff_t *off_out, size_t len, unsigned int flags)
{
	struct conn *ci = conn_of(fdt_get(in)), *co = conn_of(fdt_get(out));
	if (__builtin_expect(!ci && !co, 1))
		return R(splice)(in, off_in, out, off_out, len, flags);
	int nb = !!(flags & SPLICE_F_NONBLOCK);
	unsigned char buf[COPY_CHUNK];
	if (ci) {
		int a = accel_ready(ci, in, nb || atomic_load(&ci->user_nonblock));
		if (a < 0)
			return -1;
		if (a) { /* socket -> pipe: peek, write, then consume what the pipe took */
			if (off_out) {
				errno = ESPIPE;
				return -1;
			}
			struct iovec v = {buf, len < sizeof(buf) ? len : sizeof(buf)};
			ssize_t r = ring_recv(ci, in, &v, 1, MSG_PEEK | (nb ? MSG_DONTWAIT : 0));
			if (r <= 0)
				return r;
			ssize_t w = nb ? pipe_write_nowait(out, buf, (size_t)r) : R(write)(out, buf, (size_t)r);
			if (w <= 0)
				return w;
			v.iov_len = (size_t)w;
			ring_recv(ci, in, &v, 1, MSG_DONTWAIT | MSG_TRUNC);
			return w;
		}
	}
	if (co) {
		int a = accel_ready(co, out, nb || atomic_load(&co->user_nonblock));
		if (a < 0)
			return -1;
		if (a) { /* pipe -> socket: read no more than the ring takes */
			if (off_in) {
				errno = ESPIPE;
				return -1;
			}
			ssize_t space = ring_send_space(co, out, nb ? MSG_DONTWAIT : 0);
			if (space < 0)
				return -1;
			size_t chunk = len < (size_t)space ? len : (size_t)space;
			if (chunk > sizeof(buf))
				chunk = sizeof(buf);
			if (nb && !pipe_nowait(in, POLLIN))
				return -1;
			ssize_t n = R(read)(in, buf, chunk);
			if (n <= 0)
				return n;
			struct iovec v = {buf, (size_t)n};
			return ring_send(co, out, &v, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
		}
	}
	return R(splice)(in, off_in, out, off_out, len, flags);
}

/* ---- fcntl, ioctl, getsockopt */

static int do_fcntl(int fd, int cmd, void *arg, int is64)
{
	int (*f)(int, int, ...) = is64 ? R(fcntl64) : R(fcntl);
	struct obj *o = fdt_get(fd);
	if (__builtin_expect(!o, 1))
		return f(fd, cmd, arg);
	struct conn *c = conn_of(o);
	switch (cmd) {
	case F_DUPFD:
	case F_DUPFD_CLOEXEC: {
		int r = f(fd, cmd, arg);
		if (r >= 0)
			dup_done(fd, r);
		return r;
	}
	case F_SETOWN:
	case F_SETOWN_EX: {
		/* the owner gets SIGURG when urgent data comes: with SHM from the peer
		 * library, which reads it in the area */
		int r = f(fd, cmd, arg);
		if (r == 0 && c && atomic_load(&c->state) == CS_ACCEL)
			conn_note_owner(c, fd);
		return r;
	}
	case F_GETFL: {
		int r = f(fd, cmd);
		if (r >= 0 && c && flags_emulated(c))
			r = (r & ~O_NONBLOCK) | (atomic_load(&c->user_nonblock) ? O_NONBLOCK : 0);
		return r;
	}
	case F_SETFL:
		if (c && flags_emulated(c)) {
			int v = (int)(long)arg;
			int r = f(fd, cmd, v | O_NONBLOCK);
			if (r == 0)
				atomic_store(&c->user_nonblock, !!(v & O_NONBLOCK));
			return r;
		}
		return f(fd, cmd, arg);
	default:
		return f(fd, cmd, arg);
	}
}

EXPORT int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	return do_fcntl(fd, cmd, arg, 0);
}

EXPORT int fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	return do_fcntl(fd, cmd, arg, 1);
}

EXPORT int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	struct conn *c = conn_of(fdt_get(fd));
	if (__builtin_expect(!c, 1))
		return R(ioctl)(fd, req, arg);
	int st = atomic_load(&c->state);
	switch (req) {
	case FIONBIO:
		if (st == CS_PENDING || st == CS_ACCEL) {
			atomic_store(&c->user_nonblock, *(int *)arg != 0);
			return 0;
		}
		break;
	case FIONREAD:
		if (st == CS_ACCEL) {
			*(int *)arg = (int)ring_rx_inq(c);
			return 0;
		}
		if (st == CS_PENDING) {
			*(int *)arg = 0;
			return 0;
		}
		if (st == CS_PREFIX) {
			int k = 0;
			if (R(ioctl)(fd, req, &k) < 0)
				k = 0;
			size_t off = atomic_load(&c->prefix_off);
			*(int *)arg = k + (int)(off < c->prefix_len ? c->prefix_len - off : 0);
			return 0;
		}
		break;
	case SIOCOUTQ:
		if (st == CS_ACCEL) {
			*(int *)arg = (int)ring_tx_queued(c);
			return 0;
		}
		if (st == CS_PENDING) {
			*(int *)arg = 0;
			return 0;
		}
		break;
	case SIOCATMARK:
		if (st == CS_ACCEL) {
			*(int *)arg = ring_at_mark(c);
			return 0;
		}
		/* the bytes CLC read ahead come before any mark in the kernel's queue */
		if (st == CS_PENDING || (st == CS_PREFIX && atomic_load(&c->prefix_off) < c->prefix_len)) {
			*(int *)arg = 0;
			return 0;
		}
		break;
	}
	return R(ioctl)(fd, req, arg);
}

/* oobinline_emulated: while PENDING and ACCEL the kernel socket's SO_OOBINLINE is
 * smcrd's (its engine keeps urgent bytes inline, for a continuation over TCP); the
 * program's is the library's, and the socket gets it back if the connection goes
 * on as plain TCP (conn_restore_oobinline). */
static int oobinline_emulated(struct conn *c, int level, int opt)
{
	if (!c || level != SOL_SOCKET || opt != SO_OOBINLINE)
		return 0;
	int st = atomic_load(&c->state);
	return st == CS_PENDING || st == CS_ACCEL;
}

EXPORT int setsockopt(int fd, int level, int opt, const void *val, socklen_t len)
{
	struct conn *c = conn_of(fdt_get(fd));
	if (__builtin_expect(!c, 1) || !oobinline_emulated(c, level, opt))
		return R(setsockopt)(fd, level, opt, val, len);
	if (!val || len < sizeof(int)) {
		errno = !val ? EFAULT : EINVAL;
		return -1;
	}
	atomic_store(&c->oob_inline, *(const int *)val != 0);
	return 0;
}

EXPORT int getsockopt(int fd, int level, int opt, void *val, socklen_t *len)
{
	struct conn *c = conn_of(fdt_get(fd));
	if (oobinline_emulated(c, level, opt) && val && len && *len >= sizeof(int)) {
		*(int *)val = atomic_load(&c->oob_inline);
		*len = sizeof(int);
		return 0;
	}
	if (__builtin_expect(!c, 1) || level != SOL_SOCKET || opt != SO_ERROR || !val || !len ||
	    *len < sizeof(int))
		return R(getsockopt)(fd, level, opt, val, len);
	int st = atomic_load(&c->state);
	if (st == CS_PENDING)
		conn_decide(c, fd, 0);
	st = atomic_load(&c->state);
	int e = 0;
	if (st == CS_FAILED)
		e = atomic_exchange(&c->pending_err, 0);
	else if (st == CS_ACCEL && conn_error(c) && !atomic_exchange(&c->err_taken, 1))
		e = conn_error(c); /* once, as the kernel's sk_err */
	else if (st == CS_RESET)
		e = 0;
	else if (st != CS_PENDING && st != CS_ACCEL)
		return R(getsockopt)(fd, level, opt, val, len);
	if (!e && st == CS_FAILED)
		return R(getsockopt)(fd, level, opt, val, len);
	*(int *)val = e;
	*len = sizeof(int);
	return 0;
}

/* ---- epoll, poll, select */

EXPORT int epoll_create(int size)
{
	int fd = R(epoll_create)(size);
	if (fd >= 0) {
		fdt_forget(fd);
		if (!smcr_disabled)
			ready_epoll_created(fd);
	}
	return fd;
}

EXPORT int epoll_create1(int flags)
{
	int fd = R(epoll_create1)(flags);
	if (fd >= 0) {
		fdt_forget(fd);
		if (!smcr_disabled)
			ready_epoll_created(fd);
	}
	return fd;
}

EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	int r;
	struct obj *o = fdt_get(fd);
	if (o && o->kind == OBJ_EPOLL && op != EPOLL_CTL_DEL)
		ready_epoll_nested(fd); /* a set inside a set */
	else if (o && ready_epoll_ctl(epfd, op, fd, ev, &r))
		return r;
	r = R(epoll_ctl)(epfd, op, fd, ev);
	if (r == 0)
		ready_note_ctl(epfd, op, fd, ev);
	return r;
}

static int64_t ms_to_ns(int ms)
{
	return ms < 0 ? -1 : (int64_t)ms * 1000000;
}

static int64_t ts_to_ns(const struct timespec *ts)
{
	return ts ? (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec : -1;
}

/* kernel_waited: what a kernel wait on a set without emulated members returned
 * (k), unless members came while it waited: then without the library's events,
 * and the members' readiness, if that leaves none */
static int kernel_waited(int epfd, struct epoll_event *evs, int max, int k, const sigset_t *sigmask)
{
	if (__builtin_expect(k <= 0 || !ready_epoll_emulated(epfd), 1))
		return k;
	k = ready_epoll_filter(epfd, evs, k);
	return k ? k : ready_epoll_wait(epfd, evs, max, 0, sigmask);
}

EXPORT int epoll_wait(int epfd, struct epoll_event *evs, int max, int timeout)
{
	if (__builtin_expect(!ready_epoll_emulated(epfd), 1))
		return kernel_waited(epfd, evs, max, R(epoll_wait)(epfd, evs, max, timeout), NULL);
	return ready_epoll_wait(epfd, evs, max, ms_to_ns(timeout), NULL);
}

EXPORT int epoll_pwait(int epfd, struct epoll_event *evs, int max, int timeout, const sigset_t *sigmask)
{
	if (__builtin_expect(!ready_epoll_emulated(epfd), 1))
		return kernel_waited(epfd, evs, max, R(epoll_pwait)(epfd, evs, max, timeout, sigmask), sigmask);
	return ready_epoll_wait(epfd, evs, max, ms_to_ns(timeout), sigmask);
}

EXPORT int epoll_pwait2(int epfd, struct epoll_event *evs, int max, const struct timespec *ts,
			const sigset_t *sigmask)
{
	if (__builtin_expect(!ready_epoll_emulated(epfd), 1)) {
		if (!R(epoll_pwait2)) {
			errno = ENOSYS;
			return -1;
		}
		return kernel_waited(epfd, evs, max, R(epoll_pwait2)(epfd, evs, max, ts, sigmask), sigmask);
	}
	return ready_epoll_wait(epfd, evs, max, ts_to_ns(ts), sigmask);
}

/* glibc declares poll's fds write-only (access attribute); they are read too */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
EXPORT int poll(struct pollfd *fds, nfds_t n, int timeout)
{
	if (__builtin_expect(!ready_poll_emulated(fds, n), 1))
		return R(poll)(fds, n, timeout);
	return ready_poll(fds, n, ms_to_ns(timeout), NULL);
}

EXPORT int __poll_chk(struct pollfd *fds, nfds_t n, int timeout, size_t fdslen)
{
	if (fdslen / sizeof(*fds) < n)
		__chk_fail();
	return poll(fds, n, timeout);
}

EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *sigmask)
{
	if (__builtin_expect(!ready_poll_emulated(fds, n), 1))
		return R(ppoll)(fds, n, ts, sigmask);
	return ready_poll(fds, n, ts_to_ns(ts), sigmask);
}

EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *sigmask,
		       size_t fdslen)
{
	if (fdslen / sizeof(*fds) < n)
		__chk_fail();
	return ppoll(fds, n, ts, sigmask);
}
#pragma GCC diagnostic pop

EXPORT int select(int nfds, fd_set *r, fd_set *w, fd_set *e, struct timeval *tv)
{
	if (__builtin_expect(!ready_select_emulated(nfds, r, w, e), 1))
		return R(select)(nfds, r, w, e, tv);
	int64_t t = tv ? (int64_t)tv->tv_sec * 1000000000 + (int64_t)tv->tv_usec * 1000 : -1;
	int k = ready_select(nfds, r, w, e, &t, NULL);
	if (tv) {
		tv->tv_sec = (time_t)(t / 1000000000);
		tv->tv_usec = (suseconds_t)((t % 1000000000) / 1000);
	}
	return k;
}

EXPORT int pselect(int nfds, fd_set *r, fd_set *w, fd_set *e, const struct timespec *ts, const sigset_t *sigmask)
{
	if (__builtin_expect(!ready_select_emulated(nfds, r, w, e), 1))
		return R(pselect)(nfds, r, w, e, ts, sigmask);
	int64_t t = ts_to_ns(ts);
	return ready_select(nfds, r, w, e, &t, sigmask);
}
