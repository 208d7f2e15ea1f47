// Package verbstest is the conformance suite every verbs provider passes, and the
// standard benchmarks they report. It checks the RC queue-pair semantics RFC 7609
// relies on (§2.1, §4.3: RDMA WRITE into the peer's RMB, SEND for LLC, in order).
//
// A provider's test calls Run with an Env describing how to open two devices:
//
//	func TestConformance(t *testing.T) {
//		verbstest.Run(t, verbstest.Env{
//			Open: func(t testing.TB) (a, b verbs.Device) { ... two fresh devices ... },
//		})
//	}
//	func BenchmarkVerbs(b *testing.B) { verbstest.Bench(b, env) }
//
// Open is called once per subtest; Run closes both devices when the subtest ends
// (Close must therefore be safe to call twice, as it is for every verbs object).
//
// # The peer-process test
//
// "PeerProcessDies" runs the far end in a real child process and kills it with
// SIGKILL. The child is the test binary itself, re-executed with
// -test.run selecting the very test that called Run and the environment variable
// VERBSTEST_PEER=1. When Run sees that variable it does not run the suite: it opens
// the peer device (Env.OpenPeer, or Open's b), talks to the parent over two pipes
// (file descriptors 3 and 4, one JSON object per line), connects a QP and waits to be
// killed. So a provider needs nothing more than calling Run from a test function
// that does the same thing in the child as in the parent; a test function that must
// not repeat expensive setup in the child can check InPeer first. Env.PeerCommand
// lets the child run elsewhere, e.g. inside a network namespace with nstest's
// NS.Command.
package verbstest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// Env describes a provider to the suite.
type Env struct {
	// Open returns two fresh devices whose QPs can connect to each other.
	Open func(t testing.TB) (a, b verbs.Device)
	// OpenPeer opens, inside the peer child process, a device whose QPs can connect
	// to those of Open's a in the parent. Nil: the child calls Open and uses b.
	OpenPeer func(t testing.TB) verbs.Device
	// PeerCommand builds the child's command line (for example nstest's
	// NS.Command, to start it inside a namespace). Nil: exec.Command.
	PeerCommand func(name string, args ...string) *exec.Cmd
	// SkipPeerProcess, when not empty, skips the peer-process test with this reason
	// (for a second Env of a provider whose first Env already runs it).
	SkipPeerProcess string
	// Timeout bounds every wait for a completion or a connection
	// (default 20 s; raise it for slow providers such as soft-RoCE under emulation).
	Timeout time.Duration
}

// peerEnvVar marks the child process of the peer-process test.
const peerEnvVar = "VERBSTEST_PEER"

// InPeer reports whether this process is the child of the peer-process test: a test
// function may then skip setup that only the parent needs before calling Run.
func InPeer() bool { return os.Getenv(peerEnvVar) == "1" }

func (e Env) timeout() time.Duration {
	if e.Timeout > 0 {
		return e.Timeout
	}
	return 20 * time.Second
}

// Run runs the conformance tests as subtests of t.
func Run(t *testing.T, env Env) {
	if env.Open == nil {
		t.Fatal("verbstest: Env.Open is nil")
	}
	if InPeer() {
		runPeer(t, env)
		return
	}
	for _, tc := range conformance {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, env) })
	}
}

var conformance = []struct {
	name string
	fn   func(t *testing.T, env Env)
}{
	{"Connect", testConnect},
	{"SendRecvOrder", testSendRecvOrder},
	{"WriteLanding", testWriteLanding},
	{"Chain", testChain},
	{"WriteImm", testWriteImm},
	{"Inline", testInline},
	{"CompletionOrder", testCompletionOrder},
	{"Unsignaled", testUnsignaled},
	{"RNRRetryExceeded", testRNRExceeded},
	{"RNRDeliveredInTime", testRNRInTime},
	{"RemoteAccessWrongRKey", testRemAccessRKey},
	{"RemoteAccessPastEnd", testRemAccessBounds},
	{"RemoteAccessNoPermission", testRemAccessPerm},
	{"LocalLengthError", testLocLen},
	{"FlushOnDestroy", testFlushOnDestroy},
	{"CloseWhilePosting", testCloseWhilePosting},
	{"CloseDeviceFirst", testCloseDeviceFirst},
	{"PeerProcessDies", testPeerDies},
	{"ManyQPs", testManyQPs},
	{"WrongState", testWrongState},
	{"InvalidSGE", testInvalidSGE},
	{"CQWait", testCQWait},
	{"RegisterMR", testRegisterMR},
}

