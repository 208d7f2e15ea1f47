// Focused tests of the shm provider: data paths, access checks, RNR, flush, and a
// peer that writes nonsense into the shared queues.

package shm

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"math"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/verbstest"
	"golang.org/x/sys/unix"
)

// end is one side of a connected test pair.
type end struct {
	dev  verbs.Device
	pd   verbs.PD
	scq  verbs.CQ
	rcq  verbs.CQ
	qp   verbs.QP
	buf  verbs.MR // local scratch, local write only
	rmb  verbs.MR // remote write
	ronl verbs.MR // remote read only
}

func openDev(t testing.TB, dir string) verbs.Device {
	t.Helper()
	d, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func newEnd(t testing.TB, d verbs.Device, cfg verbs.QPConfig) *end {
	t.Helper()
	e := &end{dev: d}
	var err error
	if e.pd, err = d.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.scq, err = d.CreateCQ(64); err != nil {
		t.Fatal(err)
	}
	if e.rcq, err = d.CreateCQ(64); err != nil {
		t.Fatal(err)
	}
	cfg.SendCQ, cfg.RecvCQ = e.scq, e.rcq
	if e.qp, err = e.pd.CreateQP(cfg); err != nil {
		t.Fatal(err)
	}
	if e.buf, err = e.pd.AllocMR(1<<20, verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if e.rmb, err = e.pd.AllocMR(1<<20, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	if e.ronl, err = e.pd.AllocMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	return e
}

func connect(t testing.TB, a, b *end) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- b.qp.Connect(ctx, a.qp.Attr()) }()
	if err := a.qp.Connect(ctx, b.qp.Attr()); err != nil {
		t.Fatalf("connect a: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("connect b: %v", err)
	}
}

func pair(t testing.TB, cfg verbs.QPConfig) (a, b *end) {
	t.Helper()
	dir := t.TempDir()
	a = newEnd(t, openDev(t, dir), cfg)
	b = newEnd(t, openDev(t, dir), cfg)
	connect(t, a, b)
	return a, b
}

// next waits for one completion on c.
func next(t testing.TB, c verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wc [1]verbs.WorkCompletion
	for {
		n, err := c.Poll(wc[:])
		if err != nil {
			t.Fatalf("poll: %v", err)
		}
		if n == 1 {
			return wc[0]
		}
		if err := c.Wait(ctx); err != nil {
			t.Fatalf("wait: %v", err)
		}
	}
}

// awaitWoken waits for a sleeping Wait's return, which a completion brings.
func awaitWoken(t testing.TB, woke chan error) {
	t.Helper()
	select {
	case err := <-woke:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the sleeping Wait missed the completion")
	}
}

// none checks that no completion arrives within d.
func none(t testing.TB, c verbs.CQ, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	var wc [1]verbs.WorkCompletion
	for time.Now().Before(deadline) {
		if n, _ := c.Poll(wc[:]); n > 0 {
			t.Fatalf("unexpected completion %+v", wc[0])
		}
		time.Sleep(time.Millisecond)
	}
}

func TestSendRecvInOrder(t *testing.T) {
	a, b := pair(t, verbs.QPConfig{})
	for i := 0; i < 40; i++ {
		if err := b.qp.PostRecv(&verbs.RecvWR{ID: uint64(100 + i), SG: []verbs.SGE{{MR: b.buf, Offset: i * 64, Length: 64}}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 40; i++ {
		copy(a.buf.Bytes()[i*64:], bytes.Repeat([]byte{byte(i)}, 10+i))
		err := a.qp.PostSend(&verbs.SendWR{ID: uint64(i), Opcode: verbs.OpSend, Signaled: i%2 == 0,
			SG: []verbs.SGE{{MR: a.buf, Offset: i * 64, Length: 10 + i}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 40; i++ {
		wc := next(t, b.rcq)
		if wc.ID != uint64(100+i) || wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || wc.ByteLen != uint32(10+i) || wc.HasImm {
			t.Fatalf("recv %d: %+v", i, wc)
		}
		if got := b.buf.Bytes()[i*64 : i*64+10+i]; !bytes.Equal(got, bytes.Repeat([]byte{byte(i)}, 10+i)) {
			t.Fatalf("recv %d payload %x", i, got)
		}
	}
	for i := 0; i < 40; i += 2 {
		if wc := next(t, a.scq); wc.ID != uint64(i) || wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCSend {
			t.Fatalf("send completion %d: %+v", i, wc)
		}
	}
	none(t, a.scq, 5*time.Millisecond)
}

func TestWriteAndWriteImm(t *testing.T) {
	a, b := pair(t, verbs.QPConfig{})
	src := a.buf.Bytes()
	for i := range 200000 {
		src[i] = byte(i * 7)
	}
	// Two gather elements land back to back at address+offset.
	err := a.qp.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Signaled: true, RKey: b.rmb.RKey(), RemoteAddr: b.rmb.Addr() + 1000,
		SG: []verbs.SGE{{MR: a.buf, Offset: 0, Length: 100000}, {MR: a.buf, Offset: 150000, Length: 50000}}})
	if err != nil {
		t.Fatal(err)
	}
	if wc := next(t, a.scq); wc.ID != 1 || wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCWrite {
		t.Fatalf("write completion %+v", wc)
	}
	dst := b.rmb.Bytes()
	if !bytes.Equal(dst[1000:101000], src[:100000]) || !bytes.Equal(dst[101000:151000], src[150000:200000]) {
		t.Fatal("written bytes differ")
	}
	if dst[999] != 0 || dst[151000] != 0 {
		t.Fatal("write spilled outside its range")
	}
	if err := b.qp.PostRecv(&verbs.RecvWR{ID: 9}); err != nil {
		t.Fatal(err)
	}
	copy(src, "immediate data")
	err = a.qp.PostSend(&verbs.SendWR{ID: 2, Opcode: verbs.OpWriteImm, Imm: 0xdeadbeef, RKey: b.rmb.RKey(), RemoteAddr: b.rmb.Addr() + 5,
		SG: []verbs.SGE{{MR: a.buf, Length: 14}}})
	if err != nil {
		t.Fatal(err)
	}
	wc := next(t, b.rcq)
	if wc.ID != 9 || wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecvRDMAImm || !wc.HasImm || wc.Imm != 0xdeadbeef || wc.ByteLen != 14 {
		t.Fatalf("write imm at responder: %+v", wc)
	}
	if string(dst[5:19]) != "immediate data" {
		t.Fatalf("write imm data %q", dst[5:19])
	}
	none(t, a.scq, 5*time.Millisecond) // unsignaled
}

func TestRemoteAccessErrors(t *testing.T) {
	cases := []struct {
		name string
		wr   func(b *end) verbs.SendWR
	}{
		{"bad rkey", func(b *end) verbs.SendWR {
			return verbs.SendWR{RKey: b.rmb.RKey() + 1000, RemoteAddr: b.rmb.Addr()}
		}},
		{"past the end", func(b *end) verbs.SendWR {
			return verbs.SendWR{RKey: b.rmb.RKey(), RemoteAddr: b.rmb.Addr() + 1<<20 - 10}
		}},
		{"before the start", func(b *end) verbs.SendWR {
			return verbs.SendWR{RKey: b.rmb.RKey(), RemoteAddr: b.rmb.Addr() - 1}
		}},
		{"no remote write", func(b *end) verbs.SendWR {
			return verbs.SendWR{RKey: b.ronl.RKey(), RemoteAddr: b.ronl.Addr()}
		}},
		{"local only", func(b *end) verbs.SendWR {
			return verbs.SendWR{RKey: b.buf.RKey(), RemoteAddr: b.buf.Addr()}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := pair(t, verbs.QPConfig{})
			copy(a.buf.Bytes(), bytes.Repeat([]byte{0xAA}, 64))
			wr := c.wr(b)
			wr.ID, wr.Opcode, wr.SG = 7, verbs.OpWrite, []verbs.SGE{{MR: a.buf, Length: 64}}
			if err := a.qp.PostSend(&wr); err != nil {
				t.Fatal(err)
			}
			if wc := next(t, a.scq); wc.ID != 7 || wc.Status != verbs.WCRemAccessErr {
				t.Fatalf("completion %+v, want remote access error", wc)
			}
			for _, m := range []verbs.MR{b.rmb, b.ronl, b.buf} {
				if bytes.IndexByte(m.Bytes(), 0xAA) >= 0 {
					t.Fatal("bytes written despite the error")
				}
			}
			if a.qp.State() != verbs.QPError {
				t.Fatalf("requester state %v", a.qp.State())
			}
		})
	}
}

func TestRNR(t *testing.T) {
	t.Run("retry exceeded", func(t *testing.T) {
		a, _ := pair(t, verbs.QPConfig{RNRRetry: 2})
		start := time.Now()
		a.qp.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: a.buf, Length: 8}}})
		a.qp.PostSend(&verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Signaled: true, SG: []verbs.SGE{{MR: a.buf, Length: 8}}})
		if wc := next(t, a.scq); wc.ID != 1 || wc.Status != verbs.WCRNRRetryExcErr {
			t.Fatalf("completion %+v, want RNR retry exceeded", wc)
		}
		if el := time.Since(start); el < 3*time.Millisecond {
			t.Fatalf("RNR reported after %v, before three RNR timers", el)
		}
		if wc := next(t, a.scq); wc.ID != 2 || wc.Status != verbs.WCWRFlushErr {
			t.Fatalf("completion %+v, want flush", wc)
		}
	})
	t.Run("late receive", func(t *testing.T) {
		a, b := pair(t, verbs.QPConfig{RNRRetry: 7})
		a.qp.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Signaled: true, SG: []verbs.SGE{{MR: a.buf, Length: 8}}})
		none(t, a.scq, 20*time.Millisecond)
		b.qp.PostRecv(&verbs.RecvWR{ID: 5, SG: []verbs.SGE{{MR: b.buf, Length: 8}}})
		if wc := next(t, a.scq); wc.ID != 1 || wc.Status != verbs.WCSuccess {
			t.Fatalf("completion %+v", wc)
		}
		if wc := next(t, b.rcq); wc.ID != 5 || wc.Status != verbs.WCSuccess || wc.ByteLen != 8 {
			t.Fatalf("completion %+v", wc)
		}
	})
}

