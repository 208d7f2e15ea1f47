/* oob.c: a transcript of TCP urgent data (MSG_OOB) on one connection: send, sendto and
 * sendmsg with MSG_OOB, recv and recvmsg with MSG_OOB (and MSG_PEEK), reads that stop
 * at the mark, the urgent byte out of line and inline (SO_OOBINLINE), SIOCATMARK,
 * POLLPRI, select's exceptfds and EPOLLPRI, FIONREAD, a later mark that takes the
 * place of an earlier one, and SIGURG to the socket's owner (F_SETOWN). Run with and without libsmcr-preload.so: the transcripts
 * must be equal. stdout: the transcript; stderr: whether the library accelerated the
 * sockets (accel=1), as ready.c.
 * usage: oob */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "loopback.h"

static int ep; /* level-triggered, EPOLLIN | EPOLLPRI */
static volatile sig_atomic_t urged; /* SIGURGs since the last sigurg() */

static void on_sigurg(int sig)
{
	(void)sig;
	urged = 1;
}

/* sigurg prints whether SIGURG came since it last looked. The kernel sends it
 * while the urgent pointer arrives, smcrd and a peer library before the byte is
 * readable: a system call (whose return delivers a pending signal) makes sure it
 * is taken before the look. */
static void sigurg(const char *step)
{
	syscall(SYS_getpid);
	printf("%-14s sigurg=%d\n", step, (int)urged);
	urged = 0;
}

/* the waits go on through the signal's interruptions (poll and select are never
 * restarted) */
static int xpoll(struct pollfd *p, int ms)
{
	int n;
	while ((n = poll(p, 1, ms)) < 0 && errno == EINTR)
		;
	return n;
}

static int xselect(int nfds, fd_set *r, fd_set *w, fd_set *e)
{
	for (;;) {
		fd_set r0 = *r, w0 = *w, e0 = *e;
		struct timeval tv = {0, 0};
		int n = select(nfds, r, w, e, &tv);
		if (n >= 0 || errno != EINTR)
			return n;
		*r = r0, *w = w0, *e = e0;
	}
}

static int xepoll_wait(int fd, struct epoll_event *ev, int max)
{
	int n;
	while ((n = epoll_wait(fd, ev, max, 0)) < 0 && errno == EINTR)
		;
	return n;
}

/* show prints a call's result and errno, and the bytes it read (buf, if any) */
static void show(const char *label, long r, int e, const char *buf)
{
	printf("%-14s %ld %s", label, r, r < 0 ? strerror(e) : "");
	if (r > 0 && buf)
		printf("%.*s", (int)r, buf);
	printf("\n");
}
#define SHOW(label, call, buf) do { errno = 0; long r_ = (long)(call); show(label, r_, errno, buf); } while (0)

