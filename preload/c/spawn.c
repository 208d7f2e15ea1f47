/* spawn.c: posix_spawn, posix_spawnp, system and popen start a program without the
 * library's fork and exec: glibc makes the child with its own clone and runs its
 * internal execve, and system and popen call its internal posix_spawn. So here, in
 * the parent, before the child exists, each accelerated (or pending) connection
 * whose socket the child gets — not close-on-exec, or given to it by the spawn's
 * file actions, which the library learns as the program adds them — either:
 *   - goes with it, as across exec (exec.c): where the child's image loads the
 *     library and every fd behind the connection reaches the child, the connection
 *     is named in SMCR_INHERIT at its fds in the child and becomes shared, as after
 *     fork; or
 *   - is handed back to its kernel socket first (conn_release_or_abort), which both
 *     processes then use as plain TCP: into an image without the library, where the
 *     file actions close or replace an fd behind it, for file actions the library
 *     did not see made, and for popen (its stream's child is glibc's to wait for).
 * system runs its shell through this file's posix_spawn where a connection would
 * go with it, as glibc's does (POSIX's signal handling included). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "channel.h"
#include "conn.h"
#include "exec.h"
#include "fdtable.h"
#include "real.h"

#define EXPORT __attribute__((visibility("default")))

extern char **environ;

/* ---- file actions: what each posix_spawn_file_actions_t does to the child's fds,
 * recorded as the program adds them (the type is opaque). */

enum fa_kind { FA_CLOSE, FA_OPEN, FA_DUP2, FA_CLOSEFROM };

struct fa_op {
	enum fa_kind kind;
	int fd, newfd; /* FA_DUP2: fd onto newfd; else fd (FA_CLOSEFROM: the lowest) */
};

struct fa_rec {
	const posix_spawn_file_actions_t *fa;
	struct fa_op *ops;
	int n, cap;
	int lost; /* an op could not be recorded */
	struct fa_rec *next;
};

static pthread_mutex_t fa_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fa_rec *fa_recs;

/* fa_find: fa's record, or NULL; fa_mu held */
static struct fa_rec *fa_find(const posix_spawn_file_actions_t *fa)
{
	for (struct fa_rec *r = fa_recs; r; r = r->next)
		if (r->fa == fa)
			return r;
	return NULL;
}

static void fa_forget(const posix_spawn_file_actions_t *fa)
{
	pthread_mutex_lock(&fa_mu);
	for (struct fa_rec **p = &fa_recs; *p; p = &(*p)->next)
		if ((*p)->fa == fa) {
			struct fa_rec *r = *p;
			*p = r->next;
			free(r->ops);
			free(r);
			break;
		}
	pthread_mutex_unlock(&fa_mu);
}

static void fa_start(const posix_spawn_file_actions_t *fa)
{
	fa_forget(fa);
	struct fa_rec *r = calloc(1, sizeof(*r));
	if (!r)
		return; /* unknown at the spawn: its connections are released */
	r->fa = fa;
	pthread_mutex_lock(&fa_mu);
	r->next = fa_recs;
	fa_recs = r;
	pthread_mutex_unlock(&fa_mu);
}

static void fa_add(const posix_spawn_file_actions_t *fa, enum fa_kind kind, int fd, int newfd)
{
	pthread_mutex_lock(&fa_mu);
	struct fa_rec *r = fa_find(fa);
	if (r && r->n == r->cap) {
		int cap = r->cap ? 2 * r->cap : 8;
		struct fa_op *ops = realloc(r->ops, (size_t)cap * sizeof(*ops));
		if (ops) {
			r->ops = ops;
			r->cap = cap;
		}
	}
	if (r && r->n < r->cap)
		r->ops[r->n++] = (struct fa_op){kind, fd, newfd};
	else if (r)
		r->lost = 1;
	pthread_mutex_unlock(&fa_mu);
}