func TestRecvTooSmall(t *testing.T) {
	a, b := pair(t, verbs.QPConfig{})
	b.qp.PostRecv(&verbs.RecvWR{ID: 5, SG: []verbs.SGE{{MR: b.buf, Length: 4}}})
	b.qp.PostRecv(&verbs.RecvWR{ID: 6, SG: []verbs.SGE{{MR: b.buf, Length: 4}}})
	a.qp.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: a.buf, Length: 8}}})
	if wc := next(t, b.rcq); wc.ID != 5 || wc.Status != verbs.WCLocLenErr {
		t.Fatalf("responder %+v, want local length error", wc)
	}
	if wc := next(t, b.rcq); wc.ID != 6 || wc.Status != verbs.WCWRFlushErr {
		t.Fatalf("responder %+v, want flush", wc)
	}
	if wc := next(t, a.scq); wc.ID != 1 || wc.Status != verbs.WCRemInvReqErr {
		t.Fatalf("requester %+v, want remote invalid request", wc)
	}
}

func TestCloseFlushes(t *testing.T) {
	a, b := pair(t, verbs.QPConfig{RNRRetry: 7})
	a.qp.PostRecv(&verbs.RecvWR{ID: 11, SG: []verbs.SGE{{MR: a.buf, Length: 8}}})
	// b posts no receive: the SEND waits (RNR retry 7) until b goes away.
	a.qp.PostSend(&verbs.SendWR{ID: 12, Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: a.buf, Length: 8}}})
	none(t, a.scq, 5*time.Millisecond)
	b.qp.Close()
	if wc := next(t, a.scq); wc.ID != 12 || wc.Status != verbs.WCWRFlushErr {
		t.Fatalf("send after peer close: %+v", wc)
	}
	if wc := next(t, a.rcq); wc.ID != 11 || wc.Status != verbs.WCWRFlushErr {
		t.Fatalf("recv after peer close: %+v", wc)
	}
	if a.qp.State() != verbs.QPError {
		t.Fatalf("state %v", a.qp.State())
	}
	if err := a.qp.PostSend(&verbs.SendWR{ID: 13, Opcode: verbs.OpSend}); err != nil {
		t.Fatal(err)
	}
	if wc := next(t, a.scq); wc.ID != 13 || wc.Status != verbs.WCWRFlushErr {
		t.Fatalf("post in error %+v", wc)
	}
	// Destroying a QP flushes its own receives too.
	c, _ := pair(t, verbs.QPConfig{})
	c.qp.PostRecv(&verbs.RecvWR{ID: 21})
	c.qp.Close()
	if wc := next(t, c.rcq); wc.ID != 21 || wc.Status != verbs.WCWRFlushErr {
		t.Fatalf("closed end %+v", wc)
	}
}

