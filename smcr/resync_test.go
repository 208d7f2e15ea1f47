package smcr

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/smcr-io/smcr/smcr/clc"
	"github.com/smcr-io/smcr/smcr/internal/memverbs"
	"github.com/smcr-io/smcr/smcr/verbs"
)

func TestResyncCodec(t *testing.T) {
	r := resync{flags: 0x80, received: 0x0102030405060708}
	b := r.encode()
	want := []byte{'S', 'M', 'C', 'Z', 1, 0x80, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}
	if !bytes.Equal(b[:], want) {
		t.Fatalf("% x", b)
	}
	got, err := parseResync(b[:])
	if err != nil || got != r {
		t.Fatalf("%+v %v", got, err)
	}
	b[4] = 2
	if _, err := parseResync(b[:]); err == nil {
		t.Fatal("version 2 accepted")
	}
}

// TestContinuationOverTCP fails the only link in the middle of streams in both
// directions: the connections go on over TCP with every byte, once.
func TestContinuationOverTCP(t *testing.T) {
	d1, d2 := twoDevices(t)
	p := newPair(t, Config{Devices: []verbs.Device{d1}, RMBSize: 16 << 10}, Config{Devices: []verbs.Device{d2}, RMBSize: 16 << 10})
	c, s := p.connect(t)
	c2, s2 := p.connect(t)
	mustSMC(t, c, s, c2, s2)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); stream(t, c, s, 32<<20, 21) }()
	go func() { defer wg.Done(); stream(t, s, c, 32<<20, 22) }()
	go func() { defer wg.Done(); stream(t, c2, s2, 32<<20, 23) }()
	eventually(t, "streams under way", func() bool { return p.cli.Stats().RxBytes > 4<<20 })
	d1.Fail()
	wg.Wait()
	if n := p.cli.Stats().Continued + p.srv.Stats().Continued; n != 4 {
		t.Fatalf("continued %d connections, want 4", n)
	}
	if !c.continued() || !s.continued() {
		t.Fatal("connections not marked continued")
	}
	// Half-close and close still work over TCP.
	s2.CloseWrite()
	if b, err := io.ReadAll(c2); err != nil || len(b) != 0 {
		t.Fatalf("c2 after half-close: %q %v", b, err)
	}
	for _, x := range []*Conn{c, s, c2, s2} {
		x.Close()
	}
	eventually(t, "released", func() bool {
		return p.cli.Stats().MemoryInUse == 0 && p.srv.Stats().MemoryInUse == 0
	})
}

// TestContinuationIdle fails the link of an idle connection with unread data.
func TestContinuationIdle(t *testing.T) {
	d1, d2 := twoDevices(t)
	p := newPair(t, Config{Devices: []verbs.Device{d1}}, Config{Devices: []verbs.Device{d2}})
	c, s := p.connect(t)
	c.Write([]byte("before"))
	d2.Fail()
	eventually(t, "continued", func() bool { return c.continued() && s.continued() })
	c.Write([]byte(" after"))
	c.CloseWrite()
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(s)
	if err != nil || string(b) != "before after" {
		t.Fatalf("%q %v", b, err)
	}
}

// TestContinuationSlowPeer: a peer that reads our resync later than the CLC
// timeout (a busy host, hundreds of continuations at once; an operator who
// shortened clc_timeout) still continues: the resync's wait has a floor of its
// own (minResyncWait).
func TestContinuationSlowPeer(t *testing.T) {
	d1, d2 := twoDevices(t)
	const clcTimeout = 300 * time.Millisecond
	sclk := &fakeClock{}
	p := newPair(t, Config{Devices: []verbs.Device{d1}, CLCTimeout: clcTimeout}, Config{Devices: []verbs.Device{d2}, CLCTimeout: clcTimeout, Clock: sclk})
	release := holdWatch(t, false)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	c.Write([]byte("before"))
	d1.Fail()
	// The client read the server's resync; the server waits for the client's,
	// which its watcher reads only after three CLC timeouts.
	eventually(t, "the client continued", c.continued)
	sclk.Advance(3 * clcTimeout)
	release()
	eventually(t, "continued", func() bool { return c.continued() && s.continued() })
	c.Write([]byte(" after"))
	c.CloseWrite()
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(s); err != nil || string(b) != "before after" {
		t.Fatalf("%q %v", b, err)
	}
}

