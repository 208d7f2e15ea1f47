/* sharedrelease.c: a connection shared by fork is released by one process while the
 * other writes through it. The child streams numbered words into the server's end p;
 * the parent, while a thread of it reads them from the client's end s, sends p to
 * itself with SCM_RIGHTS (which releases the connection to the kernel socket) and
 * closes its copies. The child's copies under way must end before smcrd takes the
 * cursors, and its later writes go to the kernel socket: the reader sees every word
 * once, in order, then the end. The writes are as large as a ring, so that copies
 * are long; ROUNDS connections, one after the other, each released once.
 * stdout: "ok N" (the words read in all). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>

#include "loopback.h"

#define BLOCK 65536 /* words per write: 256 KiB */
#define BLOCKS 64   /* per connection: 16 MiB */
#define ROUNDS 8

static atomic_uint words_read; /* the reader's progress */

static void *reader(void *arg)
{
	int s = *(int *)arg;
	static uint32_t buf[BLOCK];
	uint32_t want = 0;
	size_t carry = 0; /* bytes of a word split across reads */
	for (;;) {
		ssize_t r = read(s, (char *)buf + carry, sizeof(buf) - carry);
		CHECK(r >= 0);
		if (r == 0)
			break;
		size_t n = carry + (size_t)r, words = n / 4;
		for (size_t i = 0; i < words; i++)
			if (buf[i] != want++) {
				fprintf(stderr, "word %u: got %u\n", want - 1, buf[i]);
				exit(3);
			}
		atomic_store(&words_read, want);
		carry = n % 4;
		memmove(buf, (char *)buf + words * 4, carry);
	}
	CHECK(carry == 0);
	*(uint32_t *)arg = want;
	return NULL;
}

/* round_trip makes a connection, has a child stream into it and releases it under the
 * child: the words read */
static uint32_t round_trip(int l, const struct sockaddr_in *a)
{
	int s, p;
	connect_pair(l, a, SOCK_CLOEXEC, &s, &p);
	char b;
	CHECK(write(p, "?", 1) == 1 && read(s, &b, 1) == 1); /* both decided */
	int u[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, u) == 0);
	atomic_store(&words_read, 0);

	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* a parent that failed leaves no writer behind */
		static uint32_t w[BLOCK];
		uint32_t next = 0;
		for (int i = 0; i < BLOCKS; i++) {
			for (int j = 0; j < BLOCK; j++)
				w[j] = next++;
			size_t off = 0;
			while (off < sizeof(w)) {
				ssize_t r = write(p, (char *)w + off, sizeof(w) - off);
				CHECK(r > 0);
				off += (size_t)r;
			}
		}
		_exit(0);
	}
	int arg = s;
	pthread_t th;
	CHECK(pthread_create(&th, NULL, reader, &arg) == 0);
	/* the child is streaming (a sixteenth of its words read): release the
	 * connection under it */
	struct timespec ms = {0, 100000};
	while (atomic_load(&words_read) < (unsigned)BLOCK * BLOCKS / 16)
		nanosleep(&ms, NULL);
	send_fd(u[0], p, 0);
	char c;
	CHECK(close(p) == 0);
	CHECK(read(u[1], &c, 1) == 1); /* the passed copy, closed at once */
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK(pthread_join(th, NULL) == 0);
	CHECK(close(s) == 0 && close(u[0]) == 0 && close(u[1]) == 0);
	uint32_t got = (uint32_t)arg;
	CHECK(got == (uint32_t)BLOCK * BLOCKS);
	return got;
}

int main(void)
{
	struct sockaddr_in a;
	int l = listen_loopback(SOCK_STREAM | SOCK_CLOEXEC, &a);
	uint64_t got = 0;
	for (int i = 0; i < ROUNDS; i++)
		got += round_trip(l, &a);
	printf("ok %llu\n", (unsigned long long)got);
	return 0;
}
