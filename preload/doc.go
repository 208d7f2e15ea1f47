// Package preload holds libsmcr-preload.so, the C library of the direct mode
// (docs/direct.md): programs started with `smcrctl run` carry it, and it hands
// their TCP sockets to smcrd at connect, listen and accept, then copies their
// bytes into and out of the rings smcrd shares with it (smcr_abi.h, the same
// layout as rmb/shared.go), and emulates readiness (epoll, poll, select) from
// the rings' cursors.
//
// The C sources are in c/, split by concern: interpose.c (the interposed
// calls), exec.c (connections kept across exec), closerange.c (closefrom and
// close_range keep the library's fds behind the fds the program keeps), fdtable.c (the fd table), conn.c (a socket's states: PENDING, ACCEL,
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
//   - MSG_OOB (urgent data) is carried as TCP's (tx_urg and rx_urg in the
//     shared area, SIGURG to the socket's owner), but a blocking send with
//     MSG_OOB that a signal or SO_SNDTIMEO cuts short marks its last byte
//     late, and smcrd may have sent it unmarked by then; SIGURG to a library
//     peer's owner goes only within one pid namespace. After
//     a fallback, an urgent byte among the bytes CLC read ahead (DECIDED's
//     payload) is served inline, unmarked.
//   - splice on an accelerated socket is a copy through a 16 KiB buffer (at
//     most that much per call); sendfile is a copy loop through the send ring.
//   - A blocking read or write on an accelerated socket that a signal
//     interrupts fails with EINTR unless every caught signal has SA_RESTART
//     (and, as Linux, always when the socket has a timeout); a signal that
//     lands in the few microseconds between two of its waits goes unseen.
//     SO_RCVTIMEO and SO_SNDTIMEO are honoured, the latter by a blocking
//     connect too (EINPROGRESS, as the kernel's). A blocking connect waits for
//     smcrd's decision through signals.
//   - An epoll set with accelerated members that is waited on from outside
//     (inside another set, or under poll/select) may look readable once when
//     nothing is (never the other way round).
//   - Only the latest epoll registration of a socket made before its connect()
//     is carried into the emulation (a socket in two sets before connect keeps
//     the other one with the kernel's readiness).
//   - A socket kept across exec (not close-on-exec) stays accelerated when the
//     new image loads the library too (LD_PRELOAD in the environment it gets,
//     or /etc/ld.so.preload): exec.c leaves the library's fds behind it open
//     and names them in SMCR_INHERIT, and the new image adopts them. Into an
//     image without the library (environment cleared, SMCR_DIRECT=0) the
//     connection is first handed back to the socket (SMCR_LIB_RELEASE,
//     conn_release), which the new image uses as plain TCP; where smcrd
//     cannot release it (a peer that cannot continue over TCP, a same-host
//     peer that closed) it ends with a reset (SMCR_LIB_ABORT; smcrd resets the socket
//     itself). An exec by raw system call is not seen: the channel closes
//     with it, which smcrd takes for the program's end (a reset if bytes were
//     left unread), and the new image may wait on a TCP connection that
//     carries nothing until the peer closes.
//   - posix_spawn, posix_spawnp, system and popen start their child through
//     glibc's own clone and execve (spawn.c). The library works out, in the
//     parent, which accelerated sockets the child gets (not close-on-exec,
//     after the spawn's file actions, which it records as the program adds
//     them): each goes with the child as across exec, and becomes shared as
//     after fork, where the child's image has the library and the file
//     actions leave the library's fds alone; otherwise it is released to its
//     socket first, as for SCM_RIGHTS. system runs its shell through the
//     library's posix_spawn where a connection would go with it; popen
//     releases. A clone() made by the program itself is not seen.
//   - A vfork'd child (Python's subprocess) runs in its parent's
//     memory: its close, closefrom and close_range close its fds only and
//     leave the library's tables, which are the parent's, as they were. Its
//     dup2 and dup3 still note the new fd there (an exec after it carries a
//     connection so, exec.c), and its exec releases what it does not carry.
//   - An accelerated socket sent to another process with SCM_RIGHTS (sendmsg,
//     sendmmsg) is handed back to the kernel socket before the message goes
//     (SMCR_LIB_RELEASE): the other process gets plain TCP with the rest of
//     the stream. Where smcrd cannot release it, the connection is marked
//     SMCR_LIB_ABORT and its socket gets the program's O_NONBLOCK back, so
//     that its end here (the sender's close, or exit) resets it, the other
//     process's socket included: that process reads an error, never a clean
//     end, but nothing before. Reads and writes of
//     the connection in other threads of the process wait for the release and
//     go on with the socket; a process sharing it since a fork must not use
//     it meanwhile.
//   - io_uring: a process that makes an instance (io_uring_setup through
//     libc's syscall, or liburing's io_uring_queue_init and
//     io_uring_queue_init_params, io_uring_setup) has its accelerated
//     connections released to their sockets first (pending ones decided
//     first; where a release cannot be, they are marked SMCR_LIB_ABORT), and
//     accelerates no new ones: connect and listen offer nothing more, and a
//     listener registered before has its accepted sockets released as soon
//     as decided. An io_uring_setup by raw system call (not through libc's
//     syscall nor liburing) is not seen, nor are raw close system calls on the
//     library's fds (closefrom and close_range are: closerange.c).
//   - In a child after fork, poll and select with accelerated sockets look
//     again every millisecond instead of sleeping on the process's eventfd
//     through an epoll instance of the thread's: such a child may be in a
//     sandbox that kills it for any epoll call (sshd's preauth child). A woken
//     byte can wait up to that millisecond; epoll itself is not affected.
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