// TestContinuationKeepsDeadlines: deadlines set over SMC-R hold after the
// connection continues over TCP: a Read with nothing coming and a Write the
// peer does not drain time out then, rather than block for good.
func TestContinuationKeepsDeadlines(t *testing.T) {
	_, c, s, d1 := singleLinkPair(t, nil)
	c.SetReadDeadline(time.Now().Add(time.Second))
	c.SetWriteDeadline(time.Now().Add(time.Second))
	d1.Fail()
	eventually(t, "continued", func() bool { return c.continued() && s.continued() })
	type result struct {
		n   int
		err error
	}
	for _, op := range []struct {
		name string
		do   func() (int, error)
	}{
		{"read", func() (int, error) { return c.Read(make([]byte, 10)) }},
		{"write", func() (int, error) { return c.Write(make([]byte, 64<<20)) }}, // beyond the sockets' buffers
	} {
		done := make(chan result, 1)
		go func() { n, err := op.do(); done <- result{n, err} }()
		select {
		case r := <-done:
			if !errors.Is(r.err, os.ErrDeadlineExceeded) {
				t.Errorf("%s after the continuation: %d, %v; want a timeout", op.name, r.n, r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s after the continuation ignored its deadline", op.name)
		}
	}
	c.Close()
	s.Close()
}

// TestContinuationPeerTCPGone: when the peer's TCP connection is gone, a
// continuation fails at once instead of waiting for a resync that cannot come.
func TestContinuationPeerTCPGone(t *testing.T) {
	_, c, s, d1 := singleLinkPair(t, func(cfg *Config) { cfg.CLCTimeout = 10 * time.Second })
	s.TCP().Close()
	eventually(t, "the client's watcher seeing the end", func() bool { return goroutinesIn("smcr.(*Conn).watchTCP(") == 0 })
	start := time.Now()
	d1.Fail()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read succeeded over a connection whose peer is gone")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the continuation took %v to fail, as long as the CLC timeout", d)
	}
}

// TestReadAheadDropsCrossing: after our Decline, what the peer sent before it read
// the Decline is dropped (a Confirm, then a resync that holds nothing of ours),
// and nothing else: application bytes that only look like the start of one are
// delivered whole.
func TestReadAheadDropsCrossing(t *testing.T) {
	peer := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	confirm, err := (&clc.Confirm{LinkInfo: clc.LinkInfo{PeerID: peer, SizeCode: 1, MTU: 3}}).AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	empty := resync{flags: 0xc0}.encode()
	holds := resync{received: 1}.encode()
	app := []byte("application bytes")
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	for _, tc := range []struct {
		name     string
		in, want []byte
	}{
		{"confirm+resync", cat(confirm, empty[:], app), app},
		{"resync", cat(empty[:], app), app},
		{"confirm", cat(confirm, app), app},
		{"resync holding bytes is data", cat(holds[:], app), cat(holds[:], app)},
		{"magic only", cat([]byte("SMCZ"), app), cat([]byte("SMCZ"), app)},
		{"short", []byte("SMCZ\x01"), []byte("SMCZ\x01")},
		{"data", app, app},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			go func() { a.Write(tc.in); a.Close() }()
			r := &readAheadConn{Conn: b, r: bufio.NewReaderSize(b, clcMaxLen), crossing: true, peer: peer}
			got, err := io.ReadAll(r)
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Fatalf("read %q (%v), want %q", got, err, tc.want)
			}
		})
	}
}

