/* exec.c: an accelerated connection lives on across exec. Before an exec whose new
 * image loads the library too (LD_PRELOAD in the environment it gets), the descriptors
 * behind each connection whose socket survives the exec (its channel, shared area,
 * eventfds) are left open across it and named in SMCR_INHERIT; the new image's library
 * adopts them at start, with the bytes still in the rings. smcrd sees nothing: the
 * channel never closes. Before an exec into an image without the library, each such
 * connection is handed back to its kernel socket (conn_release), which the new image
 * reads and writes as plain TCP, no byte lost. Where that cannot be, the connection
 * is marked SMCR_LIB_ABORT: the exec closes its channel, and smcrd ends the
 * connection with a reset, of the socket too, so that the new image reads
 * ECONNRESET rather than wait on a TCP connection that carries nothing, and the
 * peer never takes the cut stream for a whole one. */
#include "exec.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "channel.h"
#include "conn.h"
#include "fdtable.h"
#include "real.h"

#define EXPORT __attribute__((visibility("default")))

extern char **environ;

static const char inherit_var[] = "SMCR_INHERIT=";

/* One inherited fd: "fd,state,flags,chan,memfd,efd_lib,wake_fd,efd_dtx,efd_drx,
 * peer_memfd,peer_efd_lib,tx_file,rx_file". */
#define INHERIT_FIELDS 13
#define CONN_FDS EXEC_CONN_FDS
_Static_assert(CONN_FDS == INHERIT_FIELDS - 3, "SMCR_INHERIT names the connection fds");
#define INHERIT_ENTRY_MAX (INHERIT_FIELDS * 12)

enum {
	INH_NONBLOCK = 1,
	INH_SHUT_RD = 2,
	INH_SHUT_WR = 4,
	INH_SHARED = 8,
	INH_ERR_TAKEN = 16,
	INH_OOBINLINE = 32,
};

/* env_get: the value of name in envp, or NULL */
static const char *env_get(char *const envp[], const char *name)
{
	size_t n = strlen(name);
	for (size_t i = 0; envp && envp[i]; i++)
		if (strncmp(envp[i], name, n) == 0 && envp[i][n] == '=')
			return envp[i] + n + 1;
	return NULL;
}

