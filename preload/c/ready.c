/* ready.c: epoll/poll/select for emulated sockets. An emulated socket's readiness
 * comes from conn_revents (its cursors and flags); the kernel waits on its wait
 * object instead (the channel while PENDING; while ACCEL, the process's eventfd, which
 * nobody drains: each write is an edge for every epoll instance holding it). Whoever
 * publishes to a connection with lib_pollers > 0 bumps the wake page's pub and writes
 * the eventfd only while the page counts sleepers: a wait counts itself there before
 * its last look at pub, and sleeps only if pub did not move (struct wakes). Plain
 * fds stay the kernel's, untouched. */
#include "ready.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "channel.h"
#include "real.h"
#include "ring.h"

/* ---- epoll sets */

struct eset;

/* An emulated member of an epoll set. Its kernel registrations carry
 * data.u64 = &member (| 1 for the channel's hang-up watch); members live in one
 * static array, so an event whose data points into it is the library's own. */
struct member {
	int in_use;
	struct eset *set;
	struct member *next_set, *next_conn;
	struct conn *c;
	int fd;
	uint32_t events;
	epoll_data_t data;
	int reg_wait; /* fd registered in the kernel set for readiness changes, or -1 */
	int reg_proc; /* ACCEL: the process eventfd counted in the set's procs, or -1 */
	int reg_chan; /* ACCEL: the channel, registered for hang-up only, or -1 */
	int pollers;  /* lib_pollers counted */
	uint32_t last_rev;
	uint64_t last_seq;
	uint64_t seen_seq; /* conn_seq at the last scan: a process wake marks it if moved */
	int kick, disarmed;
	/* EPOLL_CTL_DEL'd, its kernel registrations kept for an ADD that brings it
	 * back (programs like redis-benchmark delete and add a socket per request);
	 * it reports nothing and counts no pollers meanwhile */
	int parked;
	/* the set's ready list: members to look at in the next epoll_wait (those
	 * whose wait object fired, and level-triggered ones that were ready) */
	struct member *rnext, *rprev;
	int on_ready;
};

struct eset {
	struct obj o;
	int epfd;
	struct member *members;
	atomic_int nmembers;
	struct member *rhead, *rtail; /* the ready list */
	int wake_fd; /* an eventfd in the set (edge-triggered): marks from outside a wait */
	/* the process eventfds registered in the kernel set (one; more only for
	 * connections inherited across a fork), with their members, wake pages and
	 * the pages' pub at the last look */
	struct {
		int efd, members;
		struct smcr_wake *page;
		uint64_t seen;
	} procs[4];
	/* the set is itself waited on (poll, select, another set): its wake pages
	 * count it as a sleeper for good */
	atomic_int nested;
	atomic_int sleepers; /* threads past their scan, waiting in the kernel set */
};

/* ready list operations; ep_mu held */
static void ready_push(struct member *m)
{
	struct eset *s = m->set;
	if (m->on_ready)
		return;
	m->on_ready = 1;
	m->rnext = NULL;
	m->rprev = s->rtail;
	if (s->rtail)
		s->rtail->rnext = m;
	else
		s->rhead = m;
	s->rtail = m;
}

static void ready_remove(struct member *m)
{
	struct eset *s = m->set;
	if (!m->on_ready)
		return;
	if (m->rprev)
		m->rprev->rnext = m->rnext;
	else
		s->rhead = m->rnext;
	if (m->rnext)
		m->rnext->rprev = m->rprev;
	else
		s->rtail = m->rprev;
	m->on_ready = 0;
	m->rnext = m->rprev = NULL;
}

/* mark: the member's readiness may have changed */
static void mark(struct member *m)
{
	if (m->parked)
		return;
	m->kick = 1;
	ready_push(m);
}

/* mark_wake: mark, and wake a thread that waits on the set in the kernel (a
 * thread that has not scanned yet sees the mark: both hold ep_mu) */
static void mark_wake(struct member *m)
{
	struct eset *s = m->set;
	mark(m);
	if (!m->parked && s->wake_fd >= 0 && (atomic_load(&s->sleepers) || atomic_load(&s->nested)))
		ring_kick(s->wake_fd);
}

#define MAX_MEMBERS 65536
static struct member arena[MAX_MEMBERS];
static struct member *free_list;
static int arena_used = 1; /* arena[0] is the tag of the sets' wake eventfds */
#define WAKE_TAG ((uint64_t)(uintptr_t)&arena[0])
#define PROC_TAG (WAKE_TAG + 2) /* a process eventfd: some accelerated member may have moved */
static pthread_mutex_t ep_mu = PTHREAD_MUTEX_INITIALIZER;

static int own(uint64_t u)
{
	return u >= (uint64_t)(uintptr_t)&arena[0] && u < (uint64_t)(uintptr_t)&arena[MAX_MEMBERS];
}

static struct member *member_alloc(void)
{
	struct member *m = free_list;
	if (m)
		free_list = m->next_set;
	else if (arena_used < MAX_MEMBERS)
		m = &arena[arena_used++];
	else
		return NULL;
	memset(m, 0, sizeof(*m));
	m->in_use = 1;
	m->reg_wait = m->reg_chan = m->reg_proc = -1;
	return m;
}

static void kreg(int epfd, int op, int fd, uint32_t events, uint64_t data)
{
	struct epoll_event ev = {.events = events, .data.u64 = data};
	R(epoll_ctl)(epfd, op, fd, &ev);
}

static void pollers_add(struct member *m, int d)
{
	struct conn *c = m->c;
	if (d > 0 && !m->pollers && c->sh) {
		atomic_fetch_add(&c->sh->lib_pollers, 1);
		m->pollers = 1;
	} else if (d < 0 && m->pollers) {
		atomic_fetch_sub(&c->sh->lib_pollers, 1);
		m->pollers = 0;
	}
}

