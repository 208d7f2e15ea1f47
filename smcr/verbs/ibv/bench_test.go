//go:build ibv

// Benchmarks shaped after perftest, to compare with ib_write_bw, ib_send_lat and
// ib_write_lat in the same VM boot (test/vm/bench.sh); the RDMA operations are the
// ones SMC-R uses for its data path and CDC messages (RFC 7609 §4).
//
// How each side waits is part of the shape. perftest busy-polls: ib_write_bw on
// the sender only (the target is passive), ib_send_lat and ib_write_lat on both
// sides. On the 2-vCPU TCG guest two spinning sides compete with the kernel's rxe
// work for the CPUs, so every ping-pong also runs with one or both sides blocking
// in CQ.Wait, the way the engine waits.
//
// The latency benchmarks time every round trip, as perftest does, and report the
// median one-way latency (round trip / 2, perftest's t_typical) and the mean:
// under TCG on a shared host the mean is dominated by vCPU preemptions of tens of
// milliseconds, the median is not. The guest boots with clocksource=tsc so
// time.Now costs well under a microsecond (with hpet it costs 2–4 µs).

package ibv

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// waitFn returns at least one completion from cq into wc.
type waitFn func(cq verbs.CQ, wc []verbs.WorkCompletion) (int, error)

// spin busy-polls, as perftest does.
func spin(cq verbs.CQ, wc []verbs.WorkCompletion) (int, error) {
	for {
		if n, err := cq.Poll(wc); n > 0 || err != nil {
			return n, err
		}
	}
}

// block polls, then sleeps in CQ.Wait (which spins for Config.Spin first).
func block(cq verbs.CQ, wc []verbs.WorkCompletion) (int, error) {
	for {
		if n, err := cq.Poll(wc); n > 0 || err != nil {
			return n, err
		}
		if err := cq.Wait(context.Background()); err != nil {
			return 0, err
		}
	}
}

var waits = []struct {
	name string
	fn   waitFn
}{{"spin", spin}, {"wait", block}}

// BenchmarkWrite is ib_write_bw's method: 64 KiB RDMA WRITEs, 128 outstanding,
// every 16th signaled; the target does nothing.
func BenchmarkWrite(b *testing.B) {
	for _, w := range waits {
		b.Run(w.name, func(b *testing.B) { benchWrite(b, w.fn) })
	}
}

func benchWrite(b *testing.B, wait waitFn) {
	const size, depth, every = 65536, 128, 16
	a, p := pair(b, size, verbs.QPConfig{MaxSendWR: depth})
	wr := &verbs.SendWR{Opcode: verbs.OpWrite, SG: []verbs.SGE{{MR: a.mr, Length: size}},
		RemoteAddr: p.mr.Addr(), RKey: p.mr.RKey()}
	outstanding := 0 // WRs posted and not yet known complete
	reap := func() {
		n, err := wait(a.scq, a.wc)
		if err != nil {
			b.Fatal(err)
		}
		for _, wc := range a.wc[:n] {
			if wc.Status != verbs.WCSuccess {
				b.Fatalf("write completion %+v", wc)
			}
			// Each signaled WR also completes the unsignaled ones before it.
			outstanding -= int(wc.ID)
		}
	}
	b.SetBytes(size)
	b.ResetTimer()
	batch := 0
	for i := 0; i < b.N; i++ {
		for outstanding+1 > depth {
			reap()
		}
		batch++
		wr.Signaled = batch == every || i == b.N-1
		wr.ID = uint64(batch) // the WRs this completion accounts for
		if err := a.qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		outstanding++
		if wr.Signaled {
			batch = 0
		}
	}
	for outstanding > 0 {
		reap()
	}
	b.StopTimer()
	b.ReportMetric(float64(size)*float64(b.N)/b.Elapsed().Seconds()/(1<<20), "MiB/s")
}

// latencies reports the median and mean one-way latency of round trips in µs.
func latencies(b *testing.B, rtt []time.Duration) {
	if len(rtt) == 0 {
		return
	}
	var sum time.Duration
	for _, d := range rtt {
		sum += d
	}
	slices.Sort(rtt)
	b.ReportMetric(float64(rtt[len(rtt)/2].Nanoseconds())/2/1000, "us-median")
	b.ReportMetric(float64(sum.Nanoseconds())/float64(len(rtt))/2/1000, "us-mean")
}

// BenchmarkSendPingPong is ib_send_lat's method: an 8-byte SEND answered by an
// 8-byte SEND, every 32nd signaled so the send queue drains. The sub-benchmarks
// name how the initiator and the responder wait: spin-spin is perftest's.
func BenchmarkSendPingPong(b *testing.B) {
	for _, ini := range waits {
		for _, resp := range waits {
			if ini.name == "wait" && resp.name == "spin" {
				continue // the mirror of spin-wait
			}
			b.Run(ini.name+"-"+resp.name, func(b *testing.B) { benchSendPingPong(b, ini.fn, resp.fn) })
		}
	}
}