static void bits(char *out, unsigned v)
{
	static const struct { unsigned bit; const char *name; } names[] = {
		{POLLIN, "IN"}, {POLLPRI, "PRI"}, {POLLOUT, "OUT"}, {POLLERR, "ERR"}, {POLLHUP, "HUP"},
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

/* snap: what the program sees of fd now: poll, select (read, write, except), epoll,
 * SIOCATMARK, FIONREAD */
static void snap(const char *step, int fd)
{
	char b[64];
	struct pollfd p = {.fd = fd, .events = POLLIN | POLLOUT | POLLPRI};
	CHECK(xpoll(&p, 0) >= 0);
	bits(b, (unsigned)p.revents);
	printf("%-14s poll=%s", step, b);
	fd_set r, w, e;
	FD_ZERO(&r);
	FD_ZERO(&w);
	FD_ZERO(&e);
	FD_SET(fd, &r);
	FD_SET(fd, &w);
	FD_SET(fd, &e);
	int n = xselect(fd + 1, &r, &w, &e);
	CHECK(n >= 0);
	printf(" select=%d%s%s%s", n, FD_ISSET(fd, &r) ? "r" : "", FD_ISSET(fd, &w) ? "w" : "", FD_ISSET(fd, &e) ? "e" : "");
	struct epoll_event ev[2];
	n = xepoll_wait(ep, ev, 2);
	CHECK(n >= 0);
	bits(b, n ? ev[0].events : 0);
	printf(" epoll=%s", b);
	int mark = -1, q = -1;
	CHECK(ioctl(fd, SIOCATMARK, &mark) == 0);
	CHECK(ioctl(fd, FIONREAD, &q) == 0);
	printf(" atmark=%d fionread=%d\n", mark, q);
	fflush(stdout);
}

/* wait_urgent waits until the urgent byte came (POLLPRI) and FIONREAD says n: the
 * bytes before the mark, or with SO_OOBINLINE all (Linux's tcp_inq) */
static void wait_urgent(int fd, int n)
{
	for (int i = 0; i < 5000; i++) {
		int q = -1;
		CHECK(ioctl(fd, FIONREAD, &q) == 0);
		struct pollfd p = {.fd = fd, .events = POLLPRI};
		CHECK(xpoll(&p, 0) >= 0);
		if (q == n && (p.revents & POLLPRI))
			return;
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	fprintf(stderr, "timed out waiting for %d bytes\n", n);
	exit(2);
}

static void report_accel(const char *who, int fd)
{
	int view = fcntl(fd, F_GETFL);
	int kernel = (int)syscall(SYS_fcntl, fd, F_GETFL);
	fprintf(stderr, "%s accel=%d\n", who, (kernel & O_NONBLOCK) && !(view & O_NONBLOCK));
}

static void inline_opt(const char *step, int fd, int on)
{
	int v = -1;
	socklen_t l = sizeof(v);
	CHECK(setsockopt(fd, SOL_SOCKET, SO_OOBINLINE, &on, sizeof(on)) == 0);
	CHECK(getsockopt(fd, SOL_SOCKET, SO_OOBINLINE, &v, &l) == 0);
	printf("%-14s oobinline=%d\n", step, v != 0);
}

int main(void)
{
	struct sockaddr_in a;
	char buf[64];
	setvbuf(stdout, NULL, _IOLBF, 0);
	int l = listen_loopback(SOCK_STREAM, &a);
	struct sigaction sa = {.sa_handler = on_sigurg, .sa_flags = SA_RESTART};
	CHECK(sigaction(SIGURG, &sa, NULL) == 0);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0);
	CHECK(fcntl(s, F_SETOWN, getpid()) == 0); /* before the connect: the library finds it */
	/* connect without waiting, then accept: the same-host bypass decides both
	 * ends together */
	int fl = fcntl(s, F_GETFL);
	CHECK(fcntl(s, F_SETFL, fl | O_NONBLOCK) == 0);
	CHECK(connect(s, (struct sockaddr *)&a, sizeof(a)) == 0 || errno == EINPROGRESS);
	int p = accept(l, NULL, NULL);
	CHECK(p >= 0);
	struct pollfd cp = {.fd = s, .events = POLLOUT};
	CHECK(xpoll(&cp, 5000) == 1);
	CHECK(fcntl(s, F_SETFL, fl) == 0);
	CHECK(write(s, "x", 1) == 1); /* both ends decided: the reports below hold */
	CHECK(read(p, buf, 1) == 1);
	report_accel("client", s);
	report_accel("server", p);
	CHECK(fcntl(p, F_SETOWN, getpid()) == 0); /* on an accelerated socket */
	ep = epoll_create1(EPOLL_CLOEXEC);
	CHECK(ep >= 0);
	struct epoll_event ev = {.events = EPOLLIN | EPOLLPRI, .data.fd = p};
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, p, &ev) == 0);
	int v = -1;
	socklen_t vl = sizeof(v);
	CHECK(getsockopt(p, SOL_SOCKET, SO_OOBINLINE, &v, &vl) == 0);
	printf("%-14s oobinline=%d\n", "start", v);
	snap("connected", p);
	sigurg("connected");
	SHOW("oob-none", recv(p, buf, sizeof(buf), MSG_OOB), buf);

	/* one urgent byte after two plain ones: the read stops at the mark */
	CHECK(write(s, "ab", 2) == 2);
	SHOW("send-oob", send(s, "c", 1, MSG_OOB), NULL);
	wait_urgent(p, 2);
	sigurg("urgent");
	snap("urgent", p);
	SHOW("read", read(p, buf, sizeof(buf)), buf);
	snap("at-mark", p);
	SHOW("oob-peek", recv(p, buf, sizeof(buf), MSG_OOB | MSG_PEEK), buf);
	snap("peeked", p);
	struct iovec iv = {buf, sizeof(buf)};
	struct msghdr mh = {.msg_iov = &iv, .msg_iovlen = 1};
	SHOW("recvmsg-oob", recvmsg(p, &mh, MSG_OOB), buf);
	printf("%-14s msg_flags oob=%d\n", "recvmsg-oob", !!(mh.msg_flags & MSG_OOB));
	SHOW("oob-again", recv(p, buf, sizeof(buf), MSG_OOB), buf);
	snap("oob-taken", p);
	SHOW("read-at-mark", recv(p, buf, sizeof(buf), MSG_DONTWAIT), buf);
	snap("past-mark", p);

	/* two bytes urgent (the last is the urgent one), bytes after: a read past the
	 * mark skips the urgent byte, which is then gone */
	CHECK(write(s, "de", 2) == 2);
	SHOW("sendto-oob", sendto(s, "fg", 2, MSG_OOB, NULL, 0), NULL);
	CHECK(write(s, "hi", 2) == 2);
	wait_urgent(p, 3);
	sigurg("urgent2");
	snap("urgent2", p);
	SHOW("read", read(p, buf, sizeof(buf)), buf);
	struct pollfd in = {.fd = p, .events = POLLIN}; /* at the mark: more than the urgent byte */
	CHECK(xpoll(&in, 5000) == 1);
	snap("at-mark2", p);
	SHOW("read-past", read(p, buf, sizeof(buf)), buf); /* blocks for what follows */
	SHOW("oob-gone", recv(p, buf, sizeof(buf), MSG_OOB), buf);
	snap("passed", p);

	/* MSG_WAITALL stops at the mark too; a peek at the mark looks past the
	 * urgent byte */
	CHECK(write(s, "jk", 2) == 2);
	struct iovec siv = {"l", 1};
	struct msghdr smh = {.msg_iov = &siv, .msg_iovlen = 1};
	SHOW("sendmsg-oob", sendmsg(s, &smh, MSG_OOB), NULL);
	CHECK(write(s, "mn", 2) == 2);
	wait_urgent(p, 2);
	sigurg("urgent3");
	SHOW("waitall", recv(p, buf, 4, MSG_WAITALL), buf);
	SHOW("peek-at-mark", recv(p, buf, sizeof(buf), MSG_PEEK), buf); /* blocks for what follows */
	snap("peek-mark", p);
	SHOW("oob", recv(p, buf, sizeof(buf), MSG_OOB), buf);
	SHOW("read", read(p, buf, sizeof(buf)), buf);
	snap("drained", p);

	/* inline: the urgent byte stays in the stream, recv(MSG_OOB) refuses */
	inline_opt("inline-on", p, 1);
	CHECK(fcntl(p, F_SETOWN, 0) == 0); /* no owner: no SIGURG */
	CHECK(write(s, "op", 2) == 2);
	SHOW("send-oob", send(s, "q", 1, MSG_OOB), NULL);
	CHECK(write(s, "rs", 2) == 2);
	wait_urgent(p, 5);
	sigurg("inline");
	snap("inline", p);
	SHOW("oob-inline", recv(p, buf, sizeof(buf), MSG_OOB), buf);
	SHOW("read", read(p, buf, sizeof(buf)), buf);
	snap("inline-mark", p);
	SHOW("read", read(p, buf, sizeof(buf)), buf);
	snap("inline-past", p);
	inline_opt("inline-off", p, 0);
	CHECK(fcntl(p, F_SETOWN, getpid()) == 0);

	/* a later mark takes the place of the earlier: its byte goes inline */
	CHECK(write(s, "t", 1) == 1);
	SHOW("send-oob", send(s, "u", 1, MSG_OOB), NULL);
	SHOW("send-oob", send(s, "v", 1, MSG_OOB), NULL);
	wait_urgent(p, 2);
	sigurg("two-marks");
	snap("two-marks", p);
	SHOW("read", read(p, buf, sizeof(buf)), buf);
	SHOW("oob", recv(p, buf, sizeof(buf), MSG_OOB), buf);
	snap("latest-taken", p);

	/* urgent data the other way, and the end after it */
	SHOW("send-oob", send(p, "w", 1, MSG_OOB), NULL);
	CHECK(shutdown(p, SHUT_WR) == 0);
	struct pollfd pp = {.fd = s, .events = POLLPRI};
	CHECK(xpoll(&pp, 5000) == 1);
	sigurg("client");
	SHOW("client-oob", recv(s, buf, sizeof(buf), MSG_OOB), buf);
	SHOW("client-read", read(s, buf, sizeof(buf)), buf);
	CHECK(close(s) == 0);
	CHECK(close(p) == 0);
	CHECK(close(l) == 0);
	printf("done\n");
	return 0;
}