// side is one end of a connected pair: a device with a PD, CQs, a QP and one MR.
type side struct {
	dev    verbs.Device
	pd     verbs.PD
	scq    verbs.CQ
	rcq    verbs.CQ
	qp     verbs.QP
	mr     verbs.MR
	remote remoteMR // the other side's mr
}

// remoteMR is what a peer learns about a region (what CLC/LLC carry for an RMB).
type remoteMR struct {
	Addr uint64
	RKey uint32
	Size int
}

func describe(m verbs.MR) remoteMR {
	return remoteMR{Addr: m.Addr(), RKey: m.RKey(), Size: len(m.Bytes())}
}

// opts shapes a pair built by newPair.
type opts struct {
	mrSize   int
	access   verbs.Access // of b's region; a's is always local+remote write
	rnrRetry int          // of a's QP (b's is always 7)
	sendWR   int
}

func openDevices(t *testing.T, env Env) (a, b verbs.Device) {
	t.Helper()
	a, b = env.Open(t)
	if a == nil || b == nil {
		t.Fatal("verbstest: Open returned a nil device")
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b
}

// newSide allocates a PD, two CQs, a QP and a region on dev.
func newSide(t testing.TB, dev verbs.Device, mrSize int, access verbs.Access, rnrRetry, sendWR int) *side {
	t.Helper()
	s := &side{dev: dev}
	var err error
	if s.pd, err = dev.AllocPD(); err != nil {
		t.Fatalf("alloc pd: %v", err)
	}
	t.Cleanup(func() { s.pd.Close() })
	if s.scq, err = dev.CreateCQ(256); err != nil {
		t.Fatalf("create send cq: %v", err)
	}
	t.Cleanup(func() { s.scq.Close() })
	if s.rcq, err = dev.CreateCQ(256); err != nil {
		t.Fatalf("create recv cq: %v", err)
	}
	t.Cleanup(func() { s.rcq.Close() })
	if s.mr, err = s.pd.AllocMR(mrSize, access); err != nil {
		t.Fatalf("alloc mr: %v", err)
	}
	t.Cleanup(func() { s.mr.Close() })
	if s.qp, err = s.pd.CreateQP(verbs.QPConfig{
		SendCQ: s.scq, RecvCQ: s.rcq, MaxSendWR: sendWR, MaxRecvWR: 64, RNRRetry: rnrRetry,
		MaxInline: inlineAsk,
	}); err != nil {
		t.Fatalf("create qp: %v", err)
	}
	t.Cleanup(func() { s.qp.Close() })
	return s
}

// newPair opens two devices and connects one QP on each.
func newPair(t *testing.T, env Env, o opts) (a, b *side) {
	t.Helper()
	if o.mrSize == 0 {
		o.mrSize = 64 << 10
	}
	if o.access == 0 {
		o.access = verbs.AccessLocalWrite | verbs.AccessRemoteWrite
	}
	if o.rnrRetry == 0 {
		o.rnrRetry = 7
	}
	if o.sendWR == 0 {
		o.sendWR = 64
	}
	da, db := openDevices(t, env)
	a = newSide(t, da, o.mrSize, verbs.AccessLocalWrite|verbs.AccessRemoteWrite, o.rnrRetry, o.sendWR)
	b = newSide(t, db, o.mrSize, o.access, 7, 64)
	connect(t, env, a, b)
	return a, b
}

// connect connects a.qp and b.qp, both at once, as CLC does.
func connect(t testing.TB, env Env, a, b *side) {
	t.Helper()
	a.remote, b.remote = describe(b.mr), describe(a.mr)
	if err := connectQPs(env, a.qp, b.qp); err != nil {
		t.Fatal(err)
	}
}

func connectQPs(env Env, a, b verbs.QP) error {
	ctx, cancel := context.WithTimeout(context.Background(), env.timeout())
	defer cancel()
	aa, ba := a.Attr(), b.Attr()
	errc := make(chan error, 1)
	go func() { errc <- b.Connect(ctx, aa) }()
	errA := a.Connect(ctx, ba)
	errB := <-errc
	if errA != nil || errB != nil {
		return fmt.Errorf("connect: a: %v, b: %v", errA, errB)
	}
	return nil
}

// waitWC polls cq until n completions arrived or the timeout passed.
func waitWC(t testing.TB, env Env, cq verbs.CQ, n int) []verbs.WorkCompletion {
	t.Helper()
	wcs, err := pollN(cq, n, env.timeout())
	if err != nil {
		t.Fatalf("waiting for %d completions (got %d: %+v): %v", n, len(wcs), wcs, err)
	}
	return wcs
}

func pollN(cq verbs.CQ, n int, timeout time.Duration) ([]verbs.WorkCompletion, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out := make([]verbs.WorkCompletion, 0, n)
	buf := make([]verbs.WorkCompletion, 16)
	for len(out) < n {
		k, err := cq.Poll(buf[:min(len(buf), n-len(out))])
		if err != nil {
			return out, fmt.Errorf("poll: %w", err)
		}
		out = append(out, buf[:k]...)
		if k > 0 {
			continue
		}
		if err := cq.Wait(ctx); err != nil {
			return out, fmt.Errorf("wait: %w", err)
		}
	}
	return out, nil
}

// expectNoWC checks that cq stays empty for d.
func expectNoWC(t testing.TB, cq verbs.CQ, d time.Duration) {
	t.Helper()
	wcs, err := pollN(cq, 1, d)
	if len(wcs) > 0 {
		t.Fatalf("unexpected completion %+v", wcs[0])
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
}

func wantWC(t testing.TB, wc verbs.WorkCompletion, id uint64, status verbs.WCStatus, op verbs.WCOpcode) {
	t.Helper()
	if wc.ID != id || wc.Status != status {
		t.Fatalf("completion %+v: want id %d status %v", wc, id, status)
	}
	if status == verbs.WCSuccess && wc.Opcode != op {
		t.Fatalf("completion %+v: want opcode %d", wc, op)
	}
}

func postRecv(t testing.TB, qp verbs.QP, id uint64, mr verbs.MR, off, n int) {
	t.Helper()
	if err := qp.PostRecv(&verbs.RecvWR{ID: id, SG: []verbs.SGE{{MR: mr, Offset: off, Length: n}}}); err != nil {
		t.Fatalf("post recv %d: %v", id, err)
	}
}

func postSend(t testing.TB, qp verbs.QP, wr *verbs.SendWR) {
	t.Helper()
	if err := qp.PostSend(wr); err != nil {
		t.Fatalf("post send %d: %v", wr.ID, err)
	}
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// pattern fills b with bytes derived from seed, so misplaced bytes are detected.
func pattern(b []byte, seed int) {
	for i := range b {
		b[i] = byte(i*7 + seed*13 + 1)
	}
}

// untouched reports the first index of b that is not v, or -1.
func untouched(b []byte, v byte) int {
	for i, x := range b {
		if x != v {
			return i
		}
	}
	return -1
}

// QPNsSpread checks that d numbers its QPs unpredictably: a software provider's
// QPN is what a stranger's hello must name to take a QP's inbound stream before
// its peer does, so one QPN (from a link of one's own) must not tell the next.
// Not part of Run: an adapter numbers its QPs as it likes.
func QPNsSpread(t *testing.T, d verbs.Device) {
	t.Helper()
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	cq, err := d.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Close()
	var prev uint32
	near := 0
	for i := range 32 {
		q, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		n := q.Attr().QPN
		if i > 0 && n-prev < 16 {
			near++
		}
		prev = n
	}
	if near > 2 {
		t.Errorf("%d of 31 QPNs followed their predecessor closely", near)
	}
}
