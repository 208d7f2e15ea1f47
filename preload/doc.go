// Package preload holds libsmcr-preload.so, the C library of the direct mode
// (docs/direct.md): programs started with `smcrctl run` carry it, and it hands
// their TCP sockets to smcrd at connect, listen and accept, then copies their
// bytes into and out of the rings smcrd shares with it (smcr_abi.h, the same
// layout as rmb/shared.go), and emulates readiness (epoll, poll, select) from
// the rings' cursors.
//
// The C sources are in c/, split by concern: interpose.c (the interposed
// calls), fdtable.c (the fd table), conn.c (a socket's states: PENDING, ACCEL,
// PREFIX, TCP, FAILED, RESET), ring.c (copies and blocking waits), ready.c
// (epoll/poll/select), channel.c (smcrd's channel and the policy page),
// real.c (the real libc functions). The Makefile here builds it into ../bin,
// with AddressSanitizer and UndefinedBehaviorSanitizer variants (make asan
// ubsan; the ASan build must be preloaded after libasan.so).
//
// This package has no Go code of its own: its tests build the library, compile
// the C programs in testdata and run them with LD_PRELOAD: with no smcrd (the
// library must be a transparent pass-through), against daemon.NewDirectServer
// (every connection accelerated, its bytes carried over the TCP connection
// itself), against a fake smcrd here that decides plain TCP and hands back
// bytes it read ahead, and against an smcrd that aborts or is killed. The
// readiness program (testdata/ready.c) writes a transcript that must be the
// same on the kernel's sockets and on the library's.
//
// The library's own fds (a connection's channel to smcrd, its eventfds and
// memfds) are moved to half the fd limit (at most 1024) and up, so that the
// program's sockets get the numbers they would get without it (programs size
// tables by them: wrk's event loop, select's FD_SETSIZE). A poll that the
// kernel refuses for more fds than RLIMIT_NOFILE (a sandbox's, sshd's preauth
// child's: 1) is redone with one kernel entry per program entry, smcrd's
// channels checked apart at least once a second.
//
// Known limits:
//
//   - MSG_OOB: recv with MSG_OOB on an accelerated socket fails with EINVAL,
//     send with MSG_OOB with EOPNOTSUPP (the ABI carries no urgent data).
//   - splice on an accelerated socket is a copy through a 16 KiB buffer (at
//     most that much per call); sendfile is a copy loop through the send ring.
//   - A blocking read or write on an accelerated socket that a signal
//     interrupts fails with EINTR unless every caught signal has SA_RESTART
//     (and, as Linux, always when the socket has a timeout); a signal that
//     lands in the few microseconds between two of its waits goes unseen.
//     SO_RCVTIMEO and SO_SNDTIMEO are honoured. A blocking connect waits for
//     smcrd's decision through signals and ignores SO_SNDTIMEO.
//   - An epoll set with accelerated members that is waited on from outside
//     (inside another set, or under poll/select) may look readable once when
//     nothing is (never the other way round).
//   - Only the latest epoll registration of a socket made before its connect()
//     is carried into the emulation (a socket in two sets before connect keeps
//     the other one with the kernel's readiness).
//   - An accelerated socket kept across exec is unknown to the new image
//     (its kernel socket carries no data); its channel is close-on-exec, so
//     smcrd sees the program gone once no process holds it. Sockets passed to
//     another process with SCM_RIGHTS, io_uring, and close_range/closefrom or
//     raw close system calls on the library's fds are not followed either.
//   - After fork both processes use the connection (shared memory); the
//     library then never sets SMCR_LIB_CLOSED: the connection ends when the
//     last process closes the channel (smcrd treats the channel's end as the
//     program's close).
//   - A thread blocked on an accelerated socket that another thread closes
//     wakes with EBADF (the kernel's would go on waiting); a thread inside a
//     copy (not blocked) while another closes the socket races with the unmap
//     of the shared area (such programs race with fd reuse on kernel sockets
//     too).
package preload
