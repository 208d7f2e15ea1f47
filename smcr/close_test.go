package smcr

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/smcr-io/smcr/smcr/internal/memverbs"
	"github.com/smcr-io/smcr/smcr/verbs"
)

func TestHalfCloseBothWays(t *testing.T) {
	p := memPair(t)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	if _, err := c.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil { // as shutdown(2) twice
		t.Fatalf("second CloseWrite: %v", err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, ErrWriteClosed) {
		t.Fatalf("write after CloseWrite: %v", err)
	}
	b, err := io.ReadAll(s)
	if err != nil || string(b) != "request" {
		t.Fatalf("server read %q %v", b, err)
	}
	// The server can still answer after the client's half-close.
	if _, err := s.Write([]byte("response")); err != nil {
		t.Fatal(err)
	}
	s.CloseWrite()
	b, err = io.ReadAll(c)
	if err != nil || string(b) != "response" {
		t.Fatalf("client read %q %v", b, err)
	}
	c.Close()
	s.Close()
	if err := s.CloseWrite(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("CloseWrite after Close: %v", err)
	}
	eventually(t, "buffers released", func() bool {
		return p.cli.Stats().MemoryInUse == 0 && p.srv.Stats().MemoryInUse == 0 &&
			len(p.cli.Conns()) == 0 && len(p.srv.Conns()) == 0
	})
	// The TCP connection goes after the SMC-R connection.
	if _, err := c.TCP().Write([]byte{0}); err == nil {
		t.Fatal("tcp still open after close")
	}
}

func TestCloseDeliversAllDataBeforeEOF(t *testing.T) {
	p := memPair(t)
	c, s := p.connect(t)
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	go func() {
		c.Write(data)
		c.Close()
	}()
	b, err := io.ReadAll(s)
	if err != nil || len(b) != len(data) || b[len(b)-1] != data[len(data)-1] {
		t.Fatalf("read %d bytes, %v", len(b), err)
	}
	s.Close()
	eventually(t, "release", func() bool { return p.cli.Stats().Active == 0 && p.srv.Stats().Active == 0 })
}

func TestAbort(t *testing.T) {
	p := memPair(t)
	c, s := p.connect(t)
	c.Write([]byte("partial"))
	if err := c.Abort(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "reset seen", func() bool {
		s.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		buf := make([]byte, 64)
		_, err := s.Read(buf)
		return errors.Is(err, ErrReset)
	})
	if _, err := s.Write([]byte("x")); !errors.Is(err, ErrReset) {
		t.Fatalf("write after reset: %v", err)
	}
	s.Close()
	eventually(t, "release", func() bool {
		return p.cli.Stats().MemoryInUse == 0 && p.srv.Stats().MemoryInUse == 0
	})
	if p.srv.Stats().Aborts != 1 {
		t.Fatalf("aborts %d", p.srv.Stats().Aborts)
	}
}

// TestBroken: a connection is broken once the peer aborted before its
// sending-done, not while it is healthy, and not when the abort came after its
// sending-done (the stream was whole, as a TCP reset after the FIN leaves it).
func TestBroken(t *testing.T) {
	p := memPair(t)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	c.Write([]byte("bytes"))
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(s, make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	if s.Broken() {
		t.Fatal("a healthy connection is broken")
	}
	c.Abort()
	eventually(t, "broken after the peer's abort", s.Broken)

	c, s = p.connect(t)
	mustSMC(t, c, s)
	c.Write([]byte("bytes"))
	c.CloseWrite()
	eventually(t, "sending-done in", func() bool {
		s.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		b, err := io.ReadAll(s)
		return string(b) == "bytes" && err == nil
	})
	c.Abort()
	eventually(t, "the abort in", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.closing.peerAbort
	})
	if s.Broken() {
		t.Error("broken by an abort after the sending-done")
	}
}

// TestAbortIsNoClose: the peer of an Abort reads the bytes written before it,
// then ErrReset, never EOF: Close, which Abort ends with, sends no closed flag
// ahead of the worker's abnormal close (a peer would take the stream for whole).
func TestAbortIsNoClose(t *testing.T) {
	p := memPair(t)
	for range 10 {
		c, s := p.connect(t)
		mustSMC(t, c, s)
		if _, err := c.Write([]byte("partial")); err != nil {
			t.Fatal(err)
		}
		if err := c.Abort(); err != nil {
			t.Fatal(err)
		}
		s.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(s)
		if string(b) != "partial" || !errors.Is(err, ErrReset) {
			t.Fatalf("peer of an abort read %q, %v; want ErrReset after the bytes", b, err)
		}
		s.Close()
	}
}

func TestDeadlines(t *testing.T) {
	p := newPair(t, Config{Devices: memDevices(t, 3), RMBSize: 16 << 10}, Config{Devices: memDevices(t, 3), RMBSize: 16 << 10})
	c, s := p.connect(t)
	s.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	start := time.Now()
	_, err := s.Read(make([]byte, 10))
	var ne net.Error
	// As the net.Conn contract asks: a net.Error that times out, and wraps
	// os.ErrDeadlineExceeded.
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) < 25*time.Millisecond {
		t.Fatalf("read: %v after %v", err, time.Since(start))
	}
	s.SetReadDeadline(time.Time{})
	// Nobody reads: the peer's 16 KiB RMBE fills and Write times out.
	c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	n, err := c.Write(make([]byte, 64<<10))
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) || n != 16<<10 {
		t.Fatalf("write: %d %v", n, err)
	}
	c.SetWriteDeadline(time.Time{})
	// Both still work after the deadlines are cleared.
	go io.Copy(io.Discard, s)
	if _, err := c.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	// A deadline interrupts a Read already blocked.
	done := make(chan error, 1)
	goBlocked(t, func() { _, err := c.Read(make([]byte, 1)); done <- err })
	c.SetReadDeadline(time.Now())
	if err := <-done; !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("blocked read: %v", err)
	}
}

