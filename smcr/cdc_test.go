package smcr

import (
	"bytes"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// TestCDCOrder streams both ways on each of four connections with small RMBEs, so
// writers' CDCs and readers' consumer updates are sent at once from both ends:
// every CDC must arrive numbered one after the last (one link: RC keeps order).
func TestCDCOrder(t *testing.T) {
	cfg := func() Config { return Config{Devices: memDevices(t, verbs.KindSoft), RMBSize: 16 << 10} }
	p := newPair(t, cfg(), cfg())
	var cdcs, gaps atomic.Int64
	hook := func(c *Conn, m *rmb.CDC) {
		cdcs.Add(1)
		if c.rxSeqSet && m.Seq != c.rxSeq+1 {
			gaps.Add(1)
		}
	}
	testHookCDC.Store(&hook)
	t.Cleanup(func() { testHookCDC.Store(nil) })
	conns := p.connectSMC(t, 4)
	streamPairs(t, conns, 4<<20, 7, func() {})
	if n := gaps.Load(); n != 0 {
		t.Errorf("%d of %d CDCs out of sequence", n, cdcs.Load())
	}
	for _, e := range []*Engine{p.cli, p.srv} {
		if n := e.Stats().CDCStale; n != 0 {
			t.Errorf("%d CDCs dropped as stale", n)
		}
	}
	p.closeAll(t, conns)
}

// TestStaleCDCDropped: a CDC numbered before the last one taken is dropped, even
// one that says abnormal close; a failover validation (Linux's: zero cursors)
// moves no cursor and is answered with ours.
func TestStaleCDCDropped(t *testing.T) {
	p := memPair(t)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	echoOK(t, c, s)
	c.mu.Lock()
	last := c.rxSeq
	c.mu.Unlock()
	before := p.cli.Stats().CDCStale
	if err := s.lnk.sendCDC(&rmb.CDC{Seq: last - 1, Token: c.token, State: rmb.StateAbnormalClose}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "stale CDC counted", func() bool { return p.cli.Stats().CDCStale == before+1 })
	echoOK(t, c, s)

	sent := p.cli.Stats().CDCSent
	if err := s.lnk.sendCDC(&rmb.CDC{Seq: last, Token: c.token, Flags: rmb.FlagFailoverValidation}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "validation answered", func() bool { return p.cli.Stats().CDCSent > sent })
	echoOK(t, c, s)
	if n := p.cli.Stats().ProtoErrors; n != 0 {
		t.Errorf("%d protocol errors", n)
	}
}

// TestNoUpdateAfterClose: a consumer update the peer asks for after our Close is
// not sent: our closing CDC carried the cursors, which no longer move, and a CDC
// after it could reach a peer that has let the connection go.
func TestNoUpdateAfterClose(t *testing.T) {
	p := memPair(t)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	echoOK(t, c, s)
	d, ds := p.connect(t) // behind c in its link's worker queue
	mustSMC(t, d, ds)
	if d.lnk != c.lnk {
		t.Fatal("a second connection on another link")
	}
	c.Close()
	eventually(t, "close seen", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.closing.peerClosed
	})
	sent, recv := c.cs.cdcSent.Load(), c.cs.cdcRecv.Load()
	c.mu.Lock()
	next := c.rxSeq + 1
	c.mu.Unlock()
	if err := s.lnk.sendCDC(&rmb.CDC{Seq: next, Token: c.token, Flags: rmb.FlagUpdateRequested}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "request received", func() bool { return c.cs.cdcRecv.Load() > recv })
	// onCDC queued c for the worker under c.mu: the barrier comes after it.
	c.mu.Lock()
	//lint:ignore SA2001 waiting for onCDC to release c.mu is the point
	c.mu.Unlock()
	linkBarrier(t, d, ds)
	if n := c.cs.cdcSent.Load() - sent; n != 0 {
		t.Errorf("%d CDCs sent after the closing one", n)
	}
}

