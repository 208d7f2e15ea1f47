// A direct connection's shared area and the two pumps that carry its bytes
// between the rings the library fills and empties and the SMC-R connection
// where the rings are not the engine's own (directdrive.go drives those), and
// the policy page the libraries read. rmb/shared.go has the layout.

package daemon

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/bpf"
	"github.com/smcr-io/smcr/internal/tcpurg"
	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr"
)

// directConn is one accelerated connection of a program with the library.
type directConn struct {
	log     *slog.Logger
	carrier carrier
	mem     []byte
	sh      *rmb.Shared
	memfd   int
	ringMem []byte    // the rings' own file (rmb.SharedRingFiles) where smcrd made it, mapped
	ringFds []int     // the rings' files, until passed
	wake    *procWake // the library process's; the channel's, not closed here
	efdTx   *os.File  // the library writes: tx_prod or lib_flags moved
	efdRx   *os.File  // the library writes: rx_cons moved
	libTx   int       // the library's ends of efdTx and efdRx, until passed
	libRx   int

	// engine: the library fills and empties the engine's own buffers, and
	// smcrd drives the connection's cursors (directdrive.go)
	engine *smcr.Conn

	// bypass: the libraries write into each other's rings (directmeet.go);
	// the SMC-R connection carries only the close.
	bypass  bool
	peerMem []byte      // bypass: the peer library's area, mapped for a release
	peerSh  *rmb.Shared // (directrelease.go) and nil where it could not be
	// relAnswer: bypass, the peer's smcrd's answer to this end's release;
	// relMu: a release at the peer's ask and the carrier's close take turns
	// (carrierClosed, under relMu).
	relAnswer     chan byte
	relMu         sync.Mutex
	carrierClosed bool
	sock          *net.TCPConn // smcrd's duplicate of the program's socket: its SO_LINGER
	gone          atomic.Bool  // the channel closed: the program is gone
	stopped       atomic.Bool  // abort: smcrd ends the connection now
	rxDone        chan struct{}
	// releasing: releasePumps stopped the receive pump, which then set
	// rxPaused (directrelease.go); releases counts the connections released.
	releasing, rxPaused atomic.Bool
	releases            *atomic.Uint64
}

// ringFiles are a direct connection's rings in files of their own
// (rmb.SharedRingFiles): smcrd's view of them and the descriptors the library
// maps them from.
type ringFiles struct {
	tx, rx       []byte
	txFd, rxFd   int // smcrd's, closed once passed
	txOff, rxOff int64
	mem          []byte // smcrd's mapping to unmap at the end, if its own
}

// ownRingFiles lays rings of tx and rx bytes out in one file of smcrd's, the
// receive ring first, as DirectOptions.RingFiles asks.
func ownRingFiles(tx, rx int) (*ringFiles, error) {
	rxPages := rmb.SharedSize(0, rx) - rmb.SharedPageSize
	fd, mem, err := sealedMemfd("smcr-direct-rings", rxPages+rmb.SharedSize(0, tx)-rmb.SharedPageSize)
	if err != nil {
		return nil, err
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		unix.Munmap(mem)
		unix.Close(fd)
		return nil, fmt.Errorf("dup ring file: %w", err)
	}
	return &ringFiles{tx: mem[rxPages:][:tx], rx: mem[:rx], txFd: dup, rxFd: fd, txOff: int64(rxPages), mem: mem}, nil
}

// engineRingFiles are a cursor-driven connection's own send buffer and RMB,
// for the library to fill and empty with no copy by smcrd; an error wrapping
// errors.ErrUnsupported where the provider keeps them in no file.
func engineRingFiles(conn *smcr.Conn) (*ringFiles, error) {
	snd, rcv, err := conn.DupBufferFiles()
	if err != nil {
		return nil, err
	}
	tx, rx := conn.SendBuffer(), conn.RecvBuffer()
	if len(tx) != snd.Len || len(rx) != rcv.Len {
		unix.Close(snd.FD)
		unix.Close(rcv.FD)
		return nil, fmt.Errorf("engine buffers of %d and %d bytes in files of %d and %d", len(tx), len(rx), snd.Len, rcv.Len)
	}
	return &ringFiles{tx: tx, rx: rx, txFd: snd.FD, rxFd: rcv.FD, txOff: snd.Off, rxOff: rcv.Off}, nil
}

