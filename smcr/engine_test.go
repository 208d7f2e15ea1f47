package smcr

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/smcr-io/smcr/smcr/clc"
	"github.com/smcr-io/smcr/smcr/internal/memverbs"
	"github.com/smcr-io/smcr/smcr/verbs"
)

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("SMCR_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

// logOnFailure returns a logger of warnings and information that t prints,
// tagged with side, only if it fails: what each engine saw of a failure
// (which link failed first, and why) without the noise of a passing run.
func logOnFailure(t testing.TB, side string) *slog.Logger {
	var mu sync.Mutex // engines log from their goroutines
	var buf bytes.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			mu.Lock()
			t.Logf("%s engine's log:\n%s", side, buf.String())
			mu.Unlock()
		}
	})
	w := writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// pair is two engines, a client and a server, with a loopback listener.
type pair struct {
	cli, srv *Engine
	ln       *Listener
}

func newEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	if cfg.CLCTimeout == 0 {
		cfg.CLCTimeout = 2 * time.Second
	}
	if cfg.LinkRetry == 0 {
		cfg.LinkRetry = -1 // tests that fail a link count on one link after it
	}
	e, err := NewEngine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func memDevices(t testing.TB, kind verbs.Kind) []verbs.Device {
	d := memverbs.New(kind)
	t.Cleanup(func() { closeChecked(t, d) })
	return []verbs.Device{d}
}

// closeChecked closes test devices and fails on any lifecycle error the engine
// made on them (a PD freed before its MRs, an MR closed after its PD): what
// ibverbs refuses or crashes on. The device itself may still hold the buffers
// of connections a test left open.
func closeChecked(t testing.TB, ds ...*memverbs.Device) {
	t.Helper()
	for _, d := range ds {
		for _, m := range d.Misuse() {
			t.Errorf("%s: %s", d.Name(), m)
		}
		d.Close()
	}
}

func newPair(t testing.TB, cli, srv Config) *pair {
	t.Helper()
	p := &pair{cli: newEngine(t, cli), srv: newEngine(t, srv)}
	ln, err := p.srv.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	p.ln = ln
	return p
}

func memPair(t testing.TB) *pair {
	return newPair(t, Config{Devices: memDevices(t, verbs.KindSoft)}, Config{Devices: memDevices(t, verbs.KindSoft)})
}

// connectSMC opens n connections, each SMC-R on both ends.
func (p *pair) connectSMC(t testing.TB, n int) [][2]*Conn {
	t.Helper()
	conns := make([][2]*Conn, 0, n)
	for range n {
		c, s := p.connect(t)
		mustSMC(t, c, s)
		conns = append(conns, [2]*Conn{c, s})
	}
	return conns
}

// echoAll accepts every connection and echoes what it reads, until the
// listener closes.
func (p *pair) echoAll() {
	go func() {
		for {
			s, err := p.ln.AcceptSMC()
			if err != nil {
				return
			}
			go func() {
				io.Copy(s, s)
				s.Close()
			}()
		}
	}()
}

// connect dials and accepts one connection.
func (p *pair) connect(t testing.TB) (*Conn, *Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := p.ln.AcceptSMC()
		ch <- res{c, err}
	}()
	c, err := p.cli.Dial(ctx, "tcp", p.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := within(t, ch, "the server's side of a connection the client made: "+c.debugState())
	if r.err != nil {
		t.Fatal(r.err)
	}
	// Closed before the engines (cleanups run last first): a connection left
	// open outlives its engine over TCP, with whatever reads it (TestMain).
	t.Cleanup(func() { c.Close(); r.c.Close() })
	return c, r.c
}