func TestCloseUnblocksReadAndWrite(t *testing.T) {
	p := memPair(t)
	c, s := p.connect(t)
	done := make(chan error, 1)
	goBlocked(t, func() { _, err := c.Read(make([]byte, 1)); done <- err })
	c.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
	b, err := io.ReadAll(s)
	if err != nil || len(b) != 0 {
		t.Fatalf("peer read %q %v", b, err)
	}
	s.Close()
}

// TestEngineCloseFreesVerbs checks the order the engine frees verbs resources
// in, which real devices enforce: Close returns with every link's QP and CQ
// gone; a connection the application closed has freed its buffers; one it still
// holds keeps them, and the PD they are registered in, until it has continued
// over TCP (or is closed); then nothing is left.
func TestEngineCloseFreesVerbs(t *testing.T) {
	dc, ds := twoDevices(t)
	p := newPair(t, Config{Devices: []verbs.Device{dc}}, Config{Devices: []verbs.Device{ds}})
	var held [2]*Conn
	for i := range 3 {
		c, s := p.connect(t)
		mustSMC(t, c, s)
		go io.Copy(s, s)
		echoCheck(t, c, s)
		if i == 0 {
			held = [2]*Conn{c, s}
			continue
		}
		c.Close()
		s.Close()
	}
	p.cli.Close()
	p.srv.Close()
	for _, d := range []*memverbs.Device{dc, ds} {
		live := d.Live()
		if live.QPs != 0 || live.CQs != 0 {
			t.Errorf("%s after Engine.Close: %+v; want no QP or CQ", d.Name(), live)
		}
		// The closed connections released their buffers as the link went;
		// the held one gives its two back, one after the other, once it
		// continues over TCP, so anything from both to none may be left.
		if live.MRs > 2 || live.PDs > 1 {
			t.Errorf("%s after Engine.Close: %+v; want at most the held connection's RMB and send buffer, in one PD", d.Name(), live)
		}
	}
	for _, d := range []*memverbs.Device{dc, ds} {
		eventually(t, d.Name()+" freed", func() bool { return d.Live() == memverbs.Resources{} })
	}
	if !held[0].continued() || !held[1].continued() {
		t.Error("the held connection did not continue over TCP")
	}
	held[0].Close()
	held[1].Close()
}