// TestDeclineCrossesContinuation: the server gives up waiting for the Confirm and
// declines, and the client's link fails before it reads the Decline, so its
// continuation (and its resync) is under way when the Decline arrives. The
// server drops the crossing Confirm and resync; the client resends from its first
// byte. Nothing is lost or duplicated, and the server never starts a
// continuation of its own for a connection it declined.
func TestDeclineCrossesContinuation(t *testing.T) {
	d1, d2 := twoDevices(t)
	srv := Config{Devices: []verbs.Device{d2}, CLCTimeout: 300 * time.Millisecond, LLCTimeout: 300 * time.Millisecond}
	p := newPair(t, Config{Devices: []verbs.Device{d1}}, srv)
	good, gs := p.connect(t)
	mustSMC(t, good, gs)
	setConfirmHook(p.cli, func(*clc.Confirm) {
		awaitTimeoutDecline(t, p.srv)
		d1.Fail()
		eventually(t, "client link down", func() bool { return p.cli.Stats().LinkGroups == 0 })
	})
	c, s := p.connect(t)
	setConfirmHook(p.cli, nil)
	if c.Mode() != ModeSMCR || s.Mode() != ModeFallback || s.Decline().Code != DeclineTimeoutCLC {
		t.Fatalf("client %v, server %v %+v; want SMC-R and a CLC-timeout fallback", c.Mode(), s.Mode(), s.Decline())
	}
	exchangeAll(t, c, s, 300<<10, 100<<10)
	if !c.continued() {
		t.Fatal("client connection not marked continued")
	}
	// The established connection continues when the server reads the client's
	// resync for it, which need not come before the new one's bytes.
	eventually(t, "server continued the established connection", func() bool { return p.srv.Stats().Continued >= 1 })
	echoOK(t, good, gs)
	if n := p.srv.Stats().Continued; n != 1 {
		t.Fatalf("server continued %d connections, want 1 (the established one)", n)
	}
	for _, x := range []*Conn{c, s, good, gs} {
		x.Close()
	}
}

// gatedConn holds the reads that follow its first write until release closes:
// a server slow to read the Confirm after its Accept.
type gatedConn struct {
	net.Conn
	wrote   chan struct{}
	once    sync.Once
	release chan struct{}
}

func (g *gatedConn) Write(b []byte) (int, error) {
	n, err := g.Conn.Write(b)
	g.once.Do(func() { close(g.wrote) })
	return n, err
}

func (g *gatedConn) CloseWrite() error { return g.Conn.(*net.TCPConn).CloseWrite() }

func (g *gatedConn) Read(b []byte) (int, error) {
	select {
	case <-g.wrote:
		<-g.release
	default:
	}
	return g.Conn.Read(b)
}

