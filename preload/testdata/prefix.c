/* prefix.c: bytes the client sends at once, before the server's socket is decided;
 * a fake smcrd that falls back to TCP reads some of them ahead (its CLC would) and
 * hands them back with DECIDED: the program must see them first, and see the socket
 * readable for them, whatever it waits with.
 * usage: prefix poll|epoll|select|peek|waitall
 * (waitall: a blocking recv with MSG_WAITALL of all the bytes at once)
 * stdout: what the server read, then "ok". */
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
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, strerror(errno)); exit(2); } } while (0)

static const char msg[] = "0123456789abcdefghij";

int main(int argc, char **argv)
{
	const char *how = argc > 1 ? argv[1] : "poll";
	int l = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	CHECK(bind(l, (struct sockaddr *)&a, sizeof(a)) == 0);
	socklen_t al = sizeof(a);
	CHECK(getsockname(l, (struct sockaddr *)&a, &al) == 0);
	CHECK(listen(l, 4) == 0);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0);
	CHECK(connect(s, (struct sockaddr *)&a, sizeof(a)) == 0);
	if (strcmp(how, "waitall") == 0) {
		CHECK(write(s, msg, 20) == 20);
		int p = accept(l, NULL, NULL);
		CHECK(p >= 0);
		char all[32];
		ssize_t k = recv(p, all, 20, MSG_WAITALL);
		CHECK(k == 20 && memcmp(all, msg, 20) == 0);
		printf("read %.20s\nok\n", all);
		return 0;
	}
	CHECK(write(s, msg, 10) == 10);
	int p = accept4(l, NULL, NULL, SOCK_NONBLOCK);
	CHECK(p >= 0);
	int ep = -1;
	if (strcmp(how, "epoll") == 0) {
		ep = epoll_create1(0);
		struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u64 = 7};
		CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, p, &ev) == 0);
	}
	char got[64];
	size_t n = 0;
	int sent_rest = 0;
	while (n < 20) {
		if (strcmp(how, "epoll") == 0) {
			struct epoll_event ev;
			CHECK(epoll_wait(ep, &ev, 1, 5000) == 1 && ev.data.u64 == 7 && (ev.events & EPOLLIN));
		} else if (strcmp(how, "select") == 0) {
			fd_set r;
			FD_ZERO(&r);
			FD_SET(p, &r);
			struct timeval tv = {5, 0};
			CHECK(select(p + 1, &r, NULL, NULL, &tv) == 1);
		} else {
			struct pollfd pp = {.fd = p, .events = POLLIN};
			CHECK(poll(&pp, 1, 5000) == 1 && (pp.revents & POLLIN));
		}
		int q = 0;
		CHECK(ioctl(p, FIONREAD, &q) == 0 && q > 0);
		if (strcmp(how, "peek") == 0) {
			char pk[64];
			ssize_t k = recv(p, pk, sizeof(pk), MSG_PEEK);
			CHECK(k > 0);
			printf("peek %zd\n", k);
		}
		/* epoll is edge-triggered: read until EAGAIN */
		for (;;) {
			ssize_t k = read(p, got + n, 3);
			if (k < 0 && errno == EAGAIN)
				break;
			CHECK(k > 0);
			n += (size_t)k;
			if (n >= 10 && !sent_rest) {
				CHECK(write(s, msg + 10, 10) == 10);
				sent_rest = 1;
			}
			if (n == 20)
				break;
		}
	}
	got[n] = 0;
	printf("read %s\n", got);
	CHECK(memcmp(got, msg, 20) == 0);
	CHECK(write(p, "bye", 3) == 3);
	char b[4];
	CHECK(read(s, b, 3) == 3);
	close(p);
	CHECK(read(s, b, 3) == 0);
	close(s);
	close(l);
	printf("ok\n");
	return 0;
}
