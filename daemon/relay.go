// Relay: carries the bytes between an application's TCP socket and the connection
// smcrd made for it (an SMC-R connection or plain TCP), both ways, with half-close
// propagated, so the application sees exactly the byte stream TCP would have given
// it. RFC 7609 §4.4 (close ordering: all data before EOF), §4.3 (fallback over TCP).

package daemon

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/internal/tcpurg"
	"github.com/smcr-io/smcr/smcr"
)

// The copy buffers of one direction when splice(2) cannot be used. A direction
// reads into a small buffer of its own, and borrows a large one only while the
// bytes stream (from a read that fills the small one until one that would have
// fitted it): an idle or interactive connection holds 2 × 16 KiB rather than
// 2 × 256 KiB, which no memory budget counts. (One that goes quiet straight
// after a large read keeps the large buffer until its next read: giving it back
// on every short read cost a fifth of the throughput, in 16 KiB CDC writes.)
// 256 KiB matches the default rmb_size, so one read can empty a full ring.
const (
	smallRelayBuf = 16 << 10
	relayBuf      = 256 << 10
)

var bufPool = sync.Pool{New: func() any { b := make([]byte, relayBuf); return &b }}

// closeWriter is implemented by *net.TCPConn and *smcr.Conn.
type closeWriter interface{ CloseWrite() error }

// aborter is implemented by *smcr.Conn: the SMC-R form of a TCP RST.
type aborter interface{ Abort() error }

// relayResult says how a relay ended.
type relayResult struct {
	AtoB, BtoA int64 // bytes carried each way
	Err        error // the first error other than EOF, nil for an orderly close
}

// byteCounts are a relay's running totals, a→b (tx) and b→a (rx), which the
// connection table shows while the relay runs.
type byteCounts struct{ tx, rx atomic.Uint64 }

// relay copies a→b and b→a until both directions reached EOF, then closes both.
// EOF in one direction half-closes the other side (CloseWrite), so protocols that
// shut down writing and then read the answer work. An error in either direction
// (a reset) aborts both connections at once: neither side waits forever for bytes
// that cannot come. stop, when closed, aborts the relay too. counts, when not nil,
// follows the bytes as they go.
func relay(a, b net.Conn, stop <-chan struct{}, counts *byteCounts) relayResult {
	if counts == nil {
		counts = new(byteCounts)
	}
	var res relayResult
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := make(chan struct{})
	var once sync.Once
	fail := func(err error) {
		mu.Lock()
		if res.Err == nil {
			res.Err = err
		}
		mu.Unlock()
		once.Do(func() { close(done) })
	}
	var aShut, bShut atomic.Bool // smcrd shut down writing on a, on b
	wg.Add(2)
	go func() {
		defer wg.Done()
		n, err := copyHalf(b, a, &counts.tx, &bShut, &aShut)
		res.AtoB = n
		if err != nil {
			fail(err)
		}
	}()
	go func() {
		defer wg.Done()
		n, err := copyHalf(a, b, &counts.rx, &aShut, &bShut)
		res.BtoA = n
		if err != nil {
			fail(err)
		}
	}()
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-done:
		abort(a)
		abort(b)
		<-finished
	case <-stop:
		fail(errStopped)
		abort(a)
		abort(b)
		<-finished
	}
	a.Close()
	b.Close()
	return res
}

var errStopped = errors.New("daemon: relay stopped")

// copyHalf copies src to dst until EOF, then half-closes dst. Between two
// *net.TCPConn it splices (no copy through user space), urgent data included
// (splice.go). It adds what it carries to count as it goes. dstShut and srcShut
// say whether smcrd shut down writing on dst (set here) and on src (by the
// other direction).
func copyHalf(dst, src net.Conn, count *atomic.Uint64, dstShut, srcShut *atomic.Bool) (int64, error) {
	var n int64
	var err error
	dstTCP, dok := dst.(*net.TCPConn)
	srcTCP, sok := src.(*net.TCPConn)
	if dok && sok {
		n, err = spliceHalf(dstTCP, srcTCP, count)
	} else {
		n, err = copyMarked(dst, src, count)
	}
	if err != nil {
		return n, err
	}
	if err := resetAtEOF(src, srcShut); err != nil {
		return n, err
	}
	if cw, ok := dst.(closeWriter); ok {
		// Before the FIN: once it is out, the peer's ACK may close a socket
		// that had the peer's FIN (LAST_ACK) before this is seen (resetAtEOF).
		dstShut.Store(true)
		if err := cw.CloseWrite(); err != nil {
			return n, err
		}
	}
	return n, nil
}