// TestResyncBehindConfirm: the client's link fails just before it sends its
// Confirm, so its continuation's resync follows the Confirm on the TCP
// connection, and a server slow to read finds both in one read. It must take
// the resync for what it is, not for stray bytes (a sync-error Decline the
// client, already continuing, would never read): the connection continues over
// TCP on both ends, every byte checked.
func TestResyncBehindConfirm(t *testing.T) {
	d1, d2 := twoDevices(t)
	p := newPair(t, Config{Devices: []verbs.Device{d1}}, Config{Devices: []verbs.Device{d2}})
	good, gs := p.connect(t)
	mustSMC(t, good, gs)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	gate := &gatedConn{wrote: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(func() { // a test that failed before leaves no reader waiting
		select {
		case <-gate.release:
		default:
			close(gate.release)
		}
	})
	type result struct {
		c   *Conn
		err error
	}
	srvc := make(chan result, 1)
	go func() {
		tcp, err := ln.Accept()
		if err != nil {
			srvc <- result{nil, err}
			return
		}
		gate.Conn = tcp
		s, err := p.srv.Server(context.Background(), gate)
		srvc <- result{s, err}
	}()
	setConfirmHook(p.cli, func(*clc.Confirm) {
		d1.Fail()
		eventually(t, "client link down", func() bool { return p.cli.Stats().LinkGroups == 0 })
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := p.cli.Dial(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	setConfirmHook(p.cli, nil)
	eventually(t, "client continuing", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.cont.fo
	})
	// Its resync on the wire behind the Confirm: it waits for the server's.
	eventually(t, "the client's resync sent", func() bool { return goroutineWaitingIn("smcr.(*Conn).resync(", "select") })
	close(gate.release)
	r := within(t, srvc, "the server's setup")
	if r.err != nil {
		t.Fatal(r.err)
	}
	s := r.c
	if c.Mode() != ModeSMCR || s.Mode() != ModeSMCR {
		t.Fatalf("client %v, server %v (%+v); want both SMC-R, continued", c.Mode(), s.Mode(), s.Decline())
	}
	exchangeAll(t, c, s, 300<<10, 100<<10)
	if !s.continued() {
		t.Fatal("server connection not marked continued")
	}
	for _, x := range []*Conn{c, s, good, gs} {
		x.Close()
	}
}

// singleLinkPair connects a client and a server whose link group has one link,
// which d's Fail ends (the client's device); cfg, when not nil, adjusts both
// engines' configurations.
func singleLinkPair(t *testing.T, cfg func(*Config)) (p *pair, c, s *Conn, d *memverbs.Device) {
	t.Helper()
	d, d2 := twoDevices(t)
	cc, sc := Config{Devices: []verbs.Device{d}}, Config{Devices: []verbs.Device{d2}}
	if cfg != nil {
		cfg(&cc)
		cfg(&sc)
	}
	p = newPair(t, cc, sc)
	c, s = p.connect(t)
	mustSMC(t, c, s)
	return p, c, s, d
}

// connectVia connects one client, on the TCP connection wrap makes of a dialled
// one, to p's server; both ends must run SMC-R.
func (p *pair) connectVia(t *testing.T, wrap func(*net.TCPConn) net.Conn) (*Conn, *Conn) {
	t.Helper()
	raw, err := net.Dial("tcp", p.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc := make(chan *Conn, 1)
	go func() { s, _ := p.ln.AcceptSMC(); sc <- s }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := p.cli.Client(ctx, wrap(raw.(*net.TCPConn)))
	if err != nil {
		t.Fatal(err)
	}
	s := within(t, sc, "the accept")
	mustSMC(t, c, s)
	return c, s
}

// badResyncConn sends its resync with a version the peer does not know.
type badResyncConn struct{ *net.TCPConn }

func (b badResyncConn) Write(p []byte) (int, error) {
	if len(p) == resyncLen && [4]byte(p[:4]) == resyncMagic {
		p = bytes.Clone(p)
		p[4] = resyncVersion + 1
	}
	return b.TCPConn.Write(p)
}

// TestFailedContinuationResets: a continuation that fails resets TCP, so a peer that continued reads an error, not EOF.
func TestFailedContinuationResets(t *testing.T) {
	d1, d2 := twoDevices(t)
	p := newPair(t, Config{Devices: []verbs.Device{d1}}, Config{Devices: []verbs.Device{d2}})
	c, s := p.connectVia(t, func(tc *net.TCPConn) net.Conn { return badResyncConn{tc} })
	d1.Fail()
	eventually(t, "client continued", c.continued)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(c); err == nil {
		t.Fatalf("client read %q, then a clean EOF from a server whose continuation failed (%v)", b, s.linkError(nil))
	}
}

// TestContinuationResendWaitsForReader: the resend waits for a peer application that reads only after the resync's wait.
func TestContinuationResendWaitsForReader(t *testing.T) {
	clk := &skewedClock{}
	_, c, s, d1 := singleLinkPair(t, func(cfg *Config) { cfg.RMBSize, cfg.Clock = 512<<10, clk })
	// The resync's write deadline, dated by the clock, comes resyncSoon from now.
	const resyncSoon = 200 * time.Millisecond
	clk.behind.Store(int64(minResyncWait - resyncSoon))
	failOnCursors(t, c, d1)
	// Less than the resend in the sockets' buffers: it blocks until s reads.
	s.TCP().(*net.TCPConn).SetReadBuffer(64 << 10)
	c.TCP().(*net.TCPConn).SetWriteBuffer(64 << 10)
	up := make([]byte, 512<<10)
	rand.Read(up)
	werr := make(chan error, 1)
	go func() { _, err := c.Write(up); c.CloseWrite(); werr <- err }()
	time.Sleep(resyncSoon + time.Second) // the scenario: the reader is busy elsewhere, past the resync's wait
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(s)
	if err != nil || !bytes.Equal(got, up) {
		t.Fatalf("server read %d of %d bytes: %v (client: %v)", len(got), len(up), err, c.linkError(nil))
	}
	if err := within(t, werr, "the client's write"); err != nil {
		t.Fatal(err)
	}
}

// failOnCursors fails d, once, as x is about to send a CDC for bytes it wrote:
// they landed in the peer's RMB, unannounced.
func failOnCursors(t *testing.T, x *Conn, d *memverbs.Device) {
	var once sync.Once
	h := func(c *Conn) {
		if c == x {
			once.Do(d.Fail)
		}
	}
	testHookCursors.Store(&h)
	t.Cleanup(func() { testHookCursors.Store(nil) })
}

// skewedClock is the real clock, behind by a settable offset: a deadline the
// engine dates by it comes that much sooner in real time.
type skewedClock struct{ behind atomic.Int64 }

func (c *skewedClock) Now() time.Time { return time.Now().Add(-time.Duration(c.behind.Load())) }
func (c *skewedClock) AfterFunc(d time.Duration, f func()) Timer {
	return time.AfterFunc(d, f)
}

// holdWatch holds back the watchTCP (the resync's reader) of the client's
// connections, or of the server's, until release is called or t ends.
func holdWatch(t *testing.T, client bool) (release func()) {
	held := make(chan struct{})
	hold := func(c *Conn) {
		if c.client == client {
			<-held
		}
	}
	testHookWatch.Store(&hold)
	var once sync.Once
	release = func() { once.Do(func() { close(held) }) }
	t.Cleanup(func() { testHookWatch.Store(nil); release() })
	return release
}

// TestAbortResetsContinuation: Abort after or during a continuation resets TCP, so the peer reads an error, not EOF.
func TestAbortResetsContinuation(t *testing.T) {
	for _, during := range []bool{false, true} {
		t.Run(map[bool]string{false: "continued", true: "resyncing"}[during], func(t *testing.T) {
			release := holdWatch(t, true) // the client waits for the server's resync
			if !during {
				release()
			}
			p, c, s, d1 := singleLinkPair(t, nil)
			c.Write([]byte("partial"))
			d1.Fail()
			eventually(t, "continued", func() bool { return s.continued() && (during || c.continued()) })
			if during && c.continued() {
				t.Fatal("the client continued without the server's resync")
			}
			c.Abort()
			release()
			s.SetReadDeadline(time.Now().Add(5 * time.Second))
			if b, err := io.ReadAll(s); err == nil {
				t.Fatalf("server read %q, then a clean EOF after the client's Abort", b)
			}
			s.Close()
			eventually(t, "released", func() bool { return p.cli.Stats().MemoryInUse == 0 && p.srv.Stats().MemoryInUse == 0 })
		})
	}
}

// TestCloseAsContinuationEnds: a Close just before foDone closes still releases the connection, and the peer reads EOF.
func TestCloseAsContinuationEnds(t *testing.T) {
	p, c, s, d1 := singleLinkPair(t, nil)
	c.Write([]byte("hello"))
	h := func(x *Conn) {
		if x == c {
			c.Close() // finds the continuation under way: leaves the release to it
		}
	}
	testHookFailoverEnd.Store(&h)
	t.Cleanup(func() { testHookFailoverEnd.Store(nil) })
	d1.Fail()
	s.SetReadDeadline(time.Now().Add(2 * time.Second))
	if b, err := io.ReadAll(s); err != nil || string(b) != "hello" {
		t.Fatalf("server read %q, %v; want the bytes, then EOF", b, err)
	}
	s.Close()
	eventually(t, "released", func() bool { return p.cli.Stats().MemoryInUse == 0 && p.srv.Stats().MemoryInUse == 0 })
}

// TestWriteClosedAfterContinuation: over TCP too, Write after CloseWrite or the peer's close returns ErrWriteClosed.
func TestWriteClosedAfterContinuation(t *testing.T) {
	for _, tc := range []struct {
		name  string
		close func(t *testing.T, c, s *Conn)
	}{
		{"close write", func(t *testing.T, c, s *Conn) { c.CloseWrite() }},
		{"peer closed", func(t *testing.T, c, s *Conn) {
			s.Close()
			eventually(t, "peer's close", func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.closing.peerClosed })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, c, s, d1 := singleLinkPair(t, nil)
			tc.close(t, c, s)
			d1.Fail()
			eventually(t, "continued", c.continued)
			for range 2 { // TCP reports a peer's close on the second write
				if _, err := c.Write([]byte("x")); !errors.Is(err, ErrWriteClosed) {
					t.Fatalf("write: %v, want ErrWriteClosed", err)
				}
			}
		})
	}
}

// TestCloseWriteStateAfterContinuation: CloseWrite over a continued connection shows in its reported state.
func TestCloseWriteStateAfterContinuation(t *testing.T) {
	p, c, _, d1 := singleLinkPair(t, nil)
	d1.Fail()
	eventually(t, "continued", c.continued)
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if cs := p.cli.Conns(); len(cs) != 1 || cs[0].State != statePeerCloseWait1.String() {
		t.Fatalf("conns %+v; want one in %v", cs, statePeerCloseWait1)
	}
}

// TestReadEOFAfterFailedContinuation: after the peer's sending-done, Read ends with EOF even if the continuation fails.
func TestReadEOFAfterFailedContinuation(t *testing.T) {
	_, c, s, d1 := singleLinkPair(t, nil)
	s.Write([]byte("all"))
	s.CloseWrite()
	eventually(t, "sending-done", func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.closing.peerDone })
	s.TCP().Close() // no resync can come: the client's continuation fails
	d1.Fail()
	eventually(t, "continuation over", func() bool { return isClosed(c.cont.foDone) })
	if c.continued() {
		t.Fatal("continued without the server's resync")
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(c); err != nil || string(b) != "all" {
		t.Fatalf("read %q, %v; want every byte, then EOF", b, err)
	}
}

// TestCloseTimeoutEndsResend: a connection closed while its continuation
// resends to a peer that does not read is reset at the close timeout and
// released, rather than held for as long as the peer does not read.
func TestCloseTimeoutEndsResend(t *testing.T) {
	_, c, s, d1 := singleLinkPair(t, func(cfg *Config) { cfg.RMBSize = 512 << 10; cfg.CloseTimeout = 300 * time.Millisecond })
	failOnCursors(t, c, d1)
	s.TCP().(*net.TCPConn).SetReadBuffer(64 << 10)
	c.TCP().(*net.TCPConn).SetWriteBuffer(64 << 10)
	up := make([]byte, 512<<10)
	if _, err := c.Write(up); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the continuation under way", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.cont.fo
	})
	c.Close()
	eventually(t, "the closed connection released", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.closing.released
	})
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(s)
	if err == nil || len(got) == len(up) {
		t.Fatalf("server read %d of %d bytes, then %v; want a reset before the end", len(got), len(up), err)
	}
}