func TestPostErrors(t *testing.T) {
	dir := t.TempDir()
	// RNR retry 7: b posts no receive, and the sends must stay outstanding rather
	// than be NAKed (and the QP put in error) before the third post.
	a := newEnd(t, openDev(t, dir), verbs.QPConfig{MaxSendWR: 2, MaxRecvWR: 1, RNRRetry: 7})
	if err := a.qp.PostSend(&verbs.SendWR{Opcode: verbs.OpSend}); !errors.Is(err, verbs.ErrQPState) {
		t.Fatalf("send before connect: %v", err)
	}
	b := newEnd(t, openDev(t, dir), verbs.QPConfig{})
	connect(t, a, b)
	if err := a.qp.PostSend(&verbs.SendWR{Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: a.buf, Offset: 1 << 20, Length: 1}}}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("sge outside region: %v", err)
	}
	if err := a.qp.PostSend(&verbs.SendWR{Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: b.buf, Length: 1}}}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("sge of another pd: %v", err)
	}
	if err := a.qp.PostSend(&verbs.SendWR{Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: a.buf, Length: 1 << 16}}}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("oversized send: %v", err)
	}
	for i := range 2 {
		if err := a.qp.PostSend(&verbs.SendWR{Opcode: verbs.OpSend}); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	if err := a.qp.PostSend(&verbs.SendWR{Opcode: verbs.OpSend}); !errors.Is(err, verbs.ErrQueueFull) {
		t.Fatalf("third send on a 2-deep queue: %v", err)
	}
	a.qp.PostRecv(&verbs.RecvWR{})
	if err := a.qp.PostRecv(&verbs.RecvWR{}); !errors.Is(err, verbs.ErrQueueFull) {
		t.Fatalf("second recv on a 1-deep queue: %v", err)
	}
}