// newDirectConn makes the shared area (a sealed memfd) with rings of tx and
// rx bytes and smcrd's two eventfds; wake is how the library's process wakes.
// With files, the area is the control page and the rings are those files'
// (it takes them, also on error).
func newDirectConn(c carrier, tx, rx int, wake *procWake, files *ringFiles, log *slog.Logger) (*directConn, error) {
	dc := &directConn{log: log, carrier: c, memfd: -1, wake: wake, libTx: -1, libRx: -1, rxDone: make(chan struct{}),
		relAnswer: make(chan byte, 1)}
	fail := func(err error) (*directConn, error) {
		dc.release()
		return nil, err
	}
	var err error
	if files == nil {
		if dc.memfd, dc.mem, err = sealedMemfd("smcr-direct", rmb.SharedSize(tx, rx)); err != nil {
			return fail(err)
		}
		if dc.sh, err = rmb.InitShared(dc.mem, tx, rx); err != nil {
			return fail(err)
		}
	} else {
		dc.ringMem, dc.ringFds = files.mem, []int{files.txFd, files.rxFd}
		if dc.memfd, dc.mem, err = sealedMemfd("smcr-direct", rmb.SharedPageSize); err != nil {
			return fail(err)
		}
		if dc.sh, err = rmb.InitSharedRingFiles(dc.mem, files.tx, files.rx, files.txOff, files.rxOff); err != nil {
			return fail(err)
		}
	}
	if dc.efdTx, err = eventFile("efd_dtx"); err != nil {
		return fail(err)
	}
	if dc.efdRx, err = eventFile("efd_drx"); err != nil {
		return fail(err)
	}
	return dc, nil
}