// TestStateHeldUntilActivation: CDCs that reach a server's connection between the
// client's Confirm and the server's activation set the close flags but leave it
// INIT, so a link failure then is still a setup failure (a Decline), not a
// continuation; activation shows the flags.
func TestStateHeldUntilActivation(t *testing.T) {
	c := &Conn{e: &Engine{log: slog.New(slog.DiscardHandler)}}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closing.peerDone, c.closing.peerClosed = true, true
	c.updateState("cdc")
	if c.st != stateInit || c.canContinue() {
		t.Fatalf("before activation: %v, can continue %v; want SMC_INIT, false", c.st, c.canContinue())
	}
	c.activated = true
	c.updateState("clc done")
	if c.st != stateAppCloseWait1 {
		t.Fatalf("after activation: %v; want SMC_APPCLOSEWAIT1", c.st)
	}
}

// TestEngineCloseAfterClose: a client that closes its connection and then its
// engine (a short-lived program) finishes the close over SMC-R: no continuation,
// no wait on a resync, every byte delivered.
func TestEngineCloseAfterClose(t *testing.T) {
	srv := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft)})
	ln, err := srv.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	msg := make([]byte, 100<<10)
	rand.Read(msg)
	got := make(chan []byte, 1)
	go func() {
		for {
			s, err := ln.AcceptSMC()
			if err != nil {
				return
			}
			b, _ := io.ReadAll(s)
			s.Close()
			got <- b
		}
	}()
	for i := range 20 {
		cli := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft)})
		c, err := cli.Dial(context.Background(), "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		mustSMC(t, c)
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		c.Close()
		start := time.Now()
		cli.Close()
		if d := time.Since(start); d > time.Second {
			t.Errorf("connection %d: Engine.Close took %v", i, d)
		}
		if b := within(t, got, "what the server read"); !bytes.Equal(b, msg) {
			t.Fatalf("connection %d: server read %d of %d bytes", i, len(b), len(msg))
		}
	}
	if n := srv.Stats().Continued; n != 0 {
		t.Errorf("%d connections continued over TCP; want 0", n)
	}
}

// TestCloseWakesOnRelease: Engine.Close's wait for closed connections to
// release their buffers ends when the last one does, not at its next poll (with
// the poll made an hour here, only the release can end it).
func TestCloseWakesOnRelease(t *testing.T) {
	e := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft), releasePoll: time.Hour})
	c := &Conn{e: e, id: 1, closing: closeState{appClosed: true}}
	e.mu.Lock()
	e.conns[c.id] = c
	e.mu.Unlock()
	var ok bool
	returned := goBlocked(t, func() { ok = e.awaitClosedReleased(make(chan struct{})) })
	if isClosed(returned) {
		t.Fatal("returned while the closed connection holds its buffers")
	}
	c.mu.Lock()
	c.closing.released = true
	c.mu.Unlock()
	e.untrack(c)
	within(t, returned, "the release ending the wait")
	if !ok {
		t.Fatal("reported connections unreleased")
	}
}

// closeWithin closes both ends from inside a section of c's (testHookCopy for
// c and rx), once: the peer, then c from another goroutine. It notes whether
// that Close returned (rather than blocked), and then whether c is released:
// once its close handshake is done, when Close returned.
type closeWithin struct {
	c, s               *Conn
	rx                 bool
	once               sync.Once
	released, returned bool
}

func (w *closeWithin) install(t *testing.T) {
	hook := func(x *Conn, rx bool) {
		if x == w.c && rx == w.rx {
			w.once.Do(func() { w.closeBoth(t) })
		}
	}
	testHookCopy.Store(&hook)
	t.Cleanup(func() { testHookCopy.Store(nil) })
}

func (w *closeWithin) closeBoth(t *testing.T) {
	c := w.c
	// From a goroutine that holds nothing: this one holds c's cdcMu (a
	// Write's hook), and two connections' are never held at once.
	peerClosed := make(chan struct{})
	go func() { w.s.Close(); close(peerClosed) }()
	<-peerClosed
	eventually(t, "peer's close seen", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.closing.peerClosed
	})
	closed := goBlocked(t, func() { c.Close() })
	w.returned = isClosed(closed)
	if w.returned {
		// Nothing but the copy keeps c from its release now.
		eventually(t, "the close handshake done", func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.lnkErr || c.closing.termAcked && c.closing.peerClosed && c.wrOut.Load() == 0
		})
	}
	w.released = w.isReleased()
}

func (w *closeWithin) isReleased() bool {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	return w.c.closing.released
}