func TestNotSameHost(t *testing.T) {
	dir := t.TempDir()
	a := newEnd(t, openDev(t, dir), verbs.QPConfig{})
	attr := a.qp.Attr()
	ep, err := parseEndpoint(attr.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	other := ep
	other.boot[0] ^= 1
	b := newEnd(t, openDev(t, dir), verbs.QPConfig{})
	attr.Endpoint = other.append(nil)
	if err := b.qp.Connect(context.Background(), attr); !errors.Is(err, ErrNotSameHost) {
		t.Fatalf("other boot id: %v", err)
	}
	other = ep
	other.ino++
	attr.Endpoint = other.append(nil)
	if err := b.qp.Connect(context.Background(), attr); !errors.Is(err, ErrNotSameHost) {
		t.Fatalf("other socket inode: %v", err)
	}
}

// TestReachable is the engine's question before it chooses shm for a peer.
func TestReachable(t *testing.T) {
	dir := t.TempDir()
	a, b := openDev(t, dir), openDev(t, dir)
	r, ok := b.(interface{ Reachable([]byte) bool })
	if !ok {
		t.Fatal("shm device has no Reachable method")
	}
	if !r.Reachable(a.Endpoint()) || !r.Reachable(b.Endpoint()) {
		t.Fatal("a device on this host is not reachable")
	}
	ep, err := parseEndpoint(a.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	other := ep
	other.boot[0] ^= 1
	if r.Reachable(other.append(nil)) {
		t.Fatal("another host's boot id is reachable")
	}
	other = ep
	other.ino++
	if r.Reachable(other.append(nil)) {
		t.Fatal("another socket at the same path is reachable")
	}
	if r.Reachable([]byte("SHM1")) || r.Reachable(nil) {
		t.Fatal("a malformed endpoint is reachable")
	}
}

// TestGrantedAccess maps what a peer is handed, as a hostile peer would try.
func TestGrantedAccess(t *testing.T) {
	dir := t.TempDir()
	b := newEnd(t, openDev(t, dir), verbs.QPConfig{})
	q := b.qp.(*qp)
	for _, c := range []struct {
		m         verbs.MR
		ok, write bool
	}{{b.rmb, true, true}, {b.ronl, true, false}, {b.buf, false, false}} {
		fd, ok, _, err := c.m.(*mr).grant(q)
		if err != nil || ok != c.ok {
			t.Fatalf("grant %v: ok %v err %v", c.m.Access(), ok, err)
		}
		if !ok {
			continue
		}
		mem, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if c.write != (err == nil) {
			t.Fatalf("writable mapping of a region with access %v: err %v", c.m.Access(), err)
		}
		if err == nil {
			unix.Munmap(mem)
		}
		if err := unix.Ftruncate(fd, 0); err == nil {
			t.Fatal("peer could shrink a region")
		}
		unix.Close(fd)
	}
	// A region of another PD is never handed out.
	other := newEnd(t, b.dev, verbs.QPConfig{})
	if _, ok, _, _ := other.rmb.(*mr).grant(q); ok {
		t.Fatal("region of another PD granted")
	}
}

// TestHostilePeerRing writes nonsense into the peer's view of the shared queues:
// the QP it targets goes to ERROR, another QP between the same devices goes on.
func TestHostilePeerRing(t *testing.T) {
	corrupt := []struct {
		name string
		do   func(seg []byte, q *qp)
	}{
		{"head far ahead", func(seg []byte, q *qp) { u64(seg, segOffHead).Store(1 << 40) }},
		{"bad opcode", func(seg []byte, q *qp) {
			seg[segHdrLen] = 99
			u64(seg, segOffHead).Store(1)
		}},
		{"send longer than slot", func(seg []byte, q *qp) {
			putSlot(seg[segHdrLen:], slotHdr{op: slotOpSend, len: 1 << 30})
			u64(seg, segOffHead).Store(1)
		}},
		{"tail beyond head", func(seg []byte, q *qp) { u64(seg, segOffTail).Store(77) }},
		{"nak for nothing", func(seg []byte, q *qp) { u32(seg, segOffNakCode).Store(uint32(verbs.WCRemOpErr)) }},
	}
	for _, c := range corrupt {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			da, db := openDev(t, dir), openDev(t, dir)
			a, b := newEnd(t, da, verbs.QPConfig{}), newEnd(t, db, verbs.QPConfig{})
			a2, b2 := newEnd(t, da, verbs.QPConfig{}), newEnd(t, db, verbs.QPConfig{})
			connect(t, a, b)
			connect(t, a2, b2)
			b.qp.PostRecv(&verbs.RecvWR{ID: 1, SG: []verbs.SGE{{MR: b.buf, Length: 64}}})
			a.qp.PostRecv(&verbs.RecvWR{ID: 1, SG: []verbs.SGE{{MR: a.buf, Length: 64}}})
			// a plays the hostile peer: it scribbles on its own segment, which b reads,
			// and on b's segment where a is the writer of tail and NAK.
			qa := a.qp.(*qp)
			qa.sqMu.Lock()
			if c.name == "tail beyond head" || c.name == "nak for nothing" {
				c.do(qa.pseg.mem, qa)
			} else {
				c.do(qa.seg.mem, qa)
			}
			qa.sqMu.Unlock()
			victim := b
			if c.name == "tail beyond head" || c.name == "nak for nothing" {
				// b reads its own segment's tail/nak when it next looks at acks.
				victim = b
			}
			deadline := time.Now().Add(3 * time.Second)
			var wc [4]verbs.WorkCompletion
			for victim.qp.State() != verbs.QPError && time.Now().Before(deadline) {
				victim.scq.Poll(wc[:])
				victim.rcq.Poll(wc[:])
				time.Sleep(time.Millisecond)
			}
			if victim.qp.State() != verbs.QPError {
				t.Fatalf("victim state %v after hostile write", victim.qp.State())
			}
			// The other QP pair is untouched.
			b2.qp.PostRecv(&verbs.RecvWR{ID: 3, SG: []verbs.SGE{{MR: b2.buf, Length: 64}}})
			copy(a2.buf.Bytes(), "still fine")
			a2.qp.PostSend(&verbs.SendWR{ID: 4, Opcode: verbs.OpSend, Signaled: true, SG: []verbs.SGE{{MR: a2.buf, Length: 10}}})
			if wc := next(t, b2.rcq); wc.Status != verbs.WCSuccess || string(b2.buf.Bytes()[:10]) != "still fine" {
				t.Fatalf("other qp: %+v", wc)
			}
		})
	}
}

