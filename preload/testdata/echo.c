/* echo.c: a TCP echo over loopback, content checked by hash. A server thread echoes
 * (blocking readv/writev, or recv/send) until EOF; the client sends size bytes and
 * reads them back.
 * usage: echo block|nonblock none|poll|epoll|epoll-early|select|sendfile|splice size
 * (epoll-early: the socket joins the epoll set before its connect)
 * stdout: "sent N H recv N H"; exit 0 when both match. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, strerror(errno)); exit(2); } } while (0)

static size_t total;
static const char *wait_mode;

struct hash { uint64_t h; size_t n; };
static void hash_add(struct hash *h, const unsigned char *b, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		h->h ^= b[i];
		h->h *= 0x100000001b3ull;
	}
	h->n += n;
}

static unsigned char byte_at(size_t i)
{
	uint64_t x = i * 0x9e3779b97f4a7c15ull;
	return (unsigned char)(x >> 56 ^ i);
}

static void *server(void *arg)
{
	int l = *(int *)arg;
	int c = accept(l, NULL, NULL);
	CHECK(c >= 0);
	unsigned char a[3000], b[7000];
	for (int round = 0;; round++) {
		ssize_t n;
		if (round & 1) {
			struct iovec v[2] = {{a, sizeof(a)}, {b, sizeof(b)}};
			n = readv(c, v, 2);
		} else {
			n = recv(c, b, sizeof(b), 0);
		}
		CHECK(n >= 0);
		if (n == 0)
			break;
		size_t off = 0;
		while (off < (size_t)n) {
			ssize_t w;
			if (round & 1) {
				unsigned char t[sizeof(a) + sizeof(b)];
				memcpy(t, a, sizeof(a));
				memcpy(t + sizeof(a), b, sizeof(b));
				struct iovec v = {t + off, (size_t)n - off};
				w = writev(c, &v, 1);
			} else {
				w = send(c, b + off, (size_t)n - off, MSG_NOSIGNAL);
			}
			CHECK(w > 0);
			off += (size_t)w;
		}
	}
	close(c);
	return NULL;
}

static void *writer(void *arg)
{
	int s = *(int *)arg;
	struct hash *h = calloc(1, sizeof(*h));
	h->h = 0xcbf29ce484222325ull;
	unsigned char buf[65536];
	if (strcmp(wait_mode, "sendfile") == 0) {
		char path[] = "/tmp/echo-sendfile-XXXXXX";
		int f = mkstemp(path);
		CHECK(f >= 0);
		unlink(path);
		for (size_t i = 0; i < total;) {
			size_t k = total - i < sizeof(buf) ? total - i : sizeof(buf);
			for (size_t j = 0; j < k; j++)
				buf[j] = byte_at(i + j);
			CHECK(write(f, buf, k) == (ssize_t)k);
			hash_add(h, buf, k);
			i += k;
		}
		off_t off = 0;
		while ((size_t)off < total) {
			ssize_t n = sendfile(s, f, &off, total - (size_t)off);
			CHECK(n > 0);
		}
		close(f);
	} else if (strcmp(wait_mode, "splice") == 0) {
		int pp[2];
		CHECK(pipe(pp) == 0);
		for (size_t i = 0; i < total;) {
			size_t k = total - i < 4000 ? total - i : 4000;
			for (size_t j = 0; j < k; j++)
				buf[j] = byte_at(i + j);
			CHECK(write(pp[1], buf, k) == (ssize_t)k);
			hash_add(h, buf, k);
			for (size_t left = k; left > 0;) {
				ssize_t n = splice(pp[0], NULL, s, NULL, left, 0);
				CHECK(n > 0);
				left -= (size_t)n;
			}
			i += k;
		}
		close(pp[0]);
		close(pp[1]);
	} else {
		for (size_t i = 0; i < total;) {
			size_t k = total - i < 12345 ? total - i : 12345;
			for (size_t j = 0; j < k; j++)
				buf[j] = byte_at(i + j);
			ssize_t n = write(s, buf, k);
			CHECK(n > 0);
			hash_add(h, buf, (size_t)n);
			i += (size_t)n;
		}
	}
	CHECK(shutdown(s, SHUT_WR) == 0);
	return h;
}

/* wait_io waits until s is readable, or writable if want_out */
static void wait_io(int s, int want_out, int ep)
{
	if (strcmp(wait_mode, "poll") == 0) {
		struct pollfd p = {.fd = s, .events = POLLIN | (want_out ? POLLOUT : 0)};
		CHECK(poll(&p, 1, 10000) == 1);
	} else if (strcmp(wait_mode, "select") == 0) {
		fd_set r, w;
		FD_ZERO(&r);
		FD_ZERO(&w);
		FD_SET(s, &r);
		if (want_out)
			FD_SET(s, &w);
		struct timeval tv = {10, 0};
		CHECK(select(s + 1, &r, &w, NULL, &tv) > 0);
	} else if (strncmp(wait_mode, "epoll", 5) == 0) {
		struct epoll_event ev = {.events = EPOLLIN | (want_out ? EPOLLOUT : 0), .data.u64 = 42};
		CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev) == 0);
		CHECK(epoll_wait(ep, &ev, 1, 10000) == 1 && ev.data.u64 == 42);
	}
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: echo block|nonblock none|poll|epoll|select|sendfile size\n");
		return 2;
	}
	int nonblock = strcmp(argv[1], "nonblock") == 0;
	wait_mode = argv[2];
	total = (size_t)strtoull(argv[3], NULL, 10);

	int l = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	CHECK(bind(l, (struct sockaddr *)&a, sizeof(a)) == 0);
	socklen_t al = sizeof(a);
	CHECK(getsockname(l, (struct sockaddr *)&a, &al) == 0);
	CHECK(listen(l, 4) == 0);
	pthread_t st;
	pthread_create(&st, NULL, server, &l);

	int s = socket(AF_INET, SOCK_STREAM | (nonblock ? SOCK_NONBLOCK : 0), 0);
	CHECK(s >= 0);
	int ep = -1;
	if (strcmp(wait_mode, "epoll-early") == 0) {
		ep = epoll_create1(0);
		struct epoll_event ev = {.events = EPOLLOUT, .data.u64 = 42};
		CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) == 0);
	}
	int r = connect(s, (struct sockaddr *)&a, sizeof(a));
	CHECK(r == 0 || (nonblock && errno == EINPROGRESS));
	int view = fcntl(s, F_GETFL), kernel = (int)syscall(SYS_fcntl, s, F_GETFL);
	fprintf(stderr, "client accel=%d\n", !nonblock && (kernel & O_NONBLOCK) && !(view & O_NONBLOCK));

	struct hash rh = {0xcbf29ce484222325ull, 0}, *sh;
	unsigned char buf[65536];
	if (strcmp(wait_mode, "epoll") == 0) {
		ep = epoll_create1(0);
		struct epoll_event ev = {.events = EPOLLOUT, .data.u64 = 42};
		CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) == 0);
	}
	if (!nonblock) {
		pthread_t wt;
		pthread_create(&wt, NULL, writer, &s);
		int rp[2] = {-1, -1};
		if (strcmp(wait_mode, "splice") == 0)
			CHECK(pipe(rp) == 0);
		for (;;) {
			if (rp[0] >= 0) { /* socket -> pipe -> buffer */
				ssize_t n = splice(s, NULL, rp[1], NULL, 5000, 0);
				CHECK(n >= 0);
				if (n == 0)
					break;
				CHECK(read(rp[0], buf, (size_t)n) == n);
				hash_add(&rh, buf, (size_t)n);
				continue;
			}
			if (strcmp(wait_mode, "sendfile") != 0 && strcmp(wait_mode, "none") != 0)
				wait_io(s, 0, ep);
			ssize_t n = read(s, buf, sizeof(buf));
			CHECK(n >= 0);
			if (n == 0)
				break;
			hash_add(&rh, buf, (size_t)n);
		}
		void *res;
		pthread_join(wt, &res);
		sh = res;
	} else {
		sh = calloc(1, sizeof(*sh));
		sh->h = 0xcbf29ce484222325ull;
		size_t sent = 0;
		int shut = 0;
		wait_io(s, 1, ep);
		int err = -1;
		socklen_t el = sizeof(err);
		CHECK(getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0);
		for (;;) {
			while (sent < total) {
				size_t k = total - sent < 7777 ? total - sent : 7777;
				for (size_t j = 0; j < k; j++)
					buf[j] = byte_at(sent + j);
				ssize_t n = send(s, buf, k, MSG_NOSIGNAL);
				if (n < 0 && errno == EAGAIN)
					break;
				CHECK(n > 0);
				hash_add(sh, buf, (size_t)n);
				sent += (size_t)n;
			}
			if (sent == total && !shut) {
				CHECK(shutdown(s, SHUT_WR) == 0);
				shut = 1;
			}
			ssize_t n = read(s, buf, sizeof(buf));
			if (n == 0)
				break;
			if (n < 0) {
				CHECK(errno == EAGAIN);
				if (strcmp(wait_mode, "none") != 0)
					wait_io(s, sent < total, ep);
				continue;
			}
			hash_add(&rh, buf, (size_t)n);
		}
	}
	pthread_join(st, NULL);
	close(s);
	close(l);
	printf("sent %zu %016llx recv %zu %016llx\n", sh->n, (unsigned long long)sh->h, rh.n, (unsigned long long)rh.h);
	return !(sh->n == total && rh.n == total && sh->h == rh.h);
}