/* pin: a set waited on from outside counts as a sleeper in its wake pages */
static void pin(struct smcr_wake *page, int d)
{
	if (page)
		atomic_fetch_add(&page->sleepers, (uint32_t)d);
}

/* proc_reg registers the process eventfd efd (with its wake page) in the set for m
 * (once per set): 0, or -errno; ep_mu held */
static int proc_reg(struct member *m, int efd, struct smcr_wake *page)
{
	struct eset *s = m->set;
	int free_slot = -1;
	for (int i = 0; i < (int)(sizeof(s->procs) / sizeof(s->procs[0])); i++) {
		if (s->procs[i].members && s->procs[i].efd == efd) {
			s->procs[i].members++;
			m->reg_proc = efd;
			return 0;
		}
		if (!s->procs[i].members && free_slot < 0)
			free_slot = i;
	}
	if (free_slot < 0)
		return -ENOSPC;
	struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u64 = PROC_TAG};
	if (R(epoll_ctl)(s->epfd, EPOLL_CTL_ADD, efd, &ev) < 0 && errno != EEXIST)
		return -errno;
	s->procs[free_slot].efd = efd;
	s->procs[free_slot].members = 1;
	s->procs[free_slot].page = page;
	s->procs[free_slot].seen = page ? atomic_load(&page->pub) : 0;
	if (atomic_load(&s->nested))
		pin(page, 1);
	m->reg_proc = efd;
	return 0;
}

static void proc_unreg(struct member *m)
{
	struct eset *s = m->set;
	for (int i = 0; m->reg_proc >= 0 && i < (int)(sizeof(s->procs) / sizeof(s->procs[0])); i++)
		if (s->procs[i].members && s->procs[i].efd == m->reg_proc) {
			/* the last one: the program's own epoll_wait must not see it */
			if (!--s->procs[i].members) {
				kreg(s->epfd, EPOLL_CTL_DEL, m->reg_proc, 0, 0);
				if (atomic_load(&s->nested))
					pin(s->procs[i].page, -1);
				s->procs[i].page = NULL;
			}
			break;
		}
	m->reg_proc = -1;
}

/* accel_register: an ACCEL member's wait objects: its process eventfd, and the channel
 * for hang-up (smcrd's death); ep_mu held */
static int accel_register(struct member *m)
{
	struct conn *c = m->c;
	int r = proc_reg(m, c->efd_lib, c->wake);
	if (r < 0)
		return r;
	struct epoll_event ev = {.events = 0, .data.u64 = (uint64_t)(uintptr_t)m | 1};
	if (c->chan >= 0 && R(epoll_ctl)(m->set->epfd, EPOLL_CTL_ADD, c->chan, &ev) == 0)
		m->reg_chan = c->chan;
	pollers_add(m, 1);
	return 0;
}

/* register the member's wait objects for the connection's present state: 0, or -errno */
static int member_register(struct member *m)
{
	struct conn *c = m->c;
	int epfd = m->set->epfd;
	uint64_t tag = (uint64_t)(uintptr_t)m;
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = tag};
	switch (atomic_load(&c->state)) {
	case CS_PENDING:
		if (R(epoll_ctl)(epfd, EPOLL_CTL_ADD, c->chan, &ev) < 0 && errno != EEXIST)
			return -errno;
		m->reg_wait = c->chan;
		return 0;
	case CS_ACCEL:
		return atomic_load(&c->reset) ? 0 : accel_register(m);
	case CS_PREFIX:
	case CS_TCP:
		ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI | EPOLLET;
		if (R(epoll_ctl)(epfd, EPOLL_CTL_ADD, m->fd, &ev) < 0 && errno != EEXIST)
			return -errno;
		m->reg_wait = m->fd;
		return 0;
	default:
		return 0;
	}
}

static void member_unregister(struct member *m)
{
	if (m->reg_wait >= 0)
		kreg(m->set->epfd, EPOLL_CTL_DEL, m->reg_wait, 0, 0);
	if (m->reg_chan >= 0)
		kreg(m->set->epfd, EPOLL_CTL_DEL, m->reg_chan, 0, 0);
	m->reg_wait = m->reg_chan = -1;
	proc_unreg(m);
	pollers_add(m, -1);
}

/* member_park takes an accelerated member out of the set's view (EPOLL_CTL_DEL)
 * and keeps its kernel registrations; ep_mu held */
static void member_park(struct member *m)
{
	ready_remove(m);
	pollers_add(m, -1);
	m->parked = 1;
	m->kick = 0;
}

/* member_unpark brings a parked member back with the program's new events */
static void member_unpark(struct member *m, const struct epoll_event *ev)
{
	m->parked = 0;
	m->events = ev->events;
	m->data = ev->data;
	m->disarmed = 0;
	m->last_rev = 0;
	if (m->reg_proc >= 0)
		pollers_add(m, 1);
	mark_wake(m);
}

/* unlink and free; ep_mu held; drops the member's reference to the connection */
static void member_free(struct member *m)
{
	struct member **pp;
	for (pp = &m->set->members; *pp; pp = &(*pp)->next_set)
		if (*pp == m) {
			*pp = m->next_set;
			break;
		}
	for (pp = &m->c->members; *pp; pp = &(*pp)->next_conn)
		if (*pp == m) {
			*pp = m->next_conn;
			break;
		}
	ready_remove(m);
	atomic_fetch_sub(&m->set->nmembers, 1);
	struct conn *c = m->c;
	m->in_use = 0;
	m->parked = 0;
	m->set = NULL;
	m->c = NULL;
	m->next_set = free_list;
	free_list = m;
	obj_put(&c->o);
}

