/* forkwait.c: a child after fork waits, with epoll and then with poll, on a
 * connection it inherited and on one it made itself, while the parent waits with
 * poll on its own. With the library the inherited connection wakes by the parent's
 * eventfd and the child's new one by the child's own: both must wake the child.
 * stdout: "ok" */
#define _GNU_SOURCE
#include <poll.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loopback.h"

/* read_exact reads len bytes (blocking) and checks them */
static void read_exact(int fd, const char *want, size_t len)
{
	char b[16];
	size_t n = 0;
	while (n < len) {
		ssize_t k = read(fd, b + n, len - n);
		CHECK(k > 0);
		n += (size_t)k;
	}
	CHECK(memcmp(b, want, len) == 0);
}

/* poll_read waits with poll until fd is readable, then reads want */
static void poll_read(int fd, const char *want)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	CHECK(poll(&p, 1, 10000) == 1 && (p.revents & POLLIN));
	read_exact(fd, want, strlen(want));
}

static void child(int inherited, struct sockaddr_in *a)
{
	int own = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(own >= 0);
	CHECK(connect(own, (struct sockaddr *)a, sizeof(*a)) == 0);
	CHECK(write(own, "ready", 5) == 5);

	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 1};
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, inherited, &ev) == 0);
	ev.data.u64 = 2;
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, own, &ev) == 0);
	int seen = 0;
	while (seen != 3) {
		struct epoll_event evs[2];
		int n = epoll_wait(ep, evs, 2, 10000);
		CHECK(n > 0);
		for (int i = 0; i < n; i++) {
			if (evs[i].data.u64 == 1 && !(seen & 1))
				read_exact(inherited, "one", 3);
			if (evs[i].data.u64 == 2 && !(seen & 2))
				read_exact(own, "two", 3);
			seen |= (int)evs[i].data.u64;
		}
	}
	close(ep);

	CHECK(write(own, "next", 4) == 4);
	struct pollfd p[2] = {{.fd = inherited, .events = POLLIN}, {.fd = own, .events = POLLIN}};
	seen = 0;
	while (seen != 3) {
		CHECK(poll(p, 2, 10000) > 0);
		for (int i = 0; i < 2; i++)
			if ((p[i].revents & POLLIN) && !(seen & (1 << i))) {
				read_exact(p[i].fd, i ? "4" : "3", 1);
				seen |= 1 << i;
				p[i].events = 0;
			}
	}
	CHECK(write(own, "done", 4) == 4);
	close(own);
	close(inherited);
}

int main(void)
{
	struct sockaddr_in a;
	int l = listen_loopback(SOCK_STREAM, &a);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(connect(s, (struct sockaddr *)&a, sizeof(a)) == 0);
	int p = accept(l, NULL, NULL);
	CHECK(p >= 0);
	CHECK(write(s, "hi", 2) == 2);
	read_exact(p, "hi", 2);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		close(s);
		close(l);
		child(p, &a);
		_exit(0);
	}
	close(p);
	int c = accept(l, NULL, NULL); /* the child's own connection */
	CHECK(c >= 0);
	poll_read(c, "ready");
	CHECK(write(s, "one", 3) == 3);
	CHECK(write(c, "two", 3) == 3);
	poll_read(c, "next");
	CHECK(write(s, "3", 1) == 1);
	CHECK(write(c, "4", 1) == 1);
	poll_read(c, "done");
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	printf("ok\n");
	return 0;
}
