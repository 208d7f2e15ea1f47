/* epollwake.c: a thread waiting in epoll_wait wakes for a socket that another
 * thread makes ready by epoll_ctl: added to a set that was empty when the wait
 * began (the thread waits in the kernel), and modified in a set whose accelerated
 * member keeps the waiter in the library's wait. The same transcript with and
 * without the library.
 * usage: epollwake
 * stdout: one line per case, "<case> <events returned> <data> prompt|late", then "ok";
 * stderr: "accelerated N", the sockets the library accelerated. */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "loopback.h"

struct waiter {
	pthread_t th;
	int ep, n;
	uint64_t data;
	struct timespec woke;
};

static void *wait_once(void *arg)
{
	struct waiter *w = arg;
	struct epoll_event ev;
	w->n = epoll_wait(w->ep, &ev, 1, 5000);
	clock_gettime(CLOCK_MONOTONIC, &w->woke);
	w->data = w->n == 1 ? ev.data.u64 : 0;
	return NULL;
}

/* pair connects a client to l and returns both ends */
static void pair(int l, const struct sockaddr_in *a, int *c, int *s)
{
	*c = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(*c >= 0);
	CHECK(connect(*c, (const struct sockaddr *)a, sizeof(*a)) == 0);
	*s = accept(l, NULL, NULL);
	CHECK(*s >= 0);
}

/* readable makes s readable and waits until it is */
static void readable(int peer, int s)
{
	CHECK(write(peer, "x", 1) == 1);
	struct pollfd p = {.fd = s, .events = POLLIN};
	CHECK(poll(&p, 1, 5000) == 1);
}

static void start(struct waiter *w, int ep)
{
	*w = (struct waiter){.ep = ep};
	CHECK(pthread_create(&w->th, NULL, wait_once, w) == 0);
	usleep(100000); /* the waiter is asleep in its epoll_wait by then */
}

/* finish reports what the waiter got, and whether it woke within a second of
 * the call that made its socket ready (made at *t) */
static void finish(const char *name, struct waiter *w, const struct timespec *t)
{
	CHECK(pthread_join(w->th, NULL) == 0);
	double late = (double)(w->woke.tv_sec - t->tv_sec) + (double)(w->woke.tv_nsec - t->tv_nsec) / 1e9;
	printf("%s %d %llu %s\n", name, w->n, (unsigned long long)w->data, late < 1 ? "prompt" : "late");
}

int main(void)
{
	struct sockaddr_in a;
	setvbuf(stdout, NULL, _IOLBF, 0);
	int l = listen_loopback(SOCK_STREAM, &a);
	int c1, s1, c2, s2;
	pair(l, &a, &c1, &s1);
	pair(l, &a, &c2, &s2);
	struct waiter w;
	struct timespec t;

	/* added to an empty set while a thread waits on it */
	int ep = epoll_create1(EPOLL_CLOEXEC);
	CHECK(ep >= 0);
	start(&w, ep);
	readable(s1, c1);
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 42};
	clock_gettime(CLOCK_MONOTONIC, &t);
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c1, &ev) == 0);
	finish("empty-set", &w, &t);

	/* modified in a set with an idle member, while a thread waits on it */
	int ep2 = epoll_create1(EPOLL_CLOEXEC);
	CHECK(ep2 >= 0);
	ev = (struct epoll_event){.events = EPOLLOUT, .data.u64 = 7};
	CHECK(epoll_ctl(ep2, EPOLL_CTL_ADD, s1, &ev) == 0);
	ev = (struct epoll_event){.events = EPOLLIN, .data.u64 = 8};
	CHECK(epoll_ctl(ep2, EPOLL_CTL_ADD, c2, &ev) == 0);
	ev = (struct epoll_event){.events = 0, .data.u64 = 7};
	CHECK(epoll_ctl(ep2, EPOLL_CTL_MOD, s1, &ev) == 0);
	start(&w, ep2);
	ev = (struct epoll_event){.events = EPOLLOUT, .data.u64 = 43};
	clock_gettime(CLOCK_MONOTONIC, &t);
	CHECK(epoll_ctl(ep2, EPOLL_CTL_MOD, s1, &ev) == 0);
	finish("modified", &w, &t);

	/* deleted, then added back while a thread waits on the set */
	CHECK(epoll_ctl(ep2, EPOLL_CTL_DEL, s1, NULL) == 0);
	start(&w, ep2);
	readable(c2, s2);
	ev = (struct epoll_event){.events = EPOLLIN, .data.u64 = 44};
	clock_gettime(CLOCK_MONOTONIC, &t);
	CHECK(epoll_ctl(ep2, EPOLL_CTL_ADD, s2, &ev) == 0);
	finish("added-back", &w, &t);
	printf("ok\n");
	/* accelerated: the kernel socket is nonblocking behind a blocking view */
	int fds[] = {c1, s1, c2, s2}, accel = 0;
	for (int i = 0; i < 4; i++)
		accel += ((int)syscall(SYS_fcntl, fds[i], F_GETFL) & O_NONBLOCK) && !(fcntl(fds[i], F_GETFL) & O_NONBLOCK);
	fprintf(stderr, "accelerated %d\n", accel);
	return 0;
}
