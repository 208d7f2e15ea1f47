/* abort.c: a close that is an abort reaches the peer as a reset, as with TCP: a close
 * with SO_LINGER {1, 0} ("linger"), and a close with received bytes left unread
 * ("unread"). For each, a connection (both ends through the library, the accept in a
 * thread so that both ends meet at once), the close of one end, then the other end's
 * read. stdout: "<case> <what the read returned>" for each, and "accelerated N" (ends
 * the library accelerated). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "loopback.h"

static int accel_count;

static void count_accel(int fd)
{
	accel_count += accelerated(fd);
}

/* pair connects a new connection: s the client's end, p the server's */
static void pair(int l, const struct sockaddr_in *a, int *s, int *p)
{
	connect_pair(l, a, 0, s, p);
	/* both decided before the close */
	CHECK(write(*s, "?", 1) == 1);
	char b;
	CHECK(read(*p, &b, 1) == 1);
	count_accel(*s);
	count_accel(*p);
}

static void show_read(const char *label, int fd)
{
	char b[64];
	errno = 0;
	ssize_t r = read(fd, b, sizeof(b));
	printf("%s %zd %s\n", label, r, r < 0 ? strerror(errno) : "");
}

int main(void)
{
	struct sockaddr_in a;
	int l = listen_loopback(SOCK_STREAM, &a);

	int s, p;
	pair(l, &a, &s, &p);
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	CHECK(setsockopt(p, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) == 0);
	CHECK(close(p) == 0);
	show_read("linger", s);
	close(s);

	pair(l, &a, &s, &p);
	CHECK(write(s, "unread", 6) == 6);
	struct pollfd pf = {.fd = p, .events = POLLIN};
	CHECK(poll(&pf, 1, 10000) == 1);
	CHECK(close(p) == 0);
	show_read("unread", s);
	close(s);

	/* a close after reading everything stays a clean end */
	pair(l, &a, &s, &p);
	CHECK(close(p) == 0);
	show_read("clean", s);
	close(s);
	printf("accelerated %d\n", accel_count);
	return 0;
}
