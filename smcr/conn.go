// Conn: the net.Conn of one connection, SMC-R or fallen back to TCP, its fields
// grouped by concern, and the Linux state its close flags amount to.
// RFC 7609 §4.4 (connection states), after Linux's enum smc_state.

package smcr

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/smcr-io/smcr/internal/tcpurg"
	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// Mode says how a Conn carries its bytes.
type Mode uint8

const (
	ModeSMCR     Mode = iota + 1 // over RDMA
	ModeFallback                 // over the TCP connection
)

func (m Mode) String() string {
	switch m {
	case ModeSMCR:
		return "SMC-R"
	case ModeFallback:
		return "TCP"
	}
	return "unknown"
}

// state is the connection state, named as Linux's enum smc_state so traces line
// up. It is not a state machine the logic runs on: the logic tests the flags of
// closeState, and updateState draws the state from them after each change, for
// logs and ConnInfo (and SMC_INIT, until activate, tells a connection in setup).
// The drawing:
//
//	             CloseWrite                    peer sending-done
//	ACTIVE ─────────────────▶ PEERCLOSEWAIT1   ACTIVE ──────────────▶ APPCLOSEWAIT1
//	  │ peer closed/done          │ peer done           │ CloseWrite
//	  │                           ▼                     ▼
//	  │                      PEERCLOSEWAIT2 ◀──── APPFINCLOSEWAIT
//	  │ Close                     │ Close / peer closed
//	  ▼                           ▼
//	PEERFINCLOSEWAIT ──────────▶ CLOSED ◀───── PEERABORTWAIT / PROCESSABORT (abort)
//
// A connection is INIT until CLC activates it, whatever CDCs arrive before: a
// server's peer may write and close between its Confirm and the server's
// activation. The flags they set take effect at activation.
//
// Buffers are released in CLOSED, once both ends sent a terminal flag (closed or
// abnormal close) and every RDMA WRITE reading our send buffer has completed.
type state uint8

const (
	stateInit state = iota
	stateActive
	statePeerCloseWait1   // we sent sending-done, the peer has not
	statePeerCloseWait2   // both sent sending-done, we have not closed
	stateAppCloseWait1    // the peer sent sending-done, we can still write
	stateAppFinCloseWait  // both done; waiting for our Close
	statePeerFinCloseWait // we closed, waiting for the peer's close
	statePeerAbortWait    // we aborted, waiting for the peer's answer
	stateProcessAbort     // the peer aborted
	stateClosed
)

var stateNames = [...]string{
	stateInit:             "SMC_INIT",
	stateActive:           "SMC_ACTIVE",
	statePeerCloseWait1:   "SMC_PEERCLOSEWAIT1",
	statePeerCloseWait2:   "SMC_PEERCLOSEWAIT2",
	stateAppCloseWait1:    "SMC_APPCLOSEWAIT1",
	stateAppFinCloseWait:  "SMC_APPFINCLOSEWAIT",
	statePeerFinCloseWait: "SMC_PEERFINCLOSEWAIT",
	statePeerAbortWait:    "SMC_PEERABORTWAIT",
	stateProcessAbort:     "SMC_PROCESSABORT",
	stateClosed:           "SMC_CLOSED",
}

func (s state) String() string { return stateNames[s] }

var (
	// ErrFallback is wrapped by errors that made a connection fall back to TCP.
	ErrFallback = errors.New("smcr: fell back to tcp")
	// ErrLinkDown ends SMC-R connections whose link group lost its last link.
	ErrLinkDown = errors.New("smcr: link down")
	// ErrReset is returned after the peer aborted the connection (the SMC-R RST).
	ErrReset = errors.New("smcr: connection reset by peer")
	// ErrAborted is returned after this end aborted the connection.
	ErrAborted = errors.New("smcr: connection aborted")
	// ErrProtocol ends a connection whose peer broke the protocol.
	ErrProtocol = errors.New("smcr: protocol violation")
	// ErrWriteClosed is returned by Write after CloseWrite or the peer's close.
	ErrWriteClosed = errors.New("smcr: write after close")
)

