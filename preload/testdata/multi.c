/* multi.c: one epoll server, many connections at once. The server runs one
 * edge-triggered (or level-triggered) epoll loop over its listener and every
 * connection it accepts, all nonblocking, echoing; client threads each send their
 * own bytes (blocking) and check the echo by hash.
 * usage: multi et|lt|nested clients bytes-per-client
 * (nested: level-triggered, the server's set inside an outer set it waits on first)
 * stdout: "ok N"; stderr: "accelerated N"; exit 0 when every client got its bytes back. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, strerror(errno)); exit(2); } } while (0)

static struct sockaddr_in addr;
static size_t per_client;
static int et;
static int accelerated; /* clients whose socket the library accelerated */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

struct pending { unsigned char buf[1 << 16]; size_t len, off; int eof; };

static void *client(void *arg)
{
	size_t id = (size_t)arg;
	int s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0);
	CHECK(connect(s, (struct sockaddr *)&addr, sizeof(addr)) == 0);
	int view = fcntl(s, F_GETFL), kernel = (int)syscall(SYS_fcntl, s, F_GETFL);
	pthread_mutex_lock(&mu);
	accelerated += (kernel & O_NONBLOCK) && !(view & O_NONBLOCK);
	pthread_mutex_unlock(&mu);
	uint64_t hs = 0xcbf29ce484222325ull, hr = hs;
	unsigned char buf[8192];
	size_t sent = 0, got = 0;
	while (got < per_client) {
		if (sent < per_client) {
			size_t k = per_client - sent < 1000 + id ? per_client - sent : 1000 + id;
			for (size_t j = 0; j < k; j++) {
				buf[j] = (unsigned char)(id * 31 + sent + j);
				hs = (hs ^ buf[j]) * 0x100000001b3ull;
			}
			CHECK(write(s, buf, k) == (ssize_t)k);
			sent += k;
		}
		ssize_t n = read(s, buf, sizeof(buf));
		CHECK(n > 0);
		for (ssize_t j = 0; j < n; j++)
			hr = (hr ^ buf[j]) * 0x100000001b3ull;
		got += (size_t)n;
	}
	CHECK(shutdown(s, SHUT_WR) == 0);
	CHECK(read(s, buf, 1) == 0);
	close(s);
	return (void *)(uintptr_t)(hs == hr && got == per_client);
}

int main(int argc, char **argv)
{
	CHECK(argc == 4);
	et = strcmp(argv[1], "et") == 0;
	int clients = atoi(argv[2]);
	per_client = (size_t)atol(argv[3]);
	int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	CHECK(l >= 0);
	addr = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	CHECK(bind(l, (struct sockaddr *)&addr, sizeof(addr)) == 0);
	socklen_t al = sizeof(addr);
	CHECK(getsockname(l, (struct sockaddr *)&addr, &al) == 0);
	CHECK(listen(l, 128) == 0);
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev) == 0);
	int nested = strcmp(argv[1], "nested") == 0, outer = -1;
	if (nested) {
		outer = epoll_create1(0);
		struct epoll_event oe = {.events = EPOLLIN, .data.u64 = 99};
		CHECK(epoll_ctl(outer, EPOLL_CTL_ADD, ep, &oe) == 0);
	}
	pthread_t *t = calloc((size_t)clients, sizeof(*t));
	for (int i = 0; i < clients; i++)
		pthread_create(&t[i], NULL, client, (void *)(uintptr_t)i);
	int done = 0;
	while (done < clients) {
		struct epoll_event evs[16];
		int n;
		if (nested) {
			CHECK(epoll_wait(outer, evs, 1, 10000) == 1 && evs[0].data.u64 == 99);
			n = epoll_wait(ep, evs, 16, 0); /* may be 0: a wake-up of the inner set */
			CHECK(n >= 0);
		} else {
			n = epoll_wait(ep, evs, 16, 10000);
			CHECK(n > 0);
		}
		for (int i = 0; i < n; i++) {
			if (evs[i].data.ptr == NULL) {
				for (;;) {
					int c = accept4(l, NULL, NULL, SOCK_NONBLOCK);
					if (c < 0 && errno == EAGAIN)
						break;
					CHECK(c >= 0);
					struct pending *p = calloc(1, sizeof(*p) + sizeof(int));
					memcpy(p + 1, &c, sizeof(int));
					struct epoll_event ce = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | (et ? EPOLLET : 0), .data.ptr = p};
					CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce) == 0);
				}
				continue;
			}
			struct pending *p = evs[i].data.ptr;
			int c;
			memcpy(&c, p + 1, sizeof(int));
			for (;;) { /* until EAGAIN both ways (edge-triggered) */
				int progress = 0;
				while (p->off < p->len) {
					ssize_t w = write(c, p->buf + p->off, p->len - p->off);
					if (w < 0 && errno == EAGAIN)
						break;
					CHECK(w > 0);
					p->off += (size_t)w;
					progress = 1;
				}
				if (p->off == p->len && !p->eof) {
					p->off = p->len = 0;
					ssize_t r = read(c, p->buf, sizeof(p->buf));
					if (r == 0) {
						p->eof = 1;
					} else if (r > 0) {
						p->len = (size_t)r;
						progress = 1;
					} else {
						CHECK(errno == EAGAIN);
					}
				}
				if (p->eof && p->off == p->len) {
					CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, c, NULL) == 0);
					close(c);
					free(p);
					done++;
					break;
				}
				if (!progress)
					break;
			}
		}
	}
	int ok = 0;
	for (int i = 0; i < clients; i++) {
		void *r;
		pthread_join(t[i], &r);
		ok += r != NULL;
	}
	printf("ok %d\n", ok);
	fprintf(stderr, "accelerated %d\n", accelerated);
	return ok != clients;
}
