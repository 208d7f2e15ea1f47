/* spawn.c: an accelerated socket that a child gets from posix_spawn, posix_spawnp,
 * system or popen, none of which goes through the library's fork and exec. The
 * parent makes a connection and starts this program again ("child FD") with its
 * server end p; argv[1] names how:
 *   spawn         posix_spawn, p moved to fd 20 by the file actions: the child's
 *                 image has the library, and the connection goes with it;
 *   spawnp-noenv  posix_spawnp with an environment without LD_PRELOAD (released);
 *   closefrom     posix_spawn, p moved to fd 0, every fd from 1 up closed, the
 *                 library's too (released);
 *   system        system("exec PROG child 20") with p at fd 20: through the shell,
 *                 which has the library, and its exec;
 *   popen         popen("PROG child 20", "r") (released).
 * The child reads " more", which the parent writes (before system, after the
 * others), answers "answer A" on the socket, A being 1 if it sees the socket
 * accelerated, and exits. The parent reads the answer, closes p, and reads the end.
 * stdout: "accel A", then "ok". */
#define _GNU_SOURCE
#include <limits.h>
#include <spawn.h>
#include <sys/wait.h>

#include "loopback.h"

extern char **environ;

static int child(int fd)
{
	int a = accelerated(fd);
	char b[5];
	read_full(fd, b, 5);
	CHECK(memcmp(b, " more", 5) == 0);
	char ans[9];
	snprintf(ans, sizeof(ans), "answer %d", a);
	CHECK(write(fd, ans, 8) == 8);
	CHECK(close(fd) == 0);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "child") == 0)
		return child(atoi(argv[2]));
	CHECK(argc == 2);
	const char *how = argv[1];
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	CHECK(n > 0);
	self[n] = 0;

	struct sockaddr_in a;
	int l = listen_loopback(SOCK_STREAM | SOCK_CLOEXEC, &a), s, p;
	connect_pair(l, &a, SOCK_CLOEXEC, &s, &p);
	char b[16];
	CHECK(write(s, "hello", 5) == 5); /* both decided, nothing left unread */
	read_full(p, b, 5);

	pid_t pid = -1;
	FILE *f = NULL;
	char *child_argv[] = {argv[0], "child", "20", NULL};
	posix_spawn_file_actions_t fa;
	CHECK(posix_spawn_file_actions_init(&fa) == 0);
	if (strcmp(how, "spawn") == 0) {
		CHECK(posix_spawn_file_actions_adddup2(&fa, p, 20) == 0);
		CHECK(posix_spawn_file_actions_addclose(&fa, p) == 0);
		CHECK(posix_spawn(&pid, self, &fa, NULL, child_argv, environ) == 0);
	} else if (strcmp(how, "spawnp-noenv") == 0) {
		char *env[256];
		int k = 0;
		for (char **e = environ; *e && k < 255; e++)
			if (strncmp(*e, "LD_PRELOAD=", 11) != 0)
				env[k++] = *e;
		env[k] = NULL;
		CHECK(posix_spawn_file_actions_adddup2(&fa, p, 20) == 0);
		CHECK(posix_spawnp(&pid, self, &fa, NULL, child_argv, env) == 0);
	} else if (strcmp(how, "closefrom") == 0) {
		child_argv[2] = "0";
		CHECK(posix_spawn_file_actions_adddup2(&fa, p, 0) == 0);
		CHECK(posix_spawn_file_actions_addclosefrom_np(&fa, 1) == 0);
		CHECK(posix_spawn(&pid, self, &fa, NULL, child_argv, environ) == 0);
	} else if (strcmp(how, "system") == 0) {
		CHECK(dup2(p, 20) == 20);
		CHECK(write(s, " more", 5) == 5);
		char cmd[PATH_MAX + 32];
		snprintf(cmd, sizeof(cmd), "exec %s child 20", self);
		int st = system(cmd);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		CHECK(close(20) == 0);
	} else if (strcmp(how, "popen") == 0) {
		CHECK(dup2(p, 20) == 20);
		char cmd[PATH_MAX + 32];
		snprintf(cmd, sizeof(cmd), "%s child 20", self);
		CHECK((f = popen(cmd, "r")) != NULL);
		CHECK(close(20) == 0);
	} else {
		fprintf(stderr, "spawn: no such way %s\n", how);
		return 2;
	}
	CHECK(posix_spawn_file_actions_destroy(&fa) == 0);
	CHECK(close(p) == 0);
	if (strcmp(how, "system") != 0)
		CHECK(write(s, " more", 5) == 5);
	read_full(s, b, 8);
	CHECK(memcmp(b, "answer ", 7) == 0);
	printf("accel %c\n", b[7]);
	if (pid > 0) {
		int st;
		CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	if (f)
		CHECK(pclose(f) == 0);
	CHECK(read(s, b, sizeof(b)) == 0);
	printf("ok\n");
	return 0;
}
