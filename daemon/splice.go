// Splicing between two TCP sockets, urgent data included. io.Copy splices too, but
// splice(2) stops at TCP's urgent mark: non-blocking, it says EAGAIN there (and the
// socket never becomes readable again), and 0 once the FIN is in, which io.Copy
// takes for EOF. A relay built on it hung at the first MSG_OOB, or half-closed the
// connection there and lost every byte after it. This loop asks SIOCATMARK
// whenever a splice moves nothing, and carries the urgent byte as urgent data
// (MSG_OOB), so the receiver sees what TCP would have shown it.

package daemon

import (
	"fmt"
	"io"
	"net"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/internal/tcpurg"
)

// spliceChunk is the most one splice moves into the pipe, whose capacity is raised
// to it where the system allows (as Go's own splice path does).
const spliceChunk = 1 << 20

// spliceHalf copies src to dst through a pipe in the kernel until src's EOF, and
// returns the bytes carried. It does not half-close dst (copyHalf does).
func spliceHalf(dst, src *net.TCPConn, count *atomic.Uint64, w *watch) (int64, error) {
	rs, err := src.SyscallConn()
	if err != nil {
		return 0, err
	}
	rd, err := dst.SyscallConn()
	if err != nil {
		return 0, err
	}
	// Inline, the urgent byte stays in the stream where the mark is, and a
	// plain read at the mark returns it; out of line it would have to be fetched
	// with MSG_OOB before the reader passes the mark.
	if err := tcpurg.SetInline(src); err != nil {
		return 0, fmt.Errorf("oobinline: %w", err)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return 0, fmt.Errorf("pipe: %w", err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	unix.FcntlInt(uintptr(p[0]), unix.F_SETPIPE_SZ, spliceChunk) // else 64 KiB: fewer bytes per call
	var total int64
	for {
		var n int64
		var serr error
		var mark bool
		err := rs.Read(func(fd uintptr) bool {
			n, serr = unix.Splice(int(fd), nil, p[1], nil, spliceChunk, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			if serr == unix.EAGAIN || (serr == nil && n == 0) {
				// Nothing moved: no data, EOF, or the urgent mark, where a
				// non-blocking splice says EAGAIN though bytes wait (and
				// the socket will not become readable again).
				m, merr := unix.IoctlGetInt(int(fd), unix.SIOCATMARK)
				if merr == nil && m != 0 {
					n, mark, serr = 0, true, nil
					return true
				}
			}
			return serr != unix.EAGAIN
		})
		if err == nil {
			err = serr
		}
		if err != nil {
			return total, err
		}
		if n == 0 {
			if !mark {
				return total, nil // EOF
			}
			if err := carryUrgent(dst, src, w); err != nil {
				return total, err
			}
			total++
			count.Add(1)
			continue
		}
		left := n
		err = w.write(func() error {
			for left > 0 {
				var m int64
				err := rd.Write(func(fd uintptr) bool {
					m, serr = unix.Splice(p[0], nil, int(fd), nil, int(left), unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
					return serr != unix.EAGAIN
				})
				if err == nil {
					err = serr
				}
				if err == nil && m == 0 {
					err = io.ErrShortWrite
				}
				if err != nil {
					return err
				}
				left -= m
				total += m
				count.Add(uint64(m))
			}
			return nil
		})
		if err != nil {
			return total, err
		}
	}
}

// carryUrgent reads the urgent byte (inline, at the mark) and sends it on as
// urgent data: the bytes before it are in dst already. TCP keeps one mark: an
// urgent byte that came since the splice stopped moves it on, and the byte
// here is then ordinary data, sent on as such.
func carryUrgent(dst, src *net.TCPConn, w *watch) error {
	var b [1]byte
	n, urgent, err := tcpurg.ReadMarked(src, b[:])
	if err != nil || n != 1 {
		return fmt.Errorf("urgent byte: %d bytes, %w", n, err)
	}
	return w.write(func() error {
		if !urgent {
			_, err := dst.Write(b[:])
			return err
		}
		return tcpurg.WriteUrgent(dst, b[0])
	})
}