static void eset_last_close(struct obj *o)
{
	struct eset *s = (struct eset *)o;
	pthread_mutex_lock(&ep_mu);
	while (s->members) {
		struct member *m = s->members;
		pollers_add(m, -1); /* the kernel set goes with the epoll fd */
		member_free(m);
	}
	for (size_t i = 0; i < sizeof(s->procs) / sizeof(s->procs[0]); i++) {
		if (s->procs[i].members && atomic_load(&s->nested))
			pin(s->procs[i].page, -1);
		s->procs[i].members = 0;
		s->procs[i].page = NULL;
	}
	if (s->wake_fd >= 0)
		R(close)(s->wake_fd);
	s->wake_fd = -1;
	pthread_mutex_unlock(&ep_mu);
}

static void eset_free(struct obj *o)
{
	free(o);
}

static int eset_own_fds(struct obj *o, int *out)
{
	struct eset *s = (struct eset *)o;
	out[0] = s->wake_fd;
	return s->wake_fd >= 0;
}

static const struct obj_ops eset_ops = {.last_close = eset_last_close, .free = eset_free, .own_fds = eset_own_fds};

void ready_epoll_created(int epfd)
{
	struct eset *s = calloc(1, sizeof(*s));
	if (!s)
		return;
	obj_init(&s->o, OBJ_EPOLL, &eset_ops);
	s->epfd = epfd;
	s->wake_fd = -1;
	if (fdt_install(epfd, &s->o) < 0)
		free(s);
	else
		obj_put(&s->o); /* the table's reference remains */
}

static struct eset *eset_of(int epfd)
{
	struct obj *o = fdt_get(epfd);
	return (o && o->kind == OBJ_EPOLL) ? (struct eset *)o : NULL;
}

static int emulated(struct conn *c)
{
	return c && atomic_load_explicit(&c->state, memory_order_acquire) != CS_TCP;
}

/* member_add makes fd (of c) a member of s; ep_mu held. 0 or -errno. */
static int member_add(struct eset *s, struct conn *c, int fd, const struct epoll_event *ev)
{
	if (s->wake_fd < 0) {
		int w = fd_park(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
		if (w < 0)
			return -errno;
		struct epoll_event wev = {.events = EPOLLIN | EPOLLET, .data.u64 = WAKE_TAG};
		if (R(epoll_ctl)(s->epfd, EPOLL_CTL_ADD, w, &wev) < 0) {
			int e = errno;
			R(close)(w);
			return -e;
		}
		s->wake_fd = w;
	}
	struct member *m = member_alloc();
	if (!m)
		return -ENOSPC;
	obj_get(&c->o);
	m->set = s;
	m->c = c;
	m->fd = fd;
	m->events = ev->events;
	m->data = ev->data;
	m->next_set = s->members;
	s->members = m;
	m->next_conn = c->members;
	c->members = m;
	atomic_fetch_add(&s->nmembers, 1);
	int r = member_register(m);
	if (r < 0) {
		member_unregister(m);
		member_free(m);
	} else {
		/* a thread may wait in the kernel set since before the set had members,
		 * outside ready_epoll_wait and its count of sleepers */
		mark(m);
		ring_kick(s->wake_fd);
	}
	return r;
}

/* ---- kernel registrations of plain sockets, remembered so that a socket the
 * program put in an epoll set before its connect() can be emulated once offered:
 * one (the latest) per fd. */

struct epreg {
	int epfd_plus1;
	uint32_t events;
	epoll_data_t data;
};

static struct epreg *epreg;

void ready_init(void)
{
	if (!smcr_fdt_size)
		return;
	void *p = mmap(NULL, (size_t)smcr_fdt_size * sizeof(struct epreg), PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p != MAP_FAILED)
		epreg = p;
}

void ready_note_ctl(int epfd, int op, int fd, const struct epoll_event *ev)
{
	if (!epreg || (unsigned)fd >= (unsigned)smcr_fdt_size || !eset_of(epfd))
		return;
	struct epreg *e = &epreg[fd];
	if (op == EPOLL_CTL_DEL) {
		if (e->epfd_plus1 == epfd + 1)
			e->epfd_plus1 = 0;
	} else if (ev) {
		e->events = ev->events;
		e->data = ev->data;
		e->epfd_plus1 = epfd + 1;
	}
}

void ready_forget_fd(int fd)
{
	if (epreg && (unsigned)fd < (unsigned)smcr_fdt_size && epreg[fd].epfd_plus1)
		epreg[fd].epfd_plus1 = 0;
}

void ready_adopt(struct conn *c, int fd)
{
	if (!epreg || (unsigned)fd >= (unsigned)smcr_fdt_size || !epreg[fd].epfd_plus1)
		return;
	struct epreg e = epreg[fd];
	epreg[fd].epfd_plus1 = 0;
	int epfd = e.epfd_plus1 - 1;
	struct eset *s = eset_of(epfd);
	if (!s || R(epoll_ctl)(epfd, EPOLL_CTL_DEL, fd, NULL) < 0)
		return;
	struct epoll_event ev = {.events = e.events, .data = e.data};
	pthread_mutex_lock(&ep_mu);
	s->epfd = epfd;
	member_add(s, c, fd, &ev);
	pthread_mutex_unlock(&ep_mu);
}

int ready_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev, int *ret)
{
	struct eset *s = eset_of(epfd);
	if (!s)
		return 0;
	struct conn *c = conn_of(fdt_get(fd));
	if (!c)
		return 0;
	pthread_mutex_lock(&ep_mu);
	s->epfd = epfd;
	struct member *m;
	for (m = s->members; m; m = m->next_set)
		if (m->fd == fd && m->c == c)
			break;
	int r = 0;
	if ((!m || m->parked) && (op != EPOLL_CTL_ADD || !emulated(c))) {
		/* the kernel's: registered before the socket was offered, plain TCP,
		 * or not in the set (the kernel answers ENOENT) */
		pthread_mutex_unlock(&ep_mu);
		return 0;
	}
	switch (op) {
	case EPOLL_CTL_ADD:
		if (m && !m->parked) {
			r = -EEXIST;
			break;
		}
		if (!ev) {
			r = -EFAULT;
			break;
		}
		if (m)
			member_unpark(m, ev);
		else
			r = member_add(s, c, fd, ev);
		break;
	case EPOLL_CTL_MOD:
		if (!ev) {
			r = -EFAULT;
			break;
		}
		m->events = ev->events;
		m->data = ev->data;
		m->disarmed = 0;
		m->last_rev = 0;
		mark_wake(m);
		break;
	case EPOLL_CTL_DEL:
		if (m->reg_wait < 0 && m->reg_proc >= 0) {
			member_park(m);
			break;
		}
		member_unregister(m);
		member_free(m);
		break;
	default:
		r = -EINVAL;
	}
	pthread_mutex_unlock(&ep_mu);
	*ret = r < 0 ? (errno = -r, -1) : 0;
	return 1;
}

