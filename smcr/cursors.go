// Cursor-driven connections: the application side puts its bytes into the send
// buffer and takes the peer's out of the RMB itself, and moves the cursors.
// RFC 7609 §4.2; smcrd's direct mode shares these buffers with the library.

package smcr

import (
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr/verbs"
)

var (
	// ErrContinued is returned by PostProduced once the connection continues
	// over TCP: the cursors stop. The bytes past Cursors.Produced go by
	// Write, and Read returns what is left in the RMB, then the TCP stream.
	ErrContinued = errors.New("smcr: connection continued over tcp")
	// ErrNotCursorDriven is returned by the cursor calls of a Conn made without
	// ClientOptions.Cursors or ServerOptions.Cursors, or that fell back.
	ErrNotCursorDriven = errors.New("smcr: connection is not cursor-driven")
)

// Cursors is where a cursor-driven connection's rings stand, in stream
// positions (bytes since the connection began, package rmb). The byte at
// position p lives at p mod the buffer's length.
type Cursors struct {
	// Produced: our bytes posted (PostProduced). The send buffer is free
	// from Produced up to PeerConsumed plus its length.
	Produced     uint64
	PeerConsumed uint64
	// PeerProduced: the peer's bytes in the RMB end here; the readable
	// ones start at Consumed (ours, Consumed).
	PeerProduced uint64
	Consumed     uint64
	// ReadErr is what follows the readable bytes: io.EOF, the error that
	// ended the connection, or nil while more may come.
	ReadErr error
	// WriteErr is why no more bytes may be produced (ErrWriteClosed after
	// CloseWrite or the peer's close, say); nil while they may.
	WriteErr error
	// Continued: the connection continues over TCP (ErrContinued).
	Continued bool
	// PeerUrgent is the stream position just past the peer's urgent byte
	// (TCP's MSG_OOB, urgent.go) while the application has not consumed
	// past it; 0 when there is none. Only the latest counts.
	PeerUrgent uint64
}

// cursorDriven reports whether c's application drives the cursors.
func (c *Conn) cursorDriven() error {
	if !c.cursors || c.mode != ModeSMCR {
		return ErrNotCursorDriven
	}
	return nil
}

// SendBuffer is a cursor-driven Conn's send buffer, which mirrors the peer's
// RMBE. The application writes only into its free part (Cursors), and not
// after Close.
func (c *Conn) SendBuffer() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cursorDriven() != nil || c.snd == nil {
		return nil
	}
	return c.snd.Bytes()[:c.tx.Size()]
}

// RecvBuffer is a cursor-driven Conn's RMB. The application reads only its
// readable part (Cursors), and not after Close.
func (c *Conn) RecvBuffer() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cursorDriven() != nil || c.rmb == nil {
		return nil
	}
	return c.rmb.Bytes()[:c.rx.Size()]
}

// BufferFile is where a buffer of a cursor-driven Conn lives in a file that
// another process can map (verbs.Mappable).
type BufferFile struct {
	FD  int   // the caller's descriptor, to close
	Off int64 // of the buffer's first byte
	Len int   // the buffer's length: its ring's size
}

// DupBufferFiles returns the files of a cursor-driven Conn's send buffer and
// RMB, for another process to map, where the provider keeps its buffers in
// files (shm); else an error wrapping errors.ErrUnsupported.
func (c *Conn) DupBufferFiles() (snd, rmb BufferFile, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.cursorDriven(); err != nil {
		return snd, rmb, err
	}
	if c.snd == nil || c.rmb == nil || c.closing.released {
		return snd, rmb, net.ErrClosed
	}
	ms, ok1 := c.snd.(verbs.Mappable)
	mr, ok2 := c.rmb.(verbs.Mappable)
	if !ok1 || !ok2 {
		return snd, rmb, fmt.Errorf("smcr: buffers of provider %v: %w", c.lg.key.kind, errors.ErrUnsupported)
	}
	snd.Len, rmb.Len = int(c.tx.Size()), int(c.rx.Size())
	if snd.FD, snd.Off, err = ms.DupFile(); err != nil {
		return snd, rmb, fmt.Errorf("smcr: send buffer file: %w", err)
	}
	if rmb.FD, rmb.Off, err = mr.DupFile(); err != nil {
		unix.Close(snd.FD)
		return snd, rmb, fmt.Errorf("smcr: rmb file: %w", err)
	}
	return snd, rmb, nil
}