// Read and Write return these when their deadline passes: as the net.Conn
// contract asks, they wrap os.ErrDeadlineExceeded (which callers such as
// net/http test with errors.Is) and are net.Errors whose Timeout is true.
var (
	errReadTimeout  error = &net.OpError{Op: "read", Net: "smc", Err: os.ErrDeadlineExceeded}
	errWriteTimeout error = &net.OpError{Op: "write", Net: "smc", Err: os.ErrDeadlineExceeded}
	errClosedTwice  error = &net.OpError{Op: "close", Net: "smc", Err: net.ErrClosed}
)

// Conn is one connection. It implements net.Conn; Mode tells whether its bytes go
// over SMC-R or over the TCP connection it was set up on.
//
// Lock order (lockrank.go): txMu, rxMu and cdcMu before any mutex of a link group,
// a link or the Engine but setMu and lgCreate; mu after all of those. Two Conns' mutexes of one kind are
// never held at once.
type Conn struct {
	e      *Engine
	tcp    net.Conn
	client bool
	id     uint64

	mode    Mode
	decline *Decline
	fb      net.Conn // fallback data path: tcp with the bytes CLC read ahead first
	clcPeer [8]byte  // the peer's ID from its Proposal or Accept (fallback.go)
	// clcUnread is what is left on the stream of a CLC message read in part
	// (cut by the CLC timeout, or refused after its header): a fallback skips
	// it. -1: its end cannot be known, so no fallback can find the data.
	clcUnread int
	// endCLC ends the setup context's hold on tcp's deadline
	// (interruptOnCancel); it runs before they are cleared for the user.
	endCLC func()

	// SMC-R resources, fixed once the Conn is returned.
	lg         *linkGroup
	lnk        *link
	token      uint32 // ours: the peer puts it in every CDC to us
	peerToken  uint32
	rmb        verbs.MR // our RMBE: the peer writes into it; its size is rx's
	snd        verbs.MR // mirrors the peer's RMBE: the source of our RDMA WRITEs; its size is tx's
	peerAddr   uint64
	peerRKey   uint32
	memHeld    int64
	sndHeld    int64   // of memHeld, held for the send buffer from allocRMB until setPeer
	peerOffer  offer   // the client's offer the server chose
	v2         *connV2 // what a version-2 handshake agreed; nil in version 1
	peerDirect []byte  // the peer's tlvDirect, when both ends are direct over shm
	reserved   bool    // holds a slot of lg
	reusedLG   bool    // lg existed before this connection (Stats.Reused once active)
	// acceptSent: the server sent its Accept, so the client may write into our
	// RMB as soon as its Confirm is out, even if we decline after all.
	acceptSent bool

	// rkeyAnnounced is closed when the peer answered our RMB's CONFIRM_RKEY
	// (nil: none sent); until then the RMB is not pooled (bufpool.go).
	rkeyAnnounced <-chan struct{}
	rmbPooled     bool // the RMB came from the pool: the peer knows it (announceRMB)
	// cursors: the application side drives the cursors over the buffers
	// (cursors.go), which are neither taken from the pool nor given to it.
	cursors bool
	notify  atomic.Pointer[func()] // SetCursorNotify's

	// cdcMu keeps our CDCs on the wire in the order of their sequence numbers
	// (Linux's receiver drops one numbered before the last it took).
	cdcMu mutex[connCDCRank]

	rxMu     mutex[connRxRank]       // one Read at a time
	driveWCs [8]verbs.WorkCompletion // Read's, for drive: under rxMu
	spin     spinBudget              // drive's
	txMu     mutex[connTxRank]       // one Write at a time

	urgOnce sync.Once
	urgR    *tcpurg.Reader // reads the TCP socket: CLC's markReader, then a fallback or continuation
	clcIn   *markReader    // under CLC's bufio.Reader, which a fallback reads on (readAheadConn)

	mu mutex[connRank]
	st state // drawn from closing by updateState
	// The rings' accounting, in stream positions (package rmb): size 0 until
	// the RMB is allocated (rx) or the peer's Accept or Confirm sizes its
	// RMBE (tx), which is before the Conn is returned; the sizes are then
	// fixed and may be read without mu.
	rx          rmb.Consumer // the peer's writes into our RMBE, our reads, our reports
	tx          rmb.Producer // our writes into the peer's RMBE, its consumer cursor
	seq         uint16       // of our last CDC
	txUrgent    bool         // the producer cursor just passed an urgent byte: the next CDC says so
	txUrgentEnd uint64       // just past our last urgent byte (0: none), for a resend
	rxUrgentAt  uint64       // the peer's urgent byte, while rxUrgent (urgent.go)
	rxUrgent    bool
	rxSeq       uint16 // of the peer's last CDC taken (rxSeqSet)
	rxSeqSet    bool
	activated   bool // CLC made it an SMC-R connection (activate)
	ctlPending  ctlBits
	err         error // terminal error for Read and Write
	lnkErr      bool  // the link group is gone: nothing more can be sent
	txBusy      bool  // a Write is between taking space and posting the chunk (sendChunk)
	rxBusy      bool  // a Read is copying out of the RMB

	// By concern; each type says which of its fields c.mu guards.
	closing closeState // close and abort (close.go)
	cont    contState  // continuation over TCP (resync.go)
	move    moveState  // on the group's links: registrations, moves (multilink.go)

	wrOut atomic.Int32 // RDMA WRITEs posted and not completed

	rxWake, txWake chan struct{}
	done           chan struct{} // closed by Close
	readDL         deadline
	writeDL        deadline
	closeOnce      sync.Once

	cs connStats
}

