//go:build ibv

// Benchmarks shaped after perftest, to compare with ib_write_bw, ib_send_lat and
// ib_write_lat in the same VM boot (test/vm/bench.sh): WRITE throughput with
// 64 KiB messages and 128 outstanding, SEND and WRITE ping-pong with busy polling.

package ibv

import (
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/smcr-io/smcr/smcr/verbs"
)

func BenchmarkWrite(b *testing.B) {
	const size, depth, every = 65536, 128, 16
	a, p := pair(b, size, verbs.QPConfig{MaxSendWR: depth})
	wr := &verbs.SendWR{Opcode: verbs.OpWrite, SG: []verbs.SGE{{MR: a.mr, Length: size}},
		RemoteAddr: p.mr.Addr(), RKey: p.mr.RKey()}
	outstanding := 0 // in units of signaled batches' WRs
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Unsignaled WRs free their slots when a later signaled one completes.
		for outstanding+every > depth {
			n, err := a.scq.Poll(a.wc)
			if err != nil {
				b.Fatal(err)
			}
			for _, wc := range a.wc[:n] {
				if wc.Status != verbs.WCSuccess {
					b.Fatalf("write completion %+v", wc)
				}
			}
			outstanding -= n * every
		}
		wr.ID = uint64(i)
		wr.Signaled = i%every == every-1 || i == b.N-1
		if err := a.qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		if i%every == every-1 {
			outstanding += every
		}
	}
	for done := false; !done; {
		n, _ := a.scq.Poll(a.wc)
		for _, wc := range a.wc[:n] {
			done = done || wc.ID == uint64(b.N-1)
		}
	}
	b.ReportMetric(float64(size)*float64(b.N)/b.Elapsed().Seconds()/(1<<20), "MiB/s")
}

// BenchmarkSendPingPong measures a SEND/RECV round trip with busy polling; the
// one-way figure (half of it) compares with ib_send_lat's typical latency.
func BenchmarkSendPingPong(b *testing.B) {
	const size = 8
	a, p := pair(b, 4096, verbs.QPConfig{MaxSendWR: 256, MaxRecvWR: 256})
	for _, s := range []*side{a, p} {
		for i := 0; i < 64; i++ {
			if err := s.qp.PostRecv(&verbs.RecvWR{SG: []verbs.SGE{{MR: s.mr, Offset: 2048, Length: size}}}); err != nil {
				b.Fatal(err)
			}
		}
	}
	// One side's loop: wait for a RECV, repost it, answer (or start) with a SEND.
	// Every 32nd SEND is signaled so the send queue drains.
	step := func(s *side, wr *verbs.SendWR, rwr *verbs.RecvWR, i int, wc []verbs.WorkCompletion) error {
		wr.Signaled = i%32 == 31
		if err := s.qp.PostSend(wr); err != nil {
			return err
		}
		if wr.Signaled {
			for n := 0; n == 0; {
				n, _ = s.scq.Poll(wc)
			}
		}
		for n := 0; n == 0; {
			n, _ = s.rcq.Poll(wc)
		}
		if wc[0].Status != verbs.WCSuccess {
			b.Errorf("recv %+v", wc[0])
		}
		return s.qp.PostRecv(rwr)
	}
	done := make(chan error, 1)
	go func() {
		wr := &verbs.SendWR{Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: p.mr, Length: size}}}
		rwr := &verbs.RecvWR{SG: []verbs.SGE{{MR: p.mr, Offset: 2048, Length: size}}}
		wc := make([]verbs.WorkCompletion, 1)
		for i := 0; i < b.N; i++ {
			for n := 0; n == 0; {
				n, _ = p.rcq.Poll(wc)
			}
			if err := p.qp.PostRecv(rwr); err != nil {
				done <- err
				return
			}
			wr.Signaled = i%32 == 31
			if err := p.qp.PostSend(wr); err != nil {
				done <- err
				return
			}
			if wr.Signaled {
				for n := 0; n == 0; {
					n, _ = p.scq.Poll(wc)
				}
			}
		}
		done <- nil
	}()
	wr := &verbs.SendWR{Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: a.mr, Length: size}}}
	rwr := &verbs.RecvWR{SG: []verbs.SGE{{MR: a.mr, Offset: 2048, Length: size}}}
	wc := make([]verbs.WorkCompletion, 1)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := step(a, wr, rwr, i, wc); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2/1000, "us-one-way")
}

// BenchmarkWritePingPong is ib_write_lat's method: each side WRITEs a counter into
// the other's buffer and busy-polls its own buffer for the peer's, with no receive
// completions involved.
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
			for n := 0; n == 0; {
				n, _ = s.scq.Poll(s.wc[:1])
			}
		}
		return nil
	}
	done := make(chan error, 1)
	go func() {
		wr := mk(p, a)
		for i := 1; i <= b.N; i++ {
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
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		if err := post(a, wr, i); err != nil {
			b.Fatal(err)
		}
		for atomic.LoadUint32(watch(a)) != uint32(i) {
		}
	}
	b.StopTimer()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2/1000, "us-one-way")
}