// TestReleaseWaitsForCopy: a connection closed while a Read copies out of its
// RMB, or a Write into its send buffer, keeps both until the copy ends (released,
// a buffer is unmapped or given to another connection), and the Write's bytes
// go before the closing CDC (after it, the peer may have let its RMB go).
func TestReleaseWaitsForCopy(t *testing.T) {
	for _, rx := range []bool{true, false} {
		t.Run(map[bool]string{true: "read", false: "write"}[rx], func(t *testing.T) {
			p := memPair(t)
			c, s := p.connect(t)
			mustSMC(t, c, s)
			d, ds := p.connect(t) // for linkBarrier
			mustSMC(t, d, ds)
			w := &closeWithin{c: c, s: s, rx: rx}
			w.install(t)
			if rx {
				if _, err := s.Write([]byte("hello")); err != nil {
					t.Fatal(err)
				}
				b := make([]byte, 5)
				if _, err := io.ReadFull(c, b); err != nil || string(b) != "hello" {
					t.Fatalf("read %q %v", b, err)
				}
			} else {
				c.Write([]byte("hello"))
				if w.returned {
					t.Error("Close sent its closing CDC while a Write was posting")
				}
			}
			if w.released {
				t.Fatal("buffers released while a copy used them")
			}
			eventually(t, "released after the copy", w.isReleased)
			// Nothing followed the closing CDC to a peer that may have let
			// the connection go.
			linkBarrier(t, d, ds)
			if n := p.srv.Stats().ProtoErrors; n != 0 {
				t.Errorf("the peer counted %d protocol errors", n)
			}
		})
	}
}

// TestCloseTimeout: a peer whose application never closes its end does not
// hold ours for ever. CloseTimeout after our Close the connection aborts,
// which frees its buffers, and the peer's application sees a reset.
func TestCloseTimeout(t *testing.T) {
	const timeout = 30 * time.Second
	clk := &fakeClock{}
	p := newPair(t, Config{Devices: memDevices(t, verbs.KindSoft), CloseTimeout: timeout, Clock: clk}, Config{Devices: memDevices(t, verbs.KindSoft)})
	c, s := p.connect(t)
	mustSMC(t, c, s)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := s.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Fatalf("peer read %d bytes (%v), want EOF", n, err)
	}
	clk.Advance(timeout - time.Millisecond)
	if p.cli.Stats().MemoryInUse == 0 {
		t.Fatal("released before the peer closed or the timeout")
	}
	clk.Advance(time.Millisecond)
	eventually(t, "released after the timeout", func() bool { return p.cli.Stats().MemoryInUse == 0 })
	eventually(t, "peer sees the abort", func() bool {
		_, err := s.Write([]byte("x"))
		return errors.Is(err, ErrReset)
	})
	s.Close()
	eventually(t, "peer released", func() bool { return p.srv.Stats().MemoryInUse == 0 })
}

// gatedDevice holds its first AllocPD until release is closed, so that a test
// can act while a link is being made.
type gatedDevice struct {
	*memverbs.Device
	entered chan struct{} // closed when the first AllocPD waits
	release chan struct{}
	once    sync.Once
	opened  sync.Once
}

// open lets the waiting AllocPD go; tests call it from a cleanup too, so that
// one that failed before leaves no goroutine blocked in it.
func (d *gatedDevice) open() { d.opened.Do(func() { close(d.release) }) }

func (d *gatedDevice) AllocPD() (verbs.PD, error) {
	first := false
	d.once.Do(func() { first = true })
	if first {
		close(d.entered)
		<-d.release
	}
	return d.Device.AllocPD()
}

// TestCloseDuringNewLinkGroup: a link group whose first link is being made as
// Close begins is not left behind it. It was listed after Close had taken the
// list of groups to end: Close waited its full closeWait for the link, which no
// one closed, and returned with the group, its QP, CQ and PD still there.
func TestCloseDuringNewLinkGroup(t *testing.T) {
	d := memverbs.New(verbs.KindSoft)
	t.Cleanup(func() { closeChecked(t, d) })
	g := &gatedDevice{Device: d, entered: make(chan struct{}), release: make(chan struct{})}
	e := newEngine(t, Config{Devices: []verbs.Device{g}})
	t.Cleanup(g.open)
	made := make(chan error, 1)
	go func() {
		_, err := e.newLinkGroup(lgKey{peer: [8]byte{1}, kind: verbs.KindSoft}, 0)
		made <- err
	}()
	within(t, g.entered, "the link being made")
	closed := make(chan struct{})
	go func() {
		e.Close()
		close(closed)
	}()
	eventually(t, "Close to begin", e.isClosed)
	g.open()
	if err := within(t, made, "newLinkGroup"); !errors.Is(err, ErrEngineClosed) {
		t.Errorf("new link group during Close: %v; want ErrEngineClosed", err)
	}
	select {
	case <-closed:
	case <-time.After(closeWait / 2):
		t.Fatal("Close waits for the link of a group made as it ran")
	}
	if n := len(e.LinkGroups()); n != 0 {
		t.Errorf("%d link groups after Close", n)
	}
	eventually(t, "the link freed", func() bool { return d.Live() == memverbs.Resources{} })
}