// closeState is where each end is in closing (close.go): the flags the CDCs'
// connection-state bits and Close, CloseWrite and Abort set, under c.mu.
// updateState draws the Linux state (Conn.st) from them.
type closeState struct {
	peerDone   bool // peer sent sending-done (or closed)
	peerClosed bool // peer sent closed or abort: it will not write again
	// A standard peer (Linux) whose close found our RMBE full in its view may
	// still write what its close left unsent (lateWrites in cdc.go).
	peerLate     bool
	peerLateRoom bool // a CDC of ours gave such a peer room since: the RMB outlives the close
	peerAbort    bool
	abortEarly   bool // the peer aborted before its sending-done: its stream ends short
	localDone    bool // we sent sending-done
	localTerm    bool // we sent closed or abort
	localAbort   bool
	termAcked    bool // a CDC of ours that said closed or abnormal close completed
	appClosed    bool // Close was called
	released     bool
	closeTimer   Timer // CloseTimeout after Close, until the peer closes too
}

// contState is the continuation over TCP (resync.go): the flags under c.mu,
// the channels made with the Conn.
type contState struct {
	smcx bool // the peer speaks our extensions (continuation over TCP)
	// detached (StopTCPWatch): the TCP connection is no more the engine's to
	// read; watchDone is closed when watchTCP returns.
	detached     bool
	watchDone    chan struct{}
	fo           bool // continuation over TCP started: cursors frozen
	foReady      bool // continuation done: the TCP connection carries the bytes
	declinedLate bool // the peer declined after our Confirm: continue from byte 0
	// release: the continuation is Release's, which hands the TCP connection
	// to its socket's other holder: our resync says we hold the peer's
	// stream up to releaseAt (what the application consumed), not all the
	// RMB holds, so that the peer resends the rest into the socket's queue.
	release    bool
	releaseAt  uint64
	foDone     chan struct{}     // closed when the continuation ended
	peerResync chan resyncResult // the peer's resync, from watchTCP
}

