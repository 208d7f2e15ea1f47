package smcr

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	drainio "github.com/smcr-io/smcr/internal/drain"
	"github.com/smcr-io/smcr/internal/leakcheck"
	"github.com/smcr-io/smcr/internal/nstest"
	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/shm"
	"github.com/smcr-io/smcr/smcr/verbs/soft"
)

// TestMain runs benchmarks in a network namespace of the process's own, host A
// of their pairs: a client dials from a plain goroutine, as an application does
// (nstest.BenchMain). A run that passed fails if goroutines of this module
// outlive it.
func TestMain(m *testing.M) { os.Exit(lockOrderChecked(leakcheck.After(nstest.BenchMain(m)))) }

// nsSetup is an engine in each of two namespaces, the server's listener in B.
type nsSetup struct {
	pair     *nstest.Pair
	cli, srv *Engine
	ln       *Listener
	addr     string
	newCli   func() *Engine // another client engine on A's device, for first contact
}

func openDevice(b testing.TB, kind string, ns *nstest.NS, dir string) verbs.Device {
	var d verbs.Device
	err := ns.Do(func() error {
		var err error
		switch kind {
		case "shm":
			d, err = shm.Open(shm.Config{Dir: dir})
		case "soft":
			var ln net.Listener
			ln, err = net.Listen("tcp", netip.AddrPortFrom(ns.Addr4(), 0).String())
			if err != nil {
				return err
			}
			d, err = soft.Open(soft.Config{Listener: ln, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
				var c net.Conn
				err := ns.Do(func() error {
					var err error
					c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
					return err
				})
				return c, err
			}})
		}
		return err
	})
	if err != nil {
		b.Skipf("%s provider unavailable: %v", kind, err)
	}
	b.Cleanup(func() { d.Close() })
	return d
}

func newNSSetup(b testing.TB, kind string) *nsSetup {
	p := nstest.NewPair(b)
	dir := b.TempDir()
	da, db := openDevice(b, kind, p.A, dir), openDevice(b, kind, p.B, dir)
	s := &nsSetup{pair: p}
	// The largest RMBE Linux uses: fewer consumer-cursor round trips per byte.
	const rmb = 512 << 10
	s.newCli = func() *Engine {
		return newEngine(b, Config{Devices: []verbs.Device{da}, TestLinkInterval: -1, RMBSize: rmb})
	}
	s.cli = s.newCli()
	s.srv = newEngine(b, Config{Devices: []verbs.Device{db}, TestLinkInterval: -1, RMBSize: rmb})
	err := p.B.Do(func() error {
		var err error
		s.ln, err = s.srv.Listen("tcp", netip.AddrPortFrom(p.B.Addr4(), 0).String())
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.ln.Close() })
	s.addr = s.ln.Addr().String()
	return s
}

// connPair dials from the client's engine and accepts on the server's
// listener: both ends of one SMC-R connection, closed when b ends.
func (s *nsSetup) connPair(b testing.TB) (*Conn, *Conn) {
	c := s.dial(b, s.cli)
	sc, err := s.ln.AcceptSMC()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close(); sc.Close() })
	return c, sc
}

