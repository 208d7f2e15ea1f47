package smcr

import (
	"net"
	"testing"

	"github.com/smcr-io/smcr/smcr/verbs"
	"golang.org/x/net/nettest"
)

// TestNetConnContract runs x/net's net.Conn conformance suite (nettest.TestConn:
// basic and racy I/O, concurrent methods, past, present and future deadlines,
// Close unblocking I/O) over SMC-R connections, on the in-memory fake and on
// each real provider. (Its timeout checks stop at net.Error's Timeout;
// TestDeadlines checks os.ErrDeadlineExceeded too.)
func TestNetConnContract(t *testing.T) {
	run := func(t *testing.T, p *pair) {
		nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
			c, s := p.connect(t)
			mustSMC(t, c, s)
			return c, s, func() { c.Close(); s.Close() }, nil
		})
	}
	t.Run("mem", func(t *testing.T) { run(t, memPair(t)) })
	for _, pr := range providers {
		t.Run(pr.name, func(t *testing.T) { run(t, providerPair(t, pr.open, Config{})) })
	}
}

// TestConnAddrs: a Conn's addresses are its TCP connection's, so each end's
// local address is the other's remote one, over SMC-R and after a fallback.
func TestConnAddrs(t *testing.T) {
	check := func(t *testing.T, c, s *Conn) {
		t.Helper()
		if c.LocalAddr().String() != s.RemoteAddr().String() || c.RemoteAddr().String() != s.LocalAddr().String() ||
			c.RemoteAddr().String() != c.TCP().RemoteAddr().String() {
			t.Errorf("client %v -> %v, server %v <- %v", c.LocalAddr(), c.RemoteAddr(), s.LocalAddr(), s.RemoteAddr())
		}
	}
	p := memPair(t)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	check(t, c, s)
	// No devices on the server: it declines, and both ends are plain TCP.
	fb := newPair(t, Config{Devices: memDevices(t, verbs.KindSoft)}, Config{})
	c, s = fb.connect(t)
	if c.Mode() != ModeFallback || s.Mode() != ModeFallback {
		t.Fatalf("modes %v %v, want fallbacks", c.Mode(), s.Mode())
	}
	check(t, c, s)
}
