// The history of the connections smcrd carried that have ended, for
// smcrctl history: a bounded ring, newest first, as Linux keeps none and AIX
// operators read netstat's.

package daemon

import (
	"context"
	"time"

	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/smcr"
)

// historySize is how many ended connections the history keeps.
const historySize = 256

// history is a ring of the last historySize connections that ended. The
// caller holds connMu.
type history struct {
	ring [historySize]control.ClosedConn
	next int // where the next goes
	n    int // how many it holds
}

func (h *history) add(c control.ClosedConn) {
	h.ring[h.next] = c
	h.next = (h.next + 1) % historySize
	h.n = min(h.n+1, historySize)
}

// list is the ring's connections, newest first.
func (h *history) list() []control.ClosedConn {
	out := make([]control.ClosedConn, 0, h.n)
	for i := 1; i <= h.n; i++ {
		out = append(out, h.ring[(h.next-i+historySize)%historySize])
	}
	return out
}

// ended is what the history keeps of t, which ends now. The caller holds
// connMu.
func (t *tracked) ended() control.ClosedConn {
	now := time.Now()
	c := control.ClosedConn{ID: t.id, Local: t.local.String(), Remote: t.remote.String(), Role: role(t.client),
		Ended: now, Seconds: now.Sub(t.start).Seconds(), TxBytes: t.bytes.tx.Load(), RxBytes: t.bytes.rx.Load()}
	switch {
	case t.conn != nil && t.conn.Mode() == smcr.ModeSMCR:
		c.Mode = control.ModeSMCR
	case t.conn != nil:
		c.Mode, c.Reason = control.ModeTCP, "fallback"
		if dc := t.conn.Decline(); dc != nil {
			c.Reason = dc.Code.String()
		}
	case t.reason != "":
		c.Mode, c.Reason = control.ModeTCP, t.reason
	default:
		c.Mode = control.ModeFailed
	}
	return c
}

// History lists the last connections that ended, newest first.
func (d *Daemon) History(context.Context) ([]control.ClosedConn, error) {
	d.connMu.Lock()
	defer d.connMu.Unlock()
	return d.closed.list(), nil
}
