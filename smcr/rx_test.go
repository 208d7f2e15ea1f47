package smcr

import (
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
	for range 20 {
		go func() {
			time.Sleep(2 * time.Millisecond) // well after any spin gave up
			s.Write([]byte{1})
		}()
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
	}
	if c.spin != minReadSpin {
		t.Fatalf("after 20 late messages the spin is %v, want %v", c.spin, minReadSpin)
	}
	go io.Copy(s, s)
	for range 2000 {
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		if c.spin == c.e.cfg.ReadSpin {
			return
		}
	}
	t.Fatalf("after 2000 round trips the spin is %v, want %v back", c.spin, c.e.cfg.ReadSpin)
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
