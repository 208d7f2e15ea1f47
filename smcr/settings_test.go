package smcr

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr/clc"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// connInfo returns the engine's ConnInfo of c.
func connInfo(t *testing.T, e *Engine, c *Conn) ConnInfo {
	t.Helper()
	for _, ci := range e.Conns() {
		if ci.ID == c.id {
			return ci
		}
	}
	t.Fatalf("conn %d not listed", c.id)
	return ConnInfo{}
}

func TestSetMaxMemory(t *testing.T) {
	p := memPair(t)
	c1, s1 := p.connect(t)
	mustSMC(t, c1, s1)

	// Below what one connection needs: the server's next RMB does not fit.
	if err := p.srv.SetMaxMemory(1); err != nil {
		t.Fatal(err)
	}
	if got := p.srv.Settings().MaxMemory; got != 1 {
		t.Fatalf("Settings().MaxMemory %d after SetMaxMemory(1)", got)
	}
	c2, s2 := p.connect(t)
	if c2.Mode() != ModeFallback {
		t.Fatalf("after SetMaxMemory the next connection went %v", c2.Mode())
	}
	if d := s2.Decline(); d.Code != clc.DeclineNoMemory || d.Side != SideLocal {
		t.Fatalf("server decline %+v, want local insufficient memory", d)
	}
	if d := c2.Decline(); d.Code != clc.DeclineNoMemory || d.Side != SidePeer {
		t.Fatalf("client decline %+v, want the peer's insufficient memory", d)
	}
	echoCheck(t, c2, s2)
	// The established connection keeps its buffers.
	echoCheck(t, c1, s1)

	// The same on the client's side, which declines itself.
	if err := p.srv.SetMaxMemory(0); err != nil {
		t.Fatal(err)
	}
	if err := p.cli.SetMaxMemory(1); err != nil {
		t.Fatal(err)
	}
	c3, s3 := p.connect(t)
	if d := c3.Decline(); c3.Mode() != ModeFallback || d.Code != clc.DeclineNoMemory || d.Side != SideLocal {
		t.Fatalf("client-side limit: mode %v, decline %+v", c3.Mode(), d)
	}
	echoCheck(t, c3, s3)

	// Unlimited again: SMC-R again.
	if err := p.cli.SetMaxMemory(0); err != nil {
		t.Fatal(err)
	}
	c4, s4 := p.connect(t)
	mustSMC(t, c4, s4)

	// The buffer histograms count the connections that went SMC-R, not the buffers
	// of handshakes that fell back (the server's RMB for c3 was made, then freed).
	for _, e := range []*Engine{p.cli, p.srv} {
		st, n := e.Stats(), uint64(0)
		for i := range st.RxBufSizes {
			n += st.RxBufSizes[i] + st.TxBufSizes[i]
		}
		if st.SMC != 2 || n != 2*st.SMC {
			t.Errorf("%d SMC-R connections, %d buffers in the histograms, want 2 and 4", st.SMC, n)
		}
	}

	if err := p.cli.SetMaxMemory(-1); !errors.Is(err, ErrConfig) {
		t.Fatalf("SetMaxMemory(-1): %v, want ErrConfig", err)
	}
	if got := p.cli.Settings().MaxMemory; got != 0 {
		t.Fatalf("a refused SetMaxMemory changed the limit to %d", got)
	}
}

func TestSetRMBSize(t *testing.T) {
	p := memPair(t)
	c1, s1 := p.connect(t)
	mustSMC(t, c1, s1)
	if got := connInfo(t, p.srv, s1).RMBSize; got != defaultRMB {
		t.Fatalf("default RMB %d", got)
	}

	if err := p.srv.SetRMBSize(20000); err != nil { // rounds up to 32 KiB
		t.Fatal(err)
	}
	if got := p.srv.Settings().RMBSize; got != 32<<10 {
		t.Fatalf("Settings().RMBSize %d, want 32 KiB", got)
	}
	c2, s2 := p.connect(t)
	mustSMC(t, c2, s2)
	if got := connInfo(t, p.srv, s2).RMBSize; got != 32<<10 {
		t.Fatalf("server RMB of the next connection %d, want 32 KiB", got)
	}
	if got := connInfo(t, p.cli, c2).PeerRMB; got != 32<<10 {
		t.Fatalf("client's view of the peer RMB %d, want 32 KiB", got)
	}
	if got := connInfo(t, p.srv, s1).RMBSize; got != defaultRMB {
		t.Fatalf("the established connection's RMB changed to %d", got)
	}
	// Data flows through the smaller ring, wrapping it.
	go func() { io.Copy(s2, s2); s2.CloseWrite() }()
	stream(t, c2, c2, 200<<10, 7)

	for _, bad := range []int{-1, maxRMB + 1} {
		if err := p.srv.SetRMBSize(bad); !errors.Is(err, ErrConfig) {
			t.Errorf("SetRMBSize(%d): %v, want ErrConfig", bad, err)
		}
	}
	if err := p.srv.SetRMBSize(0); err != nil || p.srv.Settings().RMBSize != defaultRMB {
		t.Fatalf("SetRMBSize(0): %v, size %d, want the default", err, p.srv.Settings().RMBSize)
	}
}