int exec_image_has_library(char *const envp[])
{
	const char *off = env_get(envp, "SMCR_DIRECT");
	if (off && strcmp(off, "0") == 0)
		return 0;
	const char *pre = env_get(envp, "LD_PRELOAD");
	if (pre && strstr(pre, "smcr-preload"))
		return 1;
	int fd = open("/etc/ld.so.preload", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	char buf[4096];
	ssize_t n = R(read)(fd, buf, sizeof(buf) - 1);
	R(close)(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	return strstr(buf, "smcr-preload") != NULL;
}

static void set_cloexec(int fd, int on)
{
	if (fd < 0)
		return;
	int fl = R(fcntl)(fd, F_GETFD);
	if (fl >= 0)
		R(fcntl)(fd, F_SETFD, on ? fl | FD_CLOEXEC : fl & ~FD_CLOEXEC);
}

void exec_conn_fds(struct conn *c, int fds[EXEC_CONN_FDS])
{
	int v[CONN_FDS] = {c->chan,        c->memfd,        c->efd_lib, c->wake_fd, c->efd_dtx, c->efd_drx,
			   c->peer_memfd, c->peer_efd_lib, c->tx_file, c->rx_file};
	memcpy(fds, v, sizeof(v));
}

/* inheritable: the state to pass for the connection at fd, which survives the exec,
 * or 0 (nothing to pass: plain TCP, or the library's fds are gone) */
static int inheritable(int fd, struct conn *c)
{
	int fl = R(fcntl)(fd, F_GETFD);
	if (fl < 0 || (fl & FD_CLOEXEC))
		return 0;
	return exec_pass_state(c);
}

int exec_pass_state(struct conn *c)
{
	if (c->chan < 0)
		return 0;
	int st = atomic_load(&c->state);
	if (st == CS_ACCEL && atomic_load(&c->reset))
		return CS_RESET;
	return st == CS_PENDING || st == CS_ACCEL ? st : 0;
}

/* each_own: the program's own fds that survive its exec */
static void each_own(void *ctx, inherit_fn f, void *arg)
{
	(void)ctx;
	int high = atomic_load(&smcr_fdt_high);
	for (int fd = 0; fd < high; fd++) {
		struct conn *c = conn_of(fdt_get(fd));
		int st = c ? inheritable(fd, c) : 0;
		if (st)
			f(fd, c, st, arg);
	}
}

static void count_one(int fd, struct conn *c, int st, void *arg)
{
	(void)fd, (void)c, (void)st;
	(*(size_t *)arg)++;
}

size_t exec_inheritable(void)
{
	size_t k = 0;
	if (smcr_fdt && !smcr_disabled)
		each_own(NULL, count_one, &k);
	return k;
}

struct writer {
	char *p, *end;
};

static void write_one(int fd, struct conn *c, int st, void *arg)
{
	struct writer *w = arg;
	int fds[CONN_FDS];
	exec_conn_fds(c, fds);
	unsigned flags = (atomic_load(&c->user_nonblock) ? INH_NONBLOCK : 0) |
			 (atomic_load(&c->shut_rd) ? INH_SHUT_RD : 0) | (atomic_load(&c->shut_wr) ? INH_SHUT_WR : 0) |
			 (conn_shared(c) ? INH_SHARED : 0) | (atomic_load(&c->err_taken) ? INH_ERR_TAKEN : 0) |
			 (atomic_load(&c->oob_inline) ? INH_OOBINLINE : 0);
	int n = snprintf(w->p, (size_t)(w->end - w->p), "%s%d,%d,%u,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d",
			 w->p[-1] == '=' ? "" : ";", fd, st, flags, fds[0], fds[1], fds[2], fds[3], fds[4],
			 fds[5], fds[6], fds[7], fds[8], fds[9]);
	if (n > 0 && n < w->end - w->p)
		w->p += n;
	for (int i = 0; i < CONN_FDS; i++)
		set_cloexec(fds[i], 0);
}

/* mark_abort sets (arg non-NULL) or clears SMCR_LIB_ABORT on an accelerated one, and
 * gives its socket the program's O_NONBLOCK for the new image (or takes it back) */
static void mark_abort(int fd, struct conn *c, int st, void *arg)
{
	if (st != CS_ACCEL || !c->sh)
		return;
	if (arg) {
		atomic_fetch_or(&c->sh->lib_flags, SMCR_LIB_ABORT);
		conn_restore_flags(c, fd);
	} else {
		atomic_fetch_and(&c->sh->lib_flags, ~SMCR_LIB_ABORT);
		int fl = R(fcntl)(fd, F_GETFL);
		if (fl >= 0)
			R(fcntl)(fd, F_SETFL, fl | O_NONBLOCK);
	}
}

/* release_one hands an accelerated one back to its kernel socket, which the new image
 * then uses as plain TCP (conn_release); where that cannot be, it is marked
 * SMCR_LIB_ABORT (mark_abort) */
static void release_one(int fd, struct conn *c, int st, void *arg)
{
	if (st == CS_ACCEL && c->sh && conn_release(c, fd) < 0)
		mark_abort(fd, c, st, arg);
}

static void restore_one(int fd, struct conn *c, int st, void *arg)
{
	(void)fd, (void)st, (void)arg;
	int fds[CONN_FDS];
	exec_conn_fds(c, fds);
	for (int i = 0; i < CONN_FDS; i++)
		set_cloexec(fds[i], 1);
}

struct exec_env exec_env_inherit(char *const envp[], inherit_walk walk, void *ctx)
{
	struct exec_env e = {.envp = (char **)envp};
	size_t k = 0;
	walk(ctx, count_one, &k);
	if (k == 0)
		return e;
	size_t n = 0;
	while (envp && envp[n])
		n++;
	e.size = (n + 2) * sizeof(char *) + sizeof(inherit_var) + k * INHERIT_ENTRY_MAX;
	e.map = mmap(NULL, e.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (e.map == MAP_FAILED) {
		e.map = NULL;
		return e;
	}
	char **out = e.map;
	char *str = (char *)(out + n + 2);
	size_t j = 0;
	for (size_t i = 0; i < n; i++)
		if (strncmp(envp[i], inherit_var, sizeof(inherit_var) - 1) != 0)
			out[j++] = envp[i];
	memcpy(str, inherit_var, sizeof(inherit_var));
	struct writer w = {.p = str + sizeof(inherit_var) - 1, .end = (char *)e.map + e.size};
	walk(ctx, write_one, &w);
	out[j++] = str;
	out[j] = NULL;
	e.envp = out;
	return e;
}

void exec_env_close(struct exec_env *e, inherit_walk walk, void *ctx)
{
	if (!e->map)
		return;
	walk(ctx, restore_one, NULL);
	munmap(e->map, e->size);
	e->map = NULL;
}

/* exec_prepare makes the environment to exec with: envp itself when nothing is
 * passed, else a copy with SMCR_INHERIT (in its own mapping: a vfork child may call
 * this). The library's fds behind it are left open across the exec. */
static struct exec_env exec_prepare(char *const envp[])
{
	struct exec_env e = {.envp = (char **)envp};
	if (exec_inheritable() == 0)
		return e;
	if (!exec_image_has_library(envp)) {
		each_own(NULL, release_one, &e);
		e.aborting = 1;
		return e;
	}
	return exec_env_inherit(envp, each_own, NULL);
}

/* exec_failed: the exec returned: the library's fds close on exec again */
static void exec_failed(struct exec_env *e)
{
	int err = errno;
	if (e->aborting)
		each_own(NULL, mark_abort, NULL);
	exec_env_close(e, each_own, NULL);
	errno = err;
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	struct exec_env e = exec_prepare(envp);
	int r = R(execve)(path, argv, e.envp);
	exec_failed(&e);
	return r;
}

EXPORT int execv(const char *path, char *const argv[])
{
	return execve(path, argv, environ);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	struct exec_env e = exec_prepare(envp);
	int r = R(execvpe)(file, argv, e.envp);
	exec_failed(&e);
	return r;
}

EXPORT int execvp(const char *file, char *const argv[])
{
	return execvpe(file, argv, environ);
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	struct exec_env e = exec_prepare(envp);
	int r = R(fexecve)(fd, argv, e.envp);
	exec_failed(&e);
	return r;
}

EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[], int flags)
{
	if (!R(execveat)) {
		errno = ENOSYS;
		return -1;
	}
	struct exec_env e = exec_prepare(envp);
	int r = R(execveat)(dirfd, path, argv, e.envp, flags);
	exec_failed(&e);
	return r;
}

/* The execl family: the arguments into an array on the stack, then the v form. */
#define COLLECT_ARGS(arg0, ap, argv, envp_out)                                   \
	size_t argc_ = 1;                                                        \
	va_list cp_;                                                             \
	va_copy(cp_, ap);                                                        \
	while (va_arg(cp_, char *))                                              \
		argc_++;                                                         \
	va_end(cp_);                                                             \
	char *argv[argc_ + 1];                                                   \
	argv[0] = (char *)(arg0);                                                \
	for (size_t i_ = 1; i_ <= argc_; i_++)                                   \
		argv[i_] = va_arg(ap, char *);                                   \
	envp_out

EXPORT int execl(const char *path, const char *arg, ...)
{
	va_list ap;
	va_start(ap, arg);
	COLLECT_ARGS(arg, ap, argv, );
	va_end(ap);
	return execve(path, argv, environ);
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
	va_list ap;
	va_start(ap, arg);
	COLLECT_ARGS(arg, ap, argv, );
	va_end(ap);
	return execvpe(file, argv, environ);
}

EXPORT int execle(const char *path, const char *arg, ...)
{
	va_list ap;
	va_start(ap, arg);
	COLLECT_ARGS(arg, ap, argv, char *const *envp = va_arg(ap, char *const *));
	va_end(ap);
	return execve(path, argv, envp);
}

/* parse_ints reads n comma-separated ints from s: the rest of s, or NULL */
static const char *parse_ints(const char *s, int *v, int n)
{
	for (int i = 0; i < n; i++) {
		char *end;
		long x = strtol(s, &end, 10);
		if (end == s || x < -1 || x > 0x7fffffff || (i < n - 1 && *end != ','))
			return NULL;
		v[i] = (int)x;
		s = end + (i < n - 1);
	}
	return s;
}

/* adopt_one makes the connection of one entry, or finds it among the fds adopted
 * before (aliases share one connection), and installs it at fd. */
static void adopt_one(const int *v)
{
	int fd = v[0], st = v[1], flags = v[2], chan = v[3];
	/* memfd, efd_lib, wake_fd, efd_dtx, efd_drx, peer_memfd, peer_efd_lib, tx_file,
	 * rx_file */
	const int *fds = v + 4;
	if (R(fcntl)(fd, F_GETFD) < 0 || R(fcntl)(chan, F_GETFD) < 0)
		return;
	/* the old image's process eventfd, which smcrd writes, becomes this one's */
	channel_adopt_proc_wake(fds[1], fds[2]);
	int high = atomic_load(&smcr_fdt_high);
	for (int i = 0; i < high; i++) {
		struct conn *c = conn_of(fdt_get(i));
		if (c && c->chan == chan) {
			fdt_install(fd, &c->o);
			return;
		}
	}
	struct conn *c = conn_new(chan, flags & INH_NONBLOCK, flags & INH_OOBINLINE);
	if (!c)
		return;
	if (flags & INH_SHARED)
		conn_set_shared(c);
	atomic_store(&c->shut_rd, !!(flags & INH_SHUT_RD));
	atomic_store(&c->shut_wr, !!(flags & INH_SHUT_WR));
	atomic_store(&c->err_taken, !!(flags & INH_ERR_TAKEN));
	c->efd_lib = fds[1];
	c->wake_fd = fds[2];
	c->wake = channel_map_wake(fds[2]);
	/* as DECIDED brought them: SHM's peer pair or SMCR's ring files after the three */
	/* (without the peer's wake page, which the old image closed once mapped) */
	int files = fds[7] >= 0, mode = fds[5] >= 0 ? SMCR_MODE_SHM : SMCR_MODE_SMCR;
	int area[6] = {fds[0], fds[3], fds[4], files ? fds[7] : fds[5], files ? fds[8] : fds[6], -1};
	int nfds = fds[5] >= 0 ? 6 : files ? 5 : 3;
	if (st == CS_ACCEL && conn_attach(c, mode, area, nfds) == 0) {
		atomic_store(&c->state, CS_ACCEL);
		if (!(flags & INH_SHARED)) {
			/* the threads of the old image that waited are gone */
			atomic_store(&c->sh->lib_waiters, 0);
			atomic_store(&c->sh->lib_pollers, 0);
		}
	} else if (st != CS_PENDING) {
		atomic_store(&c->state, CS_RESET);
		atomic_store(&c->reset, 1);
	}
	set_cloexec(chan, 1);
	set_cloexec(fds[1], 1);
	set_cloexec(fds[2], 1);
	for (int i = 0; i < nfds; i++) {
		if (area[i] < 0)
			continue;
		if (atomic_load(&c->state) == CS_ACCEL)
			set_cloexec(area[i], 1);
		else
			R(close)(area[i]); /* not the area the ABI says: the connection is reset */
	}
	fdt_install(fd, &c->o);
	obj_put(&c->o);
}

void exec_adopt(void)
{
	const char *s = getenv("SMCR_INHERIT");
	if (!s || !smcr_fdt)
		return;
	while (*s) {
		int v[INHERIT_FIELDS];
		const char *rest = parse_ints(s, v, INHERIT_FIELDS);
		if (!rest || (*rest && *rest != ';'))
			break;
		adopt_one(v);
		s = *rest ? rest + 1 : rest;
	}
	unsetenv("SMCR_INHERIT");
}
