// Package preload holds libsmcr-preload.so, the C library of the direct mode
// (docs/direct.md): programs started with `smcrctl run` carry it, and it hands
// their TCP sockets to smcrd at connect, listen and accept, then copies their
// bytes into and out of the rings smcrd shares with it (smcr_abi.h, the same
// layout as rmb/shared.go), and emulates readiness (epoll, poll, select) from
// the rings' cursors.
//
// The C sources are split by concern: interpose.c (the interposed calls),
// fdtable.c (the fd table), conn.c (a socket's states), ring.c (copies and
// waits), ready.c (epoll/poll/select), channel.c (smcrd's channel and the
// policy page), real.c (the real libc functions). The Makefile here builds it
// into ../bin, with AddressSanitizer and UndefinedBehaviorSanitizer variants.
//
// This package has no Go code of its own: its tests build the library, compile
// the C programs in testdata and run them with LD_PRELOAD, with no smcrd (the
// library must be a transparent pass-through), against daemon.NewDirectServer
// (every connection accelerated, its bytes carried over the TCP connection
// itself) and against a fake smcrd here that decides plain TCP.
package preload