// moveState is the connection on its group's links (multilink.go): our RMB and
// send buffer registered on each link by link slot, and the peer RMB's rkey on
// the link CLC named. rmb and snd are allocated in the PD of rmbHome and
// sndHome, and are among rmbOn and sndOn until that link fails with c moved off
// it (forgetLink). moving is under c.mu; the counters are atomic, kept by the
// completions.
type moveState struct {
	rmbOn, sndOn     [linkSlots]verbs.MR
	regLink          [linkSlots]*link // whose PD holds rmbOn[i] and sndOn[i]
	rmbHome, sndHome *link
	peerKey          rkeyOn
	moving           bool                    // moving to another link after ours failed: writers wait
	wrOutOn          [linkSlots]atomic.Int32 // wrOut by link slot
	txAcked          atomic.Uint64           // producer cursor of our last CDC that completed
	seqAcked         atomic.Uint32           // sequence number of our last CDC that completed
}

type connStats struct {
	tx, rx, cdcSent, cdcRecv, blocked, updates atomic.Uint64
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// setState is the one place the state changes; it logs every transition.
// The caller holds c.mu.
func (c *Conn) setState(s state, why string) {
	if c.st == s {
		return
	}
	c.e.log.Debug("smcr: conn state", "conn", c.id, "from", c.st, "to", s, "why", why)
	c.st = s
}

// PeerDirect is what the peer's smcrd sent in tlvDirect, when both ends said
// in CLC that they are programs' own sockets in the direct mode and the link is
// shm (ClientOptions.Direct, ServerOptions.Direct); nil otherwise.
func (c *Conn) PeerDirect() []byte { return c.peerDirect }

// ID is the connection's number in the engine (ConnInfo.ID).
func (c *Conn) ID() uint64 { return c.id }

// Mode reports whether the connection runs over SMC-R or fell back to TCP.
func (c *Conn) Mode() Mode { return c.mode }

// Decline returns why the connection fell back, or nil when it runs over SMC-R.
func (c *Conn) Decline() *Decline { return c.decline }

// TCP returns the TCP connection the Conn was set up on.
func (c *Conn) TCP() net.Conn { return c.tcp }

// LocalAddr is the TCP connection's local address.
func (c *Conn) LocalAddr() net.Addr { return c.tcp.LocalAddr() }

// RemoteAddr is the TCP connection's remote address.
func (c *Conn) RemoteAddr() net.Addr { return c.tcp.RemoteAddr() }

// Stats returns the connection's counters.
func (c *Conn) Stats() ConnStats {
	return ConnStats{
		TxBytes: c.cs.tx.Load(), RxBytes: c.cs.rx.Load(),
		CDCSent: c.cs.cdcSent.Load(), CDCRecv: c.cs.cdcRecv.Load(),
		WriteBlocked: c.cs.blocked.Load(), ConsumerUpdates: c.cs.updates.Load(),
	}
}

// Read reads data the peer wrote into our RMBE (or, after a fallback, from TCP).
func (c *Conn) Read(p []byte) (int, error) {
	n, _, err := c.ReadMarked(p)
	return n, err
}

// ReadMarked is Read that reports TCP urgent data (MSG_OOB) from the peer: Read
// and ReadMarked never return the urgent byte together with other bytes, and
// ReadMarked sets urgent when p[0] is it. The byte stays in the stream, as with
// SO_OOBINLINE (urgent.go).
func (c *Conn) ReadMarked(p []byte) (n int, urgent bool, err error) {
	if c.mode == ModeFallback {
		n, urgent, err = c.readMarkedTCP(c.fb, p)
		c.cs.rx.Add(uint64(n))
		c.e.st.fbRx.Add(uint64(n))
		return n, urgent, err
	}
	if len(p) > int(c.rx.Size()) {
		c.e.st.rxTooSmall.Add(1)
	}
	n, urgent, err = c.smcRead(p)
	if n > 0 {
		c.e.st.rxReq.observe(uint64(n))
	}
	return n, urgent, err
}

// Write writes p into the peer's RMBE (or, after a fallback, to TCP).
func (c *Conn) Write(p []byte) (int, error) {
	if c.mode == ModeFallback {
		n, err := c.fb.Write(p)
		c.cs.tx.Add(uint64(n))
		c.e.st.fbTx.Add(uint64(n))
		return n, err
	}
	if len(p) > int(c.tx.Size()) {
		c.e.st.txTooSmall.Add(1)
	}
	n, err := c.smcWrite(p, false)
	if n > 0 {
		c.e.st.txReq.observe(uint64(n))
	}
	return n, err
}

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	if c.mode == ModeFallback {
		return c.fb.SetDeadline(t)
	}
	c.readDL.set(t)
	c.writeDL.set(t)
	if c.continued() {
		c.tcp.SetDeadline(t)
	}
	return nil
}

