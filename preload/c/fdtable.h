/* fdtable.h: the library's view of file descriptors: a flat array indexed by fd, read
 * without locks, pointing at the object (connection, listener, epoll set) behind it. */
#pragma once

#include <stdatomic.h>
#include <stddef.h>

enum obj_kind {
	OBJ_CONN = 1,     /* a TCP socket offered to smcrd: pending, accelerated, fallen back */
	OBJ_LISTENER = 2, /* a listening socket registered with smcrd */
	OBJ_EPOLL = 3,    /* an epoll set with emulated members */
};

struct obj;

struct obj_ops {
	void (*last_close)(struct obj *); /* the program closed its last alias */
	void (*free)(struct obj *);       /* the last reference is gone */
	/* own_fds writes the fds the library holds for the object (at most
	 * OBJ_MAX_OWN_FDS) and returns how many: closefrom and close_range keep them. */
	int (*own_fds)(struct obj *, int *out);
};

#define OBJ_MAX_OWN_FDS 10

/* struct obj heads every object. fdrefs counts the fd table slots (aliases made by
 * dup and friends share one object); refs counts every reference, slots included. */
struct obj {
	int kind;
	const struct obj_ops *ops;
	atomic_int fdrefs;
	atomic_int refs;
};

extern _Atomic(struct obj *) *smcr_fdt;
extern int smcr_fdt_size;
extern atomic_int smcr_fdt_high; /* above every fd ever installed */

void fdt_init(void);

static inline struct obj *fdt_get(int fd)
{
	if ((unsigned)fd >= (unsigned)smcr_fdt_size)
		return NULL;
	return atomic_load_explicit(&smcr_fdt[fd], memory_order_acquire);
}

void obj_init(struct obj *o, int kind, const struct obj_ops *ops);
void obj_get(struct obj *o);
void obj_put(struct obj *o);

/* fdt_install puts o at fd as one more alias; it returns -1 if fd is out of the
 * table's range (the object is then not installed). A stale object found there (an
 * fd closed behind the library's back) is released first. */
int fdt_install(int fd, struct obj *o);
/* fdt_take removes the object at fd and returns it (its alias still counted). */
struct obj *fdt_take(int fd);
/* fdt_release drops one alias taken with fdt_take. */
void fdt_release(struct obj *o);
/* fdt_forget drops whatever the table holds for fd: for calls that return a new fd. */
void fdt_forget(int fd);