// resetAtEOF tells a reset from the FIN that src's end of stream seemed to say.
// After a reset the error goes to the first system call that asks, and the
// other direction's write to src may have taken it: the read then sees only
// the end of the stream, and the peer would get an orderly EOF where bytes may
// be missing. A FIN leaves the socket open (CLOSE_WAIT) until smcrd shuts down
// writing on it; a reset closes it at once.
func resetAtEOF(src net.Conn, srcShut *atomic.Bool) error {
	tcp := tcpUnder(src)
	if tcp == nil || srcShut.Load() {
		return nil
	}
	closed, soerr, err := closedState(tcp)
	switch {
	case err != nil:
		return readError(tcp, err)
	case closed && soerr != unix.EPIPE:
		// Closed. A reset after the FIN (the error EPIPE, still there:
		// the read stopped at the FIN without taking it) came after every
		// byte; one that left no error had its error taken by a write.
		return readError(tcp, unix.ECONNRESET)
	}
	return nil
}

// readError is err as a read from tcp would have returned it.
func readError(tcp *net.TCPConn, err error) error {
	return &net.OpError{Op: "read", Net: "tcp", Source: tcp.LocalAddr(), Addr: tcp.RemoteAddr(), Err: err}
}

// closedState says whether tcp's connection is closed (TCP_CLOSE: reset, or
// both sides done) and, if so, the error pending on it (SO_ERROR, which this
// takes), zero when a system call took it first.
func closedState(tcp *net.TCPConn) (closed bool, soerr unix.Errno, err error) {
	rc, err := tcp.SyscallConn()
	if err != nil {
		return false, 0, err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		var info *unix.TCPInfo
		if info, serr = unix.GetsockoptTCPInfo(int(fd), unix.SOL_TCP, unix.TCP_INFO); serr != nil || info.State != tcpClose {
			return
		}
		closed = true
		var e int
		e, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		soerr = unix.Errno(e)
	}); err != nil {
		return false, 0, err
	}
	return closed, soerr, serr
}

// tcpUnder is the TCP socket that carries c's bytes: c itself, or the one an
// SMC-R connection fell back to or continued over; nil for one over SMC-R.
func tcpUnder(c net.Conn) *net.TCPConn {
	switch c := c.(type) {
	case *net.TCPConn:
		return c
	case *smcr.Conn:
		if c.Mode() == smcr.ModeFallback || c.Continued() {
			tcp, _ := c.TCP().(*net.TCPConn)
			return tcp
		}
	}
	return nil
}

// tcpClose is TCP_CLOSE of the kernel's TCP states (tcp_states.h), as TCP_INFO
// reports it.
const tcpClose = 7

// abort ends c abnormally: the peer sees a reset, not an orderly EOF, so it knows
// bytes may be missing.
func abort(c net.Conn) {
	switch c := c.(type) {
	case aborter:
		c.Abort()
	case *net.TCPConn:
		c.SetLinger(0)
		c.Close()
	default:
		c.Close()
	}
}

// markedReader and urgentWriter are *smcr.Conn's urgent-data side (smcr/urgent.go).
type markedReader interface {
	ReadMarked(p []byte) (n int, urgent bool, err error)
}
type urgentWriter interface{ WriteUrgent(b byte) error }

// copyMarked copies src to dst until EOF, as io.Copy would, and carries urgent
// data as urgent data: a TCP socket's urgent byte (MSG_OOB) goes over SMC-R with
// the CDC's urgent flag, and back out with MSG_OOB.
func copyMarked(dst, src net.Conn, count *atomic.Uint64) (int64, error) {
	read := func(p []byte) (int, bool, error) { n, err := src.Read(p); return n, false, err }
	switch s := src.(type) {
	case markedReader:
		read = s.ReadMarked
	case *net.TCPConn:
		r, err := tcpurg.NewReader(s)
		if err != nil {
			return 0, err
		}
		read = r.ReadMarked
	}
	writeUrgent := func(b byte) error { _, err := dst.Write([]byte{b}); return err }
	switch d := dst.(type) {
	case urgentWriter:
		writeUrgent = d.WriteUrgent
	case *net.TCPConn:
		writeUrgent = func(b byte) error { return tcpurg.WriteUrgent(d, b) }
	}
	small := make([]byte, smallRelayBuf)
	buf := small
	var large *[]byte
	defer func() {
		if large != nil {
			bufPool.Put(large)
		}
	}()
	var total int64
	for {
		n, urgent, err := read(buf)
		if n > 0 {
			var werr error
			if urgent {
				werr = writeUrgent(buf[0])
			} else {
				_, werr = dst.Write(buf[:n])
			}
			if werr != nil {
				return total, werr
			}
			total += int64(n)
			count.Add(uint64(n))
		}
		switch {
		case large == nil && n == len(buf):
			large = bufPool.Get().(*[]byte)
			buf = *large
		case large != nil && n < smallRelayBuf:
			// The stream slowed to what the small buffer holds: the next
			// read may wait long.
			bufPool.Put(large)
			large, buf = nil, small
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}