func benchSendPingPong(b *testing.B, iniWait, respWait waitFn) {
	const size = 8
	a, p := pair(b, 4096, verbs.QPConfig{MaxSendWR: 256, MaxRecvWR: 256})
	for _, s := range []*side{a, p} {
		for i := 0; i < 64; i++ {
			if err := s.qp.PostRecv(&verbs.RecvWR{SG: []verbs.SGE{{MR: s.mr, Offset: 2048, Length: size}}}); err != nil {
				b.Fatal(err)
			}
		}
	}
	// send posts one SEND and, when it is signaled, waits for its completion;
	// recv waits for one RECV and reposts it.
	send := func(s *side, wr *verbs.SendWR, i int, wait waitFn) error {
		wr.Signaled = i%32 == 31
		if err := s.qp.PostSend(wr); err != nil {
			return err
		}
		if wr.Signaled {
			if _, err := wait(s.scq, s.wc[:1]); err != nil {
				return err
			}
		}
		return nil
	}
	recv := func(s *side, rwr *verbs.RecvWR, wc []verbs.WorkCompletion, wait waitFn) error {
		if _, err := wait(s.rcq, wc); err != nil {
			return err
		}
		if wc[0].Status != verbs.WCSuccess {
			b.Errorf("recv %+v", wc[0])
		}
		return s.qp.PostRecv(rwr)
	}
	mk := func(s *side) (*verbs.SendWR, *verbs.RecvWR, []verbs.WorkCompletion) {
		return &verbs.SendWR{Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: s.mr, Length: size}}},
			&verbs.RecvWR{SG: []verbs.SGE{{MR: s.mr, Offset: 2048, Length: size}}},
			make([]verbs.WorkCompletion, 1)
	}
	n := b.N
	done := make(chan error, 1)
	go func() {
		wr, rwr, wc := mk(p)
		for i := 0; i < n; i++ {
			if err := recv(p, rwr, wc, respWait); err != nil {
				done <- err
				return
			}
			if err := send(p, wr, i, respWait); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	wr, rwr, wc := mk(a)
	rtt := make([]time.Duration, n)
	b.ResetTimer()
	for i := 0; i < n; i++ {
		start := time.Now()
		if err := send(a, wr, i, iniWait); err != nil {
			b.Fatal(err)
		}
		if err := recv(a, rwr, wc, iniWait); err != nil {
			b.Fatal(err)
		}
		rtt[i] = time.Since(start)
	}
	b.StopTimer()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	latencies(b, rtt)
}

// BenchmarkWritePingPong is ib_write_lat's method: each side WRITEs a counter
// into the other's buffer and busy-polls its own buffer for the peer's, with no
// receive completions involved, so both sides necessarily spin.
func BenchmarkWritePingPong(b *testing.B) {
	a, p := pair(b, 4096, verbs.QPConfig{MaxSendWR: 256})
	// The counter sits at offset 64 of each region; 4 bytes sent from offset 0.
	watch := func(s *side) *uint32 { return (*uint32)(unsafe.Pointer(&s.mr.Bytes()[64])) }
	src := func(s *side) *uint32 { return (*uint32)(unsafe.Pointer(&s.mr.Bytes()[0])) }
	mk := func(from, to *side) *verbs.SendWR {
		return &verbs.SendWR{Opcode: verbs.OpWrite, SG: []verbs.SGE{{MR: from.mr, Length: 4}},
			RemoteAddr: to.mr.Addr() + 64, RKey: to.mr.RKey()}
	}
	post := func(s *side, wr *verbs.SendWR, i int) error {
		atomic.StoreUint32(src(s), uint32(i))
		wr.Signaled = i%32 == 31
		if err := s.qp.PostSend(wr); err != nil {
			return err
		}
		if wr.Signaled {
			if _, err := spin(s.scq, s.wc[:1]); err != nil {
				return err
			}
		}
		return nil
	}
	n := b.N
	done := make(chan error, 1)
	go func() {
		wr := mk(p, a)
		for i := 1; i <= n; i++ {
			for atomic.LoadUint32(watch(p)) != uint32(i) {
			}
			if err := post(p, wr, i); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	wr := mk(a, p)
	rtt := make([]time.Duration, n)
	b.ResetTimer()
	for i := 1; i <= n; i++ {
		start := time.Now()
		if err := post(a, wr, i); err != nil {
			b.Fatal(err)
		}
		for atomic.LoadUint32(watch(a)) != uint32(i) {
		}
		rtt[i-1] = time.Since(start)
	}
	b.StopTimer()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	latencies(b, rtt)
}