// connectWith connects a client of e1 and a server of e2 with options, over
// a TCP connection of their own.
func connectWith(t testing.TB, e1, e2 *Engine, co ClientOptions, so ServerOptions) (cli, srv *Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		tcp, err := ln.Accept()
		if err != nil {
			ch <- res{nil, err}
			return
		}
		s, err := e2.ServerWith(ctx, tcp, so)
		ch <- res{s, err}
	}()
	tcp, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cli, err = e1.ClientWith(ctx, tcp, co)
	if err != nil {
		t.Fatal(err)
	}
	r := within(t, ch, "the server's side of a connection the client made")
	if r.err != nil {
		t.Fatal(r.err)
	}
	return cli, r.c
}

func mustSMC(t testing.TB, cs ...*Conn) {
	t.Helper()
	for _, c := range cs {
		if c.Mode() != ModeSMCR {
			t.Fatalf("mode %v, decline %v", c.Mode(), c.Decline())
		}
	}
}

func TestEcho(t *testing.T) {
	p := memPair(t)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	go io.Copy(s, s)
	msg := []byte("hello over smc-r")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("got %q", got)
	}
	c.Close()
	s.Close()
}

// randomBytes returns n bytes seeded by seed. ChaCha8 fills them in bulk: a
// byte per rand call costs ~100ms a megabyte under the race detector, and
// tests that start dozens of streams at once spent seconds of a loaded
// 2-core machine on it before the first byte moved.
func randomBytes(seed uint64, n int) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	b := make([]byte, n)
	rand.NewChaCha8(key).Read(b)
	return b
}

// stream writes total random bytes in random sizes and checks them by hash.
func stream(t testing.TB, w, r *Conn, total int, seed uint64) {
	t.Helper()
	// No larger than the stream: a test of a thousand short streams made
	// 2 GiB of source before, which starved the engines it tested.
	src := randomBytes(seed, min(1<<20, total))
	want := sha256.New()
	errc := make(chan error, 1)
	go func() {
		defer w.CloseWrite()
		rng := rand.New(rand.NewPCG(seed, 2))
		for sent := 0; sent < total; {
			n := min(1+rng.IntN(200<<10), total-sent)
			off := rng.IntN(len(src) - n + 1)
			want.Write(src[off : off+n])
			if _, err := w.Write(src[off : off+n]); err != nil {
				errc <- err
				return
			}
			sent += n
		}
		errc <- nil
	}()
	got := sha256.New()
	buf := make([]byte, 300<<10)
	rrng := rand.New(rand.NewPCG(seed, 3))
	n := 0
	for {
		// A stream that stops moving fails here, naming where each end
		// stands, rather than hanging the suite until its timeout.
		r.SetReadDeadline(time.Now().Add(streamStall))
		k, err := r.Read(buf[:1+rrng.IntN(len(buf)-1)])
		got.Write(buf[:k])
		n += k
		if err == io.EOF {
			break
		}
		if err != nil {
			// Errorf, not Fatalf: streams run in goroutines of their tests.
			t.Errorf("read after %d of %d bytes: %v\nwriter %s\nreader %s", n, total, err, w.debugState(), r.debugState())
			return
		}
	}
	r.SetReadDeadline(time.Time{})
	if err := <-errc; err != nil {
		t.Errorf("write: %v", err)
		return
	}
	if n != total || !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Errorf("received %d of %d bytes, hash match %v", n, total, bytes.Equal(got.Sum(nil), want.Sum(nil)))
	}
}

// streamStall is how long stream waits for a byte: far beyond any pause of a
// working stream, under the race detector on a busy machine too.
const streamStall = time.Minute

// debugState is what a test that failed prints of c: cursors, close and
// failover state.
func (c *Conn) debugState() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("conn %d %v client=%v: tx prod %d cons %d (peer rmbe %d) wrOut %d busy %v; "+
		"rx prod %d cons %d confirmed %d (rmbe %d) busy %v; peer done %v closed %v, local done %v term %v; "+
		"fo %v ready %v moving %v lnkErr %v ctl %v err %v",
		c.id, c.mode, c.client, c.tx.Pos(), c.tx.PeerConsumerPos(), uint64(c.tx.Size()), c.wrOut.Load(), c.txBusy,
		c.rx.PeerProducerPos(), c.rx.Pos(), c.rx.ConfirmedPos(), uint64(c.rx.Size()), c.rxBusy, c.closing.peerDone, c.closing.peerClosed, c.closing.localDone, c.closing.localTerm,
		c.cont.fo, c.cont.foReady, c.move.moving, c.lnkErr, c.ctlPending, c.err)
}

