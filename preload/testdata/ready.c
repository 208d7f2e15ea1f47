/* ready.c: a transcript of what a program sees of one TCP connection (readiness by
 * poll, select, level-triggered, edge-triggered and one-shot epoll, FIONREAD, reads,
 * SO_ERROR), step by step. Run with and without libsmcr-preload.so: the transcripts
 * must be equal. stdout: the transcript; stderr: whether the library accelerated the
 * socket (accel=1: the kernel socket is nonblocking behind a blocking view).
 * usage: ready [refused-port] */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, strerror(errno)); exit(2); } } while (0)

static int ep_lt, ep_et, ep_os;
/* sizes the compiler cannot see: with _FORTIFY_SOURCE, the calls that use them go
 * through __poll_chk, __read_chk, __recv_chk */
static volatile size_t vsize = 64;
static volatile nfds_t vone = 1;

static void bits(char *out, unsigned v)
{
	static const struct { unsigned bit; const char *name; } names[] = {
		{POLLIN, "IN"}, {POLLPRI, "PRI"}, {POLLOUT, "OUT"}, {POLLERR, "ERR"},
		{POLLHUP, "HUP"}, {POLLRDHUP, "RDHUP"}, {POLLNVAL, "NVAL"},
	};
	out[0] = 0;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (v & names[i].bit) {
			if (out[0])
				strcat(out, "|");
			strcat(out, names[i].name);
		}
	if (!out[0])
		strcpy(out, "-");
}

static void epoll_show(const char *name, int ep, int fd)
{
	struct epoll_event ev[4];
	char b[64];
	int n = epoll_wait(ep, ev, 4, 0);
	CHECK(n >= 0);
	printf(" %s=", name);
	if (n == 0)
		printf("none");
	for (int i = 0; i < n; i++) {
		bits(b, ev[i].events & ~(EPOLLRDNORM | EPOLLWRNORM));
		printf("%s%s@%s", i ? "," : "", b, ev[i].data.u64 == (uint64_t)fd + 1000 ? "fd" : "??");
	}
}

static void snap(const char *step, int fd)
{
	char b[64];
	struct pollfd p = {.fd = fd, .events = POLLIN | POLLOUT | POLLRDHUP | POLLPRI};
	CHECK(poll(&p, 1, 0) >= 0);
	bits(b, (unsigned)p.revents);
	printf("%-12s poll=%s", step, b);
	fd_set r, w, e;
	FD_ZERO(&r);
	FD_ZERO(&w);
	FD_ZERO(&e);
	FD_SET(fd, &r);
	FD_SET(fd, &w);
	FD_SET(fd, &e);
	struct timeval tv = {0, 0};
	int n = select(fd + 1, &r, &w, &e, &tv);
	CHECK(n >= 0);
	printf(" select=%d%s%s%s", n, FD_ISSET(fd, &r) ? "r" : "", FD_ISSET(fd, &w) ? "w" : "", FD_ISSET(fd, &e) ? "e" : "");
	epoll_show("lt", ep_lt, fd);
	epoll_show("et", ep_et, fd);
	epoll_show("oneshot", ep_os, fd);
	int q = -1;
	CHECK(ioctl(fd, FIONREAD, &q) == 0);
	printf(" fionread=%d\n", q);
	fflush(stdout);
}

static void wait_for(int fd, short ev)
{
	struct pollfd p = {.fd = fd, .events = ev};
	CHECK(poll(&p, vone, 5000) == 1);
}

static int listener(struct sockaddr_in *a)
{
	int l = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0);
	int one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(a, 0, sizeof(*a));
	a->sin_family = AF_INET;
	a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	const char *pe = getenv("READY_PORT");
	a->sin_port = htons(pe ? (uint16_t)atoi(pe) : 0);
	CHECK(bind(l, (struct sockaddr *)a, sizeof(*a)) == 0);
	socklen_t al = sizeof(*a);
	CHECK(getsockname(l, (struct sockaddr *)a, &al) == 0);
	CHECK(listen(l, 16) == 0);
	return l;
}