// TestCloseTimeoutAfterAbort: a peer that never answers our abnormal close (its
// software hung, or a hostile peer that broke the protocol and went silent)
// does not hold the connection either: CloseTimeout after Close it is released.
func TestCloseTimeoutAfterAbort(t *testing.T) {
	const timeout = 30 * time.Second
	clk, sclk := &fakeClock{}, &fakeClock{}
	p := newPair(t, Config{Devices: memDevices(t, verbs.KindSoft), CloseTimeout: timeout, Clock: clk},
		Config{Devices: memDevices(t, verbs.KindSoft), CloseTimeout: timeout, Clock: sclk})
	c, s := p.connect(t)
	mustSMC(t, c, s)
	s.mu.Lock()
	s.closing.localTerm = true // it answers no abort (onCDC)
	s.mu.Unlock()
	if err := c.Abort(); err != nil {
		t.Fatal(err)
	}
	released := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.closing.released
	}
	clk.Advance(timeout - time.Millisecond)
	if released() {
		t.Fatal("released before the timeout, though the peer never answered")
	}
	clk.Advance(time.Millisecond)
	eventually(t, "released after the timeout", released)
	s.Close()
	sclk.Advance(timeout) // its close is not answered either
	eventually(t, "peer released", func() bool { return p.srv.Stats().MemoryInUse == 0 })
}

// TestCloseWithUnreadData: a Close that leaves received bytes unread ends the
// connection abnormally, as TCP's close answers unread data with a reset (and
// Linux's smc_close_final with an abnormal close): the peer, still reading,
// reads ErrReset where it read EOF, as if its bytes had all been taken. A peer
// that closed already is sent a plain close.
func TestCloseWithUnreadData(t *testing.T) {
	p := memPair(t)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	if _, err := c.Write([]byte("a request the server never reads")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the request landed", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.rx.PeerProducerPos() > 0
	})
	s.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(c); !errors.Is(err, ErrReset) {
		t.Fatalf("client read after the server closed with the request unread: %v, want ErrReset", err)
	}
	c.Close()

	// The client closes first; the server closes with bytes unread after.
	c2, s2 := p.connect(t)
	mustSMC(t, c2, s2)
	if _, err := c2.Write([]byte("unread")); err != nil {
		t.Fatal(err)
	}
	before := p.cli.Stats().Aborts
	c2.Close()
	eventually(t, "the client's close taken", func() bool {
		s2.mu.Lock()
		defer s2.mu.Unlock()
		return s2.closing.peerClosed
	})
	s2.Close()
	eventually(t, "both released", func() bool {
		c2.mu.Lock()
		defer c2.mu.Unlock()
		return c2.closing.released
	})
	if n := p.cli.Stats().Aborts - before; n != 0 {
		t.Errorf("%d aborts sent to a peer that had closed", n)
	}
}

// TestCloseTwice: a second Close says the connection is closed, as TCPConn's
// does, over SMC-R and after a fallback.
func TestCloseTwice(t *testing.T) {
	p := memPair(t)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	fp := newPair(t, Config{}, Config{Devices: memDevices(t, verbs.KindSoft)})
	fc, fs := fp.connect(t)
	if fc.Mode() != ModeFallback {
		t.Fatalf("mode %v", fc.Mode())
	}
	for _, conn := range []*Conn{c, s, fc, fs} {
		if err := conn.Close(); err != nil {
			t.Fatalf("%v: first Close: %v", conn.Mode(), err)
		}
		if err := conn.Close(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("%v: second Close: %v, want net.ErrClosed", conn.Mode(), err)
		}
	}
}
