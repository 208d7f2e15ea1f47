/* exec.h: connections that live on across exec (exec.c), and what spawn.c shares of
 * it. */
#pragma once

#include <stddef.h>

struct conn;

/* exec_adopt, at the library's start, takes over the connections an exec passed
 * (SMCR_INHERIT) and installs them at their fds. */
void exec_adopt(void);

/* EXEC_CONN_FDS: the library's own fds behind one connection (exec_conn_fds) */
#define EXEC_CONN_FDS 10

/* exec_conn_fds: the library's own fds of c, -1 for those it has not */
void exec_conn_fds(struct conn *c, int fds[EXEC_CONN_FDS]);

/* exec_pass_state: the state to name in SMCR_INHERIT for c, or 0 where there is
 * nothing to pass (plain TCP, or the library's fds are gone) */
int exec_pass_state(struct conn *c);

/* exec_inheritable: how many of the program's fds are accelerated (or pending)
 * connections that a new image would get (not close-on-exec) */
size_t exec_inheritable(void);

/* exec_image_has_library: whether the new image, given envp, loads the library (and
 * has it on): through LD_PRELOAD or the host's /etc/ld.so.preload */
int exec_image_has_library(char *const envp[]);

/* inherit_fn is given each connection a new image is to get: at fd there, state st */
typedef void (*inherit_fn)(int fd, struct conn *c, int st, void *arg);
/* inherit_walk calls f(fd, c, st, arg) for each connection a new image is to get */
typedef void (*inherit_walk)(void *ctx, inherit_fn f, void *arg);

struct exec_env {
	char **envp;  /* the environment to exec with */
	void *map;    /* its memory, or NULL (envp is the caller's) */
	size_t size;
	int aborting; /* the connections are marked SMCR_LIB_ABORT */
};

/* exec_env_inherit: envp with SMCR_INHERIT naming the connections walk gives (in its
 * own mapping), their library fds left open across an exec; envp itself where walk
 * gives none */
struct exec_env exec_env_inherit(char *const envp[], inherit_walk walk, void *ctx);

/* exec_env_close: the library's fds of the connections walk gives close on exec
 * again, and the copy of the environment goes */
void exec_env_close(struct exec_env *e, inherit_walk walk, void *ctx);