// TestRevoke: a WRITE after the peer deregistered the region fails, writing nothing.
func TestRevoke(t *testing.T) {
	a, b := pair(t, verbs.QPConfig{})
	wr := verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Signaled: true, RKey: b.rmb.RKey(), RemoteAddr: b.rmb.Addr(),
		SG: []verbs.SGE{{MR: a.buf, Length: 64}}}
	if err := a.qp.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	if wc := next(t, a.scq); wc.Status != verbs.WCSuccess {
		t.Fatalf("first write %+v", wc)
	}
	b.rmb.Close()
	// The revoke travels on the socket; the requester drops the mapping when it
	// next looks at its queues.
	deadline := time.Now().Add(5 * time.Second)
	q := a.qp.(*qp)
	for {
		q.poll()
		q.sqMu.Lock()
		_, mapped := q.remote[b.rmb.RKey()]
		q.sqMu.Unlock()
		if !mapped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("mapping not revoked")
		}
		time.Sleep(time.Millisecond)
	}
	wr.ID = 2
	if err := a.qp.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	if wc := next(t, a.scq); wc.ID != 2 || wc.Status != verbs.WCRemAccessErr {
		t.Fatalf("write to a deregistered region: %+v", wc)
	}
}

// TestHostileControl: garbage on the rendezvous socket and on a QP's socket.
func TestHostileControl(t *testing.T) {
	dir := t.TempDir()
	da, db := openDev(t, dir), openDev(t, dir)
	a, b := newEnd(t, da, verbs.QPConfig{}), newEnd(t, db, verbs.QPConfig{})
	a2, b2 := newEnd(t, da, verbs.QPConfig{}), newEnd(t, db, verbs.QPConfig{})
	// A stranger dials the device and sends nonsense, then a hello for a QP that
	// does not exist: both are dropped.
	ep, _ := parseEndpoint(da.Endpoint())
	for _, msg := range [][]byte{{0xff, 1, 2}, (&ctl{typ: ctlHello, dstQPN: 1, srcQPN: 2}).append(nil)} {
		c, err := dialPeer(context.Background(), ep.path)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(msg)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if n, err := c.Read(make([]byte, 64)); err == nil && n > 0 {
			t.Fatalf("device answered garbage with %d bytes", n)
		}
		c.Close()
	}
	connect(t, a, b)
	connect(t, a2, b2)
	// a's peer sends an unknown control message type on the QP socket.
	qb := b.qp.(*qp)
	qb.bellMu.RLock()
	unix.Sendto(qb.bellFD, []byte{0x7f, 0, 0, 0}, 0, nil)
	qb.bellMu.RUnlock()
	deadline := time.Now().Add(3 * time.Second)
	for a.qp.State() != verbs.QPError && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if a.qp.State() != verbs.QPError {
		t.Fatalf("state %v after a bad control message", a.qp.State())
	}
	b2.qp.PostRecv(&verbs.RecvWR{ID: 3, SG: []verbs.SGE{{MR: b2.buf, Length: 64}}})
	a2.qp.PostSend(&verbs.SendWR{ID: 4, Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: a2.buf, Length: 10}}})
	if wc := next(t, b2.rcq); wc.ID != 3 || wc.Status != verbs.WCSuccess {
		t.Fatalf("other qp: %+v", wc)
	}
}

