/* reset.c: an accelerated connection whose smcrd goes away. The program makes a
 * connection (both ends through the library), checks SO_RCVTIMEO on a blocking read,
 * prints "ready" and waits for a line on stdin (the test ends smcrd meanwhile), then
 * reads and writes: a reset, never a clean EOF. A new connection is then plain TCP. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, strerror(errno)); exit(2); } } while (0)
#define SHOW(label, call) do { errno = 0; long r_ = (long)(call); int e_ = errno; \
	printf("%s %ld %s\n", label, r_, r_ < 0 ? strerror(e_) : ""); fflush(stdout); } while (0)

static int accel(int fd)
{
	int view = fcntl(fd, F_GETFL);
	int kernel = (int)syscall(SYS_fcntl, fd, F_GETFL);
	return (kernel & O_NONBLOCK) && !(view & O_NONBLOCK);
}

static void on_alarm(int sig)
{
	(void)sig;
}

static void alarm_in(long ms)
{
	struct itimerval it = {.it_value = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000}};
	setitimer(ITIMER_REAL, &it, NULL);
}

static void *late_writer(void *arg)
{
	usleep(300000);
	CHECK(write(*(int *)arg, "late", 4) == 4);
	return NULL;
}

int main(void)
{
	int l = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	CHECK(bind(l, (struct sockaddr *)&a, sizeof(a)) == 0);
	socklen_t al = sizeof(a);
	CHECK(getsockname(l, (struct sockaddr *)&a, &al) == 0);
	CHECK(listen(l, 4) == 0);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(connect(s, (struct sockaddr *)&a, sizeof(a)) == 0);
	int p = accept(l, NULL, NULL);
	CHECK(p >= 0);
	char b[16];
	CHECK(write(s, "x", 1) == 1);
	CHECK(read(p, b, 1) == 1);
	printf("accel %d %d\n", accel(s), accel(p));

	struct timeval tv = {0, 200000};
	CHECK(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	SHOW("rcvtimeo", read(s, b, sizeof(b)));
	clock_gettime(CLOCK_MONOTONIC, &t1);
	long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
	printf("waited-enough %d\n", ms >= 150 && ms < 2000);

	/* signals: without SA_RESTART a blocking read fails with EINTR; with it, and
	 * a socket timeout, too (as Linux); with it and no timeout, it goes on */
	struct sigaction sa = {.sa_handler = on_alarm};
	CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
	tv.tv_usec = 0;
	CHECK(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0);
	alarm_in(150);
	SHOW("eintr", read(s, b, sizeof(b)));
	sa.sa_flags = SA_RESTART;
	CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
	tv.tv_sec = 2;
	CHECK(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0);
	alarm_in(150);
	SHOW("eintr-timeo", read(s, b, sizeof(b)));
	tv.tv_sec = 0;
	CHECK(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0);
	pthread_t lw;
	pthread_create(&lw, NULL, late_writer, &p);
	alarm_in(150);
	SHOW("restarted", read(s, b, sizeof(b)));
	pthread_join(lw, NULL);

	printf("ready\n");
	fflush(stdout);
	char line[16];
	CHECK(fgets(line, sizeof(line), stdin) != NULL);

	struct pollfd pp = {.fd = s, .events = POLLIN};
	CHECK(poll(&pp, 1, 5000) == 1);
	printf("poll err-or-hup %d\n", !!(pp.revents & (POLLERR | POLLHUP)));
	SHOW("read", read(s, b, sizeof(b)));
	errno = 0;
	ssize_t w = send(s, "y", 1, MSG_NOSIGNAL);
	printf("write fails %d\n", w < 0 && (errno == ECONNRESET || errno == EPIPE));
	SHOW("read-again", read(s, b, sizeof(b))); /* the error was taken: end of file */
	int soerr = -1;
	socklen_t sl = sizeof(soerr);
	CHECK(getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0);
	printf("so_error-after %d\n", soerr);
	close(s);
	close(p);

	s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(connect(s, (struct sockaddr *)&a, sizeof(a)) == 0);
	p = accept(l, NULL, NULL);
	CHECK(p >= 0);
	CHECK(write(s, "z", 1) == 1);
	CHECK(read(p, b, 1) == 1 && b[0] == 'z');
	printf("new accel %d %d\n", accel(s), accel(p));
	close(s);
	close(p);
	close(l);
	printf("done\n");
	return 0;
}