func TestSetCLCTimeout(t *testing.T) {
	e := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft)}) // test default: 2 s
	if err := e.SetCLCTimeout(100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// A server that accepts and never answers the proposal.
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	addr := rawServer(t, func(c net.Conn) { <-hold; c.Close() })
	start := time.Now()
	c, err := e.Dial(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if took := time.Since(start); took > time.Second {
		t.Fatalf("the handshake waited %v: SetCLCTimeout(100ms) not in effect", took)
	}
	if d := c.Decline(); c.Mode() != ModeFallback || d.Code != DeclineTimeoutCLC {
		t.Fatalf("mode %v, decline %+v, want a CLC timeout", c.Mode(), d)
	}

	if err := e.SetCLCTimeout(-time.Second); !errors.Is(err, ErrConfig) {
		t.Fatalf("SetCLCTimeout(-1s): %v, want ErrConfig", err)
	}
	if err := e.SetCLCTimeout(0); err != nil || e.Settings().CLCTimeout != 6*time.Second {
		t.Fatalf("SetCLCTimeout(0): %v, %v, want the 6 s default", err, e.Settings().CLCTimeout)
	}
}

// TestTransferCounters checks what smcrctl shows after a transfer: the cursors of
// both ends, the bytes of the links each way, the size histograms, and that
// ResetStats zeroes the histograms.
func TestTransferCounters(t *testing.T) {
	p := memPair(t)
	if err := p.srv.SetRMBSize(32 << 10); err != nil {
		t.Fatal(err)
	}
	if err := p.cli.SetRMBSize(64 << 10); err != nil {
		t.Fatal(err)
	}
	c, s := p.connect(t)
	mustSMC(t, c, s)

	// 3 small writes and one of 20000 bytes: 23000 bytes, no wrap of the 32 KiB ring.
	const total = 3*1000 + 20000
	for _, n := range []int{1000, 1000, 1000, 20000} {
		if _, err := c.Write(make([]byte, n)); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 4096)
	reads := uint64(0)
	for got := 0; got < total; {
		n, err := s.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got += n
		reads++
	}

	sci, cci := connInfo(t, p.srv, s), connInfo(t, p.cli, c)
	want := rmb.Cursor{Count: total}
	if sci.RxProd != want || sci.RxCons != want {
		t.Errorf("server rx cursors prod %v cons %v, want %v", sci.RxProd, sci.RxCons, want)
	}
	if cci.TxProd != want {
		t.Errorf("client tx producer %v, want %v", cci.TxProd, want)
	}
	if cci.TxCons.Count > total || cci.TxCons.Wrap != 0 {
		t.Errorf("client's view of the peer's consumer cursor %v is past %v", cci.TxCons, want)
	}
	if sci.Token == 0 || sci.PeerToken != cci.Token || cci.PeerToken != sci.Token {
		t.Errorf("tokens: server %#x/%#x, client %#x/%#x", sci.Token, sci.PeerToken, cci.Token, cci.PeerToken)
	}

	// Link bytes: the client RDMA-wrote them, the server's CDCs announced them.
	cl, sl := p.cli.LinkGroups()[0].Links[0], p.srv.LinkGroups()[0].Links[0]
	if cl.TxBytes != total || sl.RxBytes != total {
		t.Errorf("link bytes: client tx %d, server rx %d, want %d", cl.TxBytes, sl.RxBytes, total)
	}
	if cl.RxBytes != 0 || sl.TxBytes != 0 {
		t.Errorf("link bytes the other way: client rx %d, server tx %d, want 0", cl.RxBytes, sl.TxBytes)
	}

	// Histograms: buffer sizes by connection, request sizes by call.
	cs, ss := p.cli.Stats(), p.srv.Stats()
	if want := (SizeHistogram{3: 1}); cs.RxBufSizes != want {
		t.Errorf("client RMB sizes %v, want one 64K", cs.RxBufSizes)
	}
	if want := (SizeHistogram{2: 1}); cs.TxBufSizes != want || ss.RxBufSizes != want {
		t.Errorf("32K buffers: client send buffers %v, server RMBs %v, want one 32K each", cs.TxBufSizes, ss.RxBufSizes)
	}
	if want := (SizeHistogram{0: 3, 2: 1}); cs.TxReqSizes != want {
		t.Errorf("client write sizes %v, want 3 up to 8K and 1 up to 32K", cs.TxReqSizes)
	}
	if got := ss.RxReqSizes[0]; got != reads || ss.RxReqSizes != (SizeHistogram{0: reads}) {
		t.Errorf("server read sizes %v, want %d reads up to 8K", ss.RxReqSizes, reads)
	}

	p.cli.ResetStats()
	cs = p.cli.Stats()
	if cs.RxBufSizes != (SizeHistogram{}) || cs.TxBufSizes != (SizeHistogram{}) || cs.TxReqSizes != (SizeHistogram{}) || cs.TxBytes != 0 {
		t.Errorf("after ResetStats: %+v", cs)
	}
	if cs.MemoryPeak != cs.MemoryInUse || cs.MemoryInUse == 0 {
		t.Errorf("after ResetStats memory peak %d, in use %d: the peak starts again from the use", cs.MemoryPeak, cs.MemoryInUse)
	}
}

// TestServerMemoryBeforeAccept: a server with room for its RMB but not for the
// send buffer beside even the smallest one declines before its Accept, so the
// client falls back cleanly; a Decline after the client's Confirm would end the
// client's connection instead.
func TestServerMemoryBeforeAccept(t *testing.T) {
	p := memPair(t)
	if err := p.srv.SetMaxMemory(defaultRMB + minRMB - 1); err != nil {
		t.Fatal(err)
	}
	c, s := p.connect(t)
	if d := c.Decline(); c.Mode() != ModeFallback || d.Code != clc.DeclineNoMemory || d.Side != SidePeer {
		t.Fatalf("client: mode %v, decline %+v; want a fallback for the peer's insufficient memory", c.Mode(), d)
	}
	if d := s.Decline(); d.Code != clc.DeclineNoMemory || d.Side != SideLocal {
		t.Fatalf("server decline %+v", d)
	}
	echoCheck(t, c, s)
	if st := p.srv.Stats(); st.MemoryInUse != 0 || st.MemoryPeak != 0 || st.RxDowngrades != 0 {
		t.Errorf("server memory in use %d, peak %d, downgrades %d: want nothing held", st.MemoryInUse, st.MemoryPeak, st.RxDowngrades)
	}
}

// TestRMBDowngrade: an end whose max_memory cannot hold an RMB of the
// configured size beside its send buffer takes the largest smaller RMB that
// fits, as Linux's smc_buf_create, and counts a downgrade: the connection runs
// over SMC-R (every byte through the smaller ring), within max_memory.
func TestRMBDowngrade(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int64 // of the downgrading end; the peer's is unlimited
		want  int   // its RMB
	}{
		{"server", defaultRMB * 3 / 2, defaultRMB / 2}, // send buffer held at the configured size
		{"client", defaultRMB + defaultRMB/4, defaultRMB / 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := memPair(t)
			e := p.srv
			if tc.name == "client" {
				e = p.cli
			}
			if err := e.SetMaxMemory(tc.limit); err != nil {
				t.Fatal(err)
			}
			c, s := p.connect(t)
			mustSMC(t, c, s)
			conn := s
			if tc.name == "client" {
				conn = c
			}
			if got := connInfo(t, e, conn).RMBSize; got != tc.want {
				t.Errorf("RMB of %d bytes, want %d", got, tc.want)
			}
			exchangeAll(t, c, s, 3*defaultRMB, 3*defaultRMB)
			st := e.Stats()
			if st.RxDowngrades != 1 {
				t.Errorf("%d downgrades counted, want 1", st.RxDowngrades)
			}
			if st.MemoryPeak > tc.limit {
				t.Errorf("memory peaked at %d bytes, over max_memory %d", st.MemoryPeak, tc.limit)
			}
			if ps := p.cli.Stats().RxDowngrades + p.srv.Stats().RxDowngrades; ps != 1 {
				t.Errorf("%d downgrades on both ends, want the one", ps)
			}
		})
	}
}

// TestReusedCountsSMCROnly: Stats.Reused counts connections that went SMC-R
// on a link group that existed, not setups that reserved one and fell back.
func TestReusedCountsSMCROnly(t *testing.T) {
	p := memPair(t)
	c1, s1 := p.connect(t)
	mustSMC(t, c1, s1)
	if err := p.srv.SetMaxMemory(1); err != nil {
		t.Fatal(err)
	}
	c2, s2 := p.connect(t) // the group is reserved, then the server declines
	if c2.Mode() != ModeFallback {
		t.Fatalf("second connection %v, want a fallback for memory", c2.Mode())
	}
	echoCheck(t, c2, s2)
	if err := p.srv.SetMaxMemory(0); err != nil {
		t.Fatal(err)
	}
	c3, s3 := p.connect(t)
	mustSMC(t, c3, s3)
	for _, e := range []*Engine{p.cli, p.srv} {
		if st := e.Stats(); st.Reused != 1 || st.FirstContact != 1 {
			t.Errorf("reused %d, first contacts %d; want 1 and 1", st.Reused, st.FirstContact)
		}
	}
}
