// The direct mode's driver: the library's rings are the engine's own send
// buffer and RMB, so smcrd copies nothing and only carries cursors between the
// shared area and a cursor-driven smcr.Conn (smcr/cursors.go).

package daemon

import (
	"errors"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr"
)

// drive carries the connection until the program has closed or the connection
// ended: the library's tx_prod and rx_cons go to the engine (PostProduced,
// Consumed), the engine's PeerConsumed and PeerProduced and its end come back
// as tx_cons, rx_prod and d_flags. A continuation over TCP hands the
// connection to the pumps (handBack).
func (dc *directConn) drive() {
	conn := dc.engine
	wake := make(chan struct{}, 1)
	conn.SetCursorNotify(func() { nudge(wake) })
	defer conn.SetCursorNotify(nil)
	efds := []*os.File{dc.efdTx, dc.efdRx}
	var fwd sync.WaitGroup
	for _, efd := range efds {
		fwd.Add(1)
		go func() {
			defer fwd.Done()
			forwardEvents(efd, wake) // until release closes efd, or the hand-back
		}()
	}
	d := driver{dc: dc, conn: conn, txSize: uint64(len(dc.sh.TxRing())), rxSize: uint64(len(dc.sh.RxRing()))}
	for {
		switch d.step() {
		case driveDone:
			close(dc.rxDone)
			return
		case driveHandBack:
			conn.SetCursorNotify(nil)
			// The pumps read the eventfds themselves.
			for _, efd := range efds {
				efd.SetReadDeadline(time.Unix(1, 0))
			}
			fwd.Wait()
			for _, efd := range efds {
				efd.SetReadDeadline(time.Time{})
			}
			dc.handBack(conn)
			return
		case driveMoved:
			continue
		}
		// Idle: ask the library for a wake-up, then look once more, as
		// it may have moved before it saw the request.
		dc.sh.DTxWait().Store(1)
		dc.sh.DRxWait().Store(1)
		if d.step() == driveIdle {
			<-wake
		}
		dc.sh.DTxWait().Store(0)
		dc.sh.DRxWait().Store(0)
	}
}

// driver is drive's state between steps.
type driver struct {
	dc             *directConn
	conn           *smcr.Conn
	txSize, rxSize uint64
	shut           bool // CloseWrite done
}

type driveOutcome int

const (
	driveIdle     driveOutcome = iota // nothing moved: wait
	driveMoved                        // something moved: look again
	driveDone                         // the connection's end: stop
	driveHandBack                     // continued over TCP: the pumps go on
)

// step moves what can move once.
func (d *driver) step() driveOutcome {
	dc, sh := d.dc, d.dc.sh
	if dc.stopped.Load() {
		return driveDone
	}
	// Flags before the cursor: bytes written before a shutdown or close are
	// all in the cursor read after.
	flags := sh.LibFlags().Load()
	// The program's end, seen before the cursors: they are final then. (A
	// close seen after them could follow reads they miss: the engine would
	// take the bytes for unread and abort.)
	ending := flags&rmb.LibClosed != 0 || dc.gone.Load()
	if dc.endsInAbort(flags) {
		dc.log.Debug("direct: the program's end is an abort", "flags", flags, "rx_unread", sh.RxProd().Load()-sh.RxCons().Load())
		dc.abort() // as TCP's RST, the bytes not yet posted go too
		return driveDone
	}
	prod, rxCons := sh.TxProd().Load(), sh.RxCons().Load()
	urg := sh.TxUrg().Load() // after tx_prod: stored before the tx_prod that covers it
	cur := d.conn.Cursors()
	if cur.Continued {
		return driveHandBack
	}
	moved := false
	if prod != cur.Produced && cur.WriteErr == nil {
		if prod < cur.Produced || prod-cur.PeerConsumed > d.txSize {
			dc.log.Warn("direct: library's send cursor out of bounds: connection aborted")
			dc.abort()
			return driveDone
		}
		switch err := d.post(cur.Produced, prod, urg); {
		case errors.Is(err, smcr.ErrContinued):
			return driveHandBack
		case err != nil:
			dc.log.Debug("direct: post", "err", err)
			dc.writeError(err)
		}
		moved = true
	}
	if rxCons != cur.Consumed {
		if rxCons < cur.Consumed || rxCons > cur.PeerProduced {
			dc.log.Warn("direct: library's receive cursor out of bounds: connection aborted")
			dc.abort()
			return driveDone
		}
		if err := d.conn.Consumed(rxCons); err != nil {
			dc.log.Debug("direct: consumed", "err", err)
			dc.fail(errnoOf(err))
		}
		moved = true
	}
	if moved {
		cur = d.conn.Cursors()
	}
	if d.publish(cur) {
		moved = true
	}
	switch {
	case ending:
		if prod != cur.Produced && cur.WriteErr == nil {
			break // post the last bytes first
		}
		if dc.endsInAbort(sh.LibFlags().Load()) {
			dc.log.Debug("direct: the program's end is an abort", "flags", sh.LibFlags().Load(), "rx_unread", sh.RxProd().Load()-sh.RxCons().Load())
			dc.abort()
		} else {
			dc.carrier.Close()
		}
		return driveDone
	case flags&rmb.LibShutWR != 0 && !d.shut && prod == cur.Produced:
		d.shut = true
		if err := d.conn.CloseWrite(); err != nil {
			dc.writeError(err)
		}
		return driveMoved
	case dc.releaseAsked(flags) && (prod == cur.Produced || cur.WriteErr != nil):
		// After the last bytes, with rx_cons final (the library waits).
		return d.release(sh.RxCons().Load())
	}
	if moved {
		return driveMoved
	}
	return driveIdle
}

