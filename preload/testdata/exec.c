/* exec.c: connections kept across exec. The first image connects a pair, leaves bytes
 * unread in one end, and execs itself (argv[1] names the exec call: execv, execvp,
 * execl; closefrom, close_range: execv after closing every fd above the program's
 * own with that call; execve-noenv: execve with an environment without the library) with both
 * sockets open (one of them only as a dup2 alias). The new image reads the unread
 * bytes, echoes both ways (waiting for each piece with poll, or epoll: the wake-ups
 * come through the process eventfd the new image adopted), and closes one end: the
 * other reads EOF.
 * stdout: "ok"; stderr: "accelerated N" (sockets the new image sees accelerated).
 * execve-noenv: the new image reads once; stdout "noenv data" (the kernel's bytes) or
 * "noenv reset" (a connection the library had accelerated is reset: ECONNRESET, EPIPE
 * or ENOTCONN as the kernel reports a reset, depending on which end's came first). */
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
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "loopback.h"

extern char **environ;

/* poll_in waits with poll until fd is readable */
static void poll_in(int fd)
{
	struct pollfd pf = {.fd = fd, .events = POLLIN};
	CHECK(poll(&pf, 1, 10000) == 1 && (pf.revents & POLLIN));
}

/* epoll_in waits with the epoll set ep (fd in it, edge-triggered) until fd is readable */
static void epoll_in(int ep, int fd)
{
	struct epoll_event ev;
	CHECK(epoll_wait(ep, &ev, 1, 10000) == 1 && ev.data.fd == fd && (ev.events & EPOLLIN));
}

static int after_exec_noenv(int p)
{
	char b[64];
	errno = 0;
	ssize_t r = read(p, b, sizeof(b));
	if (r > 0 && memcmp(b, "ello more", (size_t)r < 9 ? (size_t)r : 9) == 0)
		printf("noenv data\n");
	else if (r < 0 && (errno == ECONNRESET || errno == EPIPE || errno == ENOTCONN))
		printf("noenv reset\n");
	else
		printf("noenv %zd %s\n", r, r < 0 ? strerror(errno) : "");
	return 0;
}

static int after_exec(int s, int p)
{
	fprintf(stderr, "accelerated %d\n", accelerated(s) + accelerated(p));
	char b[65536];
	read_full(p, b, 9);
	CHECK(memcmp(b, "ello more", 9) == 0);
	static char big[200000];
	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (char)(i * 7);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.fd = s};
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) == 0);
	/* both ways, in pieces smaller than a ring, so one thread does it */
	for (size_t off = 0; off < sizeof(big); off += 20000) {
		CHECK(write(s, big + off, 20000) == 20000);
		poll_in(p);
		read_full(p, b, 20000);
		CHECK(memcmp(b, big + off, 20000) == 0);
		CHECK(write(p, big + off, 20000) == 20000);
		epoll_in(ep, s);
		read_full(s, b, 20000);
		CHECK(memcmp(b, big + off, 20000) == 0);
	}
	CHECK(close(ep) == 0);
	CHECK(close(s) == 0);
	CHECK(read(p, b, sizeof(b)) == 0);
	CHECK(close(p) == 0);
	printf("ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	CHECK(argc >= 2);
	if (argc == 4 && strcmp(argv[1], "execve-noenv") == 0)
		return after_exec_noenv(atoi(argv[3]));
	if (argc == 4)
		return after_exec(atoi(argv[2]), atoi(argv[3]));
	struct sockaddr_in a;
	int l = listen_loopback(SOCK_STREAM | SOCK_CLOEXEC, &a);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(connect(s, (struct sockaddr *)&a, sizeof(a)) == 0);
	int p0 = accept4(l, NULL, NULL, SOCK_CLOEXEC);
	CHECK(p0 >= 0);
	CHECK(write(s, "hello", 5) == 5);
	char b[1];
	CHECK(read(p0, b, 1) == 1 && b[0] == 'h');
	CHECK(write(s, " more", 5) == 5);
	/* the accepted socket crosses the exec only as an alias, the way inetd's
	 * children get theirs as stdin */
	int p = dup2(p0, 20);
	CHECK(p == 20);
	CHECK(close(p0) == 0);
	char sfd[16], pfd[16];
	snprintf(sfd, sizeof(sfd), "%d", s);
	snprintf(pfd, sizeof(pfd), "%d", p);
	char *args[] = {argv[0], argv[1], sfd, pfd, NULL};
	if (strcmp(argv[1], "execv") == 0)
		execv("/proc/self/exe", args);
	else if (strcmp(argv[1], "closefrom") == 0) {
		/* sshd's way: every fd above the program's own closed, then the exec */
		closefrom(21);
		execv("/proc/self/exe", args);
	} else if (strcmp(argv[1], "close_range") == 0) {
		CHECK(close_range(21, ~0U, 0) == 0);
		execv("/proc/self/exe", args);
	}
	else if (strcmp(argv[1], "execvp") == 0)
		execvp("/proc/self/exe", args);
	else if (strcmp(argv[1], "execl") == 0)
		execl("/proc/self/exe", argv[0], argv[1], sfd, pfd, (char *)NULL);
	else if (strcmp(argv[1], "execve-noenv") == 0) {
		char *env[64];
		int n = 0;
		for (char **e = environ; *e && n < 63; e++)
			if (strncmp(*e, "LD_PRELOAD=", 11) != 0)
				env[n++] = *e;
		env[n] = NULL;
		execve("/proc/self/exe", args, env);
	}
	fprintf(stderr, "exec %s: %s\n", argv[1], strerror(errno));
	return 2;
}