// Cursors returns where the rings stand.
func (c *Conn) Cursors() Cursors {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := Cursors{
		Produced:     c.tx.Pos(),
		PeerConsumed: c.tx.PeerConsumerPos(),
		PeerProduced: c.rx.PeerProducerPos(),
		Consumed:     c.rx.Pos(),
		ReadErr:      c.readEndLocked(),
		WriteErr:     c.writeErrLocked(),
		Continued:    c.cont.fo,
	}
	if c.rxUrgent {
		cur.PeerUrgent = c.rxUrgentAt + 1
	}
	return cur
}

// SetCursorNotify has f called whenever the peer's cursors or the connection's
// state may have moved: from the link's poller, with no lock of c's held, so
// f must not block (it may call Cursors). nil stops the calls. A caller reads
// Cursors after setting f, which may have moved before.
func (c *Conn) SetCursorNotify(f func()) {
	if f == nil {
		c.notify.Store(nil)
		return
	}
	c.notify.Store(&f)
}

// PostProduced posts the bytes that the application has put into the send
// buffer up to stream position pos: their RDMA WRITEs and the CDC that
// announces them, in one chain. pos lies between Produced and the end of the
// free space. It waits only while the connection moves to another link.
func (c *Conn) PostProduced(pos uint64) error { return c.postProduced(pos, false) }

// PostUrgent is PostProduced for bytes whose last, at pos-1, is urgent data,
// as WriteUrgent's byte (urgent.go): the CDC that announces it carries the
// urgent-data-present flag, and a continuation over TCP resends it with
// MSG_OOB. pos lies past Produced.
func (c *Conn) PostUrgent(pos uint64) error { return c.postProduced(pos, true) }

func (c *Conn) postProduced(pos uint64, urgent bool) error {
	if err := c.cursorDriven(); err != nil {
		return err
	}
	c.txMu.Lock()
	defer c.txMu.Unlock()
	c.cdcMu.Lock()
	c.mu.Lock()
	for c.awaitMoveLocked() {
		c.cdcMu.Lock()
		c.mu.Lock()
	}
	err := c.writeErrLocked()
	if err == nil && c.cont.fo {
		err = ErrContinued
	}
	at, free := c.tx.Pos(), uint64(c.tx.Free())
	if err == nil && (pos < at || pos-at > free || urgent && pos == at) {
		err = fmt.Errorf("smcr: producer cursor %d outside the free space [%d, %d]", pos, at, at+free)
	}
	if err != nil || pos == at {
		c.mu.Unlock()
		c.cdcMu.Unlock()
		return err
	}
	n := uint32(pos - at)
	var w [2]rmb.Span
	ws := rmb.AppendSpans(w[:0], at, n, c.tx.Size())
	c.txBusy = true // a Close, move or continuation waits until the post
	lnk := c.lnk
	c.mu.Unlock()
	// more: a full ring asks the peer for its consumer cursor at once.
	err = c.sendChunk(lnk, ws, n, urgent, true)
	c.cdcMu.Unlock()
	c.cs.tx.Add(uint64(n))
	c.e.st.txBytes.Add(uint64(n))
	c.mu.Lock()
	c.txBusy = false
	release := c.closing.appClosed
	c.mu.Unlock()
	if release {
		c.maybeRelease() // closed during the post: the release waited for us
	}
	if err != nil {
		// The bytes are in the producer cursor: a move to another link or
		// the continuation resends them if the peer lacks them.
		c.awaitLinkDown(lnk)
	}
	return nil
}

