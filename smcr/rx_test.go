package smcr

import (
	"bufio"
	"bytes"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// TestReadersDrive: a reader waiting for bytes handles its link's completions
// itself (Conn.drive) while the poller steps aside. Two readers wait on the same
// link, taking turns at driving it: the ping-pong's on one connection and a bulk
// transfer's on a second connection of the link group; each gets every byte of
// its own, whoever handled the completion that brought it.
func TestReadersDrive(t *testing.T) {
	t.Run("default", func(t *testing.T) { testReadersDrive(t, 0) })
	// Disabled, every completion is the poller's and the bytes arrive the same.
	t.Run("off", func(t *testing.T) { testReadersDrive(t, -1) })
}

func testReadersDrive(t *testing.T, spin time.Duration) {
	p := newPair(t, Config{Devices: memDevices(t, verbs.KindSoft), ReadSpin: spin},
		Config{Devices: memDevices(t, verbs.KindSoft), ReadSpin: spin})
	c, s := p.connect(t)
	c2, s2 := p.connect(t)
	mustSMC(t, c, s, c2, s2)
	if c.lnk != c2.lnk {
		t.Fatal("the connections are on different links")
	}
	go io.Copy(s, s)

	const bulk = 8 << 20
	want := bytes.Repeat([]byte("0123456789abcdef"), bulk/16)
	var wg sync.WaitGroup
	var got []byte
	var readErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		s2.Write(want)
		s2.CloseWrite()
	}()
	go func() {
		defer wg.Done()
		got, readErr = io.ReadAll(c2)
	}()

	msg := make([]byte, 64)
	back := make([]byte, 64)
	for i := range 2000 {
		msg[0], msg[1] = byte(i), byte(i>>8)
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, back); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back, msg) {
			t.Fatalf("round trip %d: got %x", i, back[:2])
		}
	}
	wg.Wait()
	if readErr != nil || !bytes.Equal(got, want) {
		t.Fatalf("bulk transfer beside the ping-pong: %d of %d bytes, %v", len(got), len(want), readErr)
	}
	driven, polled := c.lnk.driven.Load(), c.lnk.polled.Load()
	t.Logf("client link: %d of %d completions handled by readers", driven, polled)
	switch {
	case spin >= 0 && driven == 0:
		t.Fatal("no completion was handled by a waiting reader")
	case spin < 0 && driven != 0:
		t.Fatalf("%d completions handled by readers with ReadSpin %v", driven, spin)
	}
}

// TestReadSpinAdapts: a reader whose bytes keep coming later than its spin halves
// it down to minReadSpin, so well-spaced messages cost little CPU; once they come
// while it spins again (found by a probe), it is back at ReadSpin.
func TestReadSpinAdapts(t *testing.T) {
	p := memPair(t)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	buf := make([]byte, 1)
	reader := goroutineID()
	for range 20 {
		go func() {
			// Once the reader's spin gave up and it sleeps.
			if !waitFor(waitLimit, func() bool { return goroutineBlocked(reader, "select") }) {
				t.Error("the reader never slept")
			}
			s.Write([]byte{1})
		}()
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
	}
	if got := time.Duration(c.spin.cur.Load()); got != minReadSpin {
		t.Fatalf("after 20 late messages the spin is %v, want %v", got, minReadSpin)
	}
	go io.Copy(s, s)
	for range 2000 {
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		if time.Duration(c.spin.cur.Load()) == c.e.cfg.ReadSpin {
			return
		}
	}
	t.Fatalf("after 2000 round trips the spin is %v, want %v back", time.Duration(c.spin.cur.Load()), c.e.cfg.ReadSpin)
}

// TestSetReadSpin: SetReadSpin applies to Reads from then on: turned off, no
// completion is handled by a waiting reader any more; 0 restores the default.
func TestSetReadSpin(t *testing.T) {
	p := memPair(t)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	go io.Copy(s, s)
	pingPong := func() {
		t.Helper()
		msg, back := make([]byte, 64), make([]byte, 64)
		for i := range 500 {
			msg[0], msg[1] = byte(i), byte(i>>8)
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, back); err != nil || !bytes.Equal(back, msg) {
				t.Fatalf("round trip %d: %x %v", i, back[:2], err)
			}
		}
	}
	pingPong()
	if c.lnk.driven.Load() == 0 {
		t.Fatal("no completion was handled by a waiting reader with the default spin")
	}
	p.cli.SetReadSpin(-1)
	if got := p.cli.Settings().ReadSpin; got >= 0 {
		t.Fatalf("read spin %v after SetReadSpin(-1)", got)
	}
	before := c.lnk.driven.Load()
	pingPong()
	if n := c.lnk.driven.Load() - before; n != 0 {
		t.Fatalf("%d completions handled by the reader with its spin off", n)
	}
	p.cli.SetReadSpin(0)
	if got := p.cli.Settings().ReadSpin; got != 20*time.Microsecond {
		t.Fatalf("read spin %v after SetReadSpin(0), want the default 20µs", got)
	}
	pingPong()
	if c.lnk.driven.Load() == before {
		t.Fatal("no completion was handled by the reader once its spin was back")
	}
	c.Close()
	s.Close()
}