// sealedMemfd makes a memfd of size bytes, sealed against resizing, and maps
// it.
func sealedMemfd(name string, size int) (int, []byte, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("memfd: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("memfd size: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("memfd seals: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("mmap: %w", err)
	}
	return fd, mem, nil
}

func eventFile(name string) (*os.File, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// libraryFds are the descriptors DECIDED passes: memfd, efd_dtx, efd_drx,
// then the rings' files if they have their own. They stay valid until
// closeLibraryFds.
func (dc *directConn) libraryFds() []int {
	return append([]int{dc.memfd, int(dc.efdTx.Fd()), int(dc.efdRx.Fd())}, dc.ringFds...)
}

// closeLibraryFds closes smcrd's memfds once the library has its own.
func (dc *directConn) closeLibraryFds() {
	for _, fd := range append(dc.ringFds, dc.memfd) {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	dc.memfd, dc.ringFds = -1, nil
}

// size is the memory the shared area and the rings smcrd made hold (the
// engine counts its own buffers).
func (dc *directConn) size() int { return len(dc.mem) + len(dc.ringMem) }

// release frees what newDirectConn made.
func (dc *directConn) release() {
	dc.closeLibraryFds()
	for _, f := range []*os.File{dc.efdTx, dc.efdRx} {
		if f != nil {
			f.Close()
		}
	}
	for _, m := range []*[]byte{&dc.mem, &dc.ringMem, &dc.peerMem} {
		if *m != nil {
			unix.Munmap(*m)
			*m = nil
		}
	}
}

// publish tells the library that smcrd's words moved.
func (dc *directConn) publish() {
	dc.sh.DSeq().Add(1)
	if dc.sh.LibWaiters().Load() > 0 {
		futexWake(dc.sh.DSeqAddr())
	}
	if dc.sh.LibPollers().Load() > 0 {
		dc.wake.signal()
	}
}

// abort ends the connection from smcrd's side: the program reads ECONNRESET,
// the peer a reset.
func (dc *directConn) abort() {
	if dc.stopped.Swap(true) {
		return
	}
	if dc.sock != nil {
		disconnect(dc.sock)
	}
	if c, ok := dc.carrier.(net.Conn); ok {
		abort(c)
	} else {
		dc.carrier.Close()
	}
	dc.fail(unix.ECONNRESET)
	signal(dc.efdTx)
	signal(dc.efdRx)
}

// fail records err for the program's reads and writes.
func (dc *directConn) fail(errno syscall.Errno) {
	if dc.sh.DFlags().Load()&rmb.DError == 0 {
		dc.sh.DErrno().Store(int32(errno))
		dc.sh.DFlags().Or(rmb.DError)
	}
	dc.publish()
}

// endsInAbort reports whether the program's end of the connection, once it
// came, is an abort, as TCP's RST would be: the library said so (LibAbort: a
// close with SO_LINGER {1, 0} or bytes unread, or an exec into an image
// without the library), or the program went away (exit) leaving bytes unread
// or with SO_LINGER {1, 0} on its socket.
func (dc *directConn) endsInAbort(flags uint32) bool {
	switch {
	case flags&rmb.LibClosed == 0 && !dc.gone.Load():
		return false
	case flags&rmb.LibAbort != 0:
		return true
	case flags&rmb.LibClosed != 0:
		return false
	case dc.sh.RxProd().Load() != dc.sh.RxCons().Load():
		return true
	}
	return dc.sock != nil && lingerZero(dc.sock)
}

// disconnect resets the program's socket itself: a connect to AF_UNSPEC has
// the kernel send a RST and fail the socket's next read with ECONNRESET, for
// a process that still holds it (an exec into an image without the library)
// and would otherwise wait on a TCP connection that carries nothing.
//
// A socket the peer reset already is disconnected too. Its ECONNRESET is
// taken by the first reader, which may be smcrd's own (the engine watches the
// socket), and the program would then read a clean EOF (the RST shut the
// receive side); disconnected, it reads ENOTCONN, an error, whoever came
// first.
func disconnect(tcp *net.TCPConn) {
	rc, err := tcp.SyscallConn()
	if err != nil {
		return
	}
	var unspec [16]byte // struct sockaddr, sa_family AF_UNSPEC
	rc.Control(func(fd uintptr) {
		unix.Syscall(unix.SYS_CONNECT, fd, uintptr(unsafe.Pointer(&unspec[0])), uintptr(len(unspec)))
	})
}

// lingerZero reports whether the socket has SO_LINGER {1, 0}.
func lingerZero(tcp *net.TCPConn) bool {
	rc, err := tcp.SyscallConn()
	if err != nil {
		return false
	}
	var l *unix.Linger
	// A socket closed meanwhile runs no Control: l stays nil.
	if cerr := rc.Control(func(fd uintptr) { l, err = unix.GetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER) }); cerr != nil {
		return false
	}
	return err == nil && l != nil && l.Onoff != 0 && l.Linger == 0
}

// run carries the bytes until the program has closed and every byte it wrote
// has gone, or the connection failed; then it closes the carrier. The caller
// frees the area (release) once nothing else can reach it. ch, the library's
// channel, closes when the program is gone.
func (dc *directConn) run(ch *net.UnixConn) {
	if ch != nil {
		go func() {
			recvDirect(ch) // nothing more is sent on it: this is its EOF
			dc.gone.Store(true)
			signal(dc.efdTx)
			signal(dc.efdRx)
		}()
	}
	if dc.bypass {
		go dc.watchPeer()
		dc.awaitClose()
	} else if dc.engine != nil {
		dc.drive()
	} else {
		go dc.receive()
		dc.send()
	}
	<-dc.rxDone
	if ch != nil {
		ch.Close()
	}
}

// send carries the program's bytes from the send ring to the carrier, then
// its half-close and close.
func (dc *directConn) send() {
	ring := dc.sh.TxRing()
	size := uint64(len(ring))
	cons := dc.sh.TxCons().Load()
	shut := false
	defer func() {
		if dc.stopped.Load() {
			return // abort closed the carrier
		}
		dc.carrier.Close()
	}()
	for !dc.stopped.Load() {
		// Flags before the cursor: bytes the program wrote before it
		// shut down or closed are all in the cursor read after.
		flags := dc.sh.LibFlags().Load()
		if dc.endsInAbort(flags) {
			dc.abort() // as TCP's RST, the bytes not yet sent go too
			return
		}
		prod := dc.sh.TxProd().Load()
		urg := dc.sh.TxUrg().Load() // after tx_prod: stored before the tx_prod that covers it
		if prod-cons > size {
			dc.log.Warn("direct: library's send cursor out of bounds: connection aborted")
			dc.abort()
			return
		}
		if prod != cons {
			// The bytes before the program's urgent byte, then the byte
			// as urgent data, then on.
			end := prod
			if cons < urg && urg <= prod {
				end = urg - 1
			}
			var w [2]rmb.Span
			for _, s := range rmb.AppendSpans(w[:0], cons, uint32(end-cons), uint32(size)) {
				n, err := dc.carrier.Write(ring[s.Off:s.End()])
				cons += uint64(n)
				dc.sh.TxCons().Store(cons)
				if err != nil {
					dc.writeFailed(err)
					return
				}
			}
			if end != prod {
				if err := dc.writeUrgent(ring[end%size]); err != nil {
					dc.writeFailed(err)
					return
				}
				cons++
				dc.sh.TxCons().Store(cons)
			}
			dc.publish()
			continue
		}
		switch {
		case flags&rmb.LibClosed != 0 || dc.gone.Load():
			// The end may have come since the look above: flags again.
			if dc.endsInAbort(dc.sh.LibFlags().Load()) {
				dc.abort()
			}
			return
		case flags&rmb.LibShutWR != 0 && !shut:
			shut = true
			if err := dc.carrier.CloseWrite(); err != nil {
				dc.writeFailed(err)
				return
			}
			continue
		case dc.releaseAsked(flags):
			// Every byte up to tx_prod is sent.
			if dc.releasePumps() {
				return
			}
			continue
		case dc.sh.DFlags().Load()&rmb.DError != 0:
			// Failed: wait only for the program to close.
		}
		dc.wait(dc.efdTx, dc.sh.DTxWait(), func() bool {
			return dc.sh.TxProd().Load() != cons || dc.sh.LibFlags().Load() != flags || dc.gone.Load()
		})
	}
}

// awaitClose waits, in bypass, for the program's close (or its end), then
// closes the SMC-R connection: the peer's smcrd tells its library the end
// came, should the library itself not have.
func (dc *directConn) awaitClose() {
	for !dc.stopped.Load() {
		if dc.closeUnlessReleasing() {
			return
		}
		flags := dc.sh.LibFlags().Load()
		if dc.releaseAsked(flags) && dc.releaseBypass() {
			return
		}
		dflags := dc.sh.DFlags().Load()
		dc.wait(dc.efdTx, dc.sh.DTxWait(), func() bool {
			return dc.sh.LibFlags().Load() != flags || dc.gone.Load() || dc.sh.DFlags().Load()&rmb.DReleased != dflags&rmb.DReleased
		})
	}
}

// closeUnlessReleasing ends the connection, in bypass, where the program closed
// (or is gone), or smcrd released it at the peer's ask: it reports whether it
// did. A release at the peer's ask under way ends first (relMu).
func (dc *directConn) closeUnlessReleasing() bool {
	dc.relMu.Lock()
	defer dc.relMu.Unlock()
	flags := dc.sh.LibFlags().Load()
	switch {
	case dc.sh.DFlags().Load()&rmb.DReleased != 0:
		// The socket carries the rest: the program's end is no abort.
		dc.carrier.Close()
	case dc.endsInAbort(flags):
		dc.abort()
	case flags&rmb.LibClosed != 0 || dc.gone.Load():
		if dc.endsInAbort(dc.sh.LibFlags().Load()) {
			dc.abort()
		} else {
			dc.carrier.Close()
		}
	default:
		return false
	}
	dc.carrierClosed = true
	return true
}

// watchPeer follows, in bypass, the SMC-R connection, which carries no bytes:
// its end is the peer's close (EOF, which the peer's library has mostly told
// ours already) or abort (a reset for the program).
func (dc *directConn) watchPeer() {
	defer close(dc.rxDone)
	var b [1]byte
	for {
		// One byte at a time: after a release's, the bytes are the
		// program's (where the carrier is the socket itself, in tests).
		n, err := dc.carrier.Read(b[:])
		switch {
		case n > 0 && b[0] == relAsk:
			if dc.peerRelease() {
				return
			}
		case n > 0 && (b[0] == relYes || b[0] == relNo):
			select {
			case dc.relAnswer <- b[0]:
			default:
			}
			if b[0] == relYes {
				return
			}
		case n > 0:
			dc.log.Warn("direct: bytes over SMC-R on a same-host connection: aborted")
			dc.abort()
			return
		case err == io.EOF:
			// The peer's smcrd closes the connection only once its
			// program is gone (awaitClose): it reads no more either.
			dc.sh.DFlags().Or(rmb.DEOF | rmb.DTxClosed)
			dc.publish()
			return
		case err != nil:
			if !dc.gone.Load() && dc.sh.LibFlags().Load()&rmb.LibClosed == 0 {
				dc.fail(errnoOf(err))
			}
			return
		}
	}
}

// writeFailed records a failed write: a peer that reads no more is EPIPE to
// the program, anything else a reset.
func (dc *directConn) writeFailed(err error) {
	if errors.Is(err, smcr.ErrWriteClosed) || errors.Is(err, syscall.EPIPE) {
		dc.sh.DFlags().Or(rmb.DTxClosed)
		dc.publish()
	} else {
		dc.fail(errnoOf(err))
	}
	// Wait for the program's close, which ends send's caller.
	for !dc.stopped.Load() && !dc.gone.Load() && dc.sh.LibFlags().Load()&rmb.LibClosed == 0 {
		flags := dc.sh.LibFlags().Load()
		dc.wait(dc.efdTx, dc.sh.DTxWait(), func() bool { return dc.sh.LibFlags().Load() != flags || dc.gone.Load() })
	}
}

// writeUrgent sends b on the carrier as urgent data: over SMC-R with the
// CDC's urgent flag (urgentWriter, relay.go), on a TCP carrier with MSG_OOB.
func (dc *directConn) writeUrgent(b byte) error {
	switch c := dc.carrier.(type) {
	case urgentWriter:
		return c.WriteUrgent(b)
	case *net.TCPConn:
		if err := tcpurg.WriteUrgent(c, b); err != nil {
			return fmt.Errorf("urgent byte: %w", err)
		}
		return nil
	}
	_, err := dc.carrier.Write([]byte{b})
	return err
}

// markedRead is how receive reads the carrier: never past the peer's urgent
// mark, the urgent byte alone and reported (smcr.Conn's ReadMarked; on a TCP
// carrier the kernel's mark, its urgent bytes kept inline, which the library
// hides from the program: the program's SO_OOBINLINE is the library's).
func (dc *directConn) markedRead() func(p []byte) (int, bool, error) {
	switch c := dc.carrier.(type) {
	case markedReader:
		return c.ReadMarked
	case *net.TCPConn:
		r, err := tcpurg.NewReader(c)
		if err == nil {
			return r.ReadMarked
		}
		dc.log.Warn("direct: urgent data will arrive inline", "err", err)
	}
	return func(p []byte) (int, bool, error) {
		n, err := dc.carrier.Read(p)
		return n, false, err
	}
}

// newMark publishes the peer's urgent mark u (rx_urg), and signals the
// program as the kernel's tcp_check_urg does: SIGURG to the owner of its
// socket (F_SETOWN), which smcrd's duplicate shares; both before the rx_prod
// that covers the urgent byte, so that a program that sees the byte has had
// the signal.
func (dc *directConn) newMark(u uint64) {
	if dc.sh.RxUrg().Swap(u) == u || dc.sock == nil {
		return
	}
	rc, err := dc.sock.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		// A pid, or minus a process group; 0 none. The kernel gives it as
		// smcrd's pid namespace sees it.
		if owner, err := unix.FcntlInt(fd, unix.F_GETOWN, 0); err == nil && owner != 0 && owner != -1 {
			unix.Kill(owner, unix.SIGURG)
		}
	})
}

