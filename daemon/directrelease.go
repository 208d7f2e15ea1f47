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
// closes only its own descriptor of the socket: no FIN, no reset.
func (dc *directConn) releasedToSocket() {
	dc.sh.DFlags().Or(rmb.DReleased)
	dc.publish()
	if dc.releases != nil {
		dc.releases.Add(1)
	}
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