int ready_epoll_emulated(int epfd)
{
	struct eset *s = eset_of(epfd);
	return s && atomic_load_explicit(&s->nmembers, memory_order_relaxed) > 0;
}

void ready_decided(struct conn *c, int old_chan)
{
	pthread_mutex_lock(&ep_mu);
	struct member *m = c->members, *next;
	for (; m; m = next) {
		next = m->next_conn;
		if (m->parked) {
			member_unregister(m);
			member_free(m);
			continue;
		}
		int epfd = m->set->epfd;
		uint64_t tag = (uint64_t)(uintptr_t)m;
		if (m->reg_wait == old_chan && old_chan >= 0)
			kreg(epfd, EPOLL_CTL_DEL, old_chan, 0, 0);
		m->reg_wait = -1;
		if (atomic_load(&c->state) == CS_TCP) {
			/* plain TCP: hand the socket to the kernel set as the program asked */
			struct epoll_event ev = {.events = m->events, .data = m->data};
			if (!m->disarmed)
				R(epoll_ctl)(epfd, EPOLL_CTL_ADD, m->fd, &ev);
			else {
				ev.events = 0; /* oneshot, disarmed: registered, reporting nothing */
				R(epoll_ctl)(epfd, EPOLL_CTL_ADD, m->fd, &ev);
			}
			member_free(m);
			continue;
		}
		if (atomic_load(&c->state) == CS_ACCEL) {
			accel_register(m); /* without its wake, a marked member still reports */
		} else if (atomic_load(&c->state) == CS_PREFIX) {
			kreg(epfd, EPOLL_CTL_ADD, m->fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI | EPOLLET, tag);
			m->reg_wait = m->fd;
		}
		mark_wake(m);
	}
	pthread_mutex_unlock(&ep_mu);
}

void ready_released(struct conn *c)
{
	pthread_mutex_lock(&ep_mu);
	if (atomic_load(&c->state) == CS_PREFIX) {
		/* SHM: the receive ring's rest comes first: the members stay the
		 * library's, waiting on the socket as a PREFIX connection's do */
		struct member *m = c->members, *next;
		for (; m; m = next) {
			next = m->next_conn;
			member_unregister(m);
			if (m->parked) {
				member_free(m);
				continue;
			}
			member_register(m);
			mark_wake(m);
		}
		pthread_mutex_unlock(&ep_mu);
		return;
	}
	while (c->members) {
		struct member *m = c->members;
		int parked = m->parked;
		member_unregister(m);
		if (!parked) {
			/* plain TCP: hand the socket to the kernel set as the program asked
			 * (a disarmed one-shot registered, reporting nothing) */
			struct epoll_event ev = {.events = m->disarmed ? 0 : m->events, .data = m->data};
			R(epoll_ctl)(m->set->epfd, EPOLL_CTL_ADD, m->fd, &ev);
		}
		member_free(m);
	}
	pthread_mutex_unlock(&ep_mu);
}

void ready_conn_changed(struct conn *c)
{
	pthread_mutex_lock(&ep_mu);
	for (struct member *m = c->members; m; m = m->next_conn)
		mark_wake(m);
	pthread_mutex_unlock(&ep_mu);
}

void ready_conn_closed(struct conn *c)
{
	pthread_mutex_lock(&ep_mu);
	while (c->members) {
		struct member *m = c->members;
		member_unregister(m);
		member_free(m);
	}
	pthread_mutex_unlock(&ep_mu);
}

static int64_t deadline_of(int64_t timeout_ns)
{
	return timeout_ns < 0 ? -1 : (int64_t)now_ns() + timeout_ns;
}

/* milliseconds left until deadline (-1: none), rounded up */
static int ms_left(int64_t deadline)
{
	if (deadline < 0)
		return -1;
	int64_t now = (int64_t)now_ns();
	if (now >= deadline)
		return 0;
	int64_t ms = (deadline - now + 999999) / 1000000;
	return ms > 0x7fffffff ? 0x7fffffff : (int)ms;
}

/* scan reports the ready members of the set's ready list (level, edge, one-shot);
 * ep_mu held. Level-triggered members reported go back to the list's end, to be
 * looked at again next time. */
static int scan(struct eset *s, struct epoll_event *evs, int max)
{
	int n = 0;
	struct member *last = s->rtail;
	int done = !last;
	while (!done && n < max) {
		struct member *m = s->rhead;
		done = m == last;
		ready_remove(m);
		if (m->disarmed)
			continue;
		struct conn *c = m->c;
		uint64_t seq = conn_seq(c);
		uint32_t rev = conn_revents(c, m->fd) & (m->events | EPOLLERR | EPOLLHUP);
		m->seen_seq = seq;
		int kick = m->kick;
		m->kick = 0;
		if (!rev) {
			m->last_rev = 0;
			continue;
		}
		if ((m->events & EPOLLET) && !kick && rev == m->last_rev && seq == m->last_seq)
			continue;
		evs[n].events = rev;
		evs[n].data = m->data;
		n++;
		m->last_rev = rev;
		m->last_seq = seq;
		if (m->events & EPOLLONESHOT)
			m->disarmed = 1;
		else if (!(m->events & EPOLLET))
			ready_push(m);
	}
	return n;
}

