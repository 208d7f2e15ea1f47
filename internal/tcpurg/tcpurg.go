// Package tcpurg reads and writes TCP urgent data (MSG_OOB) on a *net.TCPConn the
// way a relay needs it: the urgent byte stays in the stream (SO_OOBINLINE), a read
// stops at the mark and returns the urgent byte alone, reported as urgent, and a
// write sends one byte with MSG_OOB. smcrd relays it between an application's
// socket and an SMC-R connection, whose CDCs carry the same mark.
//
// The mark is checked inside the readiness callback, after peeking that a first
// byte is there and right before the read: otherwise an urgent byte arriving
// between the check and the read could be the read's first byte, and the read
// would return it inline, unreported, with the bytes after it.
package tcpurg

import (
	"fmt"
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// SetInline keeps c's urgent bytes in the stream (SO_OOBINLINE), where ReadMarked
// finds them; without it the kernel holds the byte for a MSG_OOB read and a plain
// read skips it.
func SetInline(c *net.TCPConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_OOBINLINE, 1)
	}); err != nil {
		return err
	}
	return serr
}

// Reader reads a TCP socket like Read, but never past TCP's urgent mark: at the
// mark it returns the urgent byte alone, reported as urgent. One per socket; it
// allocates nothing per read.
type Reader struct {
	c      *net.TCPConn
	rc     syscall.RawConn
	read   func(fd uintptr) bool // r.readFD, bound once
	p      []byte
	one    [1]byte
	n      int
	urgent bool
	err    error
}

// NewReader makes c's urgent bytes inline (SetInline) and returns its Reader.
func NewReader(c *net.TCPConn) (*Reader, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	if err := SetInline(c); err != nil {
		return nil, err
	}
	r := &Reader{c: c, rc: rc}
	r.read = r.readFD
	return r, nil
}

// ReadMarked reads into p, stopping at the mark; urgent reports that p[0] is the
// urgent byte (then n is 1).
func (r *Reader) ReadMarked(p []byte) (n int, urgent bool, err error) {
	if len(p) == 0 {
		return 0, false, nil
	}
	r.p, r.n, r.urgent, r.err = p, 0, false, nil
	err = r.rc.Read(r.read)
	r.p = nil
	if err == nil {
		err = r.err
	}
	if err != nil {
		return 0, false, &net.OpError{Op: "read", Net: "tcp", Source: r.c.LocalAddr(), Addr: r.c.RemoteAddr(), Err: err}
	}
	if r.n == 0 {
		return 0, false, io.EOF
	}
	return r.n, r.urgent, nil
}

func (r *Reader) readFD(fd uintptr) bool {
	for again := 0; ; again++ {
		// Peek the first byte before asking for the mark: an urgent byte
		// arriving between the question and the read can then only lie
		// after bytes already here, where the read stops. Without the peek
		// it could be the first byte, and the read would take it inline,
		// unreported, with whatever followed.
		k, _, err := unix.Recvfrom(int(fd), r.one[:], unix.MSG_PEEK)
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			if Queued(fd) && again < maxAgain {
				continue // at the mark with a signal pending (atMarkEAGAIN)
			}
			return false // wait until readable
		case nil:
		default:
			r.err = err
			return true
		}
		if k == 0 {
			r.n = 0 // EOF
			return true
		}
		mark, err := unix.IoctlGetInt(int(fd), unix.SIOCATMARK)
		if err != nil {
			r.err = err
			return true
		}
		buf := r.p
		if mark != 0 {
			buf = r.p[:1]
		}
		r.n, r.err = unix.Read(int(fd), buf)
		if r.err == unix.EINTR || r.err == unix.EAGAIN && again < maxAgain {
			continue // the peek saw a byte: EAGAIN is atMarkEAGAIN's
		}
		if r.n < 0 {
			r.n = 0
		}
		r.urgent = mark != 0 && r.n == 1
		return true
	}
}

// atMarkEAGAIN: Linux's recvmsg at the urgent mark returns EAGAIN, on a
// non-blocking socket, when a signal is pending for the thread (tcp_recvmsg's
// "Are we at urgent data?": sock_intr_errno of a zero timeout), though the
// urgent byte is there; and the socket will not become readable again, since
// nothing more arrives. The Go runtime signals its threads often (SIGURG to
// preempt, to scan stacks), so a read at the mark that waited for readability
// on that EAGAIN could wait forever. The signal is taken on the way back from
// the system call, so asking again succeeds.

// maxAgain bounds the retries: a signal at every one is not to be expected,
// and a socket whose urgent byte is out of line (not ours) would say EAGAIN
// with the byte queued for ever.
const maxAgain = 1000

// Queued reports whether bytes wait in the receive queue of the socket fd (SIOCINQ).
func Queued(fd uintptr) bool {
	n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
	return err == nil && n > 0
}

// ReadMarked is a Reader's ReadMarked for one read.
func ReadMarked(c *net.TCPConn, p []byte) (int, bool, error) {
	r, err := NewReader(c)
	if err != nil {
		return 0, false, err
	}
	return r.ReadMarked(p)
}

// WriteUrgent sends b as urgent data (MSG_OOB), after everything written before.
func WriteUrgent(c *net.TCPConn, b byte) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		for {
			serr = unix.Sendto(int(fd), []byte{b}, unix.MSG_OOB|unix.MSG_NOSIGNAL, nil)
			switch serr {
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return false
			}
			return true
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return &net.OpError{Op: "write", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: fmt.Errorf("urgent byte: %w", err)}
	}
	return nil
}
