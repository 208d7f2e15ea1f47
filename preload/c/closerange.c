/* closerange.c: closefrom and close_range, as servers call them before an exec
 * (sshd closes every fd above its own before it execs itself again for each
 * connection). The fds in the range that the program knows go through close, so
 * their connections end as on any close; the library's own fds behind a
 * connection, listener or epoll set that the program keeps open below or above the
 * range stay open, and so does the process's eventfd: closing them would cut the
 * connection from smcrd, and an exec after it could not carry the connection over
 * (exec.c). A vfork'd child (Python's subprocess closes every fd it does not pass
 * so) closes its fds and nothing else: the library's tables are its parent's. */
#include <errno.h>
#include <limits.h>
#include <linux/close_range.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "channel.h"
#include "fdtable.h"
#include "real.h"

#define EXPORT __attribute__((visibility("default")))

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

/* kept collects, sorted, the library's fds of every object the program holds
 * outside [first, last]; *n their count. NULL (n = 0) if there are none. */
static int *kept(unsigned first, unsigned last, int *n)
{
	int high = atomic_load(&smcr_fdt_high), cap = 0;
	int *out = NULL;
	*n = 0;
	for (int fd = 0; fd < high; fd++) {
		struct obj *o = fdt_get(fd);
		if (!o || !o->ops->own_fds || ((unsigned)fd >= first && (unsigned)fd <= last))
			continue;
		if (*n + OBJ_MAX_OWN_FDS > cap) {
			cap = 2 * cap + OBJ_MAX_OWN_FDS;
			int *grown = realloc(out, (size_t)cap * sizeof(int));
			if (!grown)
				break; /* keep what is known: closing fewer is the safe side */
			out = grown;
		}
		*n += o->ops->own_fds(o, out + *n);
	}
	/* the process's eventfd and wake page, which the next offer passes to smcrd */
	const struct proc_wake *w = channel_peek_proc_wake();
	if (w) {
		int *grown = realloc(out, (size_t)(*n + 2) * sizeof(int));
		if (grown) {
			out = grown;
			out[(*n)++] = w->efd;
			out[(*n)++] = w->page_fd;
		}
	}
	if (out)
		qsort(out, (size_t)*n, sizeof(int), cmp_int);
	return out;
}

/* close_gap closes [a, b], none of them the library's or the program's known fds */
static void close_gap(unsigned a, unsigned b)
{
	if (a > b)
		return;
	if (syscall(SYS_close_range, a, b, 0) == 0 || errno != ENOSYS)
		return;
	long max = sysconf(_SC_OPEN_MAX);
	for (unsigned fd = a; fd <= b && (long)fd < max; fd++)
		R(close)((int)fd);
}

static void close_span(unsigned first, unsigned last)
{
	if (smcr_vforked()) {
		/* the tables are the parent's: its fds there stay open and known */
		close_gap(first, last);
		return;
	}
	int n;
	int *keep = kept(first, last, &n);
	int high = atomic_load(&smcr_fdt_high);
	for (unsigned fd = first; fd <= last && (int)fd < high; fd++)
		if (fdt_get((int)fd))
			close((int)fd);
	unsigned long long from = first; /* 64 bits: past UINT_MAX without wrapping */
	for (int i = 0; i < n; i++) {
		unsigned long long k = (unsigned)keep[i];
		if (k < from || k > last)
			continue;
		if (k > from)
			close_gap((unsigned)from, (unsigned)(k - 1));
		from = k + 1;
	}
	if (from <= last)
		close_gap((unsigned)from, last);
	free(keep);
}

EXPORT void closefrom(int lowfd)
{
	close_span(lowfd < 0 ? 0 : (unsigned)lowfd, ~0U);
}

EXPORT int close_range(unsigned first, unsigned last, int flags)
{
	if (first > last || (flags & ~(CLOSE_RANGE_UNSHARE | CLOSE_RANGE_CLOEXEC))) {
		errno = EINVAL;
		return -1;
	}
	/* Marking close-on-exec closes nothing; the library's fds carry the mark
	 * already, and an exec that carries a connection clears it (exec.c). */
	if (flags & CLOSE_RANGE_CLOEXEC)
		return (int)syscall(SYS_close_range, first, last, flags);
	if (flags & CLOSE_RANGE_UNSHARE) {
		/* unshare the table (an empty range closes nothing), then close */
		if (syscall(SYS_close_range, ~0U, ~0U, CLOSE_RANGE_UNSHARE) < 0)
			return -1;
	}
	close_span(first, last);
	return 0;
}
