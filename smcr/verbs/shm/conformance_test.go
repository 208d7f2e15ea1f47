// The verbs conformance suite and the standard benchmarks on shm, with both ends
// in one network namespace and with the two ends in two network namespaces.

package shm

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/smcr-io/smcr/internal/nstest"
	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/verbstest"
)

// testDir is the rendezvous directory of the conformance tests: fixed, because the
// peer-process test's child must find its parent's sockets there.
var testDir = filepath.Join(os.TempDir(), "smcr-shm-test")

func openIn(t testing.TB, ns *nstest.NS) verbs.Device {
	t.Helper()
	var d verbs.Device
	open := func() error {
		var err error
		cfg := Config{Dir: testDir}
		// SHM_SPIN=2us (say) overrides SpinMax, to measure the sleep path.
		if v, err := time.ParseDuration(os.Getenv("SHM_SPIN")); err == nil {
			cfg.SpinMax = v
		}
		if os.Getenv("SHM_DEBUG") != "" {
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
		d, err = Open(cfg)
		return err
	}
	var err error
	if ns == nil {
		err = open()
	} else {
		err = ns.Do(open)
	}
	if err != nil {
		t.Fatalf("shm: open: %v", err)
	}
	return d
}

func TestConformance(t *testing.T) {
	verbstest.Run(t, verbstest.Env{
		Open: func(t testing.TB) (a, b verbs.Device) { return openIn(t, nil), openIn(t, nil) },
	})
}

// TestConformanceNetns runs the suite with each end in its own network namespace,
// the peer process included (started inside namespace B).
func TestConformanceNetns(t *testing.T) {
	if verbstest.InPeer() {
		verbstest.Run(t, verbstest.Env{
			Open:     func(t testing.TB) (a, b verbs.Device) { return openIn(t, nil), openIn(t, nil) },
			OpenPeer: func(t testing.TB) verbs.Device { return openIn(t, nil) },
		})
		return
	}
	p := nstest.NewPair(t)
	verbstest.Run(t, verbstest.Env{
		Open:        func(t testing.TB) (a, b verbs.Device) { return openIn(t, p.A), openIn(t, p.B) },
		PeerCommand: p.B.Command,
	})
}

// BenchmarkVerbs: RDMA WRITE throughput, SEND ping-pong, and the memcpy and TCP
// over veth baselines, the two shm ends in two network namespaces.
func BenchmarkVerbs(b *testing.B) {
	b.ReportAllocs()
	p := nstest.NewPair(b)
	verbstest.Bench(b, verbstest.Env{
		Open: func(t testing.TB) (a, bb verbs.Device) { return openIn(t, p.A), openIn(t, p.B) },
	})
}

// BenchmarkBusyPoll is the SEND ping-pong of 64 bytes with both ends busy-polling
// their CQs (Poll only, never Wait), the ends in two network namespaces, beside TCP
// over the veth pair between them measured in the same run.
func BenchmarkBusyPoll(b *testing.B) {
	p := nstest.NewPair(b)
	const size = 64
	b.Run("shm-pingpong/64B", func(b *testing.B) {
		b.ReportAllocs()
		x := newEnd(b, openIn(b, p.A), verbs.QPConfig{})
		y := newEnd(b, openIn(b, p.B), verbs.QPConfig{})
		connect(b, x, y)
		n := b.N
		done := make(chan error, 1)
		go func() { done <- busyEcho(y, size, n) }()
		rtts := make([]time.Duration, 0, n)
		send := &verbs.SendWR{Opcode: verbs.OpSend, Signaled: true, SG: []verbs.SGE{{MR: x.buf, Length: size}}}
		recv := &verbs.RecvWR{SG: []verbs.SGE{{MR: x.buf, Offset: size, Length: size}}}
		var wc [1]verbs.WorkCompletion
		b.ResetTimer()
		for i := range n {
			if err := x.qp.PostRecv(recv); err != nil {
				b.Fatal(err)
			}
			x.buf.Bytes()[0] = byte(i)
			start := time.Now()
			if err := x.qp.PostSend(send); err != nil {
				b.Fatal(err)
			}
			if err := spinOne(x.rcq, wc[:]); err != nil {
				b.Fatal(err)
			}
			rtts = append(rtts, time.Since(start))
			if x.buf.Bytes()[size] != byte(i) {
				b.Fatalf("pong %d carried %d", i, x.buf.Bytes()[size])
			}
			if err := spinOne(x.scq, wc[:]); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(nstest.Percentile(rtts, 50).Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(nstest.Percentile(rtts, 99).Nanoseconds()), "p99-ns")
	})
	b.Run("tcp-veth-pingpong/64B", func(b *testing.B) {
		rtts, err := p.TCPPingPong(size, b.N)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(nstest.Percentile(rtts, 50).Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(nstest.Percentile(rtts, 99).Nanoseconds()), "p99-ns")
	})
}

func busyEcho(e *end, size, n int) error {
	send := &verbs.SendWR{Opcode: verbs.OpSend, Signaled: true, SG: []verbs.SGE{{MR: e.buf, Length: size}}}
	recv := &verbs.RecvWR{SG: []verbs.SGE{{MR: e.buf, Length: size}}}
	var wc [1]verbs.WorkCompletion
	if err := e.qp.PostRecv(recv); err != nil {
		return err
	}
	for i := range n {
		if err := spinOne(e.rcq, wc[:]); err != nil {
			return err
		}
		if i+1 < n {
			if err := e.qp.PostRecv(recv); err != nil {
				return err
			}
		}
		if err := e.qp.PostSend(send); err != nil {
			return err
		}
		if err := spinOne(e.scq, wc[:]); err != nil {
			return err
		}
	}
	return nil
}

// spinOne polls cq until one successful completion arrives, never sleeping.
func spinOne(cq verbs.CQ, wc []verbs.WorkCompletion) error {
	for {
		n, err := cq.Poll(wc[:1])
		if err != nil {
			return err
		}
		if n == 1 {
			if wc[0].Status != verbs.WCSuccess {
				return errors.New(wc[0].Status.String())
			}
			return nil
		}
	}
}
