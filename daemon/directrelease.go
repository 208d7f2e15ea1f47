// Release: the library hands an accelerated connection back to the program's
// kernel socket (SMCR_LIB_RELEASE), before the socket goes where the library
// cannot follow it: to another process (SCM_RIGHTS), or an exec into an image
// without the library. smcrd makes the socket carry the rest of the stream,
// no byte lost, and lets go of the connection; or, where it cannot, answers so
// and the connection goes on as it was (the library then keeps today's end:
// an abort). Issue #35.

package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr"
)

// releaseAsked reports whether the library asked for the release (flags are
// its lib_flags) and smcrd has not answered yet.
func (dc *directConn) releaseAsked(flags uint32) bool {
	return flags&rmb.LibRelease != 0 && dc.sh.DFlags().Load()&(rmb.DReleased|rmb.DNoRelease) == 0
}

// refuseRelease answers a release that cannot be: the connection goes on.
func (dc *directConn) refuseRelease(why string, err error) {
	dc.log.Info("direct: release refused: the connection goes on", "why", why, "err", err)
	dc.sh.DFlags().Or(rmb.DNoRelease)
	dc.publish()
}

// releasedToSocket answers a release that is done: the program's socket
// carries the rest of the stream. smcrd closes its carrier after, which
// closes only its own descriptor of the socket: no FIN, no reset. The release
// is counted before the answer, which lets the program go on (and exit).
func (dc *directConn) releasedToSocket() {
	if dc.releases != nil {
		dc.releases.Add(1)
	}
	dc.sh.DFlags().Or(rmb.DReleased)
	dc.publish()
	dc.log.Debug("direct: released to the program's socket", "tx_prod", dc.sh.TxProd().Load(), "rx_cons", dc.sh.RxCons().Load())
}

// release has the engine hand a driven connection back (smcr.Conn.Release):
// the peer resends over TCP what the program did not take from the receive
// ring, which is the engine's RMB, so the bytes land in the socket's queue.
// The caller posted every byte up to tx_prod.
func (d *driver) release(rxCons uint64) driveOutcome {
	err := d.conn.Release(rxCons)
	switch {
	case err == nil:
		d.dc.releasedToSocket()
		d.dc.carrier.Close()
		return driveDone
	case errors.Is(err, smcr.ErrNoRelease) && d.conn.Cursors().Continued:
		// Continued over TCP meanwhile: the pumps answer (releasePumps).
		return driveHandBack
	}
	d.dc.refuseRelease("the engine", err)
	return driveMoved
}

// releasePumps answers a release where the pumps carry the bytes (the send
// pump sent every byte up to tx_prod): possible where the carrier reads the
// program's socket itself (a connection continued over TCP, or the test
// server's plain TCP) and the program took every byte the receive pump put
// into the ring, as those left the socket's queue. It stops the receive pump
// first, and starts it again if the release cannot be. It reports whether the
// connection was released.
func (dc *directConn) releasePumps() bool {
	rd, ok := tcpBacked(dc.carrier)
	if !ok {
		dc.refuseRelease("the carrier is not the program's socket", nil)
		return false
	}
	dc.releasing.Store(true)
	rd.SetReadDeadline(time.Unix(1, 0))
	<-dc.rxDone
	rd.SetReadDeadline(time.Time{})
	dc.releasing.Store(false)
	paused := dc.rxPaused.Swap(false)
	switch {
	case dc.stopped.Load():
		return false
	case dc.sh.DFlags().Load()&rmb.DError != 0:
		dc.refuseRelease("the connection failed", nil)
	case dc.sh.RxProd().Load() != dc.sh.RxCons().Load():
		dc.refuseRelease("bytes taken off the socket and not read", nil)
	default:
		dc.releasedToSocket()
		return true
	}
	if paused {
		dc.rxDone = make(chan struct{})
		go dc.receive()
	}
	return false
}

// tcpBacked returns the carrier's read deadline where its reads are those of
// the program's socket.
func tcpBacked(carrier carrier) (interface{ SetReadDeadline(time.Time) error }, bool) {
	switch c := carrier.(type) {
	case *net.TCPConn:
		return c, true
	case *smcr.Conn:
		// Continued, a Conn reads its TCP connection, unless bytes CLC read
		// ahead come first (then TCP() is not the socket itself).
		_, plain := c.TCP().(*net.TCPConn)
		return c, plain && c.Continued()
	}
	return nil, false
}

// pausedForRelease reports whether the receive pump's read ended for
// releasePumps, which it then leaves to.
func (dc *directConn) pausedForRelease(err error) bool {
	if dc.releasing.Load() && errors.Is(err, os.ErrDeadlineExceeded) {
		dc.rxPaused.Store(true)
		return true
	}
	return false
}

// The same-host bypass's release: the libraries write into each other's rings
// and the SMC-R connection carries no bytes, so the two smcrds use it for the
// release. The releasing end R's smcrd asks (relAsk); the peer P's smcrd stops
// P's library's copies into R's ring (rmb.DPeerRelease, then LibSending 0),
// answers (relYes, or relNo where it cannot), resends over TCP from P's socket
// what R's program did not take from its ring, and sets DReleased in P's
// area: P's library reads the rest of its own ring (R's last bytes), then the
// socket, and writes to the socket, after the resend. R's smcrd answers
// DReleased to R's library on relYes. Each side reads the carrier one byte at
// a time and no more after the release, whose bytes are the program's then.
const (
	relAsk = 'R' // the program released its end: stop writing into its ring
	relYes = 'A' // done: the resend is on its way, ordered before any new byte
	relNo  = 'N' // not possible: the connection goes on as it was
)

