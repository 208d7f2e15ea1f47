/* oobfull.c: a non-blocking send with MSG_OOB that the send buffer (the ring) cannot
 * take whole: as Linux's TCP, the last byte it took is the urgent one. The reader
 * reads up to the mark and finds there every byte sent but that one, which
 * recv(MSG_OOB) returns. stdout: "ok"; stderr: accel=1 when the library accelerated
 * the sockets.
 * usage: oobfull */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "loopback.h"

#define BIG (64 << 20)

static void report_accel(const char *who, int fd)
{
	int view = fcntl(fd, F_GETFL);
	int kernel = (int)syscall(SYS_fcntl, fd, F_GETFL);
	fprintf(stderr, "%s accel=%d\n", who, (kernel & O_NONBLOCK) && !(view & O_NONBLOCK));
}

static unsigned char at(size_t i)
{
	return (unsigned char)(i * 7 + (i >> 13));
}

int main(void)
{
	struct sockaddr_in a;
	alarm(30); /* a mark that never comes: the reads would wait for ever */
	int l = listen_loopback(SOCK_STREAM, &a);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0);
	int fl = fcntl(s, F_GETFL);
	CHECK(fcntl(s, F_SETFL, fl | O_NONBLOCK) == 0);
	CHECK(connect(s, (struct sockaddr *)&a, sizeof(a)) == 0 || errno == EINPROGRESS);
	int p = accept(l, NULL, NULL);
	CHECK(p >= 0);
	struct pollfd cp = {.fd = s, .events = POLLOUT};
	CHECK(poll(&cp, 1, 5000) == 1);
	CHECK(write(s, "x", 1) == 1);
	char one;
	CHECK(read(p, &one, 1) == 1);
	CHECK(fcntl(s, F_SETFL, fl) == 0); /* a blocking view, for the report */
	report_accel("client", s);
	report_accel("server", p);
	CHECK(fcntl(s, F_SETFL, fl | O_NONBLOCK) == 0);

	unsigned char *buf = malloc(BIG);
	CHECK(buf != NULL);
	for (size_t i = 0; i < BIG; i++)
		buf[i] = at(i);
	ssize_t n = send(s, buf, BIG, MSG_OOB);
	CHECK(n > 0);
	if (n == BIG) {
		fprintf(stderr, "the whole %d bytes went: no partial send to test\n", BIG);
		return 2;
	}
	size_t got = 0;
	for (;;) {
		int mark = 0;
		CHECK(ioctl(p, SIOCATMARK, &mark) == 0);
		if (mark)
			break;
		ssize_t k = read(p, buf, 1 << 20);
		CHECK(k > 0);
		for (ssize_t i = 0; i < k; i++)
			if (buf[i] != at(got + (size_t)i)) {
				fprintf(stderr, "byte %zu differs\n", got + (size_t)i);
				return 1;
			}
		got += (size_t)k;
	}
	if (got != (size_t)n - 1) {
		fprintf(stderr, "the mark after %zu bytes; the send took %zd\n", got, n);
		return 1;
	}
	unsigned char u;
	CHECK(recv(p, &u, 1, MSG_OOB) == 1);
	if (u != at((size_t)n - 1)) {
		fprintf(stderr, "urgent byte %u, want %u\n", u, at((size_t)n - 1));
		return 1;
	}
	printf("ok\n");
	return 0;
}