// receive carries the peer's bytes from the carrier into the receive ring,
// and its urgent mark into rx_urg.
func (dc *directConn) receive() {
	defer close(dc.rxDone)
	read := dc.markedRead()
	ring := dc.sh.RxRing()
	size := uint64(len(ring))
	prod := dc.sh.RxProd().Load()
	for !dc.stopped.Load() && !dc.gone.Load() {
		cons := dc.sh.RxCons().Load()
		if prod-cons > size {
			dc.log.Warn("direct: library's receive cursor out of bounds: connection aborted")
			dc.abort()
			return
		}
		if prod-cons == size {
			dc.wait(dc.efdRx, dc.sh.DRxWait(), func() bool {
				return dc.sh.RxCons().Load() != cons || dc.gone.Load() || dc.stopped.Load()
			})
			continue
		}
		free, _ := rmb.Split(prod, uint32(cons+size-prod), uint32(size))
		n, urgent, err := read(ring[free.Off:free.End()])
		if n > 0 {
			if urgent { // n is 1: the mark goes before the cursor that covers it
				dc.newMark(prod + 1)
			}
			prod += uint64(n)
			dc.sh.RxProd().Store(prod)
			dc.publish()
		}
		switch {
		case err == io.EOF:
			dc.sh.DFlags().Or(rmb.DEOF)
			dc.publish()
			return
		case err != nil && dc.pausedForRelease(err):
			return
		case err != nil:
			if !dc.gone.Load() && dc.sh.LibFlags().Load()&rmb.LibClosed == 0 {
				dc.fail(errnoOf(err))
			}
			return
		}
	}
}