func TestStreamsBothWays(t *testing.T) {
	p := memPair(t)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); stream(t, c, s, 64<<20, 1) }()
	go func() { defer wg.Done(); stream(t, s, c, 64<<20, 2) }()
	wg.Wait()
	c.Close()
	s.Close()
	st := p.cli.Stats()
	if st.TxBytes != 64<<20 || st.RxBytes != 64<<20 {
		t.Fatalf("client stats tx %d rx %d", st.TxBytes, st.RxBytes)
	}
}

// TestFallbackNoDevice: a client without a device proposes nothing and tells
// the server so with a Decline, as Linux's does: the server falls back at once
// rather than after its CLC timeout, which an application whose server speaks
// first would have waited out before its first byte.
func TestFallbackNoDevice(t *testing.T) {
	const clcTimeout = 5 * time.Second
	p := newPair(t, Config{}, Config{Devices: memDevices(t, verbs.KindSoft), CLCTimeout: clcTimeout})
	start := time.Now()
	c, s := p.connect(t)
	if d := time.Since(start); d > clcTimeout/2 {
		t.Errorf("setup took %v: the server waited for CLC", d)
	}
	if c.Mode() != ModeFallback || s.Mode() != ModeFallback {
		t.Fatalf("modes %v %v", c.Mode(), s.Mode())
	}
	if d := c.Decline(); d.Code != clc.DeclineNoSMCRDevice || d.Side != SideLocal || !d.Sent {
		t.Fatalf("client decline %+v", d)
	}
	if d := s.Decline(); d.Code != clc.DeclineNoSMCRDevice || d.Side != SidePeer || d.Sent {
		t.Fatalf("server decline %+v", d)
	}
	// The server speaks first, and its bytes are the client's first.
	if _, err := s.Write([]byte("220 ready")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 9)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "220 ready" {
		t.Fatalf("client read %q, %v", buf, err)
	}
	echoCheck(t, c, s)
}

// echoCheck proves a fallen-back pair carries bytes both ways.
func echoCheck(t *testing.T, c, s net.Conn) {
	t.Helper()
	go func() {
		buf := make([]byte, 5)
		io.ReadFull(s, buf)
		s.Write(buf)
	}()
	echoRaw(t, c)
}

func TestFallbackProviderMismatch(t *testing.T) {
	p := newPair(t, Config{Devices: memDevices(t, verbs.KindSoft)}, Config{Devices: memDevices(t, verbs.KindSHM)})
	c, s := p.connect(t)
	if c.Mode() != ModeFallback || s.Mode() != ModeFallback {
		t.Fatalf("modes %v %v", c.Mode(), s.Mode())
	}
	if d := c.Decline(); d.Code != clc.DeclineNoSMCRDevice || d.Side != SidePeer {
		t.Fatalf("client %+v", d)
	}
	if d := s.Decline(); d.Code != clc.DeclineNoSMCRDevice || d.Side != SideLocal || !d.Sent {
		t.Fatalf("server %+v", d)
	}
	if !errors.Is(c.Decline(), ErrFallback) || !errors.Is(c.Decline(), clc.DeclineNoSMCRDevice) {
		t.Fatal("decline does not match its sentinels")
	}
	echoCheck(t, c, s)
	st := p.srv.Stats()
	if st.Fallback[FallbackKey{clc.DeclineNoSMCRDevice, SideLocal}] != 1 {
		t.Fatalf("server fallback stats %v", st.Fallback)
	}
}