#define MAX_DECIDE 64

/* The wake pages a wait depends on, with each page's pub from before the wait's last
 * look at its connections. blind: a page is missing (or one too many): the wait
 * cannot count itself as a sleeper everywhere and sleeps in slices instead. */
#define MAX_WAKES 4
struct wakes {
	int n, blind;
	struct smcr_wake *page[MAX_WAKES];
	uint64_t pub[MAX_WAKES];
};

/* wakes_add notes page and its pub now, once: before the look at its connections */
static void wakes_add(struct wakes *w, struct smcr_wake *page, uint64_t pub)
{
	for (int i = 0; i < w->n; i++)
		if (w->page[i] == page)
			return;
	if (!page || w->n == MAX_WAKES) {
		w->blind = 1;
		return;
	}
	w->page[w->n] = page;
	w->pub[w->n++] = pub;
}

/* wakes_moved: a publish came since the look */
static int wakes_moved(const struct wakes *w)
{
	for (int i = 0; i < w->n; i++)
		if (atomic_load(&w->page[i]->pub) != w->pub[i])
			return 1;
	return 0;
}

/* wakes_sleep counts the thread as a sleeper in each page, then looks at pub once
 * more: 1 to sleep (then wakes_woke); 0 when a publish came, which may have looked
 * at sleepers before the count (it is undone) */
static int wakes_sleep(const struct wakes *w)
{
	for (int i = 0; i < w->n; i++)
		atomic_fetch_add(&w->page[i]->sleepers, 1);
	if (!wakes_moved(w))
		return 1;
	for (int i = 0; i < w->n; i++)
		atomic_fetch_sub(&w->page[i]->sleepers, 1);
	return 0;
}

static void wakes_woke(const struct wakes *w)
{
	for (int i = 0; i < w->n; i++)
		atomic_fetch_sub(&w->page[i]->sleepers, 1);
}

/* Blind waits look again at least this often. */
#define BLIND_SLICE_MS 1

/* sleep_ms: a sleep of t ms (-1: none), sliced when w is blind */
static int sleep_ms(const struct wakes *w, int t)
{
	return w->blind && (t < 0 || t > BLIND_SLICE_MS) ? BLIND_SLICE_MS : t;
}

/* mark_moved: the process eventfd fired (a publish): mark the accelerated
 * members whose words moved; ep_mu held */
static void mark_moved(struct eset *s)
{
	for (struct member *m = s->members; m; m = m->next_set)
		if (m->reg_proc >= 0 && conn_seq(m->c) != m->seen_seq)
			mark(m);
}

/* look_published notes the set's wake pages in w, and marks the members that moved
 * if a publish came since the last look; ep_mu held */
static void look_published(struct eset *s, struct wakes *w)
{
	int moved = 0;
	w->n = w->blind = 0;
	for (size_t i = 0; i < sizeof(s->procs) / sizeof(s->procs[0]); i++) {
		if (!s->procs[i].members)
			continue;
		struct smcr_wake *page = s->procs[i].page;
		uint64_t pub = page ? atomic_load(&page->pub) : 0;
		if (pub != s->procs[i].seen) {
			s->procs[i].seen = pub;
			moved = 1;
		}
		wakes_add(w, page, pub);
	}
	if (moved)
		mark_moved(s);
}

/* accelerated: the set has members whose bytes move through shared memory;
 * ep_mu held */
static int accelerated(struct eset *s)
{
	for (size_t i = 0; i < sizeof(s->procs) / sizeof(s->procs[0]); i++)
		if (s->procs[i].members)
			return 1;
	return 0;
}

/* spin_wait looks at the kernel set without sleeping for up to SHM_SPIN_NS,
 * and lets other threads of this CPU run after the first SHM_YIELD_NS, as a
 * blocking read does (ring.h): on these machines a sleep and its wake-up cost tens of
 * µs, more than a request and its answer between two programs that both have
 * a CPU. The process eventfd and the set's wake eventfd are in the set, so a
 * publish to any member, or a mark, ends the spin. Returns what epoll_pwait
 * returned, or 0 when the spin ran out (or the deadline came). */
static int spin_wait(int epfd, struct epoll_event *evs, int max, const sigset_t *sigmask, int64_t deadline,
		     const struct wakes *w)
{
	uint64_t t0 = now_ns();
	for (;;) {
		int k = R(epoll_pwait)(epfd, evs, max, 0, sigmask);
		if (k != 0 || wakes_moved(w))
			return k;
		uint64_t now = now_ns();
		if (now - t0 > SHM_SPIN_NS || (deadline >= 0 && (int64_t)now >= deadline))
			return 0;
		if (now - t0 > SHM_YIELD_NS)
			sched_yield();
		else
			cpu_relax();
	}
}