// wait sleeps on efd until ready reports true, with flag set meanwhile so
// that the library knows to write efd.
func (dc *directConn) wait(efd *os.File, flag *atomic.Uint32, ready func() bool) {
	flag.Store(1)
	defer flag.Store(0)
	if ready() || dc.stopped.Load() {
		return
	}
	var b [8]byte
	efd.Read(b[:]) // blocks in the netpoller; abort and the channel's end write it
}

// errnoOf is what the program's read or write returns for err.
func errnoOf(err error) syscall.Errno {
	var errno syscall.Errno
	switch {
	case errors.As(err, &errno):
		return errno
	case errors.Is(err, os.ErrDeadlineExceeded):
		return unix.ETIMEDOUT
	}
	return unix.ECONNRESET
}

// signal adds one to an eventfd.
func signal(f *os.File) {
	f.Write(eventfdOne[:])
}

// eventfdOne is 1 as an eventfd's u64, in the host's byte order.
var eventfdOne = func() (b [8]byte) {
	binary.NativeEndian.PutUint64(b[:], 1)
	return b
}()

// procWake is how smcrd wakes a library process's pollers: its eventfd,
// written after a publish only while the wake page beside it (rmb.Wake) counts
// a sleeper. The eventfd is a bare descriptor, out of Go's netpoller:
// os.NewFile would register the (non-blocking) eventfd there, and as nobody
// drains it, every kick by any of the process's libraries would wake smcrd.
type procWake struct {
	efd, page int // the eventfd and the wake page's memfd
	mem       []byte
	w         *rmb.Wake
}