func TestFallbackMaxMemory(t *testing.T) {
	p := newPair(t, Config{Devices: memDevices(t, verbs.KindSoft), RMBSize: 64 << 10},
		Config{Devices: memDevices(t, verbs.KindSoft), MaxMemory: 150 << 10, RMBSize: 64 << 10})
	c1, s1 := p.connect(t)
	mustSMC(t, c1, s1)
	c2, s2 := p.connect(t)
	if c2.Mode() != ModeFallback || s2.Decline().Code != clc.DeclineNoMemory {
		t.Fatalf("second conn %v %+v", c2.Mode(), s2.Decline())
	}
	echoCheck(t, c2, s2)
}

// TestHeldMemoryCountsAgainstMax: memory held outside the engine (smcrd's
// direct-mode rings, HoldMemory) leaves the engine's connections only what
// is left of max_memory: with it held, a connection that fitted is declined
// for memory; given back, the next one fits again.
func TestHeldMemoryCountsAgainstMax(t *testing.T) {
	p := newPair(t, Config{Devices: memDevices(t, verbs.KindSoft), RMBSize: 64 << 10},
		Config{Devices: memDevices(t, verbs.KindSoft), MaxMemory: 150 << 10, RMBSize: 64 << 10})
	p.srv.HoldMemory(100 << 10)
	if got := p.srv.MemoryHeld(); got != 100<<10 {
		t.Fatalf("memory held %d, want %d", got, 100<<10)
	}
	c1, s1 := p.connect(t)
	if c1.Mode() != ModeFallback || s1.Decline().Code != clc.DeclineNoMemory {
		t.Fatalf("with the memory held: %v %+v, want a fallback for memory", c1.Mode(), s1.Decline())
	}
	p.srv.HoldMemory(-100 << 10)
	c2, s2 := p.connect(t)
	mustSMC(t, c2, s2)
}

// TestServerSendBufferWithinMaxMemory: the server learns the size of its send
// buffer (the client's RMBE) only from the Confirm; one that does not fit
// max_memory is declined there, as at any other point, and the connection
// falls back with every byte intact.
func TestServerSendBufferWithinMaxMemory(t *testing.T) {
	const limit = 100 << 10
	p := newPair(t, Config{Devices: memDevices(t, verbs.KindSoft), RMBSize: 256 << 10},
		Config{Devices: memDevices(t, verbs.KindSoft), MaxMemory: limit, RMBSize: 32 << 10})
	c, s := p.connect(t) // the client's Dial returns at its Confirm, before the Decline
	if s.Mode() != ModeFallback || s.Decline() == nil || s.Decline().Code != clc.DeclineNoMemory {
		t.Fatalf("server %v, decline %+v; want a fallback for memory", s.Mode(), s.Decline())
	}
	if st := p.srv.Stats(); st.MemoryPeak > limit {
		t.Errorf("server memory peaked at %d bytes, over max_memory %d", st.MemoryPeak, limit)
	}
	exchangeAll(t, c, s, 300<<10, 10<<10)
}

// tcpPair returns both ends of a loopback TCP connection, closed at the test's end.
func tcpPair(t *testing.T) (cli, srv net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cli, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	srv, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return cli, srv
}

// rawServer accepts one TCP connection and runs fn on it.
func rawServer(t *testing.T, fn func(net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		fn(c)
	}()
	return ln.Addr().String()
}