// TestContinuationGivesBuffersBack: a connection that continues over TCP after
// its link group ended gives its send buffer back to max_memory at once, and its
// RMB once read empty, while it lives on. Both were held until it closed, so
// that after an outage every continued connection still counted its buffers and
// new connections were refused SMC-R for memory.
func TestContinuationGivesBuffersBack(t *testing.T) {
	p, c, s, d := singleLinkPair(t, nil)
	echoCheck(t, c, s)
	// Bytes for the client that it has not read yet when the link fails.
	if _, err := s.Write([]byte("unread")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "bytes in the client's RMB", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.rx.Readable() == 6
	})
	d.Fail()
	p.srv.cfg.Devices[0].(*memverbs.Device).Fail() // the outage ends both groups
	eventually(t, "continued", func() bool { return c.continued() && s.continued() })
	eventually(t, "the server's buffers given back", func() bool { return p.srv.Stats().MemoryInUse == 0 })
	// The server's continuation may finish the client's before the client's own
	// group has ended: the buffers go when both have happened (shedBuffers).
	eventually(t, "the client's link group ended", func() bool {
		c.lg.mu.RLock()
		defer c.lg.mu.RUnlock()
		return c.lg.dead
	})
	want := int64(c.rx.Size())
	if !waitFor(5*time.Second, func() bool { return p.cli.Stats().MemoryInUse == want }) {
		t.Errorf("client holds %d bytes; want %d, its RMB with the unread bytes", p.cli.Stats().MemoryInUse, want)
	}
	b := make([]byte, 6)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "unread" {
		t.Fatalf("%q %v", b, err)
	}
	echoCheck(t, c, s) // over TCP
	if got := p.cli.Stats().MemoryInUse; got != 0 {
		t.Errorf("client holds %d bytes after reading its RMB empty", got)
	}
	c.Close()
	s.Close()
	eventually(t, "released", func() bool {
		return p.cli.Stats().MemoryInUse == 0 && p.srv.Stats().MemoryInUse == 0
	})
}

