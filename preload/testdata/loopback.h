/* loopback.h: what the test programs share: CHECK, a listener on loopback, a connected
 * pair, and whether the library accelerates a socket. */
#pragma once

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, strerror(errno)); exit(2); } } while (0)

/* listen_loopback listens on a free loopback port (type: SOCK_STREAM and its flags)
 * and stores its address in a. */
static inline int listen_loopback(int type, struct sockaddr_in *a)
{
	int l = socket(AF_INET, type, 0);
	CHECK(l >= 0);
	*a = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	CHECK(bind(l, (struct sockaddr *)a, sizeof(*a)) == 0);
	socklen_t al = sizeof(*a);
	CHECK(getsockname(l, (struct sockaddr *)a, &al) == 0);
	CHECK(listen(l, 4) == 0);
	return l;
}

struct accept_arg {
	int l, flags, fd;
};

static inline void *accept_one(void *arg)
{
	struct accept_arg *x = arg;
	x->fd = accept4(x->l, NULL, NULL, x->flags);
	return NULL;
}

/* connect_pair connects a new socket (type SOCK_STREAM | flags) to the listener l at
 * a and accepts it (accept4 with flags): *s the client's end, *p the server's. The
 * accept runs on a thread: with the library, connect waits for CLC, which needs it. */
static inline void connect_pair(int l, const struct sockaddr_in *a, int flags, int *s, int *p)
{
	struct accept_arg x = {l, flags, -1};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, accept_one, &x) == 0);
	*s = socket(AF_INET, SOCK_STREAM | flags, 0);
	CHECK(*s >= 0);
	CHECK(connect(*s, (const struct sockaddr *)a, sizeof(*a)) == 0);
	CHECK(pthread_join(th, NULL) == 0);
	*p = x.fd;
	CHECK(*p >= 0);
}

/* accelerated: whether the library accelerates fd: it keeps the kernel socket
 * non-blocking under a blocking view */
static inline int accelerated(int fd)
{
	int kernel = (int)syscall(SYS_fcntl, fd, F_GETFL);
	int view = fcntl(fd, F_GETFL);
	return (kernel & O_NONBLOCK) && !(view & O_NONBLOCK);
}

/* read_full reads n bytes into b */
static inline void read_full(int fd, char *b, size_t n)
{
	size_t k = 0;
	while (k < n) {
		ssize_t r = read(fd, b + k, n - k);
		CHECK(r > 0);
		k += (size_t)r;
	}
}

/* send_fd sends fd and one byte over the unix socket u (SCM_RIGHTS), with sendmmsg
 * where mmsg, else sendmsg */
static inline void send_fd(int u, int fd, int mmsg)
{
	char c = 'x';
	struct iovec v = {&c, 1};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} cm;
	memset(&cm, 0, sizeof(cm));
	struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof(cm.buf)};
	struct cmsghdr *h = CMSG_FIRSTHDR(&m);
	h->cmsg_level = SOL_SOCKET;
	h->cmsg_type = SCM_RIGHTS;
	h->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(h), &fd, sizeof(fd));
	if (mmsg) {
		struct mmsghdr mm = {.msg_hdr = m};
		CHECK(sendmmsg(u, &mm, 1, 0) == 1);
	} else {
		CHECK(sendmsg(u, &m, 0) == 1);
	}
}