// TestPollBesideSleepingWait: a Poll from another goroutine while a Wait sleeps on
// the CQ leaves the doorbell armed, so the peer still rings it and the Wait wakes
// on the next completion (the engine's readers poll beside a sleeping poller).
func TestPollBesideSleepingWait(t *testing.T) {
	a, b := pair(t, verbs.QPConfig{})
	q := b.qp.(*qp)
	rcq := b.rcq.(*cq)
	if err := b.qp.PostRecv(&verbs.RecvWR{ID: 7, SG: []verbs.SGE{{MR: b.buf, Length: 64}}}); err != nil {
		t.Fatal(err)
	}
	woke := make(chan error, 1)
	go func() { woke <- rcq.Wait(context.Background()) }()
	deadline := time.Now().Add(5 * time.Second)
	for rcq.sleepers.Load() == 0 || !q.armed.Load() {
		if time.Now().After(deadline) {
			t.Fatal("Wait never went to sleep")
		}
		time.Sleep(100 * time.Microsecond)
	}
	var wc [1]verbs.WorkCompletion
	for range 100 {
		if n, err := rcq.Poll(wc[:]); n != 0 || err != nil {
			t.Fatalf("poll of an idle CQ: %d, %v", n, err)
		}
	}
	if !q.armed.Load() {
		t.Fatal("a Poll disarmed the doorbell a sleeping Wait relies on")
	}
	if err := a.qp.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: a.buf, Length: 8}}}); err != nil {
		t.Fatal(err)
	}
	awaitWoken(t, woke)
	if wc := next(t, b.rcq); wc.ID != 7 || wc.Status != verbs.WCSuccess {
		t.Fatalf("receive completion %+v", wc)
	}
}

