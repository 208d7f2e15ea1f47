// Package tcpurg reads and writes TCP urgent data (MSG_OOB) on a *net.TCPConn the
// way a relay needs it: the urgent byte stays in the stream (SO_OOBINLINE), a read
// stops at the mark and returns the urgent byte alone, reported as urgent, and a
// write sends one byte with MSG_OOB. smcrd relays it between an application's
// socket and an SMC-R connection, whose CDCs carry the same mark.
//
// The mark is checked inside the readiness callback, right before the read: a check
// before a blocking read would race the urgent byte's arrival, and the read that
// then returned it would run on past the mark with the bytes after it.
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
	return OnFD(rc, func(fd int) error { return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_OOBINLINE, 1) })
}

// ReadMarked reads into p like Read, but never past TCP's urgent mark: at the mark
// it returns the urgent byte alone, with urgent set. c must be SetInline.
func ReadMarked(c *net.TCPConn, p []byte) (n int, urgent bool, err error) {
	if len(p) == 0 {
		return 0, false, nil
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, false, err
	}
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		for {
			mark, merr := unix.IoctlGetInt(int(fd), unix.SIOCATMARK)
			if merr != nil {
				rerr = merr
				return true
			}
			buf := p
			if mark != 0 {
				buf = p[:1]
			}
			n, rerr = unix.Read(int(fd), buf)
			switch rerr {
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return false // not readable after all: wait
			}
			urgent = mark != 0 && n == 1
			return true
		}
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return 0, false, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	if n == 0 {
		return 0, false, io.EOF
	}
	return n, urgent, nil
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

// AtMark reports whether the next byte to read from rc is the urgent one.
func AtMark(rc syscall.RawConn) (bool, error) {
	var mark int
	err := OnFD(rc, func(fd int) error {
		var err error
		mark, err = unix.IoctlGetInt(fd, unix.SIOCATMARK)
		return err
	})
	return mark != 0, err
}

// OnFD runs f on rc's descriptor.
func OnFD(rc syscall.RawConn, f func(fd int) error) error {
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return err
	}
	return ferr
}