// TestCLCReadInPart: a CLC message read only in part (longer than the engine
// takes, or cut by the CLC timeout) ends in a fallback; the rest of it, arriving
// then or later, is skipped, not read by the application as the peer's data.
func TestCLCReadInPart(t *testing.T) {
	hello := func(c net.Conn) {
		buf := make([]byte, 4096)
		c.Read(buf) // the Decline
		c.Write([]byte("hello"))
		io.Copy(io.Discard, c)
	}
	readHello := func(t *testing.T, c net.Conn) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got := make([]byte, 5)
		if _, err := io.ReadFull(c, got); err != nil || string(got) != "hello" {
			t.Fatalf("application read %q (%v), want the peer's %q", got, err, "hello")
		}
	}
	accept := func(ext int) []byte {
		acc := &clc.Accept{LinkInfo: clc.LinkInfo{QPN: 1, RMBEIndex: 1, AlertToken: 1, MTU: clc.MTU1024, Ext: bytes.Repeat([]byte{'X'}, ext)}}
		b, err := acc.AppendTo(nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	dial := func(t *testing.T, cfg Config, server func(net.Conn)) *Conn {
		t.Helper()
		cfg.Devices = memDevices(t, verbs.KindSoft)
		e := newEngine(t, cfg)
		c, err := e.Dial(context.Background(), "tcp", rawServer(t, func(c net.Conn) {
			defer c.Close()
			c.Read(make([]byte, 4096)) // the Proposal
			server(c)
		}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if c.Mode() != ModeFallback {
			t.Fatalf("client %v, want a fallback", c.Mode())
		}
		return c
	}
	t.Run("accept too long", func(t *testing.T) {
		c := dial(t, Config{}, func(c net.Conn) {
			c.Write(accept(2000))
			hello(c)
		})
		readHello(t, c)
	})
	t.Run("accept cut by the timeout", func(t *testing.T) {
		c := dial(t, Config{CLCTimeout: 200 * time.Millisecond}, func(c net.Conn) {
			b := accept(0)
			c.Write(b[:20])
			c.Read(make([]byte, 4096)) // the Decline: the timeout cut the Accept
			c.Write(b[20:])
			c.Write([]byte("hello"))
			io.Copy(io.Discard, c)
		})
		readHello(t, c)
	})
	t.Run("accept of no length", func(t *testing.T) {
		// Where the peer's data would start cannot be known: the connection
		// ends rather than hand the application a guess.
		c := dial(t, Config{}, func(c net.Conn) {
			b := accept(0)
			b[5], b[6] = 0, 0
			c.Write(b)
			hello(c)
		})
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 64)); err == nil || isTimeout(err) {
			t.Fatalf("application read %d bytes (%v), want the connection ended", n, err)
		}
	})
	t.Run("proposal too long", func(t *testing.T) {
		p := memPair(t)
		raw, err := net.Dial("tcp", p.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		m := make([]byte, 2000)
		copy(m, clc.Eyecatcher[:])
		m[4] = byte(clc.TypeProposal)
		binary.BigEndian.PutUint16(m[5:], uint16(len(m)))
		m[7] = clc.Version1 << 4
		raw.Write(m)
		go hello(raw)
		s, err := p.ln.AcceptSMC()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if s.Mode() != ModeFallback {
			t.Fatalf("server %v, want a fallback", s.Mode())
		}
		readHello(t, s)
	})
}

func TestClientPeerSpeaksNoCLC(t *testing.T) {
	e := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft)})
	addr := rawServer(t, func(c net.Conn) {
		c.Write([]byte("220 hello\r\n"))
		io.Copy(io.Discard, c)
	})
	c, err := e.Dial(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Mode() != ModeFallback || c.Decline().Code != clc.DeclinePeerNoSMC {
		t.Fatalf("%v %+v", c.Mode(), c.Decline())
	}
	got := make([]byte, 11)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "220 hello\r\n" {
		t.Fatalf("app bytes %q %v", got, err)
	}
}

func TestClientCLCTimeout(t *testing.T) {
	e := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft), CLCTimeout: 100 * time.Millisecond})
	got := make(chan []byte, 1)
	addr := rawServer(t, func(c net.Conn) {
		b, _ := io.ReadAll(c)
		got <- b
	})
	c, err := e.Dial(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode() != ModeFallback || c.Decline().Code != DeclineTimeoutCLC || !c.Decline().Sent {
		t.Fatalf("%v %+v", c.Mode(), c.Decline())
	}
	c.Write([]byte("app"))
	c.Close()
	b := within(t, got, "what the server read")
	// Proposal, Decline, then the application's bytes.
	if !bytes.HasSuffix(b, []byte("app")) || !bytes.HasPrefix(b, clc.Eyecatcher[:]) {
		t.Fatalf("server saw %x", b)
	}
}