// TestContinuationGivesBuffersBackAsGroupEnds: a connection that continued over
// TCP while its link group lived on (the server declined after the client's
// Confirm) keeps its buffers, which the group's links may still reach, and
// gives them back when the group ends.
func TestContinuationGivesBuffersBackAsGroupEnds(t *testing.T) {
	p, good, gs, c, s := crossedDecline(t)
	echoOK(t, c, s)
	eventually(t, "continued", c.continued)
	c.mu.Lock()
	kept := c.rmb != nil && c.snd != nil
	c.mu.Unlock()
	if !kept {
		t.Fatal("buffers given back while the link group lives")
	}
	good.lnk.fail(errors.New("test: the group's last link fails"))
	eventually(t, "the client's buffers given back", func() bool { return p.cli.Stats().MemoryInUse == 0 })
	echoOK(t, c, s)
	for _, x := range []*Conn{c, s, good, gs} {
		x.Close()
	}
}

// hookDevice is a memverbs device whose PDs run hook, when set, before each
// AllocMR; an error from it is AllocMR's.
type hookDevice struct {
	*memverbs.Device
	hook atomic.Pointer[func(size int, access verbs.Access) error]
}

type hookPD struct {
	verbs.PD
	d *hookDevice
}

func (d *hookDevice) AllocPD() (verbs.PD, error) {
	pd, err := d.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	return &hookPD{PD: pd, d: d}, nil
}

