/* sndtimeo.c: a blocking connect under SO_SNDTIMEO gives up as the kernel's does,
 * with EINPROGRESS, when smcrd's decision does not come in time (the test's smcrd
 * holds it back). stdout: "connect -1 <error> <whether it took under 10 s>" */
#define _GNU_SOURCE
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "loopback.h"

int main(void)
{
	struct sockaddr_in a;
	int l = listen_loopback(SOCK_STREAM, &a);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0);
	struct timeval tv = {.tv_usec = 200000};
	CHECK(setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) == 0);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	errno = 0;
	int r = connect(s, (struct sockaddr *)&a, sizeof(a));
	int e = errno;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("connect %d %s %s\n", r, r < 0 ? strerror(e) : "", t1.tv_sec - t0.tv_sec < 10 ? "in time" : "late");
	close(s);
	close(l);
	return 0;
}
