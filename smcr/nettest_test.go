package smcr

import (
	"net"
	"testing"

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