// TestNoCursorsAfterClose: a Read that owes a consumer update and finds itself
// overtaken by a Close before its CDC goes sends none: the closing CDC, sent
// after the count, carried those cursors. A Close that comes while a Write
// posts a chunk waits for it: the chunk's CDC goes first, none after the
// closing one.
func TestNoCursorsAfterClose(t *testing.T) {
	for _, side := range []string{"write", "read"} {
		t.Run(side, func(t *testing.T) {
			p := memPair(t)
			c, s := p.connect(t)
			mustSMC(t, c, s)
			echoOK(t, c, s)
			d, ds := p.connect(t) // for linkBarrier
			mustSMC(t, d, ds)
			msg := make([]byte, c.rx.Size()/2) // past the 10% rule: Read owes an update
			if side == "read" {
				go s.Write(msg)
			}
			var closed atomic.Bool
			var sentAtClose atomic.Uint64
			closeDone := make(chan struct{})
			hook := func(h *Conn) {
				if h != c || !closed.CompareAndSwap(false, true) {
					return
				}
				if side == "read" {
					c.Close() // between the count and the CDC that would announce it
					sentAtClose.Store(c.cs.cdcSent.Load())
					close(closeDone)
					return
				}
				// The Write holds its chunk (txBusy): Close waits for it.
				go func() {
					c.Close()
					sentAtClose.Store(c.cs.cdcSent.Load())
					close(closeDone)
				}()
				eventually(t, "Close under way", func() bool {
					c.mu.Lock()
					defer c.mu.Unlock()
					return c.closing.appClosed
				})
			}
			testHookCursors.Store(&hook)
			t.Cleanup(func() { testHookCursors.Store(nil) })
			var err error
			if side == "write" {
				_, err = c.Write(msg)
			} else {
				_, err = io.ReadFull(c, msg)
			}
			if err != nil {
				t.Fatal(err)
			}
			if !closed.Load() {
				t.Fatal("no cursor CDC was about to go")
			}
			<-closeDone
			linkBarrier(t, d, ds)
			if n := c.cs.cdcSent.Load() - sentAtClose.Load(); n != 0 {
				t.Errorf("%d CDCs sent after the closing one", n)
			}
			if side == "write" { // the chunk's CDC announced the bytes, then the close
				got, err := io.ReadAll(s)
				if err != nil || !bytes.Equal(got, msg) {
					t.Fatalf("peer read %d of %d bytes: %v", len(got), len(msg), err)
				}
			}
			eventually(t, "peer saw the close", func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				return s.closing.peerClosed
			})
		})
	}
}