// TestDoorbellOncePerSleep: posts to a peer that sleeps ring its doorbell once,
// not once each, until the peer took that doorbell; then the next post rings
// again, so the peer's next sleep is woken too. The peer's doorbell goroutine is
// held (flagMu) before it sets its flag again.
func TestDoorbellOncePerSleep(t *testing.T) {
	a, b := pair(t, verbs.QPConfig{})
	qa, qb := a.qp.(*qp), b.qp.(*qp)
	rcq := b.rcq.(*cq)
	const posts = 5
	for i := range posts + 1 {
		if err := b.qp.PostRecv(&verbs.RecvWR{ID: uint64(i), SG: []verbs.SGE{{MR: b.buf, Length: 64}}}); err != nil {
			t.Fatal(err)
		}
	}
	sleep := func() chan error {
		start := func() chan error {
			woke := make(chan error, 1)
			go func() { woke <- rcq.Wait(context.Background()) }()
			return woke
		}
		woke := start()
		deadline := time.Now().Add(5 * time.Second)
		for rcq.sleepers.Load() == 0 || !qb.armed.Load() || u32(qb.seg.mem, segOffSleep).Load() == 0 {
			select {
			case <-woke: // a wake left from the last completions: Wait again
				woke = start()
			default:
			}
			if time.Now().After(deadline) {
				t.Fatal("Wait never went to sleep")
			}
			time.Sleep(100 * time.Microsecond)
		}
		return woke
	}
	send := func(id uint64) {
		t.Helper()
		if err := a.qp.PostSend(&verbs.SendWR{ID: id, Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: a.buf, Length: 8}}}); err != nil {
			t.Fatal(err)
		}
	}

	woke := sleep()
	qb.flagMu.Lock() // b's doorbell goroutine cannot set its flag again
	for i := range posts {
		send(uint64(i))
	}
	if got := qa.rung.Load(); got != 1 {
		qb.flagMu.Unlock()
		t.Fatalf("%d posts to a sleeping peer rang %d doorbells, want 1", posts, got)
	}
	qb.flagMu.Unlock()
	awaitWoken(t, woke)
	for i := range posts {
		if wc := next(t, b.rcq); wc.ID != uint64(i) || wc.Status != verbs.WCSuccess {
			t.Fatalf("receive completion %+v", wc)
		}
	}

	// A doorbell that brings nothing for the sleeping CQ (the acknowledgement
	// of b's own SEND) leaves b asleep: its flag must be set again, or a's
	// next post would not ring.
	if err := a.qp.PostRecv(&verbs.RecvWR{ID: 100, SG: []verbs.SGE{{MR: a.buf, Length: 64}}}); err != nil {
		t.Fatal(err)
	}
	woke = sleep()
	if err := b.qp.PostSend(&verbs.SendWR{ID: 200, Opcode: verbs.OpSend, Signaled: true, SG: []verbs.SGE{{MR: b.buf, Length: 8}}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !b.scq.(*cq).ready() { // taken from the doorbell by b's goroutine, not by a Poll
		if time.Now().After(deadline) {
			t.Fatal("b's SEND was never acknowledged")
		}
		time.Sleep(100 * time.Microsecond)
	}
	if got := qa.rung.Load(); got != 2 {
		t.Fatalf("a rang %d doorbells, want 2 (the acknowledgement)", got)
	}
	send(posts)
	awaitWoken(t, woke)
	if wc := next(t, b.rcq); wc.ID != posts || wc.Status != verbs.WCSuccess {
		t.Fatalf("receive completion %+v", wc)
	}
}

// TestPeerRegionSizeBounded: a peer's region larger than any AllocMR makes is
// refused before it is mapped: a sparse memfd costs the peer nothing and would
// cost us a terabyte of address space a mapping (128 of them end the process).
func TestPeerRegionSizeBounded(t *testing.T) {
	for _, size := range []int{math.MaxInt32 + 1, 1 << 40} {
		fd, err := unix.MemfdCreate("peer", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Ftruncate(fd, int64(size)); err != nil {
			t.Fatal(err)
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatal(err)
		}
		if r, err := mapPeer(fd, size, true); err == nil {
			r.close()
			t.Errorf("a peer region of %d bytes was mapped", size)
		}
	}
}

// TestQPNsUnpredictable: verbstest.QPNsSpread (takeHello's slot).
func TestQPNsUnpredictable(t *testing.T) { verbstest.QPNsSpread(t, openDev(t, t.TempDir())) }

// TestStrangerHelloFirst: a local stranger's hello naming the accepting QP
// before its peer's does not keep the peer's out: a few hellos wait, and the
// QP's Connect takes its peer's and closes the stranger's.
func TestStrangerHelloFirst(t *testing.T) {
	dir := t.TempDir()
	da, db := openDev(t, dir), openDev(t, dir)
	qa, qb := newEnd(t, da, verbs.QPConfig{}).qp.(*qp), newEnd(t, db, verbs.QPConfig{}).qp.(*qp)
	ea, err := parseEndpoint(da.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	eb, err := parseEndpoint(db.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	// The end with the larger (device, inode) accepts.
	acc, dialer, accEP := qb, qa, eb
	if eb.dev < ea.dev || eb.dev == ea.dev && eb.ino < ea.ino {
		acc, dialer, accEP = qa, qb, ea
	}
	fd, err := unix.MemfdCreate("stranger", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	c, err := dialPeer(context.Background(), accEP.path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, _, err := c.WriteMsgUnix((&ctl{typ: ctlHello, dstQPN: acc.qpn, srcQPN: 7}).append(nil), unix.UnixRights(fd), nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // parked before the peer's
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- dialer.Connect(ctx, acc.Attr()) }()
	time.Sleep(200 * time.Millisecond) // the acceptor's Connect comes a little later
	if err := errors.Join(acc.Connect(ctx, dialer.Attr()), <-errc); err != nil {
		t.Fatalf("the peers did not connect after a stranger's hello: %v", err)
	}
}

// TestStaleSocketsRemoved: a device removes the rendezvous sockets left in
// its directory by owners gone (a killed smcrd, test runs), and only those:
// not a live device's, not one just made, not other files. They stayed
// forever.
func TestStaleSocketsRemoved(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-time.Minute)
	leave := func(name string, age time.Time) string { // a socket nothing listens on
		t.Helper()
		p := filepath.Join(dir, name)
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: p, Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		ln.SetUnlinkOnClose(false)
		ln.Close()
		if err := os.Chtimes(p, age, age); err != nil {
			t.Fatal(err)
		}
		return p
	}
	stale := leave("4242-0123456789abcdef.sock", old)
	young := leave("4243-0123456789abcdef.sock", time.Now())
	other := leave("other.sock", old)
	live := openDev(t, dir)
	livePath := liveEndpointPath(t, live)
	if err := os.Chtimes(livePath, old, old); err != nil {
		t.Fatal(err)
	}
	openDev(t, dir)
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stale rendezvous socket kept (stat: %v)", err)
	}
	for _, p := range []string{young, other, livePath} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s removed: %v", filepath.Base(p), err)
		}
	}
}

// liveEndpointPath is the rendezvous path of d.
func liveEndpointPath(t *testing.T, d verbs.Device) string {
	t.Helper()
	ep, err := parseEndpoint(d.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	return ep.path
}

// TestDupFile: an MR's file maps the MR's own bytes, both ways, cannot be
// resized, and stays mapped after the MR's Close; a closed MR gives none.
func TestDupFile(t *testing.T) {
	b := newEnd(t, openDev(t, t.TempDir()), verbs.QPConfig{})
	m := b.rmb.(verbs.Mappable)
	fd, off, err := m.DupFile()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	mem, err := unix.Mmap(fd, off, len(b.rmb.Bytes()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	copy(b.rmb.Bytes(), "through the MR")
	copy(mem[100:], "through the file")
	if string(mem[:14]) != "through the MR" || string(b.rmb.Bytes()[100:116]) != "through the file" {
		t.Fatal("the file and the MR hold different bytes")
	}
	if err := unix.Ftruncate(fd, 0); err == nil {
		t.Fatal("the file could be shrunk")
	}
	if err := b.rmb.Close(); err != nil {
		t.Fatal(err)
	}
	if string(mem[:14]) != "through the MR" {
		t.Fatal("the mapping lost its bytes with the MR")
	}
	if _, _, err := m.DupFile(); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("file of a closed MR: %v, want %v", err, verbs.ErrClosed)
	}
}