int ready_epoll_wait(int epfd, struct epoll_event *evs, int max, int64_t timeout_ns, const sigset_t *sigmask)
{
	struct eset *s = eset_of(epfd);
	if (max <= 0 || !s) {
		errno = EINVAL;
		return -1;
	}
	int64_t deadline = deadline_of(timeout_ns);
	for (;;) {
		struct wakes w;
		pthread_mutex_lock(&ep_mu);
		look_published(s, &w);
		int n = scan(s, evs, max);
		int t = n ? 0 : ms_left(deadline);
		int spin = t != 0 && accelerated(s);
		if (t != 0)
			atomic_fetch_add(&s->sleepers, 1);
		pthread_mutex_unlock(&ep_mu);
		if (n == max)
			return n;
		int k = spin ? spin_wait(epfd, evs + n, max - n, sigmask, deadline, &w) : 0;
		if (k == 0) {
			int left = spin ? ms_left(deadline) : t;
			if (left == 0) {
				k = R(epoll_pwait)(epfd, evs + n, max - n, 0, sigmask);
			} else if (wakes_sleep(&w)) {
				k = R(epoll_pwait)(epfd, evs + n, max - n, sleep_ms(&w, left), sigmask);
				wakes_woke(&w);
			}
		}
		if (t != 0)
			atomic_fetch_sub(&s->sleepers, 1);
		if (k < 0)
			return n ? n : -1;
		struct conn *decide[MAX_DECIDE], *reset[MAX_DECIDE];
		int decide_fd[MAX_DECIDE], reset_fd[MAX_DECIDE];
		int nd = 0, nr = 0, nown = 0, out = n;
		pthread_mutex_lock(&ep_mu);
		for (int i = n; i < n + k; i++) {
			if (!own(evs[i].data.u64)) {
				evs[out++] = evs[i];
				continue;
			}
			nown++;
			if (evs[i].data.u64 == WAKE_TAG)
				continue; /* marked from outside: the scan sees it */
			if (evs[i].data.u64 == PROC_TAG) {
				mark_moved(s);
				continue;
			}
			struct member *m = (struct member *)(uintptr_t)(evs[i].data.u64 & ~(uint64_t)1);
			if (!m->in_use || m->set != s)
				continue;
			struct conn *c = m->c;
			mark(m);
			int st = atomic_load(&c->state);
			if (evs[i].data.u64 & 1) {
				/* the channel hung up: smcrd is gone; stop watching it */
				if (m->reg_chan >= 0)
					kreg(s->epfd, EPOLL_CTL_DEL, m->reg_chan, 0, 0);
				m->reg_chan = -1;
				if (st == CS_ACCEL && !m->parked && nr < MAX_DECIDE) {
					obj_get(&c->o);
					reset[nr] = c;
					reset_fd[nr++] = m->fd;
				}
			} else if (st == CS_PENDING) {
				if (nd < MAX_DECIDE) {
					obj_get(&c->o);
					decide[nd] = c;
					decide_fd[nd++] = m->fd;
				}
			}
		}
		pthread_mutex_unlock(&ep_mu);
		for (int i = 0; i < nd; i++) {
			conn_decide(decide[i], decide_fd[i], 0);
			obj_put(&decide[i]->o);
		}
		for (int i = 0; i < nr; i++) {
			conn_mark_reset(reset[i], reset_fd[i]);
			obj_put(&reset[i]->o);
		}
		if (out > 0) {
			/* a set waited on from outside must look readable while level-
			 * triggered members are still ready */
			if (atomic_load_explicit(&s->nested, memory_order_relaxed)) {
				pthread_mutex_lock(&ep_mu);
				if (s->rhead && s->wake_fd >= 0)
					ring_kick(s->wake_fd);
				pthread_mutex_unlock(&ep_mu);
			}
			return out;
		}
		if (nown == 0 && t == 0 && timeout_ns >= 0 && ms_left(deadline) == 0)
			return 0;
	}
}

int ready_epoll_filter(int epfd, struct epoll_event *evs, int k)
{
	struct eset *s = eset_of(epfd);
	if (!s)
		return k;
	int out = 0;
	pthread_mutex_lock(&ep_mu);
	for (int i = 0; i < k; i++) {
		if (!own(evs[i].data.u64)) {
			evs[out++] = evs[i];
			continue;
		}
		/* a member's channel (level-triggered) reports again in the next wait;
		 * a process eventfd's edge does not */
		if (evs[i].data.u64 == PROC_TAG)
			mark_moved(s);
	}
	pthread_mutex_unlock(&ep_mu);
	return out;
}

/* ---- poll */

void ready_epoll_nested(int epfd)
{
	struct eset *s = eset_of(epfd);
	if (!s || atomic_load(&s->nested))
		return;
	pthread_mutex_lock(&ep_mu);
	if (!atomic_exchange(&s->nested, 1)) {
		for (size_t i = 0; i < sizeof(s->procs) / sizeof(s->procs[0]); i++)
			if (s->procs[i].members)
				pin(s->procs[i].page, 1);
		if (s->rhead && s->wake_fd >= 0)
			ring_kick(s->wake_fd);
	}
	pthread_mutex_unlock(&ep_mu);
}

int ready_poll_emulated(const struct pollfd *fds, nfds_t n)
{
	int r = 0;
	for (nfds_t i = 0; i < n; i++) {
		struct obj *o = fdt_get(fds[i].fd);
		if (!o)
			continue;
		if (o->kind == OBJ_EPOLL)
			ready_epoll_nested(fds[i].fd);
		else if (emulated(conn_of(o)))
			r = 1;
	}
	return r;
}

#define STACK_PFD 128

/* poll_spin waits up to SPIN_NS for a publish to the connections a poll looks at:
 * 1 if one came */
static int poll_spin(const struct wakes *w)
{
	uint64_t t0 = now_ns();
	do {
		for (int i = 0; i < 64; i++) {
			if (wakes_moved(w))
				return 1;
			cpu_relax();
		}
	} while (now_ns() - t0 < SPIN_NS);
	return 0;
}

/* A sandbox may cap RLIMIT_NOFILE at the number of fds its program polls (sshd's
 * preauth child: 1), and ppoll fails with EINVAL past it. Then ready_poll gives
 * the kernel one entry per program entry and watches the channels of accelerated
 * sockets (smcrd's death) apart, waking at least this often. */
