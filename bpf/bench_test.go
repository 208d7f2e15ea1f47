package bpf

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/smcr-io/smcr/internal/nstest"
)

// BenchmarkConnect: what the programs cost a connection they leave alone (an
// unlisted port) and one they steer to the application (listed port, no option),
// beside the same connections with nothing attached, in the same run.
func BenchmarkConnect(b *testing.B) {
	p := nstest.NewPair(b)
	app := listen(b, p.B, ":7002", nil, nil)
	other := listen(b, p.B, ":7009", nil, nil)
	run := func(b *testing.B, dst netip.AddrPort, ln net.Listener) {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		b.ResetTimer()
		for b.Loop() {
			var c net.Conn
			err := p.A.Do(func() error {
				var err error
				c, err = net.DialTimeout("tcp", dst.String(), time.Second)
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			c.Close()
		}
	}
	listed := netip.AddrPortFrom(p.B.Addr4(), 7002)
	unlisted := netip.AddrPortFrom(p.B.Addr4(), 7009)
	b.Run("baseline", func(b *testing.B) { run(b, unlisted, other) })
	cg := testCgroup(b)
	lb := loadIn(b, p.B, Options{CgroupPath: cg, Interfaces: []string{p.B.Links[0].Name}})
	la := loadIn(b, p.A, Options{CgroupPath: cg, Interfaces: []string{p.A.Links[0].Name}})
	for _, l := range []*Loader{la, lb} {
		must2(b, l.SetPorts([]PortRange{{7002, 7002}}))
		must2(b, l.SetAlive(time.Hour))
	}
	b.Run("attached-unlisted", func(b *testing.B) { run(b, unlisted, other) })
	// A listed port with smcrd alive but the destination in the negative cache:
	// connect4 runs its whole policy, the SYN is parsed by tc, sk_lookup looks up.
	must2(b, la.AddNegative(listed, time.Hour))
	b.Run("attached-listed-negative", func(b *testing.B) { run(b, listed, app) })
}
