// End-to-end: what an operator sees and changes through smcrd's control API while
// SMC-R (RFC 7609) connections run: cursors, tokens, link bytes and size
// histograms; max_memory and rmb_size changed at run time; stats -r.

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/smcr-io/smcr/control"
)

// smcConn waits for the SMC-R connection of h whose local or remote address ends
// in suffix, until ok accepts it.
func (h *host) smcConn(t *testing.T, suffix string, ok func(control.Conn) bool) control.Conn {
	t.Helper()
	var last []control.Conn
	for range 100 {
		last = h.conns()
		for _, c := range last {
			if c.Mode == control.ModeSMCR && (strings.HasSuffix(c.Local, suffix) || strings.HasSuffix(c.Remote, suffix)) && ok(c) {
				return c
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: no SMC-R connection at %s as wanted: %+v", h.name, suffix, last)
	return control.Conn{}
}

func sum(h control.Histogram) uint64 {
	var n uint64
	for _, b := range h {
		n += b.Count
	}
	return n
}

func TestOperatorView(t *testing.T) {
	a, b := hosts(t)
	a.start("providers = shm", ports, "rmb_size = 256K", "metrics_address = 127.0.0.1:9464", "test_link_time = 1s")
	b.start("providers = shm", ports, "rmb_size = 256K")
	b.serve(5201)
	b.background("socat", "TCP-LISTEN:5204,fork,reuseaddr", "EXEC:cat")
	b.waitListening(5204)
	ctx := context.Background()

	// One connection held open by socat, echoing 1000 bytes.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	held := a.command("socat", "-", fmt.Sprintf("TCP:%s:5204", b.ns.Addr4()))
	var echoed syncWriter
	echoed.w = &bytes.Buffer{}
	held.Stdin, held.Stdout = pr, &echoed
	if err := held.Start(); err != nil {
		t.Fatal(err)
	}
	pr.Close()
	t.Cleanup(func() { pw.Close(); held.Process.Kill(); held.Wait() })
	const n = 1000
	pw.Write(bytes.Repeat([]byte("x"), n))
	for i := 0; ; i++ {
		echoed.mu.Lock()
		got := echoed.w.Len()
		echoed.mu.Unlock()
		if got == n {
			break
		}
		if i == 200 {
			t.Fatalf("socat echoed %d of %d bytes", got, n)
		}
		time.Sleep(25 * time.Millisecond)
	}

	// conns: both ends' cursors and tokens agree with the 1000 bytes each way.
	want := control.Cursor{Count: n}
	ca := a.smcConn(t, ":5204", func(c control.Conn) bool { return c.TxProd == want && c.RxProd == want && c.RxCons == want })
	cb := b.smcConn(t, ":5204", func(c control.Conn) bool { return c.TxProd == want && c.RxProd == want && c.RxCons == want })
	if ca.TxCons.Wrap != 0 || ca.TxCons.Count > n {
		t.Errorf("A's view of B's consumer cursor %v is past %v", ca.TxCons, want)
	}
	if ca.ID == 0 || ca.PeerToken != cb.ID || cb.PeerToken != ca.ID {
		t.Errorf("tokens: A %#x peer %#x, B %#x peer %#x", ca.ID, ca.PeerToken, cb.ID, cb.PeerToken)
	}
	if ca.RMBSize != 256<<10 || ca.PeerRMBSize != 256<<10 || ca.SndBufSize != 256<<10 {
		t.Errorf("A's buffers: rmb %d, peer rmb %d, sndbuf %d", ca.RMBSize, ca.PeerRMBSize, ca.SndBufSize)
	}

	// links: the bytes each way, beside the work requests.
	links, err := a.ctl.Links(ctx)
	if err != nil || len(links) != 1 {
		t.Fatalf("links: %v %+v", err, links)
	}
	if l := links[0]; l.TX.Bytes != n || l.RX.Bytes != n || l.TX.WorkRequests == 0 || l.RX.WorkRequests == 0 {
		t.Errorf("A's link traffic tx %+v rx %+v, want %d bytes each way", l.TX, l.RX, n)
	}
	// linkgroups: each end names the other's address.
	for _, hs := range [][2]*host{{a, b}, {b, a}} {
		lgs, err := hs[0].ctl.LinkGroups(ctx)
		if err != nil || len(lgs) != 1 || lgs[0].PeerAddr != hs[1].ns.Addr4().String() {
			t.Errorf("%s's link groups: %v %+v, want the peer %v", hs[0].name, err, lgs, hs[1].ns.Addr4())
		}
	}
	// Each end names the other's GID, and counts no errors.
	bLinks, err := b.ctl.Links(ctx)
	if err != nil || len(bLinks) != 1 {
		t.Fatalf("B's links: %v %+v", err, bLinks)
	}
	if la, lb := links[0], bLinks[0]; la.LocalGID == "" || la.PeerGID != lb.LocalGID || lb.PeerGID != la.LocalGID || la.Errors != 0 || lb.Errors != 0 {
		t.Errorf("A's link gid %q peer %q errors %d; B's gid %q peer %q errors %d",
			la.LocalGID, la.PeerGID, la.Errors, lb.LocalGID, lb.PeerGID, lb.Errors)
	}

	// The Prometheus metrics report the same link bytes.
	var body []byte
	err = a.ns.Do(func() error {
		c, err := net.Dial("tcp", "127.0.0.1:9464")
		if err != nil {
			return err
		}
		defer c.Close()
		fmt.Fprint(c, "GET /metrics HTTP/1.0\r\n\r\n")
		body, err = io.ReadAll(c)
		return err
	})
	for _, dir := range []string{"rx", "tx"} {
		m := fmt.Sprintf("smcr_link_bytes_total{direction=%q,link=\"1\",linkgroup=\"1\"} %d\n", dir, n)
		if err != nil || !bytes.Contains(body, []byte(m)) {
			t.Errorf("metrics lack %q: %v\n%s", m, err, body)
		}
	}

	// SIGUSR1: the link groups, links and connections (with their cursors) go
	// to the log.
	a.smcrd.Process.Signal(syscall.SIGUSR1)
	for _, want := range []string{
		fmt.Sprintf(`msg="link group" id=1 role=client peer=%s peer_addr=%s provider=shm conns=1`, links[0].Peer, b.ns.Addr4()),
		fmt.Sprintf(`msg=link group=1 num=1 state=active device=%s`, links[0].Device),
		fmt.Sprintf(`tx_bytes=%d rx_bytes=%d`, n, n),
		`msg=connection id=`,
		fmt.Sprintf(`tx_prod=%v tx_cons=%v rx_prod=%v rx_cons=%v`, want, want, want, want),
	} {
		for i := 0; !strings.Contains(a.logText(), want); i++ {
			if i == 100 {
				t.Fatalf("SIGUSR1: the log lacks %q:\n%s", want, a.logText())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// test_link_time set at run time: the idle link is tested, and links shows
	// the round trip and how long ago.
	if _, err := a.ctl.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"test_link_time=200ms"}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		l, err := a.ctl.Links(ctx)
		if err == nil && len(l) == 1 && l[0].RTTMicros > 0 && l[0].TestLinkAgo >= 0 && l[0].TestLinkAgo < 5 {
			break
		}
		if i == 50 {
			t.Fatalf("no TEST_LINK round trip after test_link_time=200ms: %v %+v", err, l)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// stats: one 256K buffer each way, requests counted by size.
	st := a.stats()
	if st.RX.BufferSizes[5].Count != 1 || st.TX.BufferSizes[5].Count != 1 || sum(st.RX.BufferSizes) != 1 {
		t.Errorf("A's buffer sizes: rx %+v tx %+v, want one 256K each", st.RX.BufferSizes, st.TX.BufferSizes)
	}
	if st.TX.Requests == 0 || st.TX.Requests != sum(st.TX.RequestSizes) || st.RX.Requests != sum(st.RX.RequestSizes) {
		t.Errorf("A's requests: tx %d %+v, rx %d %+v", st.TX.Requests, st.TX.RequestSizes, st.RX.Requests, st.RX.RequestSizes)
	}

	// max_memory and rmb_size changed at run time apply to B's next connection:
	// 1 MB cannot hold the held connection's 512K and a new 512K RMB with its
	// 256K send buffer.
	res, err := b.ctl.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"max_memory=1", "rmb_size=512K"}})
	if err != nil || len(res.Changed) != 2 || len(res.Notes) != 0 {
		t.Fatalf("set: %+v, %v", res, err)
	}
	dst := fmt.Sprintf("%s:5201", b.ns.Addr4())
	if _, err := a.client(dst, "-mode", "echo", "-bytes", "10000"); err != nil {
		t.Fatal(err)
	}
	noMem := func(s control.Stats, side string) uint64 {
		for _, f := range s.Fallbacks {
			if f.Code == 0x01010000 && f.Side == side {
				return f.Count
			}
		}
		return 0
	}
	if sb, sa := b.stats(), a.stats(); noMem(sb, control.SideLocal) != 1 || noMem(sa, control.SidePeer) != 1 {
		t.Fatalf("after max_memory=1: B fallbacks %+v, A fallbacks %+v; want one insufficient memory", sb.Fallbacks, sa.Fallbacks)
	}
	if _, err := b.ctl.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"max_memory=256"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.client(dst, "-mode", "echo", "-bytes", "10000"); err != nil {
		t.Fatal(err)
	}
	sb := b.stats()
	if sb.Connections.SMCR != 2 || sb.RX.BufferSizes[6].Count != 1 {
		t.Errorf("after max_memory=256: B went SMC-R %d times (want 2), its RMB sizes %+v (want one 512K)", sb.Connections.SMCR, sb.RX.BufferSizes)
	}
	if sa := a.stats(); sa.TX.BufferSizes[6].Count != 1 {
		t.Errorf("A's send buffer sizes %+v, want one 512K mirroring B's new RMB", sa.TX.BufferSizes)
	}

	// stats -r: the values before come back, and the counters are zero after, in
	// the engine as in smcrd; the held connection is still counted as open.
	before, err := a.ctl.ResetStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if before.Connections.Handled < 3 || before.TX.Bytes < n || sum(before.TX.RequestSizes) == 0 {
		t.Errorf("stats -r returned %+v, want the counters before the reset", before.Connections)
	}
	after := a.stats()
	zero := control.Direction{BufferSizes: control.NewHistogram(control.SizeBuckets), RequestSizes: control.NewHistogram(control.SizeBuckets)}
	c := after.Connections
	if c.Handled != 0 || c.SMCR != 0 || c.Fallback != 0 || c.FirstContact != 0 || c.Reused != 0 || len(after.Fallbacks) != 0 ||
		fmt.Sprint(after.RX) != fmt.Sprint(zero) || fmt.Sprint(after.TX) != fmt.Sprint(zero) || after.ProtocolErrors != 0 || after.Aborts != 0 {
		t.Errorf("after stats -r: %+v", after)
	}
	if c.Active < 1 || after.MemoryInUse == 0 || after.MemoryPeak < after.MemoryInUse || after.MemoryPeak > before.MemoryPeak {
		t.Errorf("after stats -r: active %d, memory %d, peak %d (before %d): the gauges stay, the peak restarts",
			c.Active, after.MemoryInUse, after.MemoryPeak, before.MemoryPeak)
	}
}

// TestHistory: smcrctl history lists the connections that ended, newest
// first, with how they went: SMC-R on both hosts, in their roles, and one
// smcrd could not set up. Nothing kept them once closed.
func TestHistory(t *testing.T) {
	a, b := hosts(t)
	a.start("providers = shm", ports)
	b.start("providers = shm", ports)
	b.serve(5201)
	if r, err := a.client(fmt.Sprintf("%s:5201", b.ns.Addr4()), "-mode", "echo", "-bytes", "1000"); err != nil || r.OK != 1 {
		t.Fatalf("%+v %v", r, err)
	}
	a.client(fmt.Sprintf("%s:5207", b.ns.Addr4()), "-mode", "echo", "-bytes", "16", "-timeout", "20s") // nothing listens
	history := func(h *host, n int) []control.ClosedConn {
		t.Helper()
		var l []control.ClosedConn
		for range 100 { // the relay ends just after the application
			var err error
			if l, err = h.ctl.History(context.Background()); err != nil {
				t.Fatal(err)
			}
			if len(l) >= n {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		return l
	}
	la := history(a, 2)
	if len(la) != 2 || la[0].Mode != control.ModeFailed || la[1].Mode != control.ModeSMCR || la[1].Role != "client" ||
		la[1].TxBytes < 1000 || !strings.HasSuffix(la[1].Remote, ":5201") {
		t.Errorf("A's history: %+v, want the failed connection, then the SMC-R one as client", la)
	}
	if lb := history(b, 1); len(lb) == 0 || lb[len(lb)-1].Mode != control.ModeSMCR || lb[len(lb)-1].Role != "server" {
		t.Errorf("B's history: %+v, want the SMC-R connection as server", lb)
	}
}

// TestProbe: smcrctl probe says whether a connection to a destination would
// be tried over SMC-R, and which check stops it: a port not listed, a peer in
// the negative cache. Nothing told that without trying.
func TestProbe(t *testing.T) {
	a, b := hosts(t)
	a.start("providers = shm", ports)
	b.start("providers = shm", ports)
	b.serve(5201)
	dst := fmt.Sprintf("%s:5201", b.ns.Addr4())
	probe := func(dst string) (bool, map[string]control.ProbeCheck) {
		t.Helper()
		p, err := a.ctl.Probe(context.Background(), dst)
		if err != nil {
			t.Fatal(err)
		}
		checks := map[string]control.ProbeCheck{}
		for _, c := range p.Checks {
			checks[c.Check] = c
		}
		return p.SMCR, checks
	}
	if ok, checks := probe(dst); !ok || len(checks) != 6 {
		t.Errorf("probe %s: %v %+v, want SMC-R, every check passed", dst, ok, checks)
	}
	if ok, checks := probe(fmt.Sprintf("%s:80", b.ns.Addr4())); ok || checks["port"].OK {
		t.Errorf("probe port 80: %v %+v, want the port check failed", ok, checks)
	}
	b.stop() // B answers without the SMC option: A caches it
	if r, err := a.client(dst, "-mode", "echo", "-bytes", "1000"); err == nil && r.OK == 1 {
		t.Logf("connection while B's smcrd is down: plain TCP")
	}
	if ok, checks := probe(dst); ok || checks["peer cache"].OK || !strings.Contains(checks["peer cache"].Detail, "without SMC-R") {
		t.Errorf("probe after B declined: %v %+v, want the peer cache check failed", ok, checks)
	}
}