#define COMPACT_SLICE_MS 1000

/* chan_hung: smcrd closed the channel (it died). */
static int chan_hung(int chan)
{
	struct pollfd p = {.fd = chan, .events = 0};
	struct timespec zero = {0};
	return R(ppoll)(&p, 1, &zero, NULL) > 0 && (p.revents & (POLLHUP | POLLERR | POLLIN));
}

/* A thread's poll set: an epoll instance holding the process eventfds (edge-triggered)
 * that ppoll waits on in place of them. Each waiter consumes its own edges, so one
 * thread's wake is never taken by another, and the eventfd is never drained (which
 * would drop the edges of the program's epoll sets). Made again in a child after fork,
 * where the parent's instance is shared; closed at the thread's exit. */
static __thread int thread_epfd = -1;
static __thread unsigned thread_epfd_gen;
static __thread int thread_epfd_last = -1; /* the eventfd last added to it */
static pthread_key_t thread_epfd_key;
static pthread_once_t thread_epfd_once = PTHREAD_ONCE_INIT;

static void thread_epfd_close(void *unused)
{
	(void)unused;
	if (thread_epfd >= 0)
		R(close)(thread_epfd);
	thread_epfd = -1;
}

static void thread_epfd_key_make(void)
{
	pthread_key_create(&thread_epfd_key, thread_epfd_close);
}

/* thread_poll_set returns the thread's poll set with efd in it, or -1 */
static int thread_poll_set(int efd)
{
	unsigned gen = atomic_load(&smcr_fork_gen);
	if (thread_epfd >= 0 && thread_epfd_gen != gen) {
		R(close)(thread_epfd);
		thread_epfd = -1;
	}
	/* Not in a child after fork: one may be in a sandbox where an epoll call
	 * kills it (sshd's preauth child allows poll, not epoll_create1 or
	 * epoll_wait); its polls look again every NO_SET_SLICE_MS instead. */
	if (thread_epfd < 0 && gen != 0)
		return -1;
	if (thread_epfd < 0) {
		pthread_once(&thread_epfd_once, thread_epfd_key_make);
		thread_epfd = fd_park(R(epoll_create1)(EPOLL_CLOEXEC));
		if (thread_epfd < 0)
			return -1;
		thread_epfd_gen = gen;
		thread_epfd_last = -1;
		pthread_setspecific(thread_epfd_key, &thread_epfd);
	}
	if (efd != thread_epfd_last) {
		struct epoll_event ev = {.events = EPOLLIN | EPOLLET};
		if (R(epoll_ctl)(thread_epfd, EPOLL_CTL_ADD, efd, &ev) < 0 && errno != EEXIST)
			return -1;
		thread_epfd_last = efd;
	}
	return thread_epfd;
}

/* thread_poll_consume takes the edges that woke the thread's poll set */
static void thread_poll_consume(int epfd)
{
	struct epoll_event evs[4];
	while (R(epoll_wait)(epfd, evs, 4, 0) == 4)
		;
}

/* Without a thread poll set (no fd to make one, or a child after fork), a poll with
 * accelerated sockets looks again at least this often. */
#define NO_SET_SLICE_MS 1

