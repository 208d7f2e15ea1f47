// Relay: carries the bytes between an application's TCP socket and the connection
// smcrd made for it (an SMC-R connection or plain TCP), both ways, with half-close
// propagated, so the application sees exactly the byte stream TCP would have given
// it. RFC 7609 §4.4 (close ordering: all data before EOF), §4.3 (fallback over TCP).

package daemon

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

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
	var aSide, bSide side
	wg.Add(2)
	go func() {
		defer wg.Done()
		n, err := copyHalf(b, a, &counts.tx, &bSide, &aSide)
		res.AtoB = n
		if err != nil {
			fail(err)
		}
	}()
	go func() {
		defer wg.Done()
		n, err := copyHalf(a, b, &counts.rx, &aSide, &bSide)
		res.BtoA = n
		if err != nil {
			fail(err)
		}
	}()
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
		if res.Err == nil {
			closeOrderly(a)
			closeOrderly(b)
		}
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

// side is what the two directions of a relay share about one of its connections.
type side struct {
	shut     atomic.Bool // smcrd shut down writing on it
	finReset atomic.Bool // reset after its FIN, which a watch saw (and took the EPIPE of)
}

// copyHalf copies src to dst until EOF, then half-closes dst. Between two
// *net.TCPConn it splices (no copy through user space), urgent data included
// (splice.go). It adds what it carries to count as it goes. dstSide and srcSide
// are what the other direction shares: whether smcrd shut down writing on dst
// (set here) and on src (set there).
func copyHalf(dst, src net.Conn, count *atomic.Uint64, dstSide, srcSide *side) (int64, error) {
	var n int64
	var err error
	w := &watch{dst: dst, ended: func() error { return endedShort(src, srcSide) }}
	dstTCP, dok := dst.(*net.TCPConn)
	srcTCP, sok := src.(*net.TCPConn)
	if dok && sok {
		n, err = spliceHalf(dstTCP, srcTCP, count, w)
	} else {
		n, err = copyMarked(dst, src, count, w)
	}
	if err != nil {
		return n, err
	}
	if err := resetAtEOF(src, srcSide); err != nil {
		return n, err
	}
	if cw, ok := dst.(closeWriter); ok {
		// Before the FIN: once it is out, the peer's ACK may close a socket
		// that had the peer's FIN (LAST_ACK) before this is seen (resetAtEOF).
		dstSide.shut.Store(true)
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
func resetAtEOF(src net.Conn, s *side) error {
	tcp := tcpUnder(src)
	if tcp == nil || s.shut.Load() {
		return nil
	}
	closed, soerr, err := closedState(tcp)
	switch {
	case err != nil:
		return readError(tcp, err)
	case closed && soerr != unix.EPIPE && !s.finReset.Load():
		// Closed. A reset after the FIN (the error EPIPE, still there:
		// the read stopped at the FIN without taking it) came after every
		// byte; one that left no error had its error taken by a write.
		return readError(tcp, unix.ECONNRESET)
	}
	return nil
}

// watchEvery is how often a relay direction whose write waits (its receiver
// does not read) looks whether its source ended short. Nothing reads the
// source meanwhile (the other direction reads the receiver's connection): an
// application's reset, or the peer's, would wait until the receiver reads
// again, where TCP would have passed it on at once, and the relay would hold
// its sockets and buffers until then.
const watchEvery = time.Second

// watch is one relay direction's writes to dst.
type watch struct {
	dst   net.Conn
	ended func() error // the source's abnormal end, nil while it has none
	until time.Time    // dst's write deadline
}

// write runs do, a write to dst that carries on where it stopped when called
// again, with dst's write deadline between half of watchEvery and watchEvery
// ahead (set again only when less is left: not a timer per write). Each time
// the deadline passes it asks whether the source ended short, and gives up
// with that error if so. Every write of a relay direction goes through it, so
// a deadline that passed between two never stops the next.
func (w *watch) write(do func() error) error {
	for {
		if now := time.Now(); w.until.Sub(now) < watchEvery/2 {
			w.until = now.Add(watchEvery)
			w.dst.SetWriteDeadline(w.until)
		}
		err := do()
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		if err := w.ended(); err != nil {
			return err
		}
	}
}

// endedShort is src's abnormal end before its end of stream, which a watch
// passes on: a reset that came before the FIN (after it, every byte is here,
// and the reader finds it: resetAtEOF), or an SMC-R connection broken before
// the peer's sending-done. After smcrd's own FIN on src, a reset is the
// answer to that and not looked at here.
func endedShort(src net.Conn, s *side) error {
	if c, ok := src.(*smcr.Conn); ok && tcpUnder(c) == nil {
		if c.Broken() {
			return errBroken
		}
		return nil
	}
	tcp := tcpUnder(src)
	if tcp == nil || s.shut.Load() || s.finReset.Load() {
		return nil
	}
	closed, soerr, err := closedState(tcp)
	switch {
	case err != nil:
		return readError(tcp, err)
	case !closed:
		return nil
	case soerr == unix.EPIPE:
		s.finReset.Store(true) // resetAtEOF would have read it
		return nil
	case soerr == 0:
		soerr = unix.ECONNRESET // taken by a write of the other direction
	}
	return readError(tcp, soerr)
}

var errBroken = errors.New("daemon: smc-r connection broken while its receiver did not read")

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

// resetIfLost has the kernel end c with a reset, not a FIN, when smcrd does
// not close it itself: killed, crashed, out of memory. The kernel closes a dead
// process's sockets as if closed on purpose, and a program reading to the end
// of the stream would take what it has for all there is. closeOrderly undoes
// it for the orderly close of a relay that carried every byte.
func resetIfLost(c *net.TCPConn) { c.SetLinger(0) }

// closeOrderly lets c, once closed, end with a FIN again (resetIfLost).
func closeOrderly(c net.Conn) {
	if tcp, ok := c.(*net.TCPConn); ok {
		tcp.SetLinger(-1)
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
func copyMarked(dst, src net.Conn, count *atomic.Uint64, w *watch) (int64, error) {
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
				werr = w.write(func() error { return writeUrgent(buf[0]) })
			} else {
				p := buf[:n]
				werr = w.write(func() error {
					m, err := dst.Write(p)
					p = p[m:]
					return err
				})
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