func TestClientMalformedCLC(t *testing.T) {
	e := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft)})
	got := make(chan []byte, 1)
	addr := rawServer(t, func(c net.Conn) {
		buf := make([]byte, 4096)
		c.Read(buf)
		// An eyecatcher, then an Accept header whose length is too small.
		c.Write([]byte{0xE2, 0xD4, 0xC3, 0xD9, 2, 0, 9, 0x10, 0, 0, 0, 0, 0, 0, 0, 0})
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, _ := c.Read(buf)
		got <- buf[:n]
	})
	c, err := e.Dial(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Mode() != ModeFallback || c.Decline().Code != clc.DeclineConfigError || !c.Decline().Sent {
		t.Fatalf("%v %+v", c.Mode(), c.Decline())
	}
	m, err := clc.Parse(within(t, got, "what the server read"))
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := m.(*clc.Decline); !ok || d.Code != clc.DeclineConfigError {
		t.Fatalf("server got %#v", m)
	}
}

func TestServerClientSpeaksNoCLC(t *testing.T) {
	e := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft)})
	ln, err := e.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	s, err := ln.AcceptSMC()
	if err != nil {
		t.Fatal(err)
	}
	if s.Mode() != ModeFallback || s.Decline().Code != clc.DeclinePeerNoSMC || s.Decline().Sent {
		t.Fatalf("%+v", s.Decline())
	}
	got := make([]byte, 18)
	if _, err := io.ReadFull(s, got); err != nil || string(got) != "GET / HTTP/1.0\r\n\r\n" {
		t.Fatalf("%q %v", got, err)
	}
}

func TestServerClientSilentTimeout(t *testing.T) {
	e := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft), CLCTimeout: 100 * time.Millisecond})
	ln, err := e.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	s, err := ln.AcceptSMC()
	if err != nil {
		t.Fatal(err)
	}
	if s.Mode() != ModeFallback || s.Decline().Code != DeclineTimeoutCLC || s.Decline().Sent {
		t.Fatalf("%+v", s.Decline())
	}
	// A server-speaks-first protocol still works.
	s.Write([]byte("220\r\n"))
	got := make([]byte, 5)
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(raw, got); err != nil || string(got) != "220\r\n" {
		t.Fatalf("%q %v", got, err)
	}
}

// TestFallbackSubnetMismatch: a client that proposes another subnet is declined
// with 0x03070000, the version-1 same-subnet rule.
func TestFallbackSubnetMismatch(t *testing.T) {
	other := func(netip.Addr) (netip.Prefix, bool) { return netip.MustParsePrefix("10.1.0.0/16"), true }
	p := newPair(t, Config{Devices: memDevices(t, verbs.KindSoft), Prefixes: other}, Config{Devices: memDevices(t, verbs.KindSoft)})
	c, s := p.connect(t)
	if d := s.Decline(); d == nil || d.Code != clc.DeclineIPSubnetMismatch || !d.Sent {
		t.Fatalf("server %+v", d)
	}
	if d := c.Decline(); d == nil || d.Code != clc.DeclineIPSubnetMismatch || d.Side != SidePeer {
		t.Fatalf("client %+v", d)
	}
	echoCheck(t, c, s)
}