int ready_poll(struct pollfd *fds, nfds_t n, int64_t timeout_ns, const sigset_t *sigmask)
{
	struct pollfd stack[STACK_PFD];
	struct pollfd *tmp = stack;
	/* per entry: where its wait objects went in tmp (-1 none), and the conn */
	int stack_at[STACK_PFD / 2];
	int *at = stack_at;
	if (n > STACK_PFD / 2) {
		tmp = malloc(sizeof(*tmp) * 2 * n + sizeof(int) * n);
		if (!tmp) {
			errno = ENOMEM;
			return -1;
		}
		at = (int *)(tmp + 2 * n);
	}
	int64_t deadline = deadline_of(timeout_ns);
	int result, compact = 0;
	for (;;) {
		int m = 0, ready = 0, set_at = -1, no_set = 0;
		nfds_t nacc = 0; /* entries accelerated: the others are the kernel's to watch */
		struct wakes w = {0};
		for (nfds_t i = 0; i < n; i++) {
			struct conn *c = conn_of(fdt_get(fds[i].fd));
			fds[i].revents = 0;
			at[i] = m;
			if (!emulated(c)) {
				tmp[m++] = (struct pollfd){.fd = fds[i].fd, .events = fds[i].events};
				continue;
			}
			if (atomic_load(&c->state) == CS_PENDING)
				conn_decide(c, fds[i].fd, 0);
			int st = atomic_load(&c->state);
			if (st == CS_ACCEL && !atomic_load(&c->reset)) {
				atomic_fetch_add(&c->sh->lib_pollers, 1);
				wakes_add(&w, c->wake, c->wake ? atomic_load(&c->wake->pub) : 0);
				nacc++;
				int set = thread_poll_set(c->efd_lib);
				if (set < 0)
					no_set = 1;
				else if (set_at < 0) {
					set_at = m;
					tmp[m++] = (struct pollfd){.fd = set, .events = POLLIN};
				}
				/* counted in lib_pollers: -2, or -3 - where its channel went */
				at[i] = compact ? -2 : -3 - m;
				if (!compact)
					tmp[m++] = (struct pollfd){.fd = c->chan, .events = 0};
			} else if (st == CS_PENDING) {
				tmp[m++] = (struct pollfd){.fd = c->chan, .events = POLLIN};
			} else if (st == CS_PREFIX || st == CS_TCP) {
				tmp[m++] = (struct pollfd){.fd = fds[i].fd, .events = fds[i].events};
			} else {
				at[i] = -1;
			}
			uint32_t rev = conn_revents(c, fds[i].fd) & ((uint16_t)fds[i].events | POLLERR | POLLHUP);
			fds[i].revents = (short)rev;
			if (rev)
				ready++;
		}
		int t = ready ? 0 : ms_left(deadline);
		if (compact && (t < 0 || t > COMPACT_SLICE_MS))
			t = COMPACT_SLICE_MS;
		if (no_set && (t < 0 || t > NO_SET_SLICE_MS))
			t = NO_SET_SLICE_MS;
		/* spin briefly, as epoll_wait does, where every entry is accelerated: on the
		 * wake pages alone, with no system call (sshd's pre-auth child polls under a
		 * seccomp filter that kills it at sched_yield) */
		if (t != 0 && nacc == n && w.n && !w.blind && poll_spin(&w))
			t = 0;
		int slept = t != 0 && wakes_sleep(&w);
		if (t != 0 && !slept)
			t = 0; /* a publish came since the look: look again */
		else
			t = sleep_ms(&w, t);
		struct timespec ts, *tsp = NULL;
		if (t >= 0) {
			ts.tv_sec = t / 1000;
			ts.tv_nsec = (long)(t % 1000) * 1000000;
			tsp = &ts;
		}
		int k = R(ppoll)(tmp, (nfds_t)m, tsp, sigmask);
		int err = errno;
		if (slept)
			wakes_woke(&w);
		int retry_compact = k < 0 && err == EINVAL && !compact && (nfds_t)m > n;
		if (set_at >= 0 && k > 0 && (tmp[set_at].revents & POLLIN))
			thread_poll_consume(tmp[set_at].fd);
		int total = 0;
		for (nfds_t i = 0; i < n; i++) {
			struct conn *c = conn_of(fdt_get(fds[i].fd));
			if (!emulated(c) || at[i] == -1) {
				if (!emulated(c) && k >= 0)
					fds[i].revents = tmp[at[i]].revents;
				if (fds[i].revents)
					total++;
				continue;
			}
			int st = atomic_load(&c->state);
			if (at[i] <= -2) {
				atomic_fetch_sub(&c->sh->lib_pollers, 1);
				struct pollfd *ch = at[i] == -2 ? NULL : &tmp[-3 - at[i]];
				if (!ch ? k >= 0 && chan_hung(c->chan) : k > 0 && (ch->revents & (POLLHUP | POLLERR | POLLIN)))
					conn_mark_reset(c, fds[i].fd);
			} else if (st == CS_PENDING && k > 0 && tmp[at[i]].revents) {
				conn_decide(c, fds[i].fd, 0);
			}
			uint32_t rev = conn_revents(c, fds[i].fd) & ((uint16_t)fds[i].events | POLLERR | POLLHUP);
			fds[i].revents = (short)rev;
			if (rev)
				total++;
		}
		if (retry_compact && !total) {
			compact = 1;
			continue;
		}
		if (k < 0 && !total) {
			errno = err;
			result = -1;
			break;
		}
		if (total || ms_left(deadline) == 0) {
			result = total;
			break;
		}
	}
	if (tmp != stack)
		free(tmp);
	return result;
}

/* ---- select, through ready_poll */

int ready_select_emulated(int nfds, fd_set *r, fd_set *w, fd_set *e)
{
	int res = 0;
	if (nfds > FD_SETSIZE)
		nfds = FD_SETSIZE;
	for (int fd = 0; fd < nfds; fd++)
		if ((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (e && FD_ISSET(fd, e))) {
			struct obj *o = fdt_get(fd);
			if (!o)
				continue;
			if (o->kind == OBJ_EPOLL)
				ready_epoll_nested(fd);
			else if (emulated(conn_of(o)))
				res = 1;
		}
	return res;
}

#define IN_SET (POLLIN | POLLRDNORM | POLLRDBAND | POLLHUP | POLLERR)
#define OUT_SET (POLLOUT | POLLWRNORM | POLLWRBAND | POLLERR)

int ready_select(int nfds, fd_set *r, fd_set *w, fd_set *e, int64_t *timeout_ns, const sigset_t *sigmask)
{
	struct pollfd pfd[FD_SETSIZE];
	int n = 0;
	if (nfds > FD_SETSIZE)
		nfds = FD_SETSIZE;
	for (int fd = 0; fd < nfds; fd++) {
		short ev = 0;
		if (r && FD_ISSET(fd, r))
			ev |= POLLIN | POLLRDNORM | POLLRDBAND;
		if (w && FD_ISSET(fd, w))
			ev |= POLLOUT | POLLWRNORM | POLLWRBAND;
		if (e && FD_ISSET(fd, e))
			ev |= POLLPRI;
		if (ev)
			pfd[n++] = (struct pollfd){.fd = fd, .events = ev};
	}
	int64_t deadline = deadline_of(*timeout_ns);
	int k = ready_poll(pfd, (nfds_t)n, *timeout_ns, sigmask);
	if (*timeout_ns >= 0) {
		int64_t left = deadline - (int64_t)now_ns();
		*timeout_ns = left > 0 ? left : 0;
	}
	if (k < 0)
		return -1;
	for (int i = 0; i < n; i++)
		if (pfd[i].revents & POLLNVAL) {
			errno = EBADF;
			return -1;
		}
	int total = 0;
	for (int i = 0; i < n; i++) {
		int fd = pfd[i].fd;
		short rv = pfd[i].revents;
		if (r && FD_ISSET(fd, r)) {
			if (rv & IN_SET)
				total++;
			else
				FD_CLR(fd, r);
		}
		if (w && FD_ISSET(fd, w)) {
			if (rv & OUT_SET)
				total++;
			else
				FD_CLR(fd, w);
		}
		if (e && FD_ISSET(fd, e)) {
			if (rv & POLLPRI)
				total++;
			else
				FD_CLR(fd, e);
		}
	}
	return total;
}
