/* passfd.c: an accelerated socket sent to another process with SCM_RIGHTS. The
 * first process makes a connection (both ends through the library), sends the
 * server's end to a process it starts (this program again, "receiver", which knows
 * nothing of the connection) and closes its copy; the receiver reads from the socket.
 * Neither end waits for good nor reads a clean end: with the kernel's sockets, and with
 * the library's where smcrd releases the connection to the socket before it goes
 * (SMCR_LIB_RELEASE), the receiver gets the bytes; where it cannot, the connection is
 * reset.
 * stdout: "receiver <data | reset>", then "client <data | reset>" (the receiver
 * echoes what it got).
 * "passfd unread": before the pass, each end also writes bytes the other has not read
 * when the socket goes: the receiver must read the client's first ("early"), the
 * client the server's ("pre") before the receiver's answer, none lost or twice. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loopback.h"

/* outcome: what a read returned, in the words of stdout */
static const char *outcome(int fd, const char *want)
{
	char b[64];
	size_t n = strlen(want), got = 0;
	ssize_t r;
	/* what came in several reads (a resend, then the rest) is read whole */
	while ((r = read(fd, b + got, sizeof(b) - got)) > 0 && (got += (size_t)r) < n && memcmp(b, want, got) == 0)
		;
	if (got > 0)
		return got == n && memcmp(b, want, n) == 0 ? "data" : "other";
	if (r < 0 && (errno == ECONNRESET || errno == EPIPE || errno == ENOTCONN))
		return "reset";
	return r == 0 ? "eof" : "other";
}

static int unread; /* "passfd unread" */

static int receiver(int u)
{
	char c;
	struct iovec v = {&c, 1};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} cm;
	struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof(cm.buf)};
	CHECK(recvmsg(u, &m, 0) == 1);
	struct cmsghdr *h = CMSG_FIRSTHDR(&m);
	CHECK(h && h->cmsg_type == SCM_RIGHTS);
	int fd;
	memcpy(&fd, CMSG_DATA(h), sizeof(fd));
	CHECK(write(u, "r", 1) == 1); /* got it: the sender closes its copy */
	const char *got = outcome(fd, unread ? "earlysent" : "sent");
	printf("receiver %s\n", got);
	fflush(stdout);
	if (strcmp(got, "data") == 0)
		CHECK(write(fd, "back", 4) == 4);
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	unread = argc >= 2 && strcmp(argv[argc - 1], "unread") == 0;
	int mmsg = argc >= 2 && strcmp(argv[1], "mmsg") == 0; /* pass it with sendmmsg */
	if (argc >= 3 && strcmp(argv[1], "receiver") == 0)
		return receiver(atoi(argv[2]));
	struct sockaddr_in a;
	int l = listen_loopback(SOCK_STREAM | SOCK_CLOEXEC, &a), s, p;
	connect_pair(l, &a, SOCK_CLOEXEC, &s, &p);
	char b;
	CHECK(write(s, "?", 1) == 1 && read(p, &b, 1) == 1); /* both decided */
	int ep = -1;
	if (unread) { /* left unread in each other's rings (SHM) or queues */
		CHECK(write(s, "early", 5) == 5 && write(p, "pre", 3) == 3);
		/* an epoll set holds the client's end across the release: it reports
		 * what the ring held, then the socket's */
		struct epoll_event ev = {.events = EPOLLIN};
		CHECK((ep = epoll_create1(EPOLL_CLOEXEC)) >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) == 0);
	}

	int u[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, u) == 0);
	fcntl(u[0], F_SETFD, FD_CLOEXEC);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		char arg[16];
		snprintf(arg, sizeof(arg), "%d", u[1]);
		execl("/proc/self/exe", argv[0], "receiver", arg, unread ? "unread" : (char *)NULL, (char *)NULL);
		_exit(127);
	}
	close(u[1]);
	send_fd(u[0], p, mmsg);
	char c;
	CHECK(read(u[0], &c, 1) == 1);
	CHECK(write(s, "sent", 4) == 4);
	CHECK(close(p) == 0);
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	if (ep >= 0) {
		struct epoll_event ev;
		CHECK(epoll_wait(ep, &ev, 1, 10000) == 1 && (ev.events & EPOLLIN));
	}
	printf("client %s\n", outcome(s, unread ? "preback" : "back"));
	return 0;
}