EXPORT int posix_spawn_file_actions_init(posix_spawn_file_actions_t *fa)
{
	int r = R(posix_spawn_file_actions_init)(fa);
	if (r == 0)
		fa_start(fa);
	return r;
}

EXPORT int posix_spawn_file_actions_destroy(posix_spawn_file_actions_t *fa)
{
	fa_forget(fa);
	return R(posix_spawn_file_actions_destroy)(fa);
}

EXPORT int posix_spawn_file_actions_addclose(posix_spawn_file_actions_t *fa, int fd)
{
	int r = R(posix_spawn_file_actions_addclose)(fa, fd);
	if (r == 0)
		fa_add(fa, FA_CLOSE, fd, -1);
	return r;
}

EXPORT int posix_spawn_file_actions_addopen(posix_spawn_file_actions_t *fa, int fd, const char *path, int oflag,
					    mode_t mode)
{
	int r = R(posix_spawn_file_actions_addopen)(fa, fd, path, oflag, mode);
	if (r == 0)
		fa_add(fa, FA_OPEN, fd, -1);
	return r;
}

EXPORT int posix_spawn_file_actions_adddup2(posix_spawn_file_actions_t *fa, int fd, int newfd)
{
	int r = R(posix_spawn_file_actions_adddup2)(fa, fd, newfd);
	if (r == 0)
		fa_add(fa, FA_DUP2, fd, newfd);
	return r;
}

EXPORT int posix_spawn_file_actions_addclosefrom_np(posix_spawn_file_actions_t *fa, int from)
{
	int (*f)(posix_spawn_file_actions_t *, int) = R(posix_spawn_file_actions_addclosefrom_np);
	if (!f)
		return ENOSYS;
	int r = f(fa, from);
	if (r == 0)
		fa_add(fa, FA_CLOSEFROM, from, -1);
	return r;
}

/* ---- the child's fds */

/* struct child: which accelerated connection each of the child's fds below n holds
 * (conn, NULL for anything else), the parent's fd that gave it (pfd), and the
 * file actions that run first */
struct child {
	int n;
	struct conn **conn;
	int *pfd;
	struct fa_op *ops;
	int nops;
	int known; /* the file actions, if any, are known */
};

/* child_touched: whether the file actions close or replace the child's fd */
static int child_touched(const struct child *ch, int fd)
{
	for (int i = 0; i < ch->nops; i++) {
		const struct fa_op *o = &ch->ops[i];
		if ((o->kind == FA_CLOSEFROM && fd >= o->fd) ||
		    ((o->kind == FA_CLOSE || o->kind == FA_OPEN) && o->fd == fd) ||
		    (o->kind == FA_DUP2 && o->newfd == fd && o->fd != fd))
			return 1;
	}
	return 0;
}

/* child_goes_along: whether c can go with the child as across exec: its image has
 * the library (lib) and every fd of the library behind c reaches it */
static int child_goes_along(const struct child *ch, struct conn *c, int lib)
{
	if (!lib || !ch->known)
		return 0;
	int fds[EXEC_CONN_FDS];
	exec_conn_fds(c, fds);
	for (int i = 0; i < EXEC_CONN_FDS; i++)
		if (fds[i] >= 0 && child_touched(ch, fds[i]))
			return 0;
	return 1;
}

static void child_free(struct child *ch)
{
	free(ch->conn);
	free(ch->pfd);
	free(ch->ops);
}

/* child_map works out the child's fds from the parent's and the file actions fa
 * (NULL: none): 0, or -1 with nothing accelerated passed (nothing to do) */