// openProcWake takes a library's eventfd and wake page (closing them on
// error): the eventfd must be one, and the page a memfd of rmb.WakeSize
// bytes sealed against shrinking (the library cannot cut the mapping from
// under smcrd) that holds a wake page.
func openProcWake(efd, page int) (*procWake, error) {
	fail := func(err error) (*procWake, error) {
		unix.Close(efd)
		unix.Close(page)
		return nil, err
	}
	if link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", efd)); err != nil || link != "anon_inode:[eventfd]" {
		return fail(fmt.Errorf("process eventfd is %q", link))
	}
	seals, err := unix.FcntlInt(uintptr(page), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return fail(fmt.Errorf("wake page not sealed against shrinking (seals %#x, %v)", seals, err))
	}
	var st unix.Stat_t
	if err := unix.Fstat(page, &st); err != nil || st.Size < rmb.WakeSize {
		return fail(fmt.Errorf("wake page of %d bytes", st.Size))
	}
	mem, err := unix.Mmap(page, 0, rmb.WakeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("wake page: mmap: %w", err))
	}
	w, err := rmb.ViewWake(mem)
	if err != nil {
		unix.Munmap(mem)
		return fail(err)
	}
	return &procWake{efd: efd, page: page, mem: mem, w: w}, nil
}