// TestSpinBudget: the first spin and every 32nd after it get the whole bound; a
// spin that found what it waited for doubles the next, up to the bound; one that
// gave up halves it, down to minReadSpin.
func TestSpinBudget(t *testing.T) {
	const bound = 20 * time.Microsecond
	var s spinBudget
	spin := func(found bool) time.Duration {
		b := s.next(bound)
		s.done(b, bound, found)
		return b
	}
	if b := spin(false); b != bound {
		t.Fatalf("first spin %v, want the bound %v", b, bound)
	}
	want := []time.Duration{10e3, 5e3, 2500, 1250, minReadSpin, minReadSpin}
	for i, w := range want {
		if b := spin(false); b != w {
			t.Fatalf("spin %d after misses: %v, want %v", i+2, b, w)
		}
	}
	for _, w := range []time.Duration{minReadSpin, 2 * minReadSpin, 4 * minReadSpin} {
		if b := spin(true); b != w {
			t.Fatalf("after hits: %v, want %v", b, w)
		}
	}
	for i := 11; i <= 32; i++ {
		spin(false)
	}
	if b := spin(false); b != bound {
		t.Fatalf("spin 33: %v, want the probe's %v", b, bound)
	}
}

// TestAwaitCLC: a handshake polls its socket for the peer's next CLC message
// for up to its budget (clcSpinMax at most): it finds bytes already there at
// once (and its budget grows), gives up on a silent peer after the budget (and
// it shrinks), and does not poll while another handshake of its engine polls,
// nor with ReadSpin off.
func TestAwaitCLC(t *testing.T) {
	e := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft)})
	cli, srv := tcpPair(t)
	br := bufio.NewReader(cli)
	var s spinBudget
	budget := func() time.Duration { return time.Duration(s.cur.Load()) }

	start := time.Now()
	e.awaitCLC(cli, br, &s) // the first: a probe of the whole bound, nothing comes
	if d := time.Since(start); d < clcSpinMax || budget() != clcSpinMax/2 {
		t.Fatalf("silent peer: returned after %v, budget %v; want ≥%v, %v", d, budget(), clcSpinMax, clcSpinMax/2)
	}
	srv.Write([]byte{1})
	awaitInput(t, cli)
	e.awaitCLC(cli, br, &s)
	if budget() != clcSpinMax {
		t.Fatalf("answered peer: budget %v, want %v", budget(), clcSpinMax)
	}
	br.ReadByte()
	spins := s.spins.Load()
	e.clcPolling.Store(true) // another handshake polls
	e.awaitCLC(cli, br, &s)
	if s.spins.Load() != spins {
		t.Fatal("polled beside another handshake's poll")
	}
	e.clcPolling.Store(false)
	e.SetReadSpin(-1)
	e.awaitCLC(cli, br, &s)
	if s.spins.Load() != spins || budget() != clcSpinMax {
		t.Fatalf("ReadSpin off: %d spins, budget %v; want none", s.spins.Load()-spins, budget())
	}
}

// TestHandshakePolls: both ends of a setup poll for the peer's answer, the
// client for the Accept and the server for the Confirm; with ReadSpin off,
// neither does.
func TestHandshakePolls(t *testing.T) {
	for _, spin := range []time.Duration{0, -1} {
		p := newPair(t, Config{Devices: memDevices(t, verbs.KindSoft), ReadSpin: spin},
			Config{Devices: memDevices(t, verbs.KindSoft), ReadSpin: spin})
		const n = 3
		p.connectSMC(t, n)
		want := uint32(n)
		if spin < 0 {
			want = 0
		}
		if a, c := p.cli.acceptSpin.spins.Load(), p.srv.confirmSpin.spins.Load(); a != want || c != want {
			t.Errorf("ReadSpin %v: client polled for %d Accepts, server for %d Confirms; want %d each", spin, a, c, want)
		}
	}
}

// TestZeroReadKeepsData: a zero-length Read returns 0 and no error, as
// TCPConn's, also once the peer half-closed with bytes still unread: an EOF
// there would tell the caller the stream ended before them.
func TestZeroReadKeepsData(t *testing.T) {
	p := memPair(t)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	if _, err := s.Write([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "sending done seen", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.closing.peerDone
	})
	if n, err := c.Read(nil); n != 0 || err != nil {
		t.Fatalf("zero-length read with 3 bytes unread: %d, %v", n, err)
	}
	if b, err := io.ReadAll(c); string(b) != "abc" || err != nil {
		t.Fatalf("read %q, %v", b, err)
	}
}
