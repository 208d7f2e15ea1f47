/* epollfds.c: many connections in one epoll set, and what the kernel set holds for
 * them. N clients connect (nonblocking) to a listener of this process; every end
 * goes into one edge-triggered set; each client writes a byte once writable, and the
 * loop runs until every accepted end has read its byte.
 * usage: epollfds N
 * stdout: "ok N", "set-eventfds K" (eventfds registered in the kernel epoll set, from
 * /proc/self/fdinfo), "eventfds E" (all of the process's eventfds). */
#define _GNU_SOURCE
#include <dirent.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>

#include "loopback.h"

static int is_eventfd(int fd)
{
	char path[64], link[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(path, link, sizeof(link) - 1);
	if (n < 0)
		return 0;
	link[n] = 0;
	return strcmp(link, "anon_inode:[eventfd]") == 0;
}

static int set_eventfds(int ep)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", ep);
	FILE *f = fopen(path, "r");
	CHECK(f);
	int k = 0, tfd;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "tfd: %d", &tfd) == 1 && is_eventfd(tfd))
			k++;
	fclose(f);
	return k;
}

static int all_eventfds(void)
{
	DIR *d = opendir("/proc/self/fd");
	CHECK(d);
	int k = 0;
	for (struct dirent *e; (e = readdir(d));)
		if (e->d_name[0] != '.' && is_eventfd(atoi(e->d_name)))
			k++;
	closedir(d);
	return k;
}

#define SERVER_END (1ull << 32)

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	int n = atoi(argv[1]);
	struct rlimit rl;
	CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
	rl.rlim_cur = rl.rlim_max;
	CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
	/* a backlog for every client: none waits for a SYN's retransmission */
	int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	CHECK(l >= 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	CHECK(bind(l, (struct sockaddr *)&a, sizeof(a)) == 0);
	socklen_t al = sizeof(a);
	CHECK(getsockname(l, (struct sockaddr *)&a, &al) == 0);
	CHECK(listen(l, n) == 0);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	CHECK(ep >= 0);
	int *cl = calloc((size_t)n, sizeof(int));
	char *written = calloc((size_t)n, 1);
	CHECK(cl && written);
	int accepted = 0, got = 0, nwritten = 0;
	for (int i = 0; i < n; i++) {
		cl[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		CHECK(cl[i] >= 0);
		CHECK(connect(cl[i], (struct sockaddr *)&a, sizeof(a)) == 0 || errno == EINPROGRESS);
		struct epoll_event ev = {.events = EPOLLOUT | EPOLLET, .data.u64 = (uint64_t)i};
		CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, cl[i], &ev) == 0);
	}
	while (got < n || nwritten < n) {
		int c;
		while ((c = accept4(l, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
			struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u64 = SERVER_END | (uint64_t)c};
			CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) == 0);
			accepted++;
		}
		CHECK(errno == EAGAIN);
		struct epoll_event evs[64];
		int k = epoll_wait(ep, evs, 64, accepted < n ? 10 : 20000);
		CHECK(k > 0 || accepted < n);
		for (int i = 0; i < k; i++) {
			uint64_t d = evs[i].data.u64;
			if (d & SERVER_END) {
				char b;
				ssize_t r = read((int)(d & 0xffffffff), &b, 1);
				CHECK(r == 1 || (r < 0 && errno == EAGAIN));
				got += r == 1;
			} else if (!written[d] && (evs[i].events & EPOLLOUT)) {
				CHECK(write(cl[d], "x", 1) == 1);
				written[d] = 1;
				nwritten++;
			}
		}
	}
	printf("ok %d\nset-eventfds %d\neventfds %d\n", got, set_eventfds(ep), all_eventfds());
	return 0;
}