func (p *hookPD) AllocMR(size int, access verbs.Access) (verbs.MR, error) {
	if h := p.d.hook.Load(); h != nil {
		if err := (*h)(size, access); err != nil {
			return nil, err
		}
	}
	return p.PD.AllocMR(size, access)
}

func (p *hookPD) RegisterMR(other verbs.MR, access verbs.Access) (verbs.MR, error) {
	return p.PD.(verbs.Registrar).RegisterMR(other, access)
}

// TestSendBufferLostInSetupNotCounted: a server whose link fails as it makes a
// connection's send buffer activates the connection without one, to continue
// over TCP. The memory it held for that buffer went on counting against
// max_memory until the connection closed.
func TestSendBufferLostInSetupNotCounted(t *testing.T) {
	dc, ds := twoDevices(t)
	hd := &hookDevice{Device: ds}
	p := newPair(t, Config{Devices: []verbs.Device{dc}, TestLinkInterval: -1}, Config{Devices: []verbs.Device{hd}, TestLinkInterval: -1})
	first, fs := p.connect(t)
	mustSMC(t, first, fs)
	fail := func(size int, access verbs.Access) error {
		if access != verbs.AccessLocalWrite || size < minRMB {
			return nil // a link's own slots
		}
		hd.hook.Store(nil)
		ds.Fail()
		// Until the group's end has reached every connection, this one too.
		waitFor(5*time.Second, func() bool {
			p.srv.mu.Lock()
			defer p.srv.mu.Unlock()
			for _, c := range p.srv.conns {
				if !c.linkFailed() {
					return false
				}
			}
			return true
		})
		return verbs.ErrClosed
	}
	hd.hook.Store(&fail)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	eventually(t, "continued", func() bool { return c.continued() && s.continued() && first.continued() && fs.continued() })
	echoOK(t, c, s)
	eventually(t, "the server's memory given back", func() bool { return p.srv.Stats().MemoryInUse == 0 })
	for _, x := range []*Conn{c, s, first, fs} {
		x.Close()
	}
}