// TestLateWritesFromStandardPeer plays a Linux writer whose close gave up on its
// send buffer (lateWrites): it fills our RMBE, says closed, and writes the rest
// once our reader gives it room. From a standard peer those bytes are the
// stream's tail; from one of ours they are a protocol error. The RMB of a
// connection that gave such a peer room outlives its release, and goes as the
// engine closes.
func TestLateWritesFromStandardPeer(t *testing.T) {
	for _, standard := range []bool{true, false} {
		t.Run(map[bool]string{true: "standard", false: "smcr"}[standard], func(t *testing.T) {
			cfg := func() Config { return Config{Devices: memDevices(t, verbs.KindSoft), RMBSize: 64 << 10} }
			p := newPair(t, cfg(), cfg())
			c, s := p.connect(t)
			mustSMC(t, c, s)
			c.mu.Lock()
			c.cont.smcx = !standard
			size := uint64(c.rx.Size())
			c.mu.Unlock()
			// Fill the RMBE; the reader does not read yet.
			body := make([]byte, size)
			for i := range body {
				body[i] = byte(i * 7)
			}
			if _, err := s.Write(body); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the RMBE full", func() bool {
				c.mu.Lock()
				defer c.mu.Unlock()
				return c.rx.PeerProducerPos() == size
			})
			// Its close, as Linux sends it with bytes still unsent.
			c.mu.Lock()
			closeCDC := rmb.CDC{Seq: c.rxSeq + 1, Token: c.token, Prod: rmb.CursorAt(size, uint32(size)),
				State: rmb.StateSendingDone | rmb.StateClosed}
			c.mu.Unlock()
			if err := s.lnk.sendCDC(&closeCDC); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the close taken", func() bool {
				c.mu.Lock()
				defer c.mu.Unlock()
				return c.closing.peerClosed
			})
			tail := []byte("the tail its close left unsent")
			wrote := make(chan error, 1)
			go func() { _, err := s.Write(tail); wrote <- err }() // once we give it room
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			got := make([]byte, size)
			if _, err := io.ReadFull(c, got); err != nil {
				t.Fatal(err)
			}
			if string(got) != string(body) {
				t.Fatal("the body read back differs")
			}
			if !standard {
				// Ours does not write after its close: that is a broken peer.
				if err := within(t, wrote, "the peer's write"); err != nil {
					t.Fatal(err)
				}
				eventually(t, "the connection aborted", func() bool {
					_, err := c.Read(make([]byte, 1))
					return errors.Is(err, ErrProtocol)
				})
				return
			}
			eventually(t, "the tail landed", func() bool {
				c.mu.Lock()
				defer c.mu.Unlock()
				return c.rx.PeerProducerPos() == size+uint64(len(tail))
			})
			rest, err := io.ReadAll(c)
			if err != nil || string(rest) != string(tail) {
				t.Fatalf("after the body: %q, %v; want %q and EOF", rest, err, tail)
			}
			if err := within(t, wrote, "the peer's write"); err != nil {
				t.Fatal(err)
			}
			// Released, its RMB stays ours, neither pooled nor freed.
			c.Close()
			s.Close()
			// The release marks the connection released, then gives its
			// buffers back: wait for the send buffer's share.
			eventually(t, "released", func() bool {
				c.mu.Lock()
				released := c.closing.released
				c.mu.Unlock()
				return released && p.cli.Stats().MemoryInUse <= int64(size)
			})
			if st := p.cli.Stats(); st.MemoryInUse != int64(size) {
				t.Errorf("memory in use after the release %d, want the RMB's %d", st.MemoryInUse, size)
			}
			start := time.Now()
			p.cli.Close()
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("Close took %v with an RMB held for late writes", d)
			}
			if st := p.cli.Stats(); st.MemoryInUse != 0 {
				t.Errorf("memory in use after Close %d", st.MemoryInUse)
			}
		})
	}
}

// TestNoDataAfterEOF: a peer of ours whose sending-done announced its last
// byte, and then announces more, is broken: the reader, which may have returned
// EOF already, gets ErrProtocol, never bytes after its EOF. (Standard peers may
// write after their sending-done, and after a close that found our RMBE full:
// TestLateWritesFromStandardPeer.)
func TestNoDataAfterEOF(t *testing.T) {
	p := memPair(t)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	if _, err := s.Write([]byte("all")); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(c); err != nil || string(b) != "all" {
		t.Fatalf("read %q, %v", b, err)
	}
	// Three bytes more, announced as the hostile peer would.
	c.mu.Lock()
	more := rmb.CDC{Seq: c.rxSeq + 1, Token: c.token, Prod: rmb.CursorAt(c.rx.PeerProducerPos()+3, c.rx.Size()), State: rmb.StateSendingDone}
	c.mu.Unlock()
	if err := s.lnk.sendCDC(&more); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the CDC taken", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.rxSeq == more.Seq
	})
	if n, err := c.Read(make([]byte, 10)); !errors.Is(err, ErrProtocol) {
		t.Fatalf("read after EOF: %d bytes, %v; want ErrProtocol", n, err)
	}
}

// linkBarrier returns once the worker of d's link is done with what it was
// given before, and the peer has taken what the link posted before: d, a
// connection on the link, has the worker send an update, and d's peer ds takes
// it. CDCs on one link arrive in order.
func linkBarrier(t *testing.T, d, ds *Conn) {
	t.Helper()
	recv := ds.cs.cdcRecv.Load()
	d.mu.Lock()
	d.queueCtlLocked(ctlUpdate)
	d.mu.Unlock()
	eventually(t, "the link's barrier", func() bool { return ds.cs.cdcRecv.Load() > recv })
}
