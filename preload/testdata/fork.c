/* fork.c: an accelerated connection shared by fork: the parent closes its copy at
 * once (as a forking server does), the child goes on with it, then the child's close
 * ends the connection: the peer reads everything, then EOF.
 * stdout: "ok" */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, strerror(errno)); exit(2); } } while (0)

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
	char b[64];
	CHECK(write(s, "hi", 2) == 2);
	CHECK(read(p, b, 2) == 2);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		close(s);
		close(l);
		usleep(100000); /* the parent has closed its copy by now */
		CHECK(write(p, "from child", 10) == 10);
		CHECK(read(p, b, 4) == 4 && memcmp(b, "ack!", 4) == 0);
		close(p);
		_exit(0);
	}
	close(p);
	size_t n = 0;
	while (n < 10) {
		ssize_t k = read(s, b + n, 10 - n);
		CHECK(k > 0);
		n += (size_t)k;
	}
	CHECK(memcmp(b, "from child", 10) == 0);
	CHECK(write(s, "ack!", 4) == 4);
	CHECK(read(s, b, sizeof(b)) == 0);
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	printf("ok\n");
	return 0;
}