// Consumed tells the connection that the application has taken the peer's
// bytes up to stream position pos out of the RMB, which lies between Consumed
// and PeerProduced. The consumer cursor goes to the peer when due (10% of the
// RMBE, an urgent byte, or the peer asked).
func (c *Conn) Consumed(pos uint64) error {
	if err := c.cursorDriven(); err != nil {
		return err
	}
	c.rxMu.Lock()
	defer c.rxMu.Unlock()
	c.mu.Lock()
	at, readable := c.rx.Pos(), uint64(c.rx.Readable())
	var err error
	switch {
	case c.closing.appClosed:
		err = net.ErrClosed
	case pos < at || pos-at > readable:
		err = fmt.Errorf("smcr: consumer cursor %d outside the readable bytes [%d, %d]", pos, at, at+readable)
	}
	if err != nil || pos == at {
		c.mu.Unlock()
		return err
	}
	urgent := c.rxUrgent && at <= c.rxUrgentAt && c.rxUrgentAt < pos
	c.rx.Consume(uint32(pos - at)) // cannot fail: they were readable
	c.passMarkLocked()
	update := c.rx.UpdateDue(urgent)
	c.mu.Unlock()
	if update {
		c.sendCursors(0, cdcUpdate)
	}
	c.cs.rx.Add(pos - at)
	c.e.st.rxBytes.Add(pos - at)
	return nil
}

// ErrNoRelease is returned by Release when the connection cannot be handed
// back to its TCP connection: the peer does not speak our extensions, the
// connection failed, closed or continues over TCP already, or the peer is
// gone with bytes the application has not read.
var ErrNoRelease = errors.New("smcr: connection cannot be released to tcp")

// Release hands a cursor-driven connection back to its TCP connection, whose
// socket another holder (the program whose socket it is) goes on with as plain
// TCP: a continuation over TCP (resync.go) started by us, where our resync says
// we hold the peer's stream up to consumed, what the application took out of
// the RMB, so that the peer resends what the application has not read and it
// lands in the socket's receive queue; we resend what the peer lacks of ours up
// to Produced (the caller posted every byte the application wrote). consumed
// lies between Consumed and PeerProduced; it is never below the consumer
// cursor our CDCs told the peer, whose send buffer still holds every byte from
// there. Once Release returns nil the engine reads nothing more from the TCP
// connection (the resync's reader stops after the peer's 16 bytes) and writes
// nothing more to it; the caller closes its Conn, which closes the engine's
// descriptor of the socket with neither FIN nor reset while the other holder
// keeps it open. It waits for the peer's resync (resyncWait at most).
func (c *Conn) Release(consumed uint64) error {
	if err := c.cursorDriven(); err != nil {
		return err
	}
	c.txMu.Lock() // no PostProduced meanwhile: Produced is final
	defer c.txMu.Unlock()
	c.mu.Lock()
	var err error
	_, readAhead := c.tcp.(*readAheadConn)
	switch {
	case c.cont.fo:
		err = fmt.Errorf("%w: it continues over tcp already", ErrNoRelease)
	case !c.canContinue() || c.closing.appClosed:
		err = fmt.Errorf("%w: state %v", ErrNoRelease, c.st)
	case readAhead:
		// The peer's resync may lie among bytes CLC read ahead, and more
		// with it: they would not reach the socket's queue.
		err = fmt.Errorf("%w: bytes read ahead of the tcp stream", ErrNoRelease)
	case consumed < c.rx.Pos() || consumed < c.rx.ConfirmedPos() || consumed > c.rx.PeerProducerPos():
		err = fmt.Errorf("smcr: release: consumer cursor %d outside [%d, %d]", consumed, max(c.rx.Pos(), c.rx.ConfirmedPos()), c.rx.PeerProducerPos())
	case c.closing.peerClosed && consumed != c.rx.PeerProducerPos():
		// A peer that closed may be gone before it reads our resync: its
		// bytes in the RMB could not come again.
		err = fmt.Errorf("%w: the peer closed, %d bytes unread", ErrNoRelease, c.rx.PeerProducerPos()-consumed)
	}
	if err != nil {
		c.mu.Unlock()
		return err
	}
	c.cont.release, c.cont.releaseAt = true, consumed
	c.startFailoverLocked()
	done := c.cont.foDone
	c.mu.Unlock()
	<-done
	c.mu.Lock()
	ok, cerr := c.cont.foReady, c.err
	c.mu.Unlock()
	if !ok {
		if cerr == nil {
			cerr = ErrLinkDown
		}
		return fmt.Errorf("smcr: release: %w", cerr)
	}
	c.e.log.Info("smcr: connection released to tcp", "conn", c.id, "consumed", consumed)
	return nil
}