// post posts the library's bytes from at up to prod; the one before urg,
// when among them, as urgent data (the program's send with MSG_OOB).
func (d *driver) post(at, prod, urg uint64) error {
	if at < urg && urg <= prod {
		if err := d.conn.PostUrgent(urg); err != nil || urg == prod {
			return err
		}
	}
	return d.conn.PostProduced(prod)
}

// publish gives the library the engine's cursors and state; it reports
// whether any moved.
func (d *driver) publish(cur smcr.Cursors) bool {
	sh := d.dc.sh
	moved := false
	if sh.TxCons().Load() != cur.PeerConsumed {
		sh.TxCons().Store(cur.PeerConsumed)
		moved = true
	}
	// The peer's urgent mark before the rx_prod that covers its byte.
	if cur.PeerUrgent != 0 && sh.RxUrg().Load() != cur.PeerUrgent {
		d.dc.newMark(cur.PeerUrgent)
		moved = true
	}
	if sh.RxProd().Load() != cur.PeerProduced {
		sh.RxProd().Store(cur.PeerProduced)
		moved = true
	}
	flags := sh.DFlags().Load()
	switch {
	case cur.ReadErr == io.EOF:
		if flags&rmb.DEOF == 0 {
			sh.DFlags().Or(rmb.DEOF)
			moved = true
		}
	case cur.ReadErr != nil:
		if flags&rmb.DError == 0 {
			d.dc.fail(errnoOf(cur.ReadErr))
			return true
		}
	}
	if cur.WriteErr != nil && !d.shut && flags&(rmb.DTxClosed|rmb.DError) == 0 {
		d.dc.writeError(cur.WriteErr)
		return true
	}
	if moved {
		d.dc.publish()
	}
	return moved
}

// writeError records why no more bytes may be posted: a peer that reads no
// more is EPIPE to the program, anything else a reset.
func (dc *directConn) writeError(err error) {
	if errors.Is(err, smcr.ErrWriteClosed) || errors.Is(err, syscall.EPIPE) {
		dc.sh.DFlags().Or(rmb.DTxClosed)
		dc.publish()
		return
	}
	dc.fail(errnoOf(err))
}

// handBack gives a connection that continued over TCP to the pumps. The
// library holds the peer's bytes up to PeerProduced in the RMB it maps, so
// the engine takes them as consumed and Read returns what the TCP stream
// brings after them; the send pump starts at Produced. tx_cons stays at
// PeerConsumed until the continuation has resent [PeerConsumed, Produced)
// from the send buffer, which the library must not overwrite before.
func (dc *directConn) handBack(conn *smcr.Conn) {
	cur := conn.Cursors()
	if cur.PeerUrgent != 0 {
		dc.newMark(cur.PeerUrgent)
	}
	dc.sh.RxProd().Store(cur.PeerProduced)
	dc.publish()
	if err := conn.Consumed(cur.PeerProduced); err != nil {
		dc.fail(errnoOf(err))
	}
	// An empty Write returns once the continuation has resent.
	if _, err := conn.Write(nil); err != nil {
		dc.writeError(err)
	}
	dc.sh.TxCons().Store(cur.Produced)
	dc.publish()
	dc.log.Debug("direct: continued over tcp: pumps carry the bytes", "produced", cur.Produced, "peer_produced", cur.PeerProduced)
	go dc.receive()
	dc.send()
}

// forwardEvents nudges wake at each write of efd, until efd closes or its
// read deadline passes.
func forwardEvents(efd *os.File, wake chan struct{}) {
	var b [8]byte
	for {
		if _, err := efd.Read(b[:]); err != nil {
			return
		}
		nudge(wake)
	}
}

// nudge wakes a waiter on wake without blocking.
func nudge(wake chan struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}
