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
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/smcr-io/smcr/internal/leakcheck"
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
// every 100th signaled (its defaults); the target does nothing.
func BenchmarkWrite(b *testing.B) {
	for _, w := range waits {
		b.Run(w.name, func(b *testing.B) { benchWrite(b, w.fn) })
	}
}

func benchWrite(b *testing.B, wait waitFn) {
	const size, depth, every = 65536, 128, 100
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

// BenchmarkPollEmpty times a poll of an empty CQ: one cgo crossing and the
// provider's bookkeeping, what each library call on a ping-pong's critical
// path costs here beyond perftest's (which calls the library directly). On
// the host a crossing costs tens of nanoseconds; under TCG, hundreds.
func BenchmarkPollEmpty(b *testing.B) {
	cq, err := openDev(b).CreateCQ(16)
	if err != nil {
		b.Fatal(err)
	}
	defer cq.Close()
	wc := make([]verbs.WorkCompletion, 1)
	for b.Loop() {
		if n, err := cq.Poll(wc); n != 0 || err != nil {
			b.Fatalf("poll of an empty CQ: %d, %v", n, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/poll")
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
// name how the initiator and the responder wait (spin-spin is perftest's) and,
// with "proc", run the responder in a child process, as perftest's two processes:
// run with GOMAXPROCS=1 that is perftest's shape exactly. "-inline" sends
// inline, beside ib_send_lat -I.
func BenchmarkSendPingPong(b *testing.B) {
	for _, proc := range []bool{false, true} {
		for _, ini := range waits {
			for _, resp := range waits {
				if ini.name == "wait" && resp.name == "spin" {
					continue // the mirror of spin-wait
				}
				name := ini.name + "-" + resp.name
				if proc {
					name = "proc-" + name
				}
				b.Run(name, func(b *testing.B) { benchSendPingPong(b, ini.fn, resp.name, proc) })
			}
		}
	}
	b.Run("proc-spin-spin-inline", func(b *testing.B) { pingPong(b, "send-spin"+inlineRole, true, spin) })
}

const (
	pingSize   = 8
	pingInline = 64 // inline space of the ping-pongs' queue pairs
)

// pingSide wraps a side with the reusable work requests of a ping-pong.
type pingSide struct {
	*side
	send *verbs.SendWR
	recv *verbs.RecvWR
}

// newPingSide prepares s's requests; inline sends them inline (perftest's -I,
// which it leaves at 0 on rxe; the engine sends its CDC messages inline).
func newPingSide(s *side, op verbs.Opcode, remoteAddr uint64, rkey uint32, inline bool) *pingSide {
	ps := &pingSide{side: s,
		send: &verbs.SendWR{Opcode: op, SG: []verbs.SGE{{MR: s.mr, Length: pingSize}}, RemoteAddr: remoteAddr, RKey: rkey, Inline: inline},
		recv: &verbs.RecvWR{SG: []verbs.SGE{{MR: s.mr, Offset: 2048, Length: pingSize}}},
	}
	if op == verbs.OpWrite {
		// The counter travels from offset 0 to the peer's offset 64.
		ps.send.SG[0].Length = 4
		ps.send.RemoteAddr += 64
	}
	return ps
}

func (s *pingSide) postRecvs() error {
	for i := 0; i < 64; i++ {
		if err := s.qp.PostRecv(s.recv); err != nil {
			return err
		}
	}
	return nil
}

// post posts the side's SEND or WRITE and, every 32nd time, waits for its
// completion so the send queue drains.
func (s *pingSide) post(i int, wait waitFn) error {
	s.send.Signaled = i%32 == 31
	if err := s.qp.PostSend(s.send); err != nil {
		return err
	}
	if s.send.Signaled {
		n, err := wait(s.scq, s.wc[:1])
		if err == nil && n == 1 && s.wc[0].Status != verbs.WCSuccess {
			err = fmt.Errorf("send completion %+v", s.wc[0])
		}
		return err
	}
	return nil
}

// await waits for the peer's SEND and reposts the receive.
func (s *pingSide) await(wait waitFn) error {
	if _, err := wait(s.rcq, s.wc[:1]); err != nil {
		return err
	}
	if s.wc[0].Status != verbs.WCSuccess {
		return fmt.Errorf("recv completion %+v", s.wc[0])
	}
	return s.qp.PostRecv(s.recv)
}

func (s *pingSide) counter(off int) *uint32 {
	return (*uint32)(unsafe.Pointer(&s.mr.Bytes()[off]))
}

// awaitWrite spins until the peer's WRITE has put i in our counter.
func (s *pingSide) awaitWrite(i int) {
	for atomic.LoadUint32(s.counter(64)) != uint32(i) {
	}
}

// inlineRole marks a role whose sides send inline.
const inlineRole = "+inline"

// parseRole splits a role into its base ("send-spin", "send-wait" or "write"),
// the opcode its sides post and whether they post it inline.
func parseRole(role string) (base string, op verbs.Opcode, inline bool) {
	base, inline = strings.CutSuffix(role, inlineRole)
	op = verbs.OpSend
	if base == "write" {
		op = verbs.OpWrite
	}
	return base, op, inline
}

// respond is the responder's loop for n round trips: "send-spin", "send-wait"
// or "write", each maybe with inlineRole.
func (s *pingSide) respond(role string, n int) error {
	role, _, _ = parseRole(role)
	for i := 1; i <= n; i++ {
		switch role {
		case "write":
			s.awaitWrite(i)
			atomic.StoreUint32(s.counter(0), uint32(i))
			if err := s.post(i, spin); err != nil {
				return err
			}
		default:
			wait := spin
			if role == "send-wait" {
				wait = block
			}
			if err := s.await(wait); err != nil {
				return err
			}
			if err := s.post(i, wait); err != nil {
				return err
			}
		}
	}
	return nil
}

// pingPong connects an initiator to a responder playing role, in this process
// or a child, times b.N round trips and reports their latencies.
func pingPong(b *testing.B, role string, proc bool, iniWait waitFn) {
	_, op, inline := parseRole(role)
	cfg := verbs.QPConfig{MaxSendWR: 256, MaxRecvWR: 256, MaxInline: pingInline}
	n := b.N
	var (
		a    *pingSide
		done = make(chan error, 1)
	)
	if proc {
		a = startPeer(b, role, n, cfg, op, inline, done)
	} else {
		sa, sp := pair(b, 4096, cfg)
		a = newPingSide(sa, op, sp.mr.Addr(), sp.mr.RKey(), inline)
		p := newPingSide(sp, op, sa.mr.Addr(), sa.mr.RKey(), inline)
		for _, s := range []*pingSide{a, p} {
			if err := s.postRecvs(); err != nil {
				b.Fatal(err)
			}
		}
		go func() { done <- p.respond(role, n) }()
	}
	rtt := make([]time.Duration, n)
	b.ResetTimer()
	for i := 1; i <= n; i++ {
		start := time.Now()
		if op == verbs.OpWrite {
			atomic.StoreUint32(a.counter(0), uint32(i))
		}
		if err := a.post(i, iniWait); err != nil {
			b.Fatal(err)
		}
		if op == verbs.OpWrite {
			a.awaitWrite(i)
		} else if err := a.await(iniWait); err != nil {
			b.Fatal(err)
		}
		rtt[i-1] = time.Since(start)
	}
	b.StopTimer()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	latencies(b, rtt)
}

func benchSendPingPong(b *testing.B, iniWait waitFn, resp string, proc bool) {
	pingPong(b, "send-"+resp, proc, iniWait)
}

// BenchmarkWritePingPong is ib_write_lat's method: each side WRITEs a counter
// into the other's buffer and busy-polls its own buffer for the peer's, with no
// receive completions involved, so both sides necessarily spin. "proc" runs the
// responder in a child process, as perftest does; "-inline" beside
// ib_write_lat -I.
func BenchmarkWritePingPong(b *testing.B) {
	b.Run("spin-spin", func(b *testing.B) { pingPong(b, "write", false, spin) })
	b.Run("proc-spin-spin", func(b *testing.B) { pingPong(b, "write", true, spin) })
	b.Run("proc-spin-spin-inline", func(b *testing.B) { pingPong(b, "write"+inlineRole, true, spin) })
}

// The responder in a child process: the test binary run again with peerEnv set
// to its role. The two ends exchange their QP attributes and RDMA addresses as
// JSON lines over the child's stdin and stdout, as perftest does over TCP.

const peerEnv = "SMCR_IBV_BENCH_PEER"

type peerInfo struct {
	QP   verbs.QPAttr
	Addr uint64
	RKey uint32
}

func TestMain(m *testing.M) {
	if role := os.Getenv(peerEnv); role != "" {
		if err := runPeer(role); err != nil {
			fmt.Fprintln(os.Stderr, "bench peer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(leakcheck.Run(m))
}

// startPeer starts the child, connects to it and returns the initiator's side;
// done receives the child's outcome.
func startPeer(b *testing.B, role string, n int, cfg verbs.QPConfig, op verbs.Opcode, inline bool, done chan<- error) *pingSide {
	b.Helper()
	s := newSide(b, openDev(b), 4096, cfg)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), peerEnv+"="+role, "SMCR_IBV_BENCH_N="+strconv.Itoa(n),
		"SMCR_IBV_BENCH_DEVICE="+s.dev.Name())
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	dec := json.NewDecoder(out)
	var peer peerInfo
	if err := dec.Decode(&peer); err != nil {
		b.Fatalf("peer attributes: %v", err)
	}
	if err := json.NewEncoder(in).Encode(peerInfo{QP: s.qp.Attr(), Addr: s.mr.Addr(), RKey: s.mr.RKey()}); err != nil {
		b.Fatal(err)
	}
	a := newPingSide(s, op, peer.Addr, peer.RKey, inline)
	if err := a.postRecvs(); err != nil {
		b.Fatal(err)
	}
	if err := s.qp.Connect(context.Background(), peer.QP); err != nil {
		b.Fatal(err)
	}
	// The child says ready once its QP is connected and its receives posted.
	var ready string
	if err := dec.Decode(&ready); err != nil {
		b.Fatalf("peer ready: %v", err)
	}
	go func() {
		var res string
		if err := dec.Decode(&res); err != nil {
			res = fmt.Sprintf("peer result: %v", err)
		}
		if err := cmd.Wait(); err != nil && res == "" {
			res = err.Error()
		}
		if res != "" {
			done <- errors.New(res)
			return
		}
		done <- nil
	}()
	return a
}

// runPeer is the child: one side on the configured device, answering n round
// trips in role.
func runPeer(role string) error {
	n, err := strconv.Atoi(os.Getenv("SMCR_IBV_BENCH_N"))
	if err != nil {
		return err
	}
	dev, err := Open(Config{Device: os.Getenv("SMCR_IBV_BENCH_DEVICE"), GIDIndex: -1})
	if err != nil {
		return err
	}
	defer dev.Close()
	s := &side{dev: dev, wc: make([]verbs.WorkCompletion, 16)}
	if s.pd, err = dev.AllocPD(); err != nil {
		return err
	}
	defer s.pd.Close()
	if s.scq, err = dev.CreateCQ(256); err != nil {
		return err
	}
	defer s.scq.Close()
	if s.rcq, err = dev.CreateCQ(256); err != nil {
		return err
	}
	defer s.rcq.Close()
	if s.mr, err = s.pd.AllocMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return err
	}
	defer s.mr.Close()
	if s.qp, err = s.pd.CreateQP(verbs.QPConfig{SendCQ: s.scq, RecvCQ: s.rcq, MaxSendWR: 256, MaxRecvWR: 256, MaxInline: pingInline}); err != nil {
		return err
	}
	defer s.qp.Close()
	enc, dec := json.NewEncoder(os.Stdout), json.NewDecoder(os.Stdin)
	if err := enc.Encode(peerInfo{QP: s.qp.Attr(), Addr: s.mr.Addr(), RKey: s.mr.RKey()}); err != nil {
		return err
	}
	var peer peerInfo
	if err := dec.Decode(&peer); err != nil {
		return err
	}
	_, op, inline := parseRole(role)
	p := newPingSide(s, op, peer.Addr, peer.RKey, inline)
	if err := p.postRecvs(); err != nil {
		return err
	}
	if err := s.qp.Connect(context.Background(), peer.QP); err != nil {
		return err
	}
	if err := enc.Encode("ready"); err != nil {
		return err
	}
	res := ""
	if err := p.respond(role, n); err != nil {
		res = err.Error()
	}
	return enc.Encode(res)
}