// fds are the descriptors a same-host peer library takes: eventfd, page.
func (p *procWake) fds() []int { return []int{p.efd, p.page} }

// signal follows a publish to a connection with pollers.
func (p *procWake) signal() {
	if p.w.Published() {
		unix.Write(p.efd, eventfdOne[:])
	}
}

// closePage closes the page's memfd, mapped already: one descriptor less per
// connection once a same-host peer has it.
func (p *procWake) closePage() {
	if p.page >= 0 {
		unix.Close(p.page)
		p.page = -1
	}
}

func (p *procWake) close() {
	unix.Munmap(p.mem)
	unix.Close(p.efd)
	p.closePage()
}

func futexWake(addr unsafe.Pointer) {
	const futexWakeOp = 1 // FUTEX_WAKE, shared: the word is in a MAP_SHARED mapping
	unix.Syscall6(unix.SYS_FUTEX, uintptr(addr), futexWakeOp, math.MaxInt32, 0, 0, 0)
}

// policyPage is the policy page the libraries map (rmb.Policy), a file
// beside the direct socket.
type policyPage struct {
	path string
	mem  []byte
	p    *rmb.Policy
	mu   sync.Mutex
}

// newPolicyPage makes the page at path, world-readable, and beats once.
func newPolicyPage(path string) (*policyPage, error) {
	tmp := path + ".new"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("policy page: %w", err)
	}
	defer f.Close()
	if err := f.Chmod(0o644); err != nil { // whatever the umask
		return nil, fmt.Errorf("policy page: %w", err)
	}
	if err := f.Truncate(rmb.PolicySize); err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("policy page: %w", err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, rmb.PolicySize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("policy page: %w", err)
	}
	p, _ := rmb.InitPolicy(mem)
	pg := &policyPage{path: path, mem: mem, p: p}
	pg.beat()
	if err := os.Rename(tmp, path); err != nil {
		unix.Munmap(mem)
		os.Remove(tmp)
		return nil, fmt.Errorf("policy page: %w", err)
	}
	return pg, nil
}

func (pg *policyPage) beat() { pg.p.Beat(uint64(bpf.Monotonic())) }

func (pg *policyPage) set(enabled bool, listed func(uint16) bool, addrs []netip.Addr) {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	pg.p.SetPorts(listed)
	pg.p.SetAddrs(addrs)
	pg.p.SetEnabled(enabled)
}

// close turns the page off for libraries that still map it and removes it.
func (pg *policyPage) close() error {
	pg.p.SetEnabled(false)
	pg.p.Beat(0)
	err := unix.Munmap(pg.mem)
	if rerr := os.Remove(pg.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
}