static int child_map(struct child *ch, const posix_spawn_file_actions_t *fa)
{
	*ch = (struct child){.known = 1};
	if (!smcr_fdt || smcr_disabled)
		return -1;
	int high = atomic_load(&smcr_fdt_high);
	if (fa) {
		pthread_mutex_lock(&fa_mu);
		struct fa_rec *r = fa_find(fa);
		ch->known = r && !r->lost;
		if (ch->known && r->n) {
			ch->ops = malloc((size_t)r->n * sizeof(*ch->ops));
			if (ch->ops) {
				memcpy(ch->ops, r->ops, (size_t)r->n * sizeof(*ch->ops));
				ch->nops = r->n;
			} else {
				ch->known = 0;
			}
		}
		pthread_mutex_unlock(&fa_mu);
	}
	ch->n = high;
	for (int i = 0; i < ch->nops; i++) {
		const struct fa_op *o = &ch->ops[i];
		int top = (o->kind == FA_DUP2 ? (o->fd > o->newfd ? o->fd : o->newfd) : o->fd) + 1;
		if (o->kind != FA_CLOSEFROM && top > ch->n)
			ch->n = top;
	}
	ch->conn = calloc((size_t)ch->n + 1, sizeof(*ch->conn));
	ch->pfd = calloc((size_t)ch->n + 1, sizeof(*ch->pfd));
	if (!ch->conn || !ch->pfd) {
		child_free(ch);
		return -1;
	}
	/* every connection the child has before the exec, and whether its fd
	 * survives the exec (keep) */
	unsigned char *keep = calloc((size_t)ch->n + 1, 1);
	if (!keep) {
		child_free(ch);
		return -1;
	}
	for (int fd = 0; fd < high; fd++) {
		struct conn *c = conn_of(fdt_get(fd));
		int fl = c && exec_pass_state(c) ? R(fcntl)(fd, F_GETFD) : -1;
		if (fl >= 0) {
			ch->conn[fd] = c;
			ch->pfd[fd] = fd;
			keep[fd] = !(fl & FD_CLOEXEC);
		}
	}
	/* the file actions, in order, as the child runs them */
	for (int i = 0; i < ch->nops; i++) {
		const struct fa_op *o = &ch->ops[i];
		switch (o->kind) {
		case FA_CLOSE:
		case FA_OPEN:
			ch->conn[o->fd] = NULL;
			break;
		case FA_CLOSEFROM:
			for (int fd = o->fd; fd < ch->n; fd++)
				ch->conn[fd] = NULL;
			break;
		case FA_DUP2:
			/* the copy survives the exec; dup2 onto itself clears
			 * close-on-exec (Austin Group issue #411) */
			ch->conn[o->newfd] = ch->conn[o->fd];
			ch->pfd[o->newfd] = ch->pfd[o->fd];
			keep[o->newfd] = 1;
			break;
		}
	}
	int any = 0;
	for (int fd = 0; fd < ch->n; fd++) {
		if (!keep[fd])
			ch->conn[fd] = NULL;
		any |= ch->conn[fd] != NULL;
	}
	free(keep);
	if (!any) {
		child_free(ch);
		return -1;
	}
	return 0;
}

struct spawn_walk {
	const struct child *ch;
	int lib;
};

/* each_going: the connections that go with the child, at its fds */
static void each_going(void *ctx, inherit_fn f, void *arg)
{
	const struct spawn_walk *w = ctx;
	for (int fd = 0; fd < w->ch->n; fd++) {
		struct conn *c = w->ch->conn[fd];
		int st = c ? exec_pass_state(c) : 0;
		if (st && child_goes_along(w->ch, c, w->lib))
			f(fd, c, st, arg);
	}
}

/* spawn_prepare: each connection the child gets goes with it (made shared) or is
 * released (a pending one decided first); the environment to spawn with */
static struct exec_env spawn_prepare(const struct child *ch, char *const envp[], struct spawn_walk *w)
{
	w->ch = ch;
	w->lib = exec_image_has_library(envp);
	for (int fd = 0; fd < ch->n; fd++) {
		struct conn *c = ch->conn[fd];
		if (!c)
			continue;
		if (child_goes_along(ch, c, w->lib)) {
			conn_set_shared(c);
			continue;
		}
		if (atomic_load(&c->state) == CS_PENDING)
			conn_decide(c, ch->pfd[fd], 1);
		conn_release_or_abort(c, ch->pfd[fd]);
	}
	return exec_env_inherit(envp, each_going, w);
}

typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *,
			char *const[], char *const[]);

static int spawn_with(spawn_fn real_spawn, pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
		      const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	struct child ch;
	if (child_map(&ch, fa) < 0)
		return real_spawn(pid, path, fa, attr, argv, envp);
	struct spawn_walk w;
	struct exec_env e = spawn_prepare(&ch, envp, &w);
	int r = real_spawn(pid, path, fa, attr, argv, e.envp);
	exec_env_close(&e, each_going, &w);
	child_free(&ch);
	return r;
}

EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
		       const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	return spawn_with(R(posix_spawn), pid, path, fa, attr, argv, envp);
}

EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
			const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	return spawn_with(R(posix_spawnp), pid, file, fa, attr, argv, envp);
}

/* ---- system and popen */

/* system_mu and system_users: concurrent calls ignore SIGINT and SIGQUIT once, and
 * the last to return restores them (as glibc's system) */
static pthread_mutex_t system_mu = PTHREAD_MUTEX_INITIALIZER;
static int system_users;
static struct sigaction system_intr, system_quit;

EXPORT int system(const char *cmd)
{
	if (!cmd || exec_inheritable() == 0)
		return R(system)(cmd);
	struct sigaction ign = {.sa_handler = SIG_IGN};
	sigemptyset(&ign.sa_mask);
	pthread_mutex_lock(&system_mu);
	if (system_users++ == 0) {
		sigaction(SIGINT, &ign, &system_intr);
		sigaction(SIGQUIT, &ign, &system_quit);
	}
	pthread_mutex_unlock(&system_mu);
	sigset_t chld, old;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, &old);

	/* the child: the caller's mask, SIGINT and SIGQUIT at their defaults unless the
	 * caller ignored them */
	sigset_t def;
	sigemptyset(&def);
	if (system_intr.sa_handler != SIG_IGN)
		sigaddset(&def, SIGINT);
	if (system_quit.sa_handler != SIG_IGN)
		sigaddset(&def, SIGQUIT);
	posix_spawnattr_t attr;
	posix_spawnattr_init(&attr);
	posix_spawnattr_setsigmask(&attr, &old);
	posix_spawnattr_setsigdefault(&attr, &def);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
	char *argv[] = {"sh", "-c", (char *)cmd, NULL};
	pid_t pid;
	int status, err = spawn_with(R(posix_spawn), &pid, "/bin/sh", NULL, &attr, argv, environ);
	posix_spawnattr_destroy(&attr);
	if (err == 0) {
		while (waitpid(pid, &status, 0) < 0)
			if (errno != EINTR) {
				status = -1;
				break;
			}
	} else {
		status = W_EXITCODE(127, 0); /* as a shell that could not run */
	}

	pthread_mutex_lock(&system_mu);
	if (--system_users == 0) {
		sigaction(SIGINT, &system_intr, NULL);
		sigaction(SIGQUIT, &system_quit, NULL);
	}
	pthread_mutex_unlock(&system_mu);
	sigprocmask(SIG_SETMASK, &old, NULL);
	return status;
}

static void release_passed(int fd, struct conn *c, int st, void *arg)
{
	(void)arg;
	if (st == CS_PENDING)
		conn_decide(c, fd, 1);
	conn_release_or_abort(c, fd);
}

/* each_passed: the program's fds that a child without file actions gets */
static void each_passed(void *ctx, inherit_fn f, void *arg)
{
	(void)ctx;
	struct child ch;
	if (child_map(&ch, NULL) < 0)
		return;
	for (int fd = 0; fd < ch.n; fd++)
		if (ch.conn[fd])
			f(fd, ch.conn[fd], exec_pass_state(ch.conn[fd]), arg);
	child_free(&ch);
}

EXPORT FILE *popen(const char *cmd, const char *type)
{
	if (exec_inheritable())
		each_passed(NULL, release_passed, NULL);
	return R(popen)(cmd, type);
}