// linuxLikeServer plays a Linux AF_SMC server that has no device it can use: it
// reads the first CLC message, closes the connection on a Proposal that fails
// Linux's length rule (smc_clc_msg_prop_valid), answers a Proposal with a
// Decline (0x03030000, as the soft-RoCE VM's kernel does), and echoes the
// rest. It reports what it read.
func linuxLikeServer(t *testing.T) (string, <-chan clc.Message) {
	got := make(chan clc.Message, 1)
	addr := rawServer(t, func(c net.Conn) {
		defer c.Close()
		var h [8]byte
		if _, err := io.ReadFull(c, h[:]); err != nil {
			return
		}
		b := make([]byte, binary.BigEndian.Uint16(h[5:]))
		copy(b, h[:])
		if _, err := io.ReadFull(c, b[8:]); err != nil {
			return
		}
		m, err := clc.Parse(b)
		if err != nil {
			t.Errorf("server: %v", err)
			return
		}
		got <- m
		if p, ok := m.(*clc.Proposal); ok {
			skip := int(binary.BigEndian.Uint16(b[38:]))
			if skip > clc.LinuxIPAreaOffset || len(b) != 40+skip+8+17*len(p.IPv6)+clc.TrailerLen {
				return // Linux: smc_listen_out_err
			}
			d, _ := (&clc.Decline{Code: clc.DeclineNoSMCDevice}).AppendTo(nil)
			c.Write(d)
		}
		io.Copy(c, c)
	})
	return addr, got
}

// TestClientStandard: toward a server that may be Linux, the Proposal carries the
// first rdma device alone, in a form Linux accepts, and Linux's Decline makes a
// clean fallback; with no rdma device, a Decline instead of a Proposal. The full
// Proposal (soft and rdma offers) is what Linux closes the connection on.
func TestClientStandard(t *testing.T) {
	dial := func(e *Engine, addr string, opts ClientOptions) *Conn {
		t.Helper()
		tcp, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c, err := e.ClientWith(context.Background(), tcp, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	rdma := memverbs.New(verbs.KindRDMA)
	t.Cleanup(func() { rdma.Close() })
	e := newEngine(t, Config{Devices: append(memDevices(t, verbs.KindSoft), rdma)})

	addr, got := linuxLikeServer(t)
	c := dial(e, addr, ClientOptions{Standard: true})
	p, ok := within(t, got, "the client's first CLC message").(*clc.Proposal)
	if !ok {
		t.Fatal("no proposal")
	}
	if p.GID != rdma.Port().GID || p.MAC != rdma.Port().MAC || len(p.Ext) != 0 {
		t.Errorf("proposal names gid %x mac %x with %d bytes after the prefixes; want the rdma device's, none", p.GID, p.MAC, len(p.Ext))
	}
	if env, err := clc.ParseEnvelope(p.EnvelopeArea()); err == nil {
		v, _ := env.Find(tlvProviders)
		if offers, err := parseOffers(v); err != nil || len(offers) != 1 || offers[0].Kind != verbs.KindRDMA {
			t.Errorf("offers %+v, %v; want the rdma device alone", offers, err)
		}
	}
	if c.Mode() != ModeFallback || c.Decline().Code != clc.DeclineNoSMCDevice || c.Decline().Side != SidePeer {
		t.Fatalf("%v %+v", c.Mode(), c.Decline())
	}
	echoRaw(t, c)

	// No rdma device: a Decline comes first, then the application's bytes.
	e2 := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft)})
	addr, got = linuxLikeServer(t)
	c = dial(e2, addr, ClientOptions{Standard: true})
	if d, ok := within(t, got, "the client's first CLC message").(*clc.Decline); !ok || d.Code != clc.DeclineNoSMCRDevice {
		t.Fatalf("server read %+v, want a Decline", d)
	}
	if c.Mode() != ModeFallback || !c.Decline().Sent {
		t.Fatalf("%v %+v", c.Mode(), c.Decline())
	}
	echoRaw(t, c)

	// The full Proposal, for an smcr server, does not pass Linux's rule: the
	// server closes the connection, and the handshake fails, as Linux's own
	// client's does.
	addr, got = linuxLikeServer(t)
	tcp, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	if c, err := e.ClientWith(context.Background(), tcp, ClientOptions{}); !errors.Is(err, io.EOF) {
		t.Fatalf("full proposal: %v, %v; want the handshake failed on the server's close", c, err)
	}
	if p, ok := within(t, got, "the client's first CLC message").(*clc.Proposal); !ok || len(p.Ext) == 0 {
		t.Fatalf("full proposal %+v: want the envelope after the prefixes", p)
	}
}