static void report_accel(const char *who, int fd)
{
	int view = fcntl(fd, F_GETFL);
	int kernel = (int)syscall(SYS_fcntl, fd, F_GETFL);
	fprintf(stderr, "%s accel=%d\n", who, (kernel & O_NONBLOCK) && !(view & O_NONBLOCK));
}

/* show prints a call's result and errno, in that order */
#define SHOW(label, call) do { errno = 0; long r_ = (long)(call); int e_ = errno; \
	printf("%s %ld %s\n", label, r_, r_ < 0 ? strerror(e_) : ""); } while (0)

static void add(int ep, int fd, unsigned events)
{
	struct epoll_event ev = {.events = events, .data.u64 = (uint64_t)fd + 1000};
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);
}

int main(int argc, char **argv)
{
	struct sockaddr_in a;
	char buf[64];
	setvbuf(stdout, NULL, _IOLBF, 0);
	int l = listener(&a);

	/* a blocking connect, an accept */
	int s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0);
	CHECK(connect(s, (struct sockaddr *)&a, sizeof(a)) == 0);
	int p = accept(l, NULL, NULL);
	CHECK(p >= 0);
	ep_lt = epoll_create1(EPOLL_CLOEXEC);
	ep_et = epoll_create1(EPOLL_CLOEXEC);
	ep_os = epoll_create1(EPOLL_CLOEXEC);
	CHECK(ep_lt >= 0 && ep_et >= 0 && ep_os >= 0);
	add(ep_lt, s, EPOLLIN | EPOLLOUT | EPOLLRDHUP);
	add(ep_et, s, EPOLLIN | EPOLLRDHUP | EPOLLET);
	add(ep_os, s, EPOLLIN | EPOLLONESHOT);
	int fl = fcntl(s, F_GETFL);
	printf("flags nonblock=%d\n", !!(fl & O_NONBLOCK));
	snap("connected", s);

	CHECK(write(p, "hello world", 11) == 11);
	wait_for(s, POLLIN);
	snap("data", s);
	snap("data-again", s);
	struct epoll_event mod = {.events = EPOLLIN | EPOLLONESHOT, .data.u64 = (uint64_t)s + 1000};
	CHECK(epoll_ctl(ep_os, EPOLL_CTL_MOD, s, &mod) == 0);
	snap("rearmed", s);
	CHECK(recv(s, buf, vsize - 59, MSG_PEEK) == 5);
	printf("peek %.5s\n", buf);
	CHECK(read(s, buf, 5) == 5);
	printf("read %.5s\n", buf);
	snap("partial", s);
	CHECK(read(s, buf, sizeof(buf)) == 6);
	printf("read %.6s\n", buf);
	CHECK(epoll_ctl(ep_os, EPOLL_CTL_MOD, s, &mod) == 0);
	snap("drained", s);

	/* nonblocking view */
	CHECK(fcntl(s, F_SETFL, fl | O_NONBLOCK) == 0);
	printf("flags nonblock=%d\n", !!(fcntl(s, F_GETFL) & O_NONBLOCK));
	SHOW("read-empty", read(s, buf, sizeof(buf)));
	CHECK(fcntl(s, F_SETFL, fl) == 0);
	int on = 1;
	CHECK(ioctl(s, FIONBIO, &on) == 0);
	SHOW("recv-fionbio", recv(s, buf, sizeof(buf), 0));
	on = 0;
	CHECK(ioctl(s, FIONBIO, &on) == 0);
	SHOW("recv-dontwait", recv(s, buf, sizeof(buf), MSG_DONTWAIT));

	/* a dup keeps the connection when the first fd closes */
	int d = dup(s);
	CHECK(d >= 0);
	CHECK(epoll_ctl(ep_lt, EPOLL_CTL_DEL, s, NULL) == 0);
	CHECK(epoll_ctl(ep_et, EPOLL_CTL_DEL, s, NULL) == 0);
	CHECK(epoll_ctl(ep_os, EPOLL_CTL_DEL, s, NULL) == 0);
	CHECK(close(s) == 0);
	s = d;
	add(ep_lt, s, EPOLLIN | EPOLLOUT | EPOLLRDHUP);
	add(ep_et, s, EPOLLIN | EPOLLRDHUP | EPOLLET);
	add(ep_os, s, EPOLLIN | EPOLLONESHOT);
	CHECK(write(s, "ping", 4) == 4);
	CHECK(read(p, buf, 4) == 4);
	printf("peer got %.4s\n", buf);
	report_accel("client", s); /* both decided by now */
	report_accel("server", p);
	snap("dup", s);

	/* deleted and added again (redis-benchmark does it per request): deleted, the
	 * socket reports nothing and is not in the set; added, it reports again */
	CHECK(epoll_ctl(ep_lt, EPOLL_CTL_DEL, s, NULL) == 0);
	CHECK(epoll_ctl(ep_et, EPOLL_CTL_DEL, s, NULL) == 0);
	CHECK(write(p, "again", 5) == 5);
	wait_for(s, POLLIN);
	snap("deleted", s);
	struct epoll_event again = {.events = EPOLLIN, .data.u64 = (uint64_t)s + 1000};
	SHOW("mod-deleted", epoll_ctl(ep_lt, EPOLL_CTL_MOD, s, &again));
	SHOW("del-deleted", epoll_ctl(ep_lt, EPOLL_CTL_DEL, s, NULL));
	add(ep_lt, s, EPOLLIN | EPOLLRDHUP);
	add(ep_et, s, EPOLLIN | EPOLLRDHUP | EPOLLET);
	SHOW("add-twice", epoll_ctl(ep_lt, EPOLL_CTL_ADD, s, &again));
	snap("added-again", s);
	CHECK(read(s, buf, 5) == 5);
	printf("read %.5s\n", buf);
	CHECK(epoll_ctl(ep_lt, EPOLL_CTL_MOD, s, &again) == 0);
	snap("read-again", s);
	CHECK(epoll_ctl(ep_lt, EPOLL_CTL_DEL, s, NULL) == 0);
	add(ep_lt, s, EPOLLIN | EPOLLOUT | EPOLLRDHUP);

	/* the peer's half-close, then ours */
	CHECK(shutdown(p, SHUT_WR) == 0);
	wait_for(s, POLLRDHUP);
	snap("peer-shut", s);
	printf("read-eof %zd\n", read(s, buf, vsize));
	CHECK(shutdown(s, SHUT_WR) == 0);
	CHECK(read(p, buf, sizeof(buf)) == 0);
	printf("peer eof\n");
	snap("both-shut", s);
	SHOW("send-after-shut", send(s, "x", 1, MSG_NOSIGNAL));
	int err = -1;
	socklen_t el = sizeof(err);
	CHECK(getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el) == 0);
	printf("so_error %d\n", err);
	close(s);
	close(p);

	/* a nonblocking connect */
	s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	CHECK(s >= 0);
	SHOW("nb-connect", connect(s, (struct sockaddr *)&a, sizeof(a)));
	wait_for(s, POLLOUT);
	p = accept(l, NULL, NULL);
	CHECK(p >= 0);
	/* the numbers the kernel gives: the library's own fds are out of the way */
	printf("nb fds %d %d\n", s, p);
	el = sizeof(err);
	CHECK(getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el) == 0);
	printf("nb so_error %d\n", err);
	SHOW("nb-read-empty", read(s, buf, sizeof(buf)));
	/* a poll under an RLIMIT_NOFILE as low as the fds it polls (a sandbox's, like
	 * sshd's preauth child's): the kernel takes it, so must the library (both
	 * ends are decided first: a decision's fds could not be received under it) */
	wait_for(p, POLLOUT);
	struct rlimit nofile, one;
	CHECK(getrlimit(RLIMIT_NOFILE, &nofile) == 0);
	one = (struct rlimit){.rlim_cur = 1, .rlim_max = nofile.rlim_max};
	CHECK(setrlimit(RLIMIT_NOFILE, &one) == 0);
	struct pollfd pf = {.fd = s, .events = POLLIN};
	SHOW("nofile-poll-empty", poll(&pf, vone, 0));
	CHECK(write(p, "abc", 3) == 3);
	SHOW("nofile-poll", poll(&pf, vone, 5000));
	printf("nofile-poll revents %x\n", pf.revents);
	CHECK(setrlimit(RLIMIT_NOFILE, &nofile) == 0);
	printf("nb read %zd\n", read(s, buf, sizeof(buf)));
	/* shutdown(SHUT_RD) keeps the bytes buffered: read, then 0 */
	CHECK(write(p, "xyz", 3) == 3);
	wait_for(s, POLLIN);
	CHECK(shutdown(s, SHUT_RD) == 0);
	snap("shut-rd", s);
	printf("shut-rd read %zd\n", read(s, buf, sizeof(buf)));
	printf("shut-rd read-empty %zd\n", read(s, buf, sizeof(buf)));
	close(p);
	wait_for(s, POLLRDHUP);
	printf("nb read-eof %zd\n", read(s, buf, sizeof(buf)));
	close(s);

	/* splice with SPLICE_F_NONBLOCK never blocks on a blocking pipe: full (socket
	 * to pipe) or empty (pipe to socket), it fails with EAGAIN (haproxy's way) */
	s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0);
	CHECK(connect(s, (struct sockaddr *)&a, sizeof(a)) == 0);
	p = accept(l, NULL, NULL);
	CHECK(p >= 0);
	int pp[2];
	CHECK(pipe(pp) == 0);
	CHECK(fcntl(pp[1], F_SETFL, O_NONBLOCK) == 0);
	static char fill[4096];
	while (write(pp[1], fill, sizeof(fill)) > 0)
		;
	CHECK(fcntl(pp[1], F_SETFL, 0) == 0);
	CHECK(write(p, "abc", 3) == 3);
	wait_for(s, POLLIN);
	SHOW("splice-full-pipe", splice(s, NULL, pp[1], NULL, 3, SPLICE_F_NONBLOCK));
	while (read(pp[0], fill, sizeof(fill)) == (ssize_t)sizeof(fill)) {
		struct pollfd pr = {.fd = pp[0], .events = POLLIN};
		if (poll(&pr, 1, 0) != 1)
			break;
	}
	SHOW("splice-to-pipe", splice(s, NULL, pp[1], NULL, 3, SPLICE_F_NONBLOCK));
	CHECK(read(pp[0], buf, 3) == 3);
	printf("pipe got %.3s\n", buf);
	SHOW("splice-empty-pipe", splice(pp[0], NULL, p, NULL, 3, SPLICE_F_NONBLOCK));
	CHECK(write(pp[1], "xyz", 3) == 3);
	SHOW("splice-from-pipe", splice(pp[0], NULL, p, NULL, 3, SPLICE_F_NONBLOCK));
	CHECK(read(s, buf, 3) == 3);
	printf("socket got %.3s\n", buf);
	close(pp[0]);
	close(pp[1]);
	close(s);
	close(p);

	/* a refused connect */
	if (argc > 1) {
		struct sockaddr_in b = a;
		b.sin_port = htons((uint16_t)atoi(argv[1]));
		s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		SHOW("refused-connect", connect(s, (struct sockaddr *)&b, sizeof(b)));
		wait_for(s, POLLOUT);
		char bb[64];
		struct pollfd pp = {.fd = s, .events = POLLIN | POLLOUT};
		poll(&pp, 1, 0);
		bits(bb, (unsigned)pp.revents);
		printf("refused poll=%s\n", bb);
		el = sizeof(err);
		CHECK(getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el) == 0);
		printf("refused so_error %s\n", strerror(err));
		close(s);
		s = socket(AF_INET, SOCK_STREAM, 0);
		SHOW("refused-blocking", connect(s, (struct sockaddr *)&b, sizeof(b)));
		close(s);
	}
	close(l);
	printf("done\n");
	return 0;
}
