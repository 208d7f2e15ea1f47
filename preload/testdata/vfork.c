/* vfork.c: a vfork'd child (as Python's subprocess makes one) closes every fd above
 * stderr with close_range, then one by one with close, before it exits, as a child
 * does before its exec: it runs in the parent's memory, and the parent's accelerated
 * connection must stay the parent's, known to its library, its bytes going both
 * ways after. stdout: "ok"; stderr: "accelerated B A" (its two sockets seen
 * accelerated before the child and after). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/close_range.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loopback.h"

int main(void)
{
	struct sockaddr_in a;
	int l = listen_loopback(SOCK_STREAM | SOCK_CLOEXEC, &a), s, p;
	connect_pair(l, &a, SOCK_CLOEXEC, &s, &p);
	char b[8];
	CHECK(write(s, "one", 3) == 3 && read(p, b, 3) == 3 && memcmp(b, "one", 3) == 0);
	int before = accelerated(s) + accelerated(p);

	pid_t pid = vfork();
	if (pid == 0) {
		close_range(3, ~0U, 0);
		close(s); /* gone already in the child: EBADF */
		close(p);
		_exit(0);
	}
	CHECK(pid > 0);
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);

	int after = accelerated(s) + accelerated(p);
	CHECK(write(s, "two", 3) == 3 && read(p, b, 3) == 3 && memcmp(b, "two", 3) == 0);
	CHECK(write(p, "three", 5) == 5 && read(s, b, 5) == 5 && memcmp(b, "three", 5) == 0);
	fprintf(stderr, "accelerated %d %d\n", before, after);
	printf("ok\n");
	return 0;
}