// echoRaw checks that a fallen-back connection carries bytes to an echo server.
func echoRaw(t *testing.T, c net.Conn) {
	t.Helper()
	if _, err := c.Write([]byte("ping!")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 5)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "ping!" {
		t.Fatalf("echo %q %v", got, err)
	}
}

// TestConnsDuringSetup: Conns (smcrctl conns) lists connections while they set
// up, SMC-R or falling back, without a data race on the mode, decline and TCP
// connection CLC sets (go test -race).
func TestConnsDuringSetup(t *testing.T) {
	p := memPair(t)
	bare := newEngine(t, Config{}) // no device: its connections fall back at once
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, e := range []*Engine{p.cli, p.srv, bare} {
				e.Conns()
			}
			time.Sleep(10 * time.Microsecond) // paces the listing: a tight loop on e.mu would slow the setups it watches
		}
	}()
	for range 10 {
		c, s := p.connect(t)
		c.Close()
		s.Close()
		a, b := net.Pipe()
		go io.Copy(io.Discard, b) // the Decline a client without a device sends
		fc, err := bare.Client(context.Background(), a)
		if err != nil {
			t.Fatal(err)
		}
		fc.Close()
		b.Close()
	}
	close(stop)
	<-done
}

// TestTokensApartFromIDs: an SMC-R connection's alert token, which smcrd
// lists as its ID, never equals the sequence number a TCP connection is
// listed by: tokens have their top bit set, sequence numbers never reach it.
func TestTokensApartFromIDs(t *testing.T) {
	p := memPair(t)
	for range 16 {
		c, s := p.connect(t)
		mustSMC(t, c, s)
		for _, x := range []*Conn{c, s} {
			if ci := connInfo(t, x.e, x); ci.Token < tokenBit || ci.ID >= tokenBit {
				t.Fatalf("token %#x, ID %d; want the token at or above %#x, the ID below", ci.Token, ci.ID, tokenBit)
			}
		}
		c.Close()
		s.Close()
	}
}

// setConfirmHook has e's client handshakes pass their Confirm to f before it
// goes; nil ends that.
func setConfirmHook(e *Engine, f func(*clc.Confirm)) {
	if f == nil {
		e.confirmHook.Store(nil)
		return
	}
	e.confirmHook.Store(&f)
}

// TestVersion2AnswerToVersion1: the engine proposes version 1 only, so a version-2
// Accept (Linux's layout, first contact) is a protocol error: the client declines
// with a configuration error and the connection goes on over TCP.
func TestVersion2AnswerToVersion1(t *testing.T) {
	acc := &clc.Accept{LinkInfo: clc.LinkInfo{QPN: 1, RMBEIndex: 1, AlertToken: 1, MTU: clc.MTU1024, FirstContact: true,
		V2: &clc.LinkInfoV2{FirstContact: clc.FirstContactExt{Direct: true, OSType: clc.OSLinux}}}}
	wire, err := acc.AppendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	declined := make(chan clc.DeclineCode, 1)
	e := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft)})
	c, err := e.Dial(context.Background(), "tcp", rawServer(t, func(c net.Conn) {
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := clc.ReadMessage(c, clc.MaxLen); err != nil { // the Proposal
			t.Errorf("read proposal: %v", err)
			return
		}
		c.Write(wire)
		m, err := clc.ReadMessage(c, clc.MaxLen)
		if d, ok := m.(*clc.Decline); ok && err == nil {
			declined <- d.Code
		} else {
			t.Errorf("after a v2 accept: %v, %v; want a decline", m, err)
		}
		c.Write([]byte("hello"))
		io.Copy(io.Discard, c)
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Mode() != ModeFallback {
		t.Fatalf("client %v, want a fallback", c.Mode())
	}
	select {
	case code := <-declined:
		if code != clc.DeclineConfigError {
			t.Fatalf("declined with %v, want %v", code, clc.DeclineConfigError)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no decline")
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, 5)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "hello" {
		t.Fatalf("application read %q (%v), want the peer's data", got, err)
	}
}