// releaseBypass answers the program's release in bypass (awaitClose): it
// reports whether the connection was released.
func (dc *directConn) releaseBypass() bool {
	if dc.peerSh == nil {
		dc.refuseRelease("same-host bypass: the peer's area is not mapped", nil)
		return false
	}
	if df := dc.sh.DFlags().Load(); df&(rmb.DError|rmb.DTxClosed) != 0 {
		// The peer closed: its socket may have sent its FIN already.
		dc.refuseRelease("same-host bypass: the peer closed or failed", nil)
		return false
	}
	// The engine reads the socket no more: the resend comes on it.
	if err := dc.stopTCPWatch(); err != nil {
		dc.refuseRelease("same-host bypass: the engine", err)
		return false
	}
	if _, err := dc.carrier.Write([]byte{relAsk}); err != nil {
		dc.refuseRelease("same-host bypass: asking the peer's smcrd", err)
		return false
	}
	t := time.NewTimer(releaseAnswerWait)
	defer t.Stop()
	var answer byte
	select {
	case answer = <-dc.relAnswer:
	case <-t.C:
	}
	if answer != relYes {
		dc.refuseRelease("same-host bypass: the peer's smcrd refused", fmt.Errorf("answer %q", answer))
		return false
	}
	// The program shut down: its socket's FIN follows the bytes it wrote
	// (all in the peer's ring), as the library's shutdown left the socket
	// alone.
	if dc.sh.LibFlags().Load()&rmb.LibShutWR != 0 && dc.sock != nil {
		if err := dc.sock.CloseWrite(); err != nil {
			dc.log.Debug("direct: release: shutdown", "err", err)
		}
	}
	dc.releasedToSocket()
	dc.carrier.Close()
	return true
}

// releaseAnswerWait bounds the wait for the peer's smcrd's answer; the library
// waits for smcrd's RELEASE_WAIT_NS (30 s).
const releaseAnswerWait = 10 * time.Second

// peerRelease is the peer's side of releaseBypass: the other end released
// (relAsk came). It reports whether this end follows (relYes sent).
func (dc *directConn) peerRelease() bool {
	dc.relMu.Lock()
	defer dc.relMu.Unlock()
	no := func(why string) bool {
		dc.log.Info("direct: the peer's release refused: the connection goes on", "why", why)
		dc.carrier.Write([]byte{relNo})
		return false
	}
	flags := dc.sh.LibFlags().Load()
	switch {
	case dc.peerSh == nil:
		return no("the peer's area is not mapped")
	case dc.carrierClosed || dc.stopped.Load() || dc.gone.Load() || flags&(rmb.LibClosed|rmb.LibAbort) != 0:
		return no("the program closed")
	case flags&rmb.LibRelease != 0:
		return no("both ends release")
	case dc.sh.DFlags().Load()&rmb.DError != 0:
		return no("the connection failed")
	}
	// The engine reads the socket no more: the peer's program writes on it
	// once released.
	if err := dc.stopTCPWatch(); err != nil {
		return no("the engine: " + err.Error())
	}
	// No copy into the peer's ring starts from here on; those under way end.
	dc.sh.DFlags().Or(rmb.DPeerRelease)
	dc.publish()
	for deadline := time.Now().Add(5 * time.Second); dc.sh.LibSending().Load() != 0; {
		if time.Now().After(deadline) || dc.gone.Load() {
			dc.sh.DFlags().And(^uint32(rmb.DPeerRelease))
			dc.publish()
			return no("the program's copy into the peer's ring did not end")
		}
		time.Sleep(20 * time.Microsecond)
	}
	// The peer's ring is final now: its program released with rx_cons
	// final, and this program writes into it no more.
	ring := dc.peerSh.RxRing()
	cons, prod := dc.peerSh.RxCons().Load(), dc.peerSh.RxProd().Load()
	if prod-cons > uint64(len(ring)) {
		dc.log.Warn("direct: release: the peer's receive cursors out of bounds: connection aborted")
		dc.carrier.Write([]byte{relNo})
		dc.abort()
		return false
	}
	if _, err := dc.carrier.Write([]byte{relYes}); err != nil {
		dc.log.Info("direct: release: answering the peer's smcrd", "err", err)
		dc.abort()
		return false
	}
	// After the answer: the resend may wait for the peer's program to read,
	// which it does once its smcrd answered it.
	var w [2]rmb.Span
	for _, s := range rmb.AppendSpans(w[:0], cons, uint32(prod-cons), uint32(len(ring))) {
		if _, err := dc.sock.Write(ring[s.Off:s.End()]); err != nil {
			dc.log.Info("direct: release: resending the peer's unread bytes", "err", err)
			dc.fail(errnoOf(err))
			signal(dc.efdTx)
			return true
		}
	}
	// The program shut down (or closed since): the FIN follows its bytes.
	if dc.sh.LibFlags().Load()&(rmb.LibShutWR|rmb.LibClosed) != 0 {
		if err := dc.sock.CloseWrite(); err != nil {
			dc.log.Debug("direct: release: shutdown", "err", err)
		}
	}
	dc.sh.DFlags().Or(rmb.DReleased)
	dc.publish()
	signal(dc.efdTx)
	dc.log.Debug("direct: released at the peer's ask", "resent", prod-cons)
	return true
}

// stopTCPWatch has the engine read the program's socket no more (the peer's
// resync: smcr.Conn.StopTCPWatch) where the carrier is an engine's connection.
func (dc *directConn) stopTCPWatch() error {
	if c, ok := dc.carrier.(interface{ StopTCPWatch() error }); ok {
		return c.StopTCPWatch()
	}
	return nil
}
