/* fdtable.c: the fd table and the reference counts of the objects it points to. The
 * table is one anonymous mapping sized by RLIMIT_NOFILE (untouched pages cost nothing). */
#include "fdtable.h"

#include <sys/mman.h>
#include <sys/resource.h>

_Atomic(struct obj *) *smcr_fdt;
int smcr_fdt_size;
atomic_int smcr_fdt_high;

#define FDT_MAX (1 << 20)
#define FDT_MIN (1 << 16)

void fdt_init(void)
{
	struct rlimit rl;
	size_t n = FDT_MIN;

	if (smcr_fdt)
		return;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		rlim_t m = rl.rlim_max;
		if (m == RLIM_INFINITY || m > FDT_MAX)
			m = FDT_MAX;
		if (m > n)
			n = m;
	}
	void *p = mmap(NULL, n * sizeof(*smcr_fdt), PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return; /* the library stays a pass-through */
	smcr_fdt = p;
	smcr_fdt_size = (int)n;
}

void obj_init(struct obj *o, int kind, const struct obj_ops *ops)
{
	o->kind = kind;
	o->ops = ops;
	atomic_init(&o->fdrefs, 0);
	atomic_init(&o->refs, 1);
}

void obj_get(struct obj *o)
{
	atomic_fetch_add(&o->refs, 1);
}

void obj_put(struct obj *o)
{
	if (atomic_fetch_sub(&o->refs, 1) == 1)
		o->ops->free(o);
}

void fdt_release(struct obj *o)
{
	if (atomic_fetch_sub(&o->fdrefs, 1) == 1)
		o->ops->last_close(o);
	obj_put(o);
}

int fdt_install(int fd, struct obj *o)
{
	if ((unsigned)fd >= (unsigned)smcr_fdt_size)
		return -1;
	atomic_fetch_add(&o->fdrefs, 1);
	obj_get(o);
	int high = atomic_load_explicit(&smcr_fdt_high, memory_order_relaxed);
	while (fd >= high && !atomic_compare_exchange_weak(&smcr_fdt_high, &high, fd + 1))
		;
	struct obj *old = atomic_exchange(&smcr_fdt[fd], o);
	if (old)
		fdt_release(old);
	return 0;
}

struct obj *fdt_take(int fd)
{
	if ((unsigned)fd >= (unsigned)smcr_fdt_size)
		return NULL;
	if (!atomic_load_explicit(&smcr_fdt[fd], memory_order_relaxed))
		return NULL;
	return atomic_exchange(&smcr_fdt[fd], NULL);
}

void fdt_forget(int fd)
{
	struct obj *o = fdt_take(fd);
	if (o)
		fdt_release(o);
}
