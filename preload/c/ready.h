/* ready.h: readiness of emulated sockets for the program's waits: epoll sets with
 * emulated members, poll/ppoll, select/pselect. */
#pragma once

#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/select.h>

#include "conn.h"

/* hooks from conn.c, with c->mu held */
void ready_decided(struct conn *c, int old_chan);
void ready_conn_closed(struct conn *c);
/* ready_released: c, ACCEL, is plain TCP now (conn_release): its members go to the
 * kernel's sets with their own socket; or PREFIX (SHM, the peer released): they stay
 * the library's, waiting on the socket */
void ready_released(struct conn *c);
/* ready_conn_changed: the library itself changed c's readiness (shutdown, reset);
 * not with ready.c's lock held */
void ready_conn_changed(struct conn *c);

void ready_init(void);
/* ready_note_ctl remembers a plain fd's kernel registration (epoll_ctl passed
 * through, successfully); ready_forget_fd forgets it (close); ready_adopt moves it
 * into the emulation once the socket is offered to smcrd (connect). */
void ready_note_ctl(int epfd, int op, int fd, const struct epoll_event *ev);
void ready_forget_fd(int fd);
void ready_adopt(struct conn *c, int fd);

/* ready_epoll_created records a new epoll fd (so its members can be emulated). */
void ready_epoll_created(int epfd);
/* 1 if epoll_ctl was handled here (result in *ret), 0 to pass it to the kernel. */
int ready_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev, int *ret);
/* ready_epoll_nested: epfd is waited on from outside (poll, select, another set) */
void ready_epoll_nested(int epfd);
/* 1 if epfd has emulated members (then call ready_epoll_wait). */
int ready_epoll_emulated(int epfd);
/* ready_epoll_filter takes the library's own events out of the k that a kernel
 * wait returned on epfd while it had no emulated members (some came meanwhile):
 * the events left for the program. */
int ready_epoll_filter(int epfd, struct epoll_event *evs, int k);
/* timeout_ns < 0: no timeout */
int ready_epoll_wait(int epfd, struct epoll_event *evs, int max, int64_t timeout_ns, const sigset_t *sigmask);

/* 1 if any of the fds is an emulated socket */
int ready_poll_emulated(const struct pollfd *fds, nfds_t n);
int ready_poll(struct pollfd *fds, nfds_t n, int64_t timeout_ns, const sigset_t *sigmask);

int ready_select_emulated(int nfds, fd_set *r, fd_set *w, fd_set *e);
/* *timeout_ns: in: the timeout (<0 none); out: what is left of it */
int ready_select(int nfds, fd_set *r, fd_set *w, fd_set *e, int64_t *timeout_ns, const sigset_t *sigmask);
