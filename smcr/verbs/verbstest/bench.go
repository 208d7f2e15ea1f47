// The standard benchmarks: RDMA WRITE throughput (how fast an RMB fills, RFC 7609
// §4.3) and SEND ping-pong latency, beside memcpy and TCP-over-veth baselines
// measured in the same run.

package verbstest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/smcr-io/smcr/internal/nstest"
	"github.com/smcr-io/smcr/smcr/verbs"
	"golang.org/x/sys/unix"
)

// Sizes the throughput benchmarks use, and the ping-pong message size.
var (
	WriteSizes   = []int{64 << 10, 1 << 20}
	PingPongSize = 64
)

// writeWindow is how many WRITEs are kept in flight.
const writeWindow = 16

// Bench runs the standard benchmarks for env, and the memcpy and TCP-over-veth
// baselines, reporting "MB/s", "p50-ns" and "p99-ns" with b.ReportMetric. SEND
// ping-pong runs twice: "send-pingpong" waits through CQ.Wait (spin, then sleep),
// "send-pingpong-busy" only polls, on both ends.
//
// The TCP baselines need a pair of network namespaces (nstest, as root); without
// them those sub-benchmarks are skipped.
func Bench(b *testing.B, env Env) {
	var base *nstest.Pair
	if os.Geteuid() == 0 {
		base = nstest.NewPair(b)
	}
	tcp := func(b *testing.B) *nstest.Pair {
		if base == nil {
			b.Skip("TCP baseline: needs root to create network namespaces")
		}
		return base
	}
	for _, size := range WriteSizes {
		b.Run("memcpy/"+sizeName(size), func(b *testing.B) { benchMemcpy(b, size) })
		b.Run("write/"+sizeName(size), func(b *testing.B) {
			a, bb := benchPair(b, env, size)
			start := time.Now()
			if err := WriteThroughput(a.qp, a.scq, a.mr, bb.mr.Addr(), bb.mr.RKey(), size, b.N); err != nil {
				b.Fatal(err)
			}
			reportMBps(b, size, time.Since(start))
		})
	}
	for _, size := range WriteSizes {
		b.Run("tcp-veth/"+sizeName(size), func(b *testing.B) {
			p := tcp(b)
			bps, err := p.TCPThroughput(size, int64(b.N)*int64(size))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(bps/1e6, "MB/s")
		})
	}
	b.Run(fmt.Sprintf("send-pingpong/%dB", PingPongSize), func(b *testing.B) { benchPingPong(b, env, false) })
	b.Run(fmt.Sprintf("send-pingpong-busy/%dB", PingPongSize), func(b *testing.B) { benchPingPong(b, env, true) })
	b.Run(fmt.Sprintf("tcp-veth-pingpong/%dB", PingPongSize), func(b *testing.B) {
		p := tcp(b)
		rtts, err := p.TCPPingPong(PingPongSize, b.N)
		if err != nil {
			b.Fatal(err)
		}
		reportLatency(b, rtts)
	})
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

func reportMBps(b *testing.B, size int, d time.Duration) {
	b.ReportMetric(float64(size)*float64(b.N)/d.Seconds()/1e6, "MB/s")
}

func reportLatency(b *testing.B, rtts []time.Duration) {
	b.ReportMetric(float64(nstest.Percentile(rtts, 50).Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(nstest.Percentile(rtts, 99).Nanoseconds()), "p99-ns")
}

func benchMemcpy(b *testing.B, size int) {
	src, dst := make([]byte, size), make([]byte, size)
	pattern(src, 1)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		copy(dst, src)
	}
	reportMBps(b, size, time.Since(start))
}

// benchPingPong measures SEND ping-pong between two devices of env, both ends
// waiting through CQ.Wait or, with busy, polling only.
func benchPingPong(b *testing.B, env Env, busy bool) {
	a, bb := benchPair(b, env, 4096)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	echoed := make(chan error, 1)
	go func() { echoed <- echo(ctx, bb.qp, bb.scq, bb.rcq, bb.mr, PingPongSize, b.N, busy) }()
	rtts, err := pingPong(a.qp, a.scq, a.rcq, a.mr, PingPongSize, b.N, busy)
	if err != nil {
		cancel()
		<-echoed
		b.Fatal(err)
	}
	if err := <-echoed; err != nil {
		b.Fatal(err)
	}
	reportLatency(b, rtts)
}

// benchPair is newPair for benchmarks: regions of size bytes, a deep send queue.
func benchPair(b *testing.B, env Env, size int) (a, bb *side) {
	b.Helper()
	da, db := env.Open(b)
	b.Cleanup(func() {
		da.Close()
		db.Close()
	})
	access := verbs.AccessLocalWrite | verbs.AccessRemoteWrite
	a = newSide(b, da, size, access, 7, 64)
	bb = newSide(b, db, size, access, 7, 64)
	// Write both regions first: a never-written mapping may read as the zero page,
	// which would make a WRITE's source cache-hot and its throughput a fiction.
	pattern(a.mr.Bytes(), 1)
	pattern(bb.mr.Bytes(), 2)
	connect(b, env, a, bb)
	b.ResetTimer()
	return a, bb
}

// WriteThroughput posts n RDMA WRITEs of size bytes from src to the remote region
// (addr, rkey), keeping a window in flight, and returns when all have completed.
func WriteThroughput(qp verbs.QP, scq verbs.CQ, src verbs.MR, addr uint64, rkey uint32, size, n int) error {
	wr := &verbs.SendWR{Opcode: verbs.OpWrite, Signaled: true, RemoteAddr: addr, RKey: rkey,
		SG: []verbs.SGE{{MR: src, Length: size}}}
	wcs := make([]verbs.WorkCompletion, writeWindow)
	ctx := context.Background()
	posted, done := 0, 0
	for done < n {
		for posted < n && posted-done < writeWindow {
			wr.ID = uint64(posted)
			if err := qp.PostSend(wr); err != nil {
				return fmt.Errorf("verbstest: post write: %w", err)
			}
			posted++
		}
		k, err := scq.Poll(wcs)
		if err != nil {
			return fmt.Errorf("verbstest: poll: %w", err)
		}
		for _, wc := range wcs[:k] {
			if wc.Status != verbs.WCSuccess {
				return fmt.Errorf("verbstest: write %d: %v", wc.ID, wc.Status)
			}
		}
		done += k
		if k == 0 {
			if err := scq.Wait(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// PingPong sends n SENDs of size bytes to a peer running Echo, waiting for each
// echo with CQ.Wait between polls, and returns each round trip's duration. mr holds
// the message at offset 0 and the receive buffer at offset size.
func PingPong(qp verbs.QP, scq, rcq verbs.CQ, mr verbs.MR, size, n int) ([]time.Duration, error) {
	return pingPong(qp, scq, rcq, mr, size, n, false)
}

// BusyPingPong is PingPong busy-polling its CQs (Poll only, never Wait), for a peer
// running BusyEcho: the latency of two ends that each keep a CPU.
func BusyPingPong(qp verbs.QP, scq, rcq verbs.CQ, mr verbs.MR, size, n int) ([]time.Duration, error) {
	return pingPong(qp, scq, rcq, mr, size, n, true)
}

// Echo answers n messages of size bytes from PingPong with the same bytes.
func Echo(ctx context.Context, qp verbs.QP, scq, rcq verbs.CQ, mr verbs.MR, size, n int) error {
	return echo(ctx, qp, scq, rcq, mr, size, n, false)
}

// BusyEcho is Echo busy-polling its CQs, the peer of BusyPingPong.
func BusyEcho(ctx context.Context, qp verbs.QP, scq, rcq verbs.CQ, mr verbs.MR, size, n int) error {
	return echo(ctx, qp, scq, rcq, mr, size, n, true)
}

func pingPong(qp verbs.QP, scq, rcq verbs.CQ, mr verbs.MR, size, n int, busy bool) ([]time.Duration, error) {
	rtts := make([]time.Duration, 0, n)
	send := &verbs.SendWR{Opcode: verbs.OpSend, Signaled: true, SG: []verbs.SGE{{MR: mr, Length: size}}}
	recv := &verbs.RecvWR{SG: []verbs.SGE{{MR: mr, Offset: size, Length: size}}}
	// One completion buffer for the whole run: Poll is an interface call, so an
	// array declared per wait would escape to the heap on every round trip.
	wc := make([]verbs.WorkCompletion, 1)
	ctx := context.Background()
	for i := range n {
		if err := qp.PostRecv(recv); err != nil {
			return rtts, fmt.Errorf("verbstest: post recv: %w", err)
		}
		mr.Bytes()[0] = byte(i)
		start := time.Now()
		if err := qp.PostSend(send); err != nil {
			return rtts, fmt.Errorf("verbstest: post send: %w", err)
		}
		if err := pollOne(ctx, rcq, wc, busy); err != nil {
			return rtts, fmt.Errorf("verbstest: pong %d: %w", i, err)
		}
		rtts = append(rtts, time.Since(start))
		if got := mr.Bytes()[size]; got != byte(i) {
			return rtts, fmt.Errorf("verbstest: pong %d carried %d", i, got)
		}
		if err := pollOne(ctx, scq, wc, busy); err != nil {
			return rtts, fmt.Errorf("verbstest: ping %d: %w", i, err)
		}
	}
	return rtts, nil
}

func echo(ctx context.Context, qp verbs.QP, scq, rcq verbs.CQ, mr verbs.MR, size, n int, busy bool) error {
	send := &verbs.SendWR{Opcode: verbs.OpSend, Signaled: true, SG: []verbs.SGE{{MR: mr, Length: size}}}
	recv := &verbs.RecvWR{SG: []verbs.SGE{{MR: mr, Length: size}}}
	wc := make([]verbs.WorkCompletion, 1)
	if err := qp.PostRecv(recv); err != nil {
		return fmt.Errorf("verbstest: post recv: %w", err)
	}
	for i := range n {
		if err := pollOne(ctx, rcq, wc, busy); err != nil {
			return fmt.Errorf("verbstest: ping %d: %w", i, err)
		}
		if i+1 < n {
			// Post the next receive before echoing, so the next ping never meets RNR.
			// The echo is sent from the same bytes; the next ping cannot arrive before it.
			if err := qp.PostRecv(recv); err != nil {
				return fmt.Errorf("verbstest: post recv: %w", err)
			}
		}
		if err := qp.PostSend(send); err != nil {
			return fmt.Errorf("verbstest: post send: %w", err)
		}
		if err := pollOne(ctx, scq, wc, busy); err != nil {
			return fmt.Errorf("verbstest: echo %d: %w", i, err)
		}
	}
	return nil
}

// busyYield is how many empty polls a busy poller makes between looks at ctx,
// each with a runtime.Gosched: providers whose completions come from goroutines
// (soft) need them to run.
const busyYield = 64

// busyPolite is how long a busy poller spins before it also yields its OS thread's
// CPU at each look: on a host with fewer CPUs than spinning threads (two processes
// busy-polling on 2 vCPUs) the thread it waits for, the peer or a soft provider
// thread, would otherwise wait out whole time slices (soft: 8 ms round trips).
// Yielding sooner (5 µs, 100 µs) fattened shm's tail on a loaded 2-vCPU VM, so
// below this the spin is pure.
const busyPolite = time.Millisecond

// pollOne polls one successful completion from cq into wc[0] (len(wc) >= 1),
// calling cq.Wait between empty polls, or with busy only polling.
func pollOne(ctx context.Context, cq verbs.CQ, wc []verbs.WorkCompletion, busy bool) error {
	var since time.Time // when the busy spin's first look found nothing
	for spins := 1; ; spins++ {
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
		if !busy {
			if err := cq.Wait(ctx); err != nil {
				return err
			}
		} else if spins%busyYield == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			runtime.Gosched()
			if since.IsZero() {
				since = time.Now()
			} else if time.Since(since) > busyPolite {
				unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			}
		}
	}
}