// Broken reports whether the connection ended abnormally before the peer
// finished sending (the peer's abort, ours, a protocol error, its links lost
// with no continuation): the peer's stream is short for good, as after a TCP
// reset that came before the FIN. Bytes that arrived can still be read. smcrd's
// relay asks while it is not reading, to pass the reset on at once.
func (c *Conn) Broken() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.err == nil:
		return false
	case errors.Is(c.err, ErrReset), errors.Is(c.err, ErrLinkDown):
		// After the peer's sending-done the stream was whole, as a TCP
		// reset after the FIN leaves it.
		return !c.closing.peerDone || c.closing.abortEarly
	}
	return true
}

// Continued reports whether the connection's bytes now go over its TCP
// connection: it ran over SMC-R until its link group failed, and continued
// over TCP (with smcr peers), as Mode still says ModeSMCR.
func (c *Conn) Continued() bool { return c.continued() }

// continued reports whether the connection now runs over TCP after its link failed.
func (c *Conn) continued() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cont.foReady
}

// SetReadDeadline sets the deadline for Read.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.mode == ModeFallback {
		return c.fb.SetReadDeadline(t)
	}
	c.readDL.set(t)
	if c.continued() {
		c.tcp.SetReadDeadline(t)
	}
	return nil
}

// SetWriteDeadline sets the deadline for Write.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.mode == ModeFallback {
		return c.fb.SetWriteDeadline(t)
	}
	c.writeDL.set(t)
	if c.continued() {
		c.tcp.SetWriteDeadline(t)
	}
	return nil
}

// deadline is a resettable deadline whose wait channel closes when it passes,
// as in net.Pipe: waiting on it allocates nothing.
type deadline struct {
	mu     sync.Mutex
	at     time.Time // as set; zero: none
	timer  *time.Timer
	cancel chan struct{}
}

// get returns the deadline as last set, for a continuation's TCP connection.
func (d *deadline) get() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.at
}

func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.at = t
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer fired: wait for it to close the channel
	}
	d.timer = nil
	closed := d.cancel != nil && isClosed(d.cancel)
	if t.IsZero() {
		if closed || d.cancel == nil {
			d.cancel = make(chan struct{})
		}
		return
	}
	if dur := t.Sub(realNow()); dur > 0 {
		if closed || d.cancel == nil {
			d.cancel = make(chan struct{})
		}
		ch := d.cancel
		d.timer = realAfterFunc(dur, func() { close(ch) })
		return
	}
	if !closed {
		if d.cancel == nil {
			d.cancel = make(chan struct{})
		}
		close(d.cancel)
	}
}

func (d *deadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cancel == nil {
		d.cancel = make(chan struct{})
	}
	return d.cancel
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// wakeApp wakes the connection's reader and writer, and calls the cursor
// notification (SetCursorNotify): its cursors or state may have moved. The
// caller holds no mutex of c's.
func (c *Conn) wakeApp() {
	wake(c.rxWake)
	wake(c.txWake)
	if f := c.notify.Load(); f != nil {
		(*f)()
	}
}
