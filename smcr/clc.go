// The CLC handshake on the TCP connection: Proposal → Accept → Confirm (or Decline),
// as client and as server, under timeouts, with every way out leading to fallback.
// RFC 7609 §3.5 (connection setup) and §3.7 (CLC messages), after Linux's smc_clc.

package smcr

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/smcr-io/smcr/smcr/clc"
	"github.com/smcr-io/smcr/smcr/verbs"
	"golang.org/x/sys/unix"
)

// clcMaxLen bounds one CLC message we read: a Proposal with 8 IPv6 prefixes and a
// generous extension area.
const clcMaxLen = 1024

// errNoCLC means the peer's first bytes are not a CLC message: it speaks no SMC.
var errNoCLC = errors.New("smcr: peer sent no clc message")

// peekCLC waits for the peer's first bytes and reports whether they start with the
// CLC eyecatcher. It returns as soon as one byte differs, so application bytes from
// a non-SMC peer are never waited on; they stay in br for the application.
func peekCLC(br *bufio.Reader) error {
	for n := 1; n <= len(clc.Eyecatcher); n++ {
		b, err := br.Peek(n)
		if len(b) >= n && b[n-1] != clc.Eyecatcher[n-1] {
			return errNoCLC
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// interruptOnCancel makes ctx's end interrupt a blocked CLC read or write by
// setting a past deadline on tcp. The returned stop ends that and, when ctx
// ended already, waits for the past deadline to be set: only a deadline set
// after stop returns is sure to stay. A context ending as setup finished
// otherwise left a connection handed out with a 1970 deadline, failing its
// every Read and Write. stop may run more than once.
func interruptOnCancel(ctx context.Context, tcp net.Conn) (stop func()) {
	ran := make(chan struct{})
	stopAfter := context.AfterFunc(ctx, func() {
		defer close(ran)
		tcp.SetDeadline(time.Unix(1, 0))
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			if !stopAfter() {
				<-ran
			}
		})
	}
}

// clcPhase arms the TCP deadline for one CLC message and makes ctx's end interrupt it.
func (e *Engine) clcPhase(ctx context.Context, tcp net.Conn) {
	e.clcPhaseFor(ctx, tcp, e.settings().CLCTimeout)
}

// clcPhaseFor is clcPhase with a bound of d.
func (e *Engine) clcPhaseFor(ctx context.Context, tcp net.Conn, d time.Duration) {
	dl := e.cfg.Clock.Now().Add(d)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	tcp.SetDeadline(dl)
}

// readCLC reads one CLC message, classifying failures for the fallback decision.
func (e *Engine) readCLC(ctx context.Context, c *Conn, br *bufio.Reader) (clc.Message, DeclineCode, bool, error) {
	return e.readCLCWithin(ctx, c, br, e.settings().CLCTimeout)
}

// readCLCWithin is readCLC waiting up to d.
func (e *Engine) readCLCWithin(ctx context.Context, c *Conn, br *bufio.Reader, d time.Duration) (clc.Message, DeclineCode, bool, error) {
	e.clcPhaseFor(ctx, c.tcp, d)
	if err := peekCLC(br); err != nil {
		switch {
		case br.Buffered() == 0 && connLost(err):
			return nil, clc.DeclinePeerNoSMC, false, lostError{err}
		case errors.Is(err, errNoCLC):
			return nil, clc.DeclinePeerNoSMC, false, err
		case isTimeout(err):
			return nil, DeclineTimeoutCLC, false, err
		default:
			return nil, clc.DeclinePeerNoSMC, false, err
		}
	}
	m, err := clc.ReadMessage(br, clcMaxLen)
	if err != nil {
		if pe := (*clc.PartialError)(nil); errors.As(err, &pe) {
			c.clcUnread = pe.Unread
		}
		if isTimeout(err) {
			return nil, DeclineTimeoutCLC, true, err
		}
		if connLost(err) {
			return nil, clc.DeclinePeerNoSMC, false, lostError{err}
		}
		if errors.Is(err, net.ErrClosed) { // our own close
			return nil, clc.DeclinePeerNoSMC, false, err
		}
		return nil, clc.DeclineConfigError, true, err
	}
	return m, 0, false, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

func (e *Engine) writeCLC(c *Conn, m clc.Message) error {
	b, err := m.AppendTo(make([]byte, 0, 128))
	if err != nil {
		return err
	}
	if _, err = c.tcp.Write(b); connLost(err) {
		return lostError{err}
	}
	return err
}

// lostError marks a CLC read or write that failed because the TCP connection
// ended under it: reset, closed by the peer, timed out by TCP. Nothing can
// fall back onto such a connection, so once the peer is known to speak CLC
// the handshake fails with it, as Linux's does (smc_clc_wait_msg's negative
// reason codes, which smc_connect_decline_fallback returns as errors). The
// connection handed out as a fallback failed at its first Read or Write
// instead, and counted as one.
type lostError struct{ err error }

func (e lostError) Error() string { return "tcp connection lost: " + e.err.Error() }
func (e lostError) Unwrap() error { return e.err }

// connLost tells the errors of a TCP connection that ended from those of
// one that lives (a deadline, our own close).
func connLost(err error) bool {
	for _, e := range []error{syscall.ECONNRESET, syscall.EPIPE, syscall.ECONNABORTED, syscall.ETIMEDOUT, io.EOF, io.ErrUnexpectedEOF} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// isLost reports whether err came from a CLC read or write on a lost connection.
func isLost(err error) bool {
	var l lostError
	return errors.As(err, &l)
}

// ctxOver reports whether ctx ended, or reached its deadline: a CLC read's
// deadline is the context's when that comes first (clcPhaseFor), and the read
// may fail a moment before the context's own timer marks it done. Without the
// deadline check a Dial whose context ran out during CLC fell back to TCP or
// failed with the context's error, by a race.
func ctxOver(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !realNow().Before(d)
}

// failed reports whether a handshake that met err ends in an error rather
// than a fallback: ctx ended, or the TCP connection was lost (lostError).
func failed(ctx context.Context, err error) bool {
	return ctxOver(ctx) || isLost(err)
}

// fail ends a handshake with an error (failed): the context's, or err.
func fail(ctx context.Context, c *Conn, err error) (*Conn, error) {
	c.abandonSetup()
	c.e.untrack(c)
	c.e.st.handshakeErrors.Add(1)
	if ctxOver(ctx) {
		err = ctx.Err()
		if err == nil {
			err = context.DeadlineExceeded // reached, its timer not run yet (ctxOver)
		}
	}
	return nil, fmt.Errorf("smcr: clc: %w", err)
}

// standardOffers are the offers a Proposal to a standard SMC-R server carries:
// its first rdma device, whose GID and MAC fill the Proposal's own fields, in an
// envelope that fits the area a Linux server skips (clc.Proposal.SetEnvelope) or
// in none.
// shm and soft mean nothing to such a server, and more would make it close the
// connection.
func standardOffers(all []offer) []offer {
	for _, o := range all {
		if o.Kind == verbs.KindRDMA {
			return []offer{o}
		}
	}
	return nil
}

func (e *Engine) offers() []offer {
	out := make([]offer, 0, len(e.cfg.Devices))
	for _, d := range e.cfg.Devices {
		p := d.Port()
		out = append(out, offer{Kind: d.Kind(), GID: p.GID, MAC: p.MAC, MTU: p.MTU, Endpoint: d.Endpoint()})
	}
	return out
}

func (e *Engine) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// client runs CLC as the client. pfx is the subnet of the local address.
func (e *Engine) client(ctx context.Context, tcp net.Conn, pfx netip.Prefix, opts ClientOptions) (*Conn, error) {
	c := e.newConn(tcp, true)
	c.cursors = opts.Cursors
	c.endCLC = interruptOnCancel(ctx, tcp)
	defer c.endCLC()
	br := c.clcReader(4096)
	offers := e.offers()
	if opts.Standard {
		offers = standardOffers(offers)
	}
	if len(offers) == 0 || e.isClosed() {
		// Without a device we do not propose, and say so, as Linux's client
		// does: the server, ours or another, waits for CLC (its SYN-ACK echoed
		// the option) and would otherwise hold the connection for its CLC
		// timeout, which an application whose server speaks first (SSH,
		// SMTP, MySQL) waits out too.
		return e.fallback(c, decline(clc.DeclineNoSMCRDevice, nil), nil), nil
	}
	prop := &clc.Proposal{PeerID: e.peerID, GID: offers[0].GID, MAC: offers[0].MAC}
	if pfx.IsValid() && pfx.Addr().Is4() {
		prop.Subnet, prop.PrefixLen = pfx.Addr().As4(), uint8(pfx.Bits())
	} else if pfx.IsValid() {
		prop.IPv6 = []clc.IPv6Prefix{{Addr: pfx.Addr().As16(), Len: uint8(pfx.Bits())}}
	}
	val, err := appendOffers(nil, offers)
	if err != nil {
		return e.fallback(c, giveUp(clc.DeclineConfigError, err), nil), nil
	}
	env := clc.Envelope{TLVs: []clc.TLV{{Type: tlvProviders, Value: val}}}
	if opts.Direct != nil && !opts.Standard {
		if len(opts.Direct) > maxDirectValue {
			return e.fallback(c, giveUp(clc.DeclineConfigError, errors.New("direct value too long")), nil), nil
		}
		env.TLVs = append(env.TLVs, clc.TLV{Type: tlvDirect, Value: opts.Direct})
	}
	area, err := env.AppendTo(nil)
	if err != nil {
		return e.fallback(c, giveUp(clc.DeclineConfigError, err), nil), nil
	}
	if opts.Standard && len(area) > clc.LinuxIPAreaOffset {
		area = nil // a plain version-1 Proposal: the device is in its own fields
	}
	prop.SetEnvelope(area)
	if opts.Standard {
		c.v2 = e.proposeV2(prop, offers[0], pfx)
	}
	e.clcPhase(ctx, tcp)
	if err := e.writeCLC(c, prop); err != nil {
		err = fmt.Errorf("send proposal: %w", err)
		if failed(ctx, err) {
			return fail(ctx, c, err)
		}
		return e.fallback(c, giveUp(clc.DeclinePeerNoSMC, err), br), nil
	}
	e.awaitCLC(c.tcp, br, &e.acceptSpin)
	m, code, send, err := e.readCLC(ctx, c, br)
	if err != nil {
		// Lost: the server (smcr's or Linux's) runs CLC before its application
		// sees the connection, so only its SMC layer can have ended it; a
		// plain server that closes at once is told from it by no one.
		err = fmt.Errorf("read accept: %w", err)
		if failed(ctx, err) {
			return fail(ctx, c, err)
		}
		// A timeout after our Proposal: the peer may be a slow SMC peer, so tell it.
		return e.fallback(c, fallbackWhy{code: code, side: SideLocal, tell: send || code == DeclineTimeoutCLC, err: err}, br), nil
	}
	var acc *clc.Accept
	switch m := m.(type) {
	case *clc.Decline:
		return e.fallback(c, peerDeclined(m.Code, nil), br), nil
	case *clc.Accept:
		if m.V2 != nil && c.v2 == nil { // we proposed version 1 only
			return e.fallback(c, decline(clc.DeclineConfigError, errors.New("clc: version 2 accept to a version 1 proposal")), br), nil
		}
		if m.V2 == nil {
			c.v2 = nil // the server chose version 1
		} else if code, err := e.clientAcceptV2(c, m); err != nil {
			return e.fallback(c, decline(code, err), br), nil
		}
		acc = m
		c.clcPeer = m.PeerID
	default:
		return e.fallback(c, decline(clc.DeclineConfigError, fmt.Errorf("clc: %v instead of accept", m.Type())), br), nil
	}
	if code, err := e.clientAccept(ctx, c, acc); err != nil {
		if ctxOver(ctx) {
			return fail(ctx, c, err)
		}
		return e.declineUnlessDeclined(ctx, c, br, code, err)
	}
	if d, err := e.declinedMeanwhile(ctx, c, br); err != nil {
		if failed(ctx, err) {
			return fail(ctx, c, err)
		}
		return e.fallback(c, decline(clc.DeclineSyncError, err), br), nil
	} else if d != nil {
		return e.fallback(c, peerDeclined(d.Code, nil), br), nil
	}
	if br.Buffered() > 0 {
		// Bytes after a Confirm on the TCP stream: the peer is out of step.
		return e.fallback(c, decline(clc.DeclineSyncError, errors.New("bytes after accept")), br), nil
	}
	// Send the Confirm while the QP connects: a provider may need both ends to meet.
	if code, err := e.clientConfirm(ctx, c, acc); err != nil {
		if failed(ctx, err) {
			return fail(ctx, c, err)
		}
		// A server that declined while we waited for CONFIRM_LINK is plain TCP
		// already: our Decline would reach its application as data.
		return e.declineAfterLink(ctx, c, br, code, err)
	}
	c.endCLC()
	tcp.SetDeadline(noDeadline)
	c.activate()
	return c, nil
}

// declineAfterLink ends a handshake whose first contact failed with err
// (code): with the peer's Decline when it sent one meanwhile (it is plain TCP
// already, and ours would reach its application as data), else with ours. The
// wait for CONFIRM_LINK may have outlasted the CLC phase's deadline: the
// Decline is there.
func (e *Engine) declineAfterLink(ctx context.Context, c *Conn, br *bufio.Reader, code DeclineCode, err error) (*Conn, error) {
	c.tcp.SetReadDeadline(e.cfg.Clock.Now().Add(e.settings().CLCTimeout))
	return e.declineUnlessDeclined(ctx, c, br, code, err)
}

// declineUnlessDeclined ends a handshake that failed with err (code) with the
// peer's Decline when it sent one meanwhile, else with ours.
func (e *Engine) declineUnlessDeclined(ctx context.Context, c *Conn, br *bufio.Reader, code DeclineCode, err error) (*Conn, error) {
	d, derr := e.declinedMeanwhile(ctx, c, br)
	if isLost(derr) {
		return fail(ctx, c, derr)
	} else if d != nil && derr == nil {
		return e.fallback(c, peerDeclined(d.Code, err), br), nil
	}
	return e.fallback(c, decline(code, err), br), nil
}

// declinedMeanwhile looks, without waiting, for a Decline the server sent after
// its Accept (it gave up waiting for our Confirm): then the server is plain TCP
// already, and a Confirm or a Decline from us would reach its application as data.
// It returns nil, nil when the server sent nothing, and an error when it sent
// something else.
func (e *Engine) declinedMeanwhile(ctx context.Context, c *Conn, br *bufio.Reader) (*clc.Decline, error) {
	if br.Buffered() == 0 && !pendingInput(c.tcp) {
		return nil, nil
	}
	m, _, _, err := e.readCLC(ctx, c, br)
	if err != nil {
		return nil, fmt.Errorf("bytes after accept: %w", err)
	}
	d, ok := m.(*clc.Decline)
	if !ok {
		return nil, fmt.Errorf("clc: %v after accept", m.Type())
	}
	return d, nil
}

// clcSpinMax bounds awaitCLC's poll: a same-host peer answers 50–150 µs after
// our message (its wake-up, its work and its write), which a Read's ReadSpin
// (20 µs) does not reach.
const clcSpinMax = 250 * time.Microsecond

// awaitCLC polls tcp for the peer's next CLC message, the client's for the
// Accept and the server's for the Confirm, for up to the adaptive budget s
// (bounded by clcSpinMax; none with ReadSpin off) before the read that would
// sleep. Asleep, the reader is woken when the runtime's network poller notices
// the message, and the runtime polls the network only when a P runs out of
// goroutines: readers spinning on every CPU leave a message unnoticed, and a
// poller thread woken on a halted CPU is slow to start. The sleep and wake-up
// the poll spares cost more than the poll, on both sides of a handshake. A
// peer farther away than the budget soon costs minReadSpin a setup and a
// probe of clcSpinMax in 32. One handshake of the engine polls at a time: in a
// burst of setups the processors have work, and more pollers would only take
// it from the handshakes they wait for.
func (e *Engine) awaitCLC(tcp net.Conn, br *bufio.Reader, s *spinBudget) {
	if e.settings().ReadSpin <= 0 || br.Buffered() > 0 || !e.clcPolling.CompareAndSwap(false, true) {
		return
	}
	defer e.clcPolling.Store(false)
	budget := s.next(clcSpinMax)
	s.done(budget, clcSpinMax, spinUntil(budget, func() bool { return pendingInput(tcp) }))
}

// spinUntil polls ready for up to d, letting other goroutines run between rounds.
func spinUntil(d time.Duration, ready func() bool) bool {
	var start time.Time // read late: most spins end within the first rounds
	for i := 1; ; i++ {
		if ready() {
			return true
		}
		if i%4 == 0 {
			if start.IsZero() {
				start = realNow()
			} else if realNow().Sub(start) > d {
				return false
			}
			runtime.Gosched()
		}
	}
}

// pendingInput reports, without waiting, whether a read of conn would not
// block: the peer sent bytes, closed, or reset the connection. It asks poll,
// which leaves a pending socket error for the read: a peek (recv) took it, and
// the read after saw a reset connection as one merely closed.
func pendingInput(conn net.Conn) bool {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	ready := false
	rc.Control(func(fd uintptr) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
		n, err := unix.Poll(pfd, 0)
		ready = err == nil && n > 0 && pfd[0].Revents != 0
	})
	return ready
}

// resyncFollows reports whether the bytes buffered after a Confirm start a resync
// message (the client continues over TCP already).
func resyncFollows(br *bufio.Reader) bool {
	b, _ := br.Peek(min(br.Buffered(), len(resyncMagic)))
	return len(b) > 0 && string(b) == string(resyncMagic[:len(b)])
}

// server runs CLC as the server; listenerAddrs are the interface addresses of its
// Listener's namespace, if any (localPrefix).
func (e *Engine) server(ctx context.Context, tcp net.Conn, listenerAddrs []net.Addr, opts ServerOptions) (*Conn, error) {
	c := e.newConn(tcp, false)
	c.cursors = opts.Cursors
	c.endCLC = interruptOnCancel(ctx, tcp)
	defer c.endCLC()
	br := c.clcReader(4096)
	m, code, send, err := e.readCLC(ctx, c, br)
	if err != nil {
		if ctxOver(ctx) {
			return fail(ctx, c, err)
		}
		// A client that sent no CLC gets no Decline: it may be waiting for us to talk.
		// One that closed or reset may be a plain client too (a health check),
		// whose application would have seen the connection: it falls back.
		return e.fallback(c, fallbackWhy{code: code, side: SideLocal, tell: send, err: fmt.Errorf("read proposal: %w", err)}, br), nil
	}
	var prop *clc.Proposal
	switch m := m.(type) {
	case *clc.Proposal:
		prop = m
		c.clcPeer = m.PeerID
	case *clc.Decline:
		return e.fallback(c, peerDeclined(m.Code, nil), br), nil
	default:
		return e.fallback(c, decline(clc.DeclineConfigError, fmt.Errorf("clc: %v instead of proposal", m.Type())), br), nil
	}
	if code, err := e.serverProposal(ctx, c, prop, listenerAddrs, opts.Direct); err != nil {
		if failed(ctx, err) { // the Accept's write
			return fail(ctx, c, err)
		}
		return e.fallback(c, decline(code, err), br), nil
	}
	// A client of this engine that joins a link group may wait up to LLCTimeout for
	// our CONFIRM_RKEY before it answers (waitPeerRKey), then answers within a CLC
	// timeout: wait that long. A Decline sent while its Confirm is on the way would
	// reach it after it began sending over SMC-R, and our fallback would hand the
	// Confirm to the application as data.
	wait := e.settings().CLCTimeout
	if c.cont.smcx && c.lg.firstConn != c {
		wait += e.cfg.LLCTimeout
	}
	e.awaitCLC(c.tcp, br, &e.confirmSpin)
	m, code, send, err = e.readCLCWithin(ctx, c, br, wait)
	if err != nil {
		// A client that sent a Proposal speaks CLC: lost, it ends the
		// handshake, and a Listener hands nothing to Accept, as Linux's.
		err = fmt.Errorf("read confirm: %w", err)
		if failed(ctx, err) {
			return fail(ctx, c, err)
		}
		return e.fallback(c, fallbackWhy{code: code, side: SideLocal, tell: send || code == DeclineTimeoutCLC, err: err}, br), nil
	}
	var conf *clc.Confirm
	switch m := m.(type) {
	case *clc.Confirm:
		if c.v2 != nil {
			if code, err := checkConfirmV2(m, c.v2); err != nil {
				return e.fallback(c, decline(code, err), br), nil
			}
		} else if m.V2 != nil { // we accepted version 1
			return e.fallback(c, decline(clc.DeclineConfigError, errors.New("clc: version 2 confirm to a version 1 accept")), br), nil
		}
		conf = m
	case *clc.Decline:
		return e.fallback(c, peerDeclined(m.Code, nil), br), nil
	default:
		return e.fallback(c, decline(clc.DeclineConfigError, fmt.Errorf("clc: %v instead of confirm", m.Type())), br), nil
	}
	if br.Buffered() > 0 {
		if !resyncFollows(br) {
			return e.fallback(c, decline(clc.DeclineSyncError, errors.New("bytes after confirm")), br), nil
		}
		// The client's link failed after it sent the Confirm: it activated and
		// began to continue over TCP. Activate too and read its resync.
		c.mu.Lock() // for Engine.Conns
		c.tcp = &readAheadConn{Conn: c.tcp, r: br, mark: c.clcIn}
		c.mu.Unlock()
	}
	if code, err := e.serverConfirm(ctx, c, conf); err != nil {
		if ctxOver(ctx) {
			return fail(ctx, c, err)
		}
		if !c.cont.smcx {
			// A standard client's Decline (it refused CONFIRM_LINK): it is
			// plain TCP already, and ours would reach its application.
			return e.declineAfterLink(ctx, c, br, code, err)
		}
		return e.fallback(c, decline(code, err), br), nil
	}
	c.endCLC()
	tcp.SetDeadline(noDeadline)
	c.activate()
	return c, nil
}

// sameSubnet is the version-1 rule: the client's subnet must be ours.
func sameSubnet(prop *clc.Proposal, local netip.Prefix) bool {
	if !local.IsValid() {
		return false
	}
	if local.Addr().Is4() {
		return prop.IPv4().IsValid() && prop.IPv4().Masked() == local.Masked()
	}
	for _, p := range prop.IPv6 {
		if pp := p.Prefix(); pp.IsValid() && pp.Masked() == local.Masked() {
			return true
		}
	}
	return false
}

// serverProposal checks the Proposal, picks the provider and link group, allocates
// the RMB and sends the Accept.
func (e *Engine) serverProposal(ctx context.Context, c *Conn, prop *clc.Proposal, listenerAddrs []net.Addr, direct []byte) (DeclineCode, error) {
	if len(e.cfg.Devices) == 0 || e.isClosed() {
		return clc.DeclineNoSMCRDevice, errors.New("no device")
	}
	if e.wantsV2(prop) {
		v, code, err := e.serverTermsV2(prop)
		if err == nil {
			return e.serverProposalV2(ctx, c, prop, v, listenerAddrs)
		}
		if prop.SMCType == clc.SMCTypeN {
			return code, err
		}
		// Version 1 offered too: Linux's server tries it next, and so do we.
		e.log.Debug("smcr: version 2 declined, trying version 1", "conn", c.id, "err", err)
	}
	if !sameSubnet(prop, e.localPrefix(c.tcp, listenerAddrs)) {
		return clc.DeclineIPSubnetMismatch, fmt.Errorf("client subnet %v not ours", prop.IPv4())
	}
	var offers []offer
	var peerDirect []byte
	ext := false
	if env, err := clc.ParseEnvelope(prop.EnvelopeArea()); err == nil {
		val, ok := env.Find(tlvProviders)
		if !ok {
			return clc.DeclineNoSMCRDevice, errors.New("extension without providers")
		}
		if offers, err = parseOffers(val); err != nil {
			return clc.DeclineConfigError, err
		}
		if v, ok := env.Find(tlvDirect); ok && len(v) <= maxDirectValue {
			peerDirect = v
		}
		ext = true
		c.cont.smcx = true
	} else if errors.Is(err, clc.ErrNoEnvelope) {
		// A plain version-1 peer: real RDMA, addressed by the Proposal's GID/MAC.
		offers = []offer{{Kind: verbs.KindRDMA, GID: prop.GID, MAC: prop.MAC, MTU: verbs.MTU1024}}
	} else {
		return clc.DeclineConfigError, err
	}
	di, o, ok := e.choose(offers)
	if !ok {
		return clc.DeclineNoSMCRDevice, errors.New("no common provider")
	}
	key := lgKey{client: false, peer: prop.PeerID, kind: o.Kind, peerGID: o.GID, endpoint: string(o.Endpoint)}
	lg, first, err := e.serverLinkGroup(ctx, key, di)
	if err != nil {
		return clc.DeclineInternal, err
	}
	c.lg, c.reserved, c.reusedLG = lg, true, !first
	c.peerOffer = o
	lnk := lg.pick()
	if first {
		lg.startFirstContact(c)
		lg.peerOffers = offers
		lnk = lg.primary()
	}
	li, code, err := e.serverRMB(c, lnk, first)
	if err != nil {
		return code, err
	}
	dev := e.cfg.Devices[di]
	acc := &clc.Accept{LinkInfo: li}
	if ext {
		env := clc.Envelope{TLVs: []clc.TLV{{Type: tlvChosen, Value: appendChosen(nil, o.Kind, dev.Endpoint())}}}
		if direct != nil && peerDirect != nil && o.Kind == verbs.KindSHM {
			env.TLVs = append(env.TLVs, clc.TLV{Type: tlvDirect, Value: direct})
			c.peerDirect = bytes.Clone(peerDirect)
		}
		if len(e.cfg.Devices) > 1 {
			// Our devices, so the client can reach the second link's (multilink.go).
			val, err := appendOffers(nil, e.offers())
			if err != nil {
				return clc.DeclineInternal, err
			}
			env.TLVs = append(env.TLVs, clc.TLV{Type: tlvProviders, Value: val})
		}
		if acc.Ext, err = env.AppendTo(nil); err != nil {
			return clc.DeclineInternal, err
		}
	}
	e.clcPhase(ctx, c.tcp)
	c.acceptSent = true // from here the client may write into our RMB (abandonSetup)
	if err := e.writeCLC(c, acc); err != nil {
		return clc.DeclineInternal, fmt.Errorf("send accept: %w", err)
	}
	return 0, nil
}

// serverProposalV2 is serverProposal for a version-2 Proposal whose terms v
// we agreed: an rdma device (RoCE v2), a link group of version 2 with the peer,
// the RMB, and the Accept of version 2 with the EID and, on first contact, the
// extension with the terms.
func (e *Engine) serverProposalV2(ctx context.Context, c *Conn, prop *clc.Proposal, v *connV2, listenerAddrs []net.Addr) (DeclineCode, error) {
	di := e.rdmaDevice()
	key := lgKey{client: false, peer: prop.PeerID, kind: verbs.KindRDMA, peerGID: prop.V2.RoCEGID, v2: true}
	lg, first, err := e.serverLinkGroup(ctx, key, di)
	if err != nil {
		return clc.DeclineInternal, err
	}
	c.lg, c.reserved, c.reusedLG, c.v2 = lg, true, !first, v
	c.peerOffer = offer{Kind: verbs.KindRDMA, GID: prop.V2.RoCEGID, MAC: prop.MAC, MTU: verbs.MTU1024}
	lnk := lg.pick()
	if first {
		lg.startFirstContact(c)
		lg.setTerms(v.terms)
		lnk = lg.primary()
	} else if lg.v2.Release != v.terms.Release {
		return clc.DeclineReleaseMismatch, fmt.Errorf("link group of release %d, proposal agrees %d", lg.v2.Release, v.terms.Release)
	}
	li, code, err := e.serverRMB(c, lnk, first)
	if err != nil {
		return code, err
	}
	li.V2 = e.acceptV2(v, first, prop.V2.RoCEGID, e.localPrefix(c.tcp, listenerAddrs))
	acc := &clc.Accept{LinkInfo: li}
	e.clcPhase(ctx, c.tcp)
	c.acceptSent = true
	if err := e.writeCLC(c, acc); err != nil {
		return clc.DeclineInternal, fmt.Errorf("send accept: %w", err)
	}
	e.log.Debug("smcr: accepted version 2", "conn", c.id, "eid", v.eid.String(), "release", v.terms.Release, "first", first)
	return 0, nil
}

// serverRMB puts c on lnk and takes its RMB, announcing it to the peer
// (CONFIRM_RKEY) when the link group is not new, and returns the Accept's
// values.
func (e *Engine) serverRMB(c *Conn, lnk *link, first bool) (clc.LinkInfo, DeclineCode, error) {
	if lnk == nil {
		return clc.LinkInfo{}, clc.DeclineNoActiveLink, errors.New("link group has no link")
	}
	c.lnk = lnk
	if code, err := c.allocRMB(e.settings().RMBSize); err != nil {
		return clc.LinkInfo{}, code, err
	}
	if !first {
		if err := c.announceRMB(); err != nil {
			return clc.LinkInfo{}, clc.DeclineInternalRToken, fmt.Errorf("confirm rkey: %w", err)
		}
	}
	qa := lnk.qp.Attr()
	return clc.LinkInfo{
		PeerID: e.peerID, GID: qa.GID, MAC: qa.MAC, QPN: qa.QPN, RKey: c.rmb.RKey(), RMBEIndex: 1,
		AlertToken: c.token, SizeCode: sizeCode(int(c.rx.Size())), MTU: uint8(lnk.mtu), RMBAddr: c.rmb.Addr(),
		PSN: qa.PSN, FirstContact: first,
	}, 0, nil
}

// checkLinkInfo checks the peer's Accept/Confirm values we will use. The send
// buffer mirrors the peer's RMBE, so its size code is held to the largest this
// engine or Linux makes (512 KiB): the field goes up to 512 MiB.
func checkLinkInfo(li *clc.LinkInfo) error {
	if err := li.Validate(clc.LinuxMaxSizeCode); err != nil {
		return err
	}
	if li.RMBEIndex != 1 {
		return fmt.Errorf("rmbe index %d", li.RMBEIndex)
	}
	if li.AlertToken == 0 {
		return errors.New("alert token 0")
	}
	if !verbs.MTU(li.MTU).Valid() {
		return fmt.Errorf("mtu code %d", li.MTU)
	}
	return nil
}

// serverConfirm takes the client's values and, on first contact, brings the link up.
func (e *Engine) serverConfirm(ctx context.Context, c *Conn, conf *clc.Confirm) (DeclineCode, error) {
	li := &conf.LinkInfo
	if err := checkLinkInfo(li); err != nil {
		return clc.DeclineConfigError, fmt.Errorf("confirm: %w", err)
	}
	lnk := c.lnk
	if c.lg.firstConn == c {
		peer := verbs.QPAttr{QPN: li.QPN, PSN: li.PSN, GID: li.GID, MAC: li.MAC, MTU: verbs.MTU(li.MTU), Endpoint: c.peerOffer.Endpoint}
		// Bounded as the client's side is (startConnect): a provider may wait
		// for an endpoint the client named, and one that never answers would
		// hold this setup, and every later one to the same peer, for good.
		cctx, cancel := context.WithTimeout(ctx, e.settings().CLCTimeout)
		err := lnk.connect(cctx, peer)
		cancel()
		if err != nil {
			c.lg.setReady(err)
			return clc.DeclineInternalReadyLink, err
		}
		if !c.cont.smcx {
			// A standard client (Linux's) that refuses our CONFIRM_LINK
			// declines on the TCP connection and falls back: stop waiting
			// then (server reads the Decline), as the client does.
			var stop func()
			ctx, stop = context.WithCancel(ctx)
			defer stop()
			go stopOnInput(ctx, e.cfg.Clock, c.tcp, stop)
		}
		if err := lnk.confirmLinkServer(ctx); err != nil {
			c.lg.setReady(err)
			return clc.DeclineTimeoutConfirmLink, err
		}
		c.lg.setReady(nil)
		switch {
		case !c.lg.key.v2:
			go c.lg.addSecondLink()
		case c.lg.v2.Release < clc.Release21:
			// A version-2 group keeps its one link (v2Offer); a 2.0 client
			// (Linux before 6.7) waits for an ADD_LINK all the same.
			go lnk.offerNoLink()
		}
	} else {
		if li.QPN != lnk.peer.QPN {
			return clc.DeclineSyncError, fmt.Errorf("confirm names qp %d, link has %d", li.QPN, lnk.peer.QPN)
		}
		if !c.lg.waitPeerRKey(ctx, lnk, li.RKey) && !c.linkFailed() && !lnk.down.Load() {
			// (With the link gone, the connection activates and continues over TCP,
			// as the client's does: its Confirm is sent.)
			return clc.DeclineInternalRToken, fmt.Errorf("rkey %#x never confirmed over llc", li.RKey)
		}
	}
	if code, err := c.setPeer(li); err != nil {
		return code, err
	}
	return 0, nil
}

// clientAccept takes the server's values: link group, RMB, QP connection start.
func (e *Engine) clientAccept(ctx context.Context, c *Conn, acc *clc.Accept) (DeclineCode, error) {
	li := &acc.LinkInfo
	if err := checkLinkInfo(li); err != nil {
		return clc.DeclineConfigError, fmt.Errorf("accept: %w", err)
	}
	kind, endpoint := verbs.KindRDMA, []byte(nil)
	var peerOffers []offer
	if env, err := clc.ParseEnvelope(li.Ext); err == nil {
		v, ok := env.Find(tlvChosen)
		if !ok {
			return clc.DeclineConfigError, errors.New("accept extension without a chosen provider")
		}
		if kind, endpoint, err = parseChosen(v); err != nil {
			return clc.DeclineConfigError, err
		}
		if v, ok := env.Find(tlvProviders); ok {
			if peerOffers, err = parseOffers(v); err != nil {
				return clc.DeclineConfigError, err
			}
		}
		if v, ok := env.Find(tlvDirect); ok && kind == verbs.KindSHM && len(v) <= maxDirectValue {
			c.peerDirect = bytes.Clone(v)
		}
		c.cont.smcx = true
	} else if !errors.Is(err, clc.ErrNoEnvelope) {
		return clc.DeclineConfigError, err
	}
	di := -1
	for i, d := range e.cfg.Devices {
		if d.Kind() == kind {
			di = i
			break
		}
	}
	if di < 0 {
		return clc.DeclineNoSMCRDevice, fmt.Errorf("server chose %v, which we lack", kind)
	}
	key := lgKey{client: true, peer: li.PeerID, kind: kind, peerGID: li.GID, endpoint: string(endpoint), v2: c.v2 != nil}
	peer := verbs.QPAttr{QPN: li.QPN, PSN: li.PSN, GID: li.GID, MAC: li.MAC, MTU: verbs.MTU(li.MTU), Endpoint: endpoint}
	if li.FirstContact {
		lg, err := e.newLinkGroup(key, di)
		if err != nil {
			return clc.DeclineInternal, err
		}
		lg.reserve()
		c.lg, c.lnk, c.reserved = lg, lg.primary(), true
		if c.v2 != nil {
			lg.setTerms(c.v2.terms)
		}
		lg.startFirstContact(c)
		lg.peerOffers = peerOffers
		c.lnk.startConnect(peer)
	} else {
		lg, err := e.clientLinkGroup(ctx, key, li.QPN)
		if err != nil {
			return clc.DeclineSyncError, err
		}
		c.lg, c.lnk, c.reserved, c.reusedLG = lg, lg.linkByPeer(li.GID, li.QPN), true, true
		if c.lnk == nil {
			return clc.DeclineNoActiveLink, errors.New("link group has no link")
		}
		if !lg.waitPeerRKey(ctx, c.lnk, li.RKey) {
			if c.lnk.down.Load() {
				return clc.DeclineNoActiveLink, fmt.Errorf("link %d failed before the server confirmed rkey %#x", c.lnk.num, li.RKey)
			}
			return clc.DeclineInternalRToken, fmt.Errorf("rkey %#x never confirmed over llc", li.RKey)
		}
	}
	if code, err := c.allocRMB(clc.RMBESize(li.SizeCode)); err != nil {
		return code, err
	}
	if code, err := c.setPeer(li); err != nil {
		return code, err
	}
	if !li.FirstContact {
		if err := c.announceRMB(); err != nil {
			return clc.DeclineInternalRToken, fmt.Errorf("confirm rkey: %w", err)
		}
	}
	return 0, nil
}

// clientConfirm sends the Confirm and, on first contact, answers CONFIRM_LINK.
func (e *Engine) clientConfirm(ctx context.Context, c *Conn, acc *clc.Accept) (DeclineCode, error) {
	qa := c.lnk.qp.Attr()
	conf := &clc.Confirm{LinkInfo: clc.LinkInfo{
		PeerID: e.peerID, GID: qa.GID, MAC: qa.MAC, QPN: qa.QPN, RKey: c.rmb.RKey(), RMBEIndex: 1,
		AlertToken: c.token, SizeCode: sizeCode(int(c.rx.Size())), MTU: uint8(c.lnk.mtu), RMBAddr: c.rmb.Addr(),
		PSN: qa.PSN, FirstContact: acc.FirstContact,
	}}
	if c.v2 != nil {
		conf.V2 = &clc.LinkInfoV2{EID: c.v2.eid}
		if acc.FirstContact {
			conf.V2.FirstContact = fceFor(c.v2.terms, acc.V2.FirstContact.Direct)
			conf.V2.GIDs = [][16]byte{qa.GID}
		}
	}
	if h := e.confirmHook.Load(); h != nil {
		(*h)(conf)
	}
	e.clcPhase(ctx, c.tcp)
	if err := e.writeCLC(c, conf); err != nil {
		return clc.DeclineInternal, fmt.Errorf("send confirm: %w", err)
	}
	if !acc.FirstContact {
		return 0, nil
	}
	// A server that gave up on us (its CLC timeout passed before our Confirm
	// came) declines on the TCP connection, and no CONFIRM_LINK will come:
	// stop waiting for it then, rather than at the LLC timeouts.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	go stopOnInput(ctx, e.cfg.Clock, c.tcp, stop)
	if err := c.lnk.waitConnected(ctx); err != nil {
		c.lg.setReady(err)
		return clc.DeclineInternalReadyLink, err
	}
	if err := c.lnk.confirmLinkClient(ctx); err != nil {
		c.lg.setReady(err)
		return clc.DeclineTimeoutConfirmLink, err
	}
	c.lg.setReady(nil)
	return 0, nil
}

// stopOnInput calls stop once tcp has bytes to read, looking every
// inputPoll, until ctx ends.
func stopOnInput(ctx context.Context, clk Clock, tcp net.Conn, stop func()) {
	t := newTicker(clk, inputPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if pendingInput(tcp) {
				stop()
				return
			}
		}
	}
}

// inputPoll is how often a first-contact client waiting for CONFIRM_LINK
// looks for a Decline from the server.
const inputPoll = 10 * time.Millisecond