// TestResyncWaitsForUnreadAnswer: the peer's resync came in time but our reader
// of it (watchTCP) has not run when the continuation's wait runs out, as on a
// busy host. The wait finds the answer on the socket and goes on, rather than
// failing the connection with "no resync from the peer".
func TestResyncWaitsForUnreadAnswer(t *testing.T) {
	clk := &fakeClock{}
	release := holdWatch(t, true)
	_, c, s, d1 := singleLinkPair(t, func(cfg *Config) { cfg.Clock, cfg.TestLinkInterval = clk, -1 })
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	d1.Fail()
	// The server reads the client's resync and continues; its own waits,
	// unread, on the client's socket.
	eventually(t, "the server continued", s.continued)
	eventually(t, "the server's resync at the client", func() bool { return pendingInput(underlyingConn(c.tcp)) })
	clk.Advance(time.Minute) // past resyncWait: the client's wait runs out
	failover := []byte(fmt.Sprintf("smcr.(*Conn).failover(%p", c))
	eventually(t, "the client's continuation looked", func() bool {
		for _, g := range goroutineStacks() {
			if bytes.Contains(g.stack, failover) {
				return g.state == "select"
			}
		}
		return true // ended
	})
	release()
	eventually(t, "the client continued", c.continued)
	s.SetReadDeadline(time.Now().Add(waitLimit))
	if b, err := io.ReadAll(io.LimitReader(s, 5)); err != nil || string(b) != "hello" {
		t.Fatalf("server read %q, %v", b, err)
	}
}

// TestStopTCPWatch: once StopTCPWatch returned, the engine reads the TCP
// connection no more: bytes the peer writes on it (those of a program that
// took the socket back, in the direct mode's same-host bypass) reach its
// reader whole, and are no resync: the connection does not continue over TCP.
func TestStopTCPWatch(t *testing.T) {
	_, c, s, _ := singleLinkPair(t, nil)
	if err := c.StopTCPWatch(); err != nil {
		t.Fatalf("StopTCPWatch: %v", err)
	}
	if err := c.StopTCPWatch(); err != nil {
		t.Fatalf("StopTCPWatch again: %v", err)
	}
	want := bytes.Repeat([]byte("not a resync "), 8)
	if _, err := s.TCP().Write(want); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	c.TCP().SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c.TCP(), got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %q (%v), want %q", got, err, want)
	}
	if c.Continued() {
		t.Error("the connection continued over TCP")
	}
	c.Close()
	s.Close()
}
