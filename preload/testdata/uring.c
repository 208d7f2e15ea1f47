/* uring.c: a process that makes an io_uring instance, whose reads and writes of a
 * socket would go around the library. A connection made before (both ends through the
 * library) carries bytes both ways, then io_uring_setup is called through libc's
 * syscall(), as programs without liburing do, while another thread waits in a read of
 * the connection: the connection must then be the kernel socket's alone, so raw read
 * and write system calls (which the library never sees) carry the rest of its stream
 * both ways, and the waiting read gets its bytes from the socket; a connection made
 * after is not accelerated.
 * stdout: "ok"; stderr: "accelerated B A N": sockets seen accelerated before the
 * setup, after it, and of the new connection. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "loopback.h"

/* raw_read_full reads n bytes with the read system call itself */
static void raw_read_full(int fd, char *b, size_t n)
{
	size_t k = 0;
	while (k < n) {
		long r = syscall(SYS_read, fd, b + k, n - k);
		CHECK(r > 0);
		k += (size_t)r;
	}
}

struct waiting {
	int fd;
	char b[8];
	ssize_t r;
};

/* wait_read: a read that waits through the release */
static void *wait_read(void *arg)
{
	struct waiting *w = arg;
	size_t k = 0;
	while (k < 3) {
		w->r = read(w->fd, w->b + k, 3 - k);
		if (w->r <= 0)
			return NULL;
		k += (size_t)w->r;
	}
	w->r = (ssize_t)k;
	return NULL;
}

/* pair connects a client to l (at a) and accepts it: out[0] the client's, out[1] the server's */
static void pair(int l, struct sockaddr_in *a, int out[2])
{
	connect_pair(l, a, SOCK_CLOEXEC, &out[0], &out[1]);
}

int main(void)
{
	struct sockaddr_in a;
	int l = listen_loopback(SOCK_STREAM | SOCK_CLOEXEC, &a);
	int c[2];
	pair(l, &a, c);
	char b[16];
	CHECK(write(c[0], "one", 3) == 3);
	CHECK(read(c[1], b, 3) == 3 && memcmp(b, "one", 3) == 0);
	CHECK(write(c[1], "two", 3) == 3);
	CHECK(read(c[0], b, 3) == 3 && memcmp(b, "two", 3) == 0);
	int before = accelerated(c[0]) + accelerated(c[1]);
	struct waiting w = {.fd = c[0]};
	pthread_t rd;
	CHECK(pthread_create(&rd, NULL, wait_read, &w) == 0);
	usleep(100000); /* in its wait, most likely */

	struct io_uring_params p;
	memset(&p, 0, sizeof(p));
	long u = syscall(SYS_io_uring_setup, 4, &p); /* may be off in the kernel: what counts is before */
	if (u >= 0)
		close((int)u);
	int after = accelerated(c[0]) + accelerated(c[1]);

	CHECK(syscall(SYS_write, c[0], "three", 5) == 5);
	raw_read_full(c[1], b, 5);
	CHECK(memcmp(b, "three", 5) == 0);
	CHECK(syscall(SYS_write, c[1], "six", 3) == 3);
	CHECK(pthread_join(rd, NULL) == 0);
	CHECK(w.r == 3 && memcmp(w.b, "six", 3) == 0);
	CHECK(syscall(SYS_write, c[1], "four", 4) == 4);
	raw_read_full(c[0], b, 4);
	CHECK(memcmp(b, "four", 4) == 0);

	int n[2];
	pair(l, &a, n);
	CHECK(write(n[0], "five", 4) == 4);
	raw_read_full(n[1], b, 4);
	CHECK(memcmp(b, "five", 4) == 0);
	fprintf(stderr, "accelerated %d %d %d\n", before, after, accelerated(n[0]) + accelerated(n[1]));
	printf("ok\n");
	return 0;
}