func (s *nsSetup) dial(b testing.TB, e *Engine) *Conn {
	var c *Conn
	err := s.pair.A.Do(func() error {
		var err error
		c, err = e.Dial(context.Background(), "tcp", s.addr)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	if c.Mode() != ModeSMCR {
		b.Fatalf("fell back: %v", c.Decline())
	}
	return c
}

// BenchmarkNamespaces measures the engine between two network namespaces beside
// TCP over their veth pair in the same run. Figures: MB/s and the ratio to TCP;
// p50/p99 round trips in µs; connections per second.
func BenchmarkNamespaces(b *testing.B) {
	for _, kind := range []string{"shm", "soft"} {
		for _, size := range []int{64 << 10, 1 << 20} {
			b.Run(fmt.Sprintf("%s/throughput/%dKiB", kind, size>>10), func(b *testing.B) {
				s := newNSSetup(b, kind)
				total := int64(256 << 20)
				tcp, err := s.pair.TCPThroughput(size, total)
				if err != nil {
					b.Fatal(err)
				}
				c, sc := s.connPair(b)
				buf := make([]byte, size)
				b.SetBytes(total)
				b.ResetTimer()
				var smc float64
				for range b.N {
					done := make(chan struct{})
					go func() {
						drainio.N(sc, total, make([]byte, 256<<10))
						sc.Write([]byte{1})
						close(done)
					}()
					start := time.Now()
					for sent := int64(0); sent < total; sent += int64(size) {
						if _, err := c.Write(buf); err != nil {
							b.Fatal(err)
						}
					}
					io.ReadFull(c, buf[:1])
					<-done
					smc = float64(total) / time.Since(start).Seconds()
				}
				b.ReportMetric(smc/1e6, "smcr-MB/s")
				b.ReportMetric(tcp/1e6, "tcp-MB/s")
				b.ReportMetric(smc/tcp, "x-tcp")
			})
		}
		b.Run(kind+"/rr64", func(b *testing.B) {
			s := newNSSetup(b, kind)
			const n = 2000
			tcp, err := s.pair.TCPPingPong(64, n)
			if err != nil {
				b.Fatal(err)
			}
			c, sc := s.connPair(b)
			go io.Copy(sc, sc)
			b.ResetTimer()
			var rtts []time.Duration
			for range b.N {
				if rtts, err = nstest.PingPong(c, 64, n); err != nil {
					b.Fatal(err)
				}
			}
			us := func(d time.Duration) float64 { return float64(d) / 1e3 }
			b.ReportMetric(us(nstest.Percentile(rtts, 50)), "smcr-p50-µs")
			b.ReportMetric(us(nstest.Percentile(rtts, 99)), "smcr-p99-µs")
			b.ReportMetric(us(nstest.Percentile(tcp, 50)), "tcp-p50-µs")
			b.ReportMetric(us(nstest.Percentile(tcp, 99)), "tcp-p99-µs")
		})
		b.Run(kind+"/connect", func(b *testing.B) {
			s := newNSSetup(b, kind)
			// TCP's own listener in B, so no TCP connect starts SMC-R work on
			// the engine's; both serve alike: accept, read the client's byte,
			// answer one, wait for EOF (smcrbench's setup, with a shorter
			// request).
			tln, err := s.pair.B.Listen("tcp", netip.AddrPortFrom(s.pair.B.Addr4(), 0).String())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { tln.Close() })
			for _, ln := range []net.Listener{s.ln, tln} {
				go func() {
					for {
						c, err := ln.Accept()
						if err != nil {
							return
						}
						go func() {
							defer c.Close()
							var one [1]byte
							if _, err := io.ReadFull(c, one[:]); err == nil {
								c.Write(one[:])
								io.Copy(io.Discard, c)
							}
						}()
					}
				}()
			}
			// exchange is each setup's request and answer, then the close.
			exchange := func(c net.Conn) {
				var one [1]byte
				if _, err := c.Write(one[:]); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, one[:]); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
			const n = 100
			// Each phase is timed alone: the first contacts' link groups end in
			// the background, and that work must not fall into the next phase.
			settle := func() {
				waitFor(2*time.Second, func() bool {
					return s.srv.Stats().LinkGroups <= 1 && len(s.cli.Conns()) <= 1 && len(s.srv.Conns()) <= 1
				})
			}
			rate := func(f func()) float64 {
				settle()
				start := time.Now()
				for range n {
					f()
				}
				return n / time.Since(start).Seconds()
			}
			b.ResetTimer()
			var tcp, first, reuse, ratio []float64
			tcpConnect := func() {
				c, err := s.pair.A.Dial("tcp", tln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				exchange(c)
			}
			for range 10 {
				tcpConnect() // warm up the namespace threads
			}
			keep := s.dial(b, s.cli) // holds the link group
			for range b.N {
				t := rate(tcpConnect)
				r := rate(func() { exchange(s.dial(b, s.cli)) })
				f := rate(func() {
					e := s.newCli()
					exchange(s.dial(b, e))
					e.Close()
				})
				tcp, first, reuse, ratio = append(tcp, t), append(first, f), append(reuse, r), append(ratio, r/t)
			}
			keep.Close()
			// Medians over the iterations; the ratio is each iteration's own.
			b.ReportMetric(nstest.Median(tcp), "tcp-conn/s")
			b.ReportMetric(nstest.Median(first), "first-contact-conn/s")
			b.ReportMetric(nstest.Median(reuse), "reuse-conn/s")
			b.ReportMetric(nstest.Median(ratio), "reuse/tcp")
		})
	}
}
