/* ddbench: the direct mode's benchmark peer, a plain dynamically linked C
 * program (what libsmcr-preload.so interposes on; Go programs make their own
 * system calls). Blocking sockets, one thread per connection.
 *
 *   ddbench server PORT              serves: first byte 'D' discard to EOF then
 *                                    answer one byte, 'E' echo to EOF
 *   ddbench tput HOST PORT TOTAL SZ  sends TOTAL bytes in writes of SZ: {"mbps":...}
 *   ddbench lat HOST PORT N          N 64-byte round trips: {"p50us":...,"p99us":...}
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int full(int fd, void *p, size_t n, int wr)
{
	char *b = p;
	while (n > 0) {
		ssize_t k = wr ? write(fd, b, n) : read(fd, b, n);
		if (k <= 0)
			return -1;
		b += k;
		n -= (size_t)k;
	}
	return 0;
}

static void *serve(void *arg)
{
	int fd = (int)(intptr_t)arg, one = 1;
	char mode;
	char *b = malloc(1 << 20);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (read(fd, &mode, 1) == 1) {
		ssize_t n;
		if (mode == 'D') {
			while ((n = read(fd, b, 1 << 20)) > 0)
				;
			write(fd, "k", 1);
		} else {
			while ((n = read(fd, b, 1 << 20)) > 0)
				if (full(fd, b, (size_t)n, 1))
					break;
		}
	}
	free(b);
	close(fd);
	return NULL;
}

static int dial(const char *host, int port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	if (fd < 0 || inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		die("socket");
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
		die("connect");
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "server")) {
		struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
		int ln = socket(AF_INET, SOCK_STREAM, 0), one = 1;
		setsockopt(ln, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(ln, (struct sockaddr *)&sa, sizeof(sa)) || listen(ln, 128))
			die("listen");
		for (;;) {
			int c = accept(ln, NULL, NULL);
			pthread_t t;
			if (c < 0)
				continue;
			pthread_create(&t, NULL, serve, (void *)(intptr_t)c);
			pthread_detach(t);
		}
	}
	if (argc >= 6 && !strcmp(argv[1], "tput")) {
		long long total = atoll(argv[4]);
		size_t sz = (size_t)atol(argv[5]);
		char *b = calloc(1, sz);
		int fd = dial(argv[2], atoi(argv[3]));
		char k;
		double t0 = now();
		if (full(fd, "D", 1, 1))
			die("write");
		for (long long sent = 0; sent < total; sent += (long long)sz)
			if (full(fd, b, sz, 1))
				die("write");
		shutdown(fd, SHUT_WR);
		if (read(fd, &k, 1) != 1)
			die("read ack");
		printf("{\"mbps\":%.1f}\n", total / (now() - t0) / 1e6);
		return 0;
	}
	if (argc >= 5 && !strcmp(argv[1], "lat")) {
		int n = atoi(argv[4]);
		double *rtt = calloc((size_t)n, sizeof(double));
		char b[64] = {0};
		int fd = dial(argv[2], atoi(argv[3]));
		if (full(fd, "E", 1, 1))
			die("write");
		for (int i = 0; i < n; i++) {
			double t0 = now();
			if (full(fd, b, 64, 1) || full(fd, b, 64, 0))
				die("round trip");
			rtt[i] = (now() - t0) * 1e6;
		}
		qsort(rtt, (size_t)n, sizeof(double), cmp);
		printf("{\"p50us\":%.2f,\"p99us\":%.2f}\n", rtt[n / 2], rtt[n * 99 / 100]);
		return 0;
	}
	fprintf(stderr, "usage: ddbench server PORT | tput HOST PORT TOTAL SIZE | lat HOST PORT N\n");
	return 2;
}
