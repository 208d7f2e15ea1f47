// The conformance tests: RC queue-pair behaviour as ibverbs defines it, which the
// SMC-R link layer depends on (RFC 7609 §4.3 RDMA WRITE and SEND over RC QPs, §4.4 LLC).

package verbstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/smcr-io/smcr/smcr/verbs"
)

func testConnect(t *testing.T, env Env) {
	da, db := openDevices(t, env)
	a := newSide(t, da, 4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite, 7, 16)
	b := newSide(t, db, 4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite, 7, 16)
	for _, s := range []*side{a, b} {
		attr := s.qp.Attr()
		if attr.QPN == 0 || attr.QPN > 0xFFFFFF {
			t.Errorf("QPN %#x is not a non-zero 24-bit number", attr.QPN)
		}
		if attr.PSN > 0xFFFFFF {
			t.Errorf("PSN %#x is wider than 24 bits", attr.PSN)
		}
		if !attr.MTU.Valid() {
			t.Errorf("MTU code %d invalid", attr.MTU)
		}
		if !bytes.Equal(attr.Endpoint, s.dev.Endpoint()) {
			t.Errorf("Attr().Endpoint %q differs from Device.Endpoint %q", attr.Endpoint, s.dev.Endpoint())
		}
		if attr.GID != s.dev.Port().GID {
			t.Errorf("Attr().GID %x differs from the port's %x", attr.GID, s.dev.Port().GID)
		}
		if st := s.qp.State(); st == verbs.QPRTS || st == verbs.QPError {
			t.Errorf("new QP in state %v", st)
		}
		if s.mr.Access() != verbs.AccessLocalWrite|verbs.AccessRemoteWrite {
			t.Errorf("MR access %v", s.mr.Access())
		}
		if s.mr.LKey() == 0 && s.mr.RKey() == 0 {
			t.Errorf("MR without keys")
		}
	}
	if a.qp.Attr().QPN == b.qp.Attr().QPN && bytes.Equal(da.Endpoint(), db.Endpoint()) {
		t.Errorf("two QPs share QPN %#x on one endpoint", a.qp.Attr().QPN)
	}
	connect(t, env, a, b)
	for _, s := range []*side{a, b} {
		if st := s.qp.State(); st != verbs.QPRTS {
			t.Fatalf("connected QP in state %v, want RTS", st)
		}
	}
	// One SEND each way proves both directions.
	for i, pair := range [][2]*side{{a, b}, {b, a}} {
		src, dst := pair[0], pair[1]
		postRecv(t, dst.qp, 100+uint64(i), dst.mr, 0, 64)
		copy(src.mr.Bytes(), "hello")
		postSend(t, src.qp, &verbs.SendWR{ID: uint64(i), Opcode: verbs.OpSend, Signaled: true,
			SG: []verbs.SGE{{MR: src.mr, Length: 5}}})
		wantWC(t, waitWC(t, env, src.scq, 1)[0], uint64(i), verbs.WCSuccess, verbs.WCSend)
		wc := waitWC(t, env, dst.rcq, 1)[0]
		wantWC(t, wc, 100+uint64(i), verbs.WCSuccess, verbs.WCRecv)
		if wc.ByteLen != 5 || string(dst.mr.Bytes()[:5]) != "hello" {
			t.Fatalf("received %d bytes %q", wc.ByteLen, dst.mr.Bytes()[:5])
		}
		if wc.QPN != dst.qp.Attr().QPN {
			t.Fatalf("completion QPN %#x, want %#x", wc.QPN, dst.qp.Attr().QPN)
		}
	}
}

func testSendRecvOrder(t *testing.T, env Env) {
	a, b := newPair(t, env, opts{})
	const n, slot = 32, 1024
	for i := range n {
		postRecv(t, b.qp, uint64(1000+i), b.mr, i*slot, slot)
	}
	for i := range n {
		msg := a.mr.Bytes()[i*slot : i*slot+1+i*31]
		pattern(msg, i)
		postSend(t, a.qp, &verbs.SendWR{ID: uint64(i), Opcode: verbs.OpSend, Signaled: true,
			SG: []verbs.SGE{{MR: a.mr, Offset: i * slot, Length: len(msg)}}})
	}
	for i, wc := range waitWC(t, env, a.scq, n) {
		wantWC(t, wc, uint64(i), verbs.WCSuccess, verbs.WCSend)
	}
	for i, wc := range waitWC(t, env, b.rcq, n) {
		wantWC(t, wc, uint64(1000+i), verbs.WCSuccess, verbs.WCRecv)
		if int(wc.ByteLen) != 1+i*31 {
			t.Fatalf("recv %d: byte length %d, want %d", i, wc.ByteLen, 1+i*31)
		}
		got, want := b.mr.Bytes()[i*slot:i*slot+int(wc.ByteLen)], a.mr.Bytes()[i*slot:i*slot+int(wc.ByteLen)]
		if !bytes.Equal(got, want) {
			t.Fatalf("recv %d: payload differs", i)
		}
	}
}

// sync1 sends a one-byte SEND from src to dst and waits for it at dst: RC ordering
// then guarantees that every earlier WRITE has landed in dst's memory.
func sync1(t testing.TB, env Env, src, dst *side, id uint64) {
	t.Helper()
	postRecv(t, dst.qp, id, dst.mr, len(dst.mr.Bytes())-1, 1)
	postSend(t, src.qp, &verbs.SendWR{ID: id, Opcode: verbs.OpSend, Signaled: true,
		SG: []verbs.SGE{{MR: src.mr, Offset: len(src.mr.Bytes()) - 1, Length: 1}}})
	wantWC(t, waitWC(t, env, src.scq, 1)[0], id, verbs.WCSuccess, verbs.WCSend)
	wantWC(t, waitWC(t, env, dst.rcq, 1)[0], id, verbs.WCSuccess, verbs.WCRecv)
}

func testWriteLanding(t *testing.T, env Env) {
	a, b := newPair(t, env, opts{})
	dst := b.mr.Bytes()
	fill(dst, 0xEE)
	src := a.mr.Bytes()
	pattern(src, 3)
	// Single SGE at an odd offset, then a gather of two SGEs right after it.
	const off, n = 1234, 5000
	postSend(t, a.qp, &verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Signaled: true,
		SG: []verbs.SGE{{MR: a.mr, Offset: 100, Length: n}}, RemoteAddr: a.remote.Addr + off, RKey: a.remote.RKey})
	postSend(t, a.qp, &verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, Signaled: true,
		SG:         []verbs.SGE{{MR: a.mr, Offset: 20000, Length: 300}, {MR: a.mr, Offset: 30000, Length: 77}},
		RemoteAddr: a.remote.Addr + off + n, RKey: a.remote.RKey})
	// A write that ends exactly at the end of the region is in bounds.
	postSend(t, a.qp, &verbs.SendWR{ID: 3, Opcode: verbs.OpWrite, Signaled: true,
		SG:         []verbs.SGE{{MR: a.mr, Offset: 40000, Length: 16}},
		RemoteAddr: a.remote.Addr + uint64(len(dst)) - 17, RKey: a.remote.RKey})
	for i, wc := range waitWC(t, env, a.scq, 3) {
		wantWC(t, wc, uint64(i+1), verbs.WCSuccess, verbs.WCWrite)
	}
	sync1(t, env, a, b, 9)
	want := bytes.Repeat([]byte{0xEE}, len(dst))
	copy(want[off:], src[100:100+n])
	copy(want[off+n:], src[20000:20300])
	copy(want[off+n+300:], src[30000:30077])
	copy(want[len(dst)-17:], src[40000:40016])
	want[len(want)-1] = src[len(src)-1] // the sync byte
	if i := firstDiff(dst, want); i >= 0 {
		t.Fatalf("remote region differs at offset %d: got %#x want %#x", i, dst[i], want[i])
	}
}

// testChain posts chains (SendWR.Next) the way the engine sends data: WRITEs
// and the SEND that announces them in one post. They execute in order, so the
// WRITEs have landed when the SEND arrives; a chain that fails part way posts
// what comes before the failing request (PostError), and one too long or nil
// posts nothing.
func testChain(t *testing.T, env Env) {
	a, b := newPair(t, env, opts{})
	src, dst := a.mr.Bytes(), b.mr.Bytes()
	fill(dst, 0)
	pattern(src, 5)
	const slot = 60000 // the SENDs' landing place in b, past the WRITEs
	for i := range 4 {
		postRecv(t, b.qp, uint64(100+i), b.mr, slot+i*64, 64)
	}
	send := &verbs.SendWR{ID: 3, Opcode: verbs.OpSend, Signaled: true, Inline: true,
		SG: []verbs.SGE{{MR: a.mr, Offset: 50000, Length: 44}}}
	second := &verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, Signaled: true, Next: send,
		SG: []verbs.SGE{{MR: a.mr, Offset: 0, Length: 100}}, RemoteAddr: a.remote.Addr, RKey: a.remote.RKey}
	first := &verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Signaled: true, Next: second,
		SG: []verbs.SGE{{MR: a.mr, Offset: 100, Length: 30000}}, RemoteAddr: a.remote.Addr + 100, RKey: a.remote.RKey}
	postSend(t, a.qp, first)
	for i, wc := range waitWC(t, env, a.scq, 3) {
		want := verbs.WCWrite
		if i == 2 {
			want = verbs.WCSend
		}
		wantWC(t, wc, uint64(i+1), verbs.WCSuccess, want)
	}
	wc := waitWC(t, env, b.rcq, 1)[0]
	wantWC(t, wc, 100, verbs.WCSuccess, verbs.WCRecv)
	if wc.ByteLen != 44 || !bytes.Equal(dst[slot:slot+44], src[50000:50044]) {
		t.Fatalf("the chain's SEND: %d bytes, or payload differs", wc.ByteLen)
	}
	if i := firstDiff(dst[:30100], src[:30100]); i >= 0 {
		t.Fatalf("the chain's WRITEs: remote region differs at offset %d", i)
	}

	// An invalid request in the middle: the one before it goes, it and the
	// one after it do not.
	one := func(id uint64, next *verbs.SendWR) *verbs.SendWR {
		return &verbs.SendWR{ID: id, Opcode: verbs.OpSend, Signaled: true, Next: next,
			SG: []verbs.SGE{{MR: a.mr, Offset: 50100 + int(id), Length: 1}}}
	}
	bad := one(12, one(13, nil))
	bad.Opcode = 99
	err := a.qp.PostSend(one(11, bad))
	var pe *verbs.PostError
	if !errors.As(err, &pe) || pe.Posted != 1 || !errors.Is(err, verbs.ErrInvalid) || verbs.Posted(err) != 1 {
		t.Fatalf("chain with an invalid second request: %v, want a PostError of 1 posted wrapping ErrInvalid", err)
	}
	wantWC(t, waitWC(t, env, a.scq, 1)[0], 11, verbs.WCSuccess, verbs.WCSend)
	wantWC(t, waitWC(t, env, b.rcq, 1)[0], 101, verbs.WCSuccess, verbs.WCRecv)

	// Too long a chain, a loop, and nil: refused whole.
	var long *verbs.SendWR
	for i := range verbs.MaxChain + 1 {
		long = one(uint64(20+i), long)
	}
	loop := one(40, nil)
	loop.Next = loop
	for name, wr := range map[string]*verbs.SendWR{"too long": long, "loop": loop, "nil": nil} {
		if err := a.qp.PostSend(wr); !errors.Is(err, verbs.ErrInvalid) || verbs.Posted(err) != 0 {
			t.Fatalf("%s chain: %v, want ErrInvalid with nothing posted", name, err)
		}
	}
	// The next SEND is the next to arrive: nothing of the refused chains went.
	postSend(t, a.qp, one(50, nil))
	wantWC(t, waitWC(t, env, a.scq, 1)[0], 50, verbs.WCSuccess, verbs.WCSend)
	wantWC(t, waitWC(t, env, b.rcq, 1)[0], 102, verbs.WCSuccess, verbs.WCRecv)
	if got, want := dst[slot+2*64], src[50150]; got != want {
		t.Fatalf("third SEND's byte %#x, want %#x (of request 50)", got, want)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// inlineAsk is the inline space the suite's queue pairs ask for: the engine's
// (a CDC message and small writes).
const inlineAsk = 64

// testInline posts SENDs and WRITEs marked Inline below, at and beyond the inline
// space asked for, single and gathered: each arrives intact, since a provider
// sends what does not fit as usual. A negative inline space is refused.
func testInline(t *testing.T, env Env) {
	a, b := newPair(t, env, opts{})
	if _, err := a.pd.CreateQP(verbs.QPConfig{SendCQ: a.scq, RecvCQ: a.rcq, MaxInline: -1}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("create qp with inline space -1: %v, want ErrInvalid", err)
	}
	const slot = 4096
	sizes := []int{1, 44, inlineAsk, inlineAsk + 1, 3000}
	src := a.mr.Bytes()
	pattern(src, 5)
	gather := func(i, n int) []verbs.SGE {
		if n < 2 {
			return []verbs.SGE{{MR: a.mr, Offset: i * slot, Length: n}}
		}
		// Two pieces, apart in the region.
		return []verbs.SGE{{MR: a.mr, Offset: i * slot, Length: n / 2}, {MR: a.mr, Offset: i*slot + 2048, Length: n - n/2}}
	}
	want := func(sg []verbs.SGE) []byte {
		var w []byte
		for _, s := range sg {
			w = append(w, src[s.Offset:s.Offset+s.Length]...)
		}
		return w
	}
	for i, n := range sizes {
		postRecv(t, b.qp, uint64(100+i), b.mr, i*slot, slot)
		postSend(t, a.qp, &verbs.SendWR{ID: uint64(i), Opcode: verbs.OpSend, Signaled: true, Inline: true, SG: gather(i, n)})
	}
	for i, wc := range waitWC(t, env, a.scq, len(sizes)) {
		wantWC(t, wc, uint64(i), verbs.WCSuccess, verbs.WCSend)
	}
	for i, wc := range waitWC(t, env, b.rcq, len(sizes)) {
		wantWC(t, wc, uint64(100+i), verbs.WCSuccess, verbs.WCRecv)
		w := want(gather(i, sizes[i]))
		if got := b.mr.Bytes()[i*slot : i*slot+int(wc.ByteLen)]; !bytes.Equal(got, w) {
			t.Fatalf("inline send of %d bytes: got %d bytes %x, want %x", sizes[i], len(got), got[:min(len(got), 16)], w[:min(len(w), 16)])
		}
	}
	dst := b.mr.Bytes()
	fill(dst, 0xEE)
	const base = 32 << 10
	for i, n := range sizes {
		postSend(t, a.qp, &verbs.SendWR{ID: uint64(10 + i), Opcode: verbs.OpWrite, Signaled: true, Inline: true,
			SG: gather(i, n), RemoteAddr: a.remote.Addr + base + uint64(i*slot), RKey: a.remote.RKey})
	}
	for i, wc := range waitWC(t, env, a.scq, len(sizes)) {
		wantWC(t, wc, uint64(10+i), verbs.WCSuccess, verbs.WCWrite)
	}
	sync1(t, env, a, b, 99)
	for i, n := range sizes {
		at := base + i*slot
		if got, w := dst[at:at+n], want(gather(i, n)); !bytes.Equal(got, w) {
			t.Fatalf("inline write of %d bytes: differs at %d", n, firstDiff(got, w))
		}
		if dst[at+n] != 0xEE {
			t.Fatalf("inline write of %d bytes wrote past its end", n)
		}
	}
}

func testWriteImm(t *testing.T, env Env) {
	a, b := newPair(t, env, opts{})
	fill(b.mr.Bytes(), 0)
	pattern(a.mr.Bytes(), 5)
	imms := []uint32{0xdeadbeef, 0, 1, 0xffffffff}
	for i := range imms {
		postRecv(t, b.qp, uint64(50+i), b.mr, 60000, 16)
	}
	for i, imm := range imms {
		// The last one is a zero-length WRITE WITH IMM: only the immediate travels.
		n := 1000 * (len(imms) - 1 - i)
		postSend(t, a.qp, &verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWriteImm, Signaled: true, Imm: imm,
			SG:         []verbs.SGE{{MR: a.mr, Offset: i * 1000, Length: n}},
			RemoteAddr: a.remote.Addr + uint64(i*10000), RKey: a.remote.RKey})
	}
	for i, wc := range waitWC(t, env, a.scq, len(imms)) {
		wantWC(t, wc, uint64(i), verbs.WCSuccess, verbs.WCWrite)
	}
	for i, wc := range waitWC(t, env, b.rcq, len(imms)) {
		wantWC(t, wc, uint64(50+i), verbs.WCSuccess, verbs.WCRecvRDMAImm)
		n := 1000 * (len(imms) - 1 - i)
		if !wc.HasImm || wc.Imm != imms[i] || int(wc.ByteLen) != n {
			t.Fatalf("completion %+v: want imm %#x and byte length %d", wc, imms[i], n)
		}
		got := b.mr.Bytes()[i*10000 : i*10000+n]
		if !bytes.Equal(got, a.mr.Bytes()[i*1000:i*1000+n]) {
			t.Fatalf("write-imm %d: data differs", i)
		}
	}
	if j := untouched(b.mr.Bytes()[60000:60016], 0); j >= 0 {
		t.Fatalf("WRITE WITH IMM wrote into the RECV buffer at %d", j)
	}
}

func testCompletionOrder(t *testing.T, env Env) {
	a, b := newPair(t, env, opts{})
	ops := []verbs.Opcode{verbs.OpWrite, verbs.OpSend, verbs.OpWriteImm, verbs.OpWrite, verbs.OpSend,
		verbs.OpWrite, verbs.OpWriteImm, verbs.OpSend, verbs.OpWrite, verbs.OpWrite}
	var recvs int
	for _, op := range ops {
		if op != verbs.OpWrite {
			postRecv(t, b.qp, uint64(500+recvs), b.mr, 8192+recvs*64, 64)
			recvs++
		}
	}
	for i, op := range ops {
		postSend(t, a.qp, &verbs.SendWR{ID: uint64(i), Opcode: op, Signaled: true, Imm: uint32(i),
			SG:         []verbs.SGE{{MR: a.mr, Offset: i * 100, Length: 10 + i}},
			RemoteAddr: a.remote.Addr + uint64(i*100), RKey: a.remote.RKey})
	}
	for i, wc := range waitWC(t, env, a.scq, len(ops)) {
		want := verbs.WCWrite
		if ops[i] == verbs.OpSend {
			want = verbs.WCSend
		}
		wantWC(t, wc, uint64(i), verbs.WCSuccess, want)
	}
	k := 0
	for i, wc := range waitWC(t, env, b.rcq, recvs) {
		for ops[k] == verbs.OpWrite {
			k++
		}
		want := verbs.WCRecv
		if ops[k] == verbs.OpWriteImm {
			want = verbs.WCRecvRDMAImm
			if !wc.HasImm || wc.Imm != uint32(k) {
				t.Fatalf("recv %d: %+v, want imm %d", i, wc, k)
			}
		}
		wantWC(t, wc, uint64(500+i), verbs.WCSuccess, want)
		if int(wc.ByteLen) != 10+k {
			t.Fatalf("recv %d: byte length %d, want %d", i, wc.ByteLen, 10+k)
		}
		k++
	}
}

func testUnsignaled(t *testing.T, env Env) {
	a, b := newPair(t, env, opts{})
	for i := range 8 {
		postSend(t, a.qp, &verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite,
			SG: []verbs.SGE{{MR: a.mr, Offset: i, Length: 100}}, RemoteAddr: a.remote.Addr, RKey: a.remote.RKey})
	}
	postRecv(t, b.qp, 77, b.mr, 1000, 100)
	postSend(t, a.qp, &verbs.SendWR{ID: 8, Opcode: verbs.OpSend, Signaled: true,
		SG: []verbs.SGE{{MR: a.mr, Length: 10}}})
	wantWC(t, waitWC(t, env, a.scq, 1)[0], 8, verbs.WCSuccess, verbs.WCSend)
	wantWC(t, waitWC(t, env, b.rcq, 1)[0], 77, verbs.WCSuccess, verbs.WCRecv)
	expectNoWC(t, a.scq, 50*time.Millisecond)
	// An unsignalled request that fails still completes, with its error.
	postSend(t, a.qp, &verbs.SendWR{ID: 9, Opcode: verbs.OpWrite,
		SG: []verbs.SGE{{MR: a.mr, Length: 10}}, RemoteAddr: a.remote.Addr, RKey: badRKey(a.remote.RKey, b.mr)})
	wantWC(t, waitWC(t, env, a.scq, 1)[0], 9, verbs.WCRemAccessErr, 0)
}

// badRKey returns an rkey that none of the given regions has.
func badRKey(rkey uint32, mrs ...verbs.MR) uint32 {
	bad := rkey ^ 0x5a5a5a5a
	for taken := true; taken; {
		taken = false
		for _, m := range mrs {
			if m.RKey() == bad || m.LKey() == bad {
				bad, taken = bad+0x01010101, true
			}
		}
	}
	return bad
}

func testRNRExceeded(t *testing.T, env Env) {
	a, b := newPair(t, env, opts{rnrRetry: 1})
	postSend(t, a.qp, &verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Signaled: true,
		SG: []verbs.SGE{{MR: a.mr, Length: 10}}})
	postSend(t, a.qp, &verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, Signaled: true,
		SG: []verbs.SGE{{MR: a.mr, Length: 10}}, RemoteAddr: a.remote.Addr, RKey: a.remote.RKey})
	wcs := waitWC(t, env, a.scq, 2)
	wantWC(t, wcs[0], 1, verbs.WCRNRRetryExcErr, 0)
	wantWC(t, wcs[1], 2, verbs.WCWRFlushErr, 0)
	if st := a.qp.State(); st != verbs.QPError {
		t.Fatalf("requester in state %v after RNR retry exceeded, want ERROR", st)
	}
	if wcs, _ := pollN(b.rcq, 1, 10*time.Millisecond); len(wcs) > 0 && wcs[0].Status == verbs.WCSuccess {
		t.Fatalf("responder completed %+v without a posted RECV", wcs[0])
	}
}

func testRNRInTime(t *testing.T, env Env) {
	a, b := newPair(t, env, opts{rnrRetry: 7})
	pattern(a.mr.Bytes(), 9)
	postSend(t, a.qp, &verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Signaled: true,
		SG: []verbs.SGE{{MR: a.mr, Length: 300}}})
	postSend(t, a.qp, &verbs.SendWR{ID: 2, Opcode: verbs.OpWriteImm, Signaled: true, Imm: 42,
		SG: []verbs.SGE{{MR: a.mr, Offset: 300, Length: 200}}, RemoteAddr: a.remote.Addr + 4096, RKey: a.remote.RKey})
	expectNoWC(t, a.scq, 60*time.Millisecond)
	postRecv(t, b.qp, 10, b.mr, 0, 1000)
	postRecv(t, b.qp, 11, b.mr, 1000, 1000)
	wcs := waitWC(t, env, a.scq, 2)
	wantWC(t, wcs[0], 1, verbs.WCSuccess, verbs.WCSend)
	wantWC(t, wcs[1], 2, verbs.WCSuccess, verbs.WCWrite)
	rwcs := waitWC(t, env, b.rcq, 2)
	wantWC(t, rwcs[0], 10, verbs.WCSuccess, verbs.WCRecv)
	wantWC(t, rwcs[1], 11, verbs.WCSuccess, verbs.WCRecvRDMAImm)
	if rwcs[0].ByteLen != 300 || !bytes.Equal(b.mr.Bytes()[:300], a.mr.Bytes()[:300]) {
		t.Fatalf("delayed SEND: %+v, payload differs", rwcs[0])
	}
	if rwcs[1].Imm != 42 || !bytes.Equal(b.mr.Bytes()[4096:4296], a.mr.Bytes()[300:500]) {
		t.Fatalf("delayed WRITE WITH IMM: %+v, payload differs", rwcs[1])
	}
}

// remAccess posts a write that the responder must refuse, then checks that the
// requester gets WCRemAccessErr, later requests are flushed, and nothing was written.
func remAccess(t *testing.T, env Env, o opts, wr func(a *side) verbs.SendWR) {
	a, b := newPair(t, env, o)
	fill(b.mr.Bytes(), 0xA5)
	pattern(a.mr.Bytes(), 1)
	// A RECV for WRITE WITH IMM: without one the responder answers RNR first.
	postRecv(t, b.qp, 1, b.mr, 0, 0)
	w := wr(a)
	w.ID, w.Signaled = 1, true
	postSend(t, a.qp, &w)
	// A request behind the failing one never executes.
	postSend(t, a.qp, &verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, Signaled: true,
		SG: []verbs.SGE{{MR: a.mr, Length: 64}}, RemoteAddr: a.remote.Addr, RKey: a.remote.RKey})
	wcs := waitWC(t, env, a.scq, 2)
	wantWC(t, wcs[0], 1, verbs.WCRemAccessErr, 0)
	wantWC(t, wcs[1], 2, verbs.WCWRFlushErr, 0)
	if st := a.qp.State(); st != verbs.QPError {
		t.Fatalf("requester in state %v after a remote access error, want ERROR", st)
	}
	// Give a misbehaving provider time to land the bytes before looking.
	time.Sleep(20 * time.Millisecond)
	if i := untouched(b.mr.Bytes(), 0xA5); i >= 0 {
		t.Fatalf("refused write changed the region at offset %d", i)
	}
}

func testRemAccessRKey(t *testing.T, env Env) {
	remAccess(t, env, opts{}, func(a *side) verbs.SendWR {
		return verbs.SendWR{Opcode: verbs.OpWrite, SG: []verbs.SGE{{MR: a.mr, Length: 128}},
			RemoteAddr: a.remote.Addr, RKey: badRKey(a.remote.RKey, a.mr)}
	})
}

func testRemAccessBounds(t *testing.T, env Env) {
	remAccess(t, env, opts{}, func(a *side) verbs.SendWR {
		return verbs.SendWR{Opcode: verbs.OpWrite, SG: []verbs.SGE{{MR: a.mr, Length: 128}},
			RemoteAddr: a.remote.Addr + uint64(a.remote.Size) - 64, RKey: a.remote.RKey}
	})
	// Starting before the region is out of bounds too (with WRITE WITH IMM).
	remAccess(t, env, opts{}, func(a *side) verbs.SendWR {
		return verbs.SendWR{Opcode: verbs.OpWriteImm, SG: []verbs.SGE{{MR: a.mr, Length: 128}},
			RemoteAddr: a.remote.Addr - 64, RKey: a.remote.RKey}
	})
}

func testRemAccessPerm(t *testing.T, env Env) {
	remAccess(t, env, opts{access: verbs.AccessLocalWrite | verbs.AccessRemoteRead}, func(a *side) verbs.SendWR {
		return verbs.SendWR{Opcode: verbs.OpWrite, SG: []verbs.SGE{{MR: a.mr, Length: 128}},
			RemoteAddr: a.remote.Addr + 256, RKey: a.remote.RKey}
	})
}

func testLocLen(t *testing.T, env Env) {
	a, b := newPair(t, env, opts{})
	fill(b.mr.Bytes(), 0x11)
	postRecv(t, b.qp, 7, b.mr, 0, 16)
	postRecv(t, b.qp, 8, b.mr, 16, 16)
	postSend(t, a.qp, &verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Signaled: true,
		SG: []verbs.SGE{{MR: a.mr, Length: 64}}})
	rwcs := waitWC(t, env, b.rcq, 2)
	wantWC(t, rwcs[0], 7, verbs.WCLocLenErr, 0)
	wantWC(t, rwcs[1], 8, verbs.WCWRFlushErr, 0)
	if wc := waitWC(t, env, a.scq, 1)[0]; wc.ID != 1 || wc.Status == verbs.WCSuccess {
		t.Fatalf("requester completion %+v after the responder's length error, want an error", wc)
	}
	if i := untouched(b.mr.Bytes()[16:], 0x11); i >= 0 {
		t.Fatalf("SEND overflowed its RECV buffer into offset %d", 16+i)
	}
}

func testFlushOnDestroy(t *testing.T, env Env) {
	a, b := newPair(t, env, opts{rnrRetry: 7})
	for i := range 4 {
		postRecv(t, a.qp, uint64(100+i), a.mr, i*10, 10)
	}
	// b has no RECV posted and a retries forever, so these stay outstanding.
	for i := range 3 {
		postSend(t, a.qp, &verbs.SendWR{ID: uint64(i), Opcode: verbs.OpSend, Signaled: i != 1,
			SG: []verbs.SGE{{MR: a.mr, Length: 10}}})
	}
	expectNoWC(t, a.scq, 30*time.Millisecond)
	if err := a.qp.Close(); err != nil {
		t.Fatalf("close qp: %v", err)
	}
	for i, wc := range waitWC(t, env, a.scq, 3) {
		wantWC(t, wc, uint64(i), verbs.WCWRFlushErr, 0)
		if wc.QPN != a.qp.Attr().QPN {
			t.Fatalf("flush completion %+v names QPN %#x", wc, a.qp.Attr().QPN)
		}
	}
	for i, wc := range waitWC(t, env, a.rcq, 4) {
		wantWC(t, wc, uint64(100+i), verbs.WCWRFlushErr, 0)
	}
	expectNoWC(t, a.scq, 20*time.Millisecond)
	if err := a.qp.PostSend(&verbs.SendWR{ID: 9, Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: a.mr, Length: 1}}}); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("PostSend on a destroyed QP: %v, want ErrClosed", err)
	}
	if err := a.qp.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	_ = b
}

// testCloseWhilePosting: Close may run while other goroutines post to the QP and
// ask its state (an engine's poller reposting receives, its writers, its
// statistics): each call either completes or returns ErrClosed, none touches
// a destroyed QP.
func testCloseWhilePosting(t *testing.T, env Env) {
	a, _ := newPair(t, env, opts{rnrRetry: 7})
	var wg sync.WaitGroup
	var posts atomic.Int64
	errc := make(chan error, 8)
	loop := func(call func(i uint64) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := uint64(0); ; i++ {
				err := call(i)
				switch {
				case errors.Is(err, verbs.ErrClosed):
					return
				case err == nil:
					posts.Add(1)
				case !errors.Is(err, verbs.ErrQueueFull) && !errors.Is(err, verbs.ErrQPState):
					errc <- err
					return
				}
				if i%64 == 63 {
					runtime.Gosched()
				}
			}
		}()
	}
	for range 2 {
		loop(func(i uint64) error {
			return a.qp.PostRecv(&verbs.RecvWR{ID: i, SG: []verbs.SGE{{MR: a.mr, Length: 8}}})
		})
		loop(func(i uint64) error {
			return a.qp.PostSend(&verbs.SendWR{ID: i, Opcode: verbs.OpSend, Signaled: true, SG: []verbs.SGE{{MR: a.mr, Length: 8}}})
		})
	}
	loop(func(uint64) error {
		if a.qp.State() == verbs.QPError {
			return verbs.ErrClosed
		}
		return nil
	})
	time.Sleep(20 * time.Millisecond)
	if err := a.qp.Close(); err != nil {
		t.Fatalf("close qp: %v", err)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(env.timeout()):
		t.Fatal("posting goroutines did not end after Close")
	}
	select {
	case err := <-errc:
		t.Fatalf("a call racing Close: %v", err)
	default:
	}
	if posts.Load() == 0 {
		t.Fatal("nothing was posted before Close")
	}
	drainCQ(a.scq)
	drainCQ(a.rcq)
}

// testCloseDeviceFirst: a device closed while its PD, CQs, MR and QP live (an
// engine that gave up waiting for a link to free) makes nothing new, and what
// it made still closes, in any order, without error.
func testCloseDeviceFirst(t *testing.T, env Env) {
	a, _ := newPair(t, env, opts{})
	// A CQ closed already takes no new QP.
	cq, err := a.dev.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	cq.Close()
	if q, err := a.pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq}); !errors.Is(err, verbs.ErrClosed) {
		if err == nil {
			q.Close()
		}
		t.Errorf("CreateQP on a closed CQ: %v, want ErrClosed", err)
	}
	if err := a.dev.Close(); err != nil {
		t.Fatalf("close device: %v", err)
	}
	if _, err := a.dev.AllocPD(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("AllocPD on a closed device: %v, want ErrClosed", err)
	}
	if _, err := a.dev.CreateCQ(16); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("CreateCQ on a closed device: %v, want ErrClosed", err)
	}
	for _, c := range []struct {
		name  string
		close func() error
	}{{"pd", a.pd.Close}, {"qp", a.qp.Close}, {"send cq", a.scq.Close}, {"mr", a.mr.Close}, {"recv cq", a.rcq.Close}} {
		if err := c.close(); err != nil {
			t.Errorf("close %s after its device: %v", c.name, err)
		}
	}
}

// drainCQ polls cq empty.
func drainCQ(cq verbs.CQ) {
	wcs := make([]verbs.WorkCompletion, 64)
	for {
		if n, err := cq.Poll(wcs); n == 0 || err != nil {
			return
		}
	}
}

func testManyQPs(t *testing.T, env Env) {
	const nqp, extraMRs = 16, 32
	da, db := openDevices(t, env)
	as, bs := make([]*side, nqp), make([]*side, nqp)
	for i := range nqp {
		as[i] = newSide(t, da, 8192+i*512, verbs.AccessLocalWrite|verbs.AccessRemoteWrite, 7, 16)
		bs[i] = newSide(t, db, 8192+i*512, verbs.AccessLocalWrite|verbs.AccessRemoteWrite, 7, 16)
	}
	// Extra regions in the same PDs: rkeys must stay distinct.
	keys := map[uint32]bool{}
	for _, s := range append(append([]*side{}, as...), bs...) {
		keys[s.mr.RKey()] = true
	}
	for i := range extraMRs {
		m, err := bs[i%nqp].pd.AllocMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		if err != nil {
			t.Fatalf("alloc extra mr %d: %v", i, err)
		}
		t.Cleanup(func() { m.Close() })
		keys[m.RKey()] = true
	}
	if len(keys) != 2*nqp+extraMRs {
		// Keys of distinct devices may coincide; keys within one device may not.
		perDev := map[uint32]bool{}
		for _, s := range bs {
			perDev[s.mr.RKey()] = true
		}
		if len(perDev) != nqp {
			t.Fatalf("rkeys repeat within one device")
		}
	}
	qpns := map[uint32]bool{}
	for _, s := range as {
		qpns[s.qp.Attr().QPN] = true
	}
	if len(qpns) != nqp {
		t.Fatalf("QPNs repeat within one device")
	}
	var wg sync.WaitGroup
	errs := make(chan error, nqp)
	for i := range nqp {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- exercise(env, as[i], bs[i], i)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// exercise connects a and b, writes a distinct pattern from a into b's region and
// checks it landed, and nowhere else.
func exercise(env Env, a, b *side, i int) error {
	a.remote, b.remote = describe(b.mr), describe(a.mr)
	if err := connectQPs(env, a.qp, b.qp); err != nil {
		return fmt.Errorf("pair %d: %w", i, err)
	}
	fill(b.mr.Bytes(), 0)
	pattern(a.mr.Bytes(), i)
	n := len(a.mr.Bytes()) - 1
	if err := a.qp.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.OpWrite,
		SG: []verbs.SGE{{MR: a.mr, Length: n}}, RemoteAddr: a.remote.Addr, RKey: a.remote.RKey}); err != nil {
		return fmt.Errorf("pair %d: post write: %w", i, err)
	}
	if err := b.qp.PostRecv(&verbs.RecvWR{ID: 2, SG: []verbs.SGE{{MR: b.mr, Offset: n, Length: 1}}}); err != nil {
		return fmt.Errorf("pair %d: post recv: %w", i, err)
	}
	if err := a.qp.PostSend(&verbs.SendWR{ID: 3, Opcode: verbs.OpSend, Signaled: true,
		SG: []verbs.SGE{{MR: a.mr, Offset: n, Length: 1}}}); err != nil {
		return fmt.Errorf("pair %d: post send: %w", i, err)
	}
	for _, cq := range []verbs.CQ{a.scq, b.rcq} {
		wcs, err := pollN(cq, 1, env.timeout())
		if err != nil {
			return fmt.Errorf("pair %d: %w", i, err)
		}
		if wcs[0].Status != verbs.WCSuccess {
			return fmt.Errorf("pair %d: completion %+v", i, wcs[0])
		}
	}
	if !bytes.Equal(b.mr.Bytes(), a.mr.Bytes()) {
		return fmt.Errorf("pair %d: region differs from what was written", i)
	}
	return nil
}

func testWrongState(t *testing.T, env Env) {
	da, db := openDevices(t, env)
	a := newSide(t, da, 4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite, 7, 4)
	b := newSide(t, db, 4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite, 7, 4)
	send := &verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Signaled: true, SG: []verbs.SGE{{MR: a.mr, Length: 8}}}
	if err := a.qp.PostSend(send); !errors.Is(err, verbs.ErrQPState) {
		t.Fatalf("PostSend before Connect: %v, want ErrQPState", err)
	}
	// Receives may be posted before the connection is up (INIT), as SMC-R does.
	postRecv(t, b.qp, 5, b.mr, 0, 64)
	connect(t, env, a, b)
	if err := a.qp.Connect(context.Background(), b.qp.Attr()); err == nil {
		t.Fatalf("second Connect succeeded")
	}
	// A full send queue refuses more.
	var full bool
	for i := range 64 {
		err := a.qp.PostSend(&verbs.SendWR{ID: uint64(10 + i), Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: a.mr, Length: 8}}})
		if errors.Is(err, verbs.ErrQueueFull) {
			full = true
			break
		}
		if err != nil {
			t.Fatalf("post send %d: %v", i, err)
		}
	}
	if !full {
		t.Fatalf("64 outstanding sends accepted on a QP sized for 4")
	}
	if err := a.qp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(send); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("PostSend after Close: %v, want ErrClosed", err)
	}
	if err := a.qp.PostRecv(&verbs.RecvWR{ID: 1, SG: []verbs.SGE{{MR: a.mr, Length: 8}}}); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("PostRecv after Close: %v, want ErrClosed", err)
	}
	if err := a.qp.Connect(context.Background(), b.qp.Attr()); err == nil {
		t.Fatalf("Connect after Close succeeded")
	}
	// Connecting to attributes that name no QP fails, or the QP errors out.
	c := newSide(t, da, 4096, verbs.AccessLocalWrite, 7, 4)
	bogus := b.qp.Attr()
	bogus.QPN ^= 0x800000
	bogus.MTU = 0
	if err := c.qp.Connect(context.Background(), bogus); err == nil {
		t.Fatalf("Connect with an invalid MTU code succeeded")
	}
}

func testInvalidSGE(t *testing.T, env Env) {
	a, _ := newPair(t, env, opts{})
	n := len(a.mr.Bytes())
	for _, sg := range [][]verbs.SGE{
		{{MR: a.mr, Offset: n - 4, Length: 8}},
		{{MR: a.mr, Offset: -1, Length: 8}},
		{{MR: a.mr, Length: -1}},
		{{MR: nil, Length: 8}},
	} {
		err := a.qp.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.OpSend, SG: sg, Signaled: true})
		if err == nil {
			// ibverbs reports a bad SGE as a local protection error completion.
			wc := waitWC(t, env, a.scq, 1)[0]
			if wc.Status != verbs.WCLocProtErr {
				t.Fatalf("SGE %+v: completion %+v, want ErrInvalid or a local protection error", sg[0], wc)
			}
			return
		}
		if !errors.Is(err, verbs.ErrInvalid) {
			t.Fatalf("SGE %+v: %v, want ErrInvalid", sg[0], err)
		}
		if err := a.qp.PostRecv(&verbs.RecvWR{ID: 1, SG: sg}); !errors.Is(err, verbs.ErrInvalid) {
			t.Fatalf("recv SGE %+v: %v, want ErrInvalid", sg[0], err)
		}
	}
	if err := a.qp.PostSend(&verbs.SendWR{ID: 1, Opcode: 99, SG: []verbs.SGE{{MR: a.mr, Length: 1}}}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("opcode 99: %v, want ErrInvalid", err)
	}
	// A region closed already: its keys may be gone with it.
	gone, err := a.pd.AllocMR(4096, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	gone.Close()
	sg := []verbs.SGE{{MR: gone, Length: 8}}
	if err := a.qp.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.OpSend, SG: sg}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("send from a closed region: %v, want ErrInvalid", err)
	}
	if err := a.qp.PostRecv(&verbs.RecvWR{ID: 1, SG: sg}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("receive into a closed region: %v, want ErrInvalid", err)
	}
}

func testCQWait(t *testing.T, env Env) {
	a, b := newPair(t, env, opts{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.rcq.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a cancelled context: %v", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
	start := time.Now()
	err := a.rcq.Wait(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past its deadline: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Wait overran its 20ms deadline by %v", d)
	}
	// A blocked Wait wakes for a completion.
	postRecv(t, a.qp, 1, a.mr, 0, 8)
	woke := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), env.timeout())
		defer cancel()
		for {
			var wc [1]verbs.WorkCompletion
			if n, err := a.rcq.Poll(wc[:]); err != nil || n == 1 {
				woke <- err
				return
			}
			if err := a.rcq.Wait(ctx); err != nil {
				woke <- err
				return
			}
		}
	}()
	time.Sleep(20 * time.Millisecond)
	postSend(t, b.qp, &verbs.SendWR{ID: 2, Opcode: verbs.OpSend, SG: []verbs.SGE{{MR: b.mr, Length: 8}}})
	if err := <-woke; err != nil {
		t.Fatalf("waiting for a completion: %v", err)
	}
	// A blocked Wait returns ErrClosed when the CQ closes; so does a later one.
	closed := make(chan error, 1)
	go func() { closed <- a.scq.Wait(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	if err := a.scq.Close(); err != nil {
		t.Fatalf("close cq: %v", err)
	}
	select {
	case err := <-closed:
		if !errors.Is(err, verbs.ErrClosed) {
			t.Fatalf("Wait across Close: %v, want ErrClosed", err)
		}
	case <-time.After(env.timeout()):
		t.Fatalf("Wait did not return after Close")
	}
	if err := a.scq.Wait(context.Background()); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("Wait after Close: %v, want ErrClosed", err)
	}
	if _, err := a.scq.Poll(make([]verbs.WorkCompletion, 1)); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("Poll after Close: %v, want ErrClosed", err)
	}
}

// testRegisterMR checks verbs.Registrar, where both PDs implement it: a region of
// device b registered on device a is the same memory, reached with a's keys.
func testRegisterMR(t *testing.T, env Env) {
	a, b := newPair(t, env, opts{})
	ra, okA := a.pd.(verbs.Registrar)
	_, okB := b.pd.(verbs.Registrar)
	if !okA || !okB {
		t.Skip("the provider's PD does not implement verbs.Registrar")
	}
	const size = 8192
	orig, err := b.pd.AllocMR(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatalf("alloc mr: %v", err)
	}
	defer orig.Close()
	reg, err := ra.RegisterMR(orig, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatalf("register mr: %v", err)
	}
	defer reg.Close()
	if len(reg.Bytes()) != size || reg.Access() != verbs.AccessLocalWrite|verbs.AccessRemoteWrite {
		t.Fatalf("registration of %d bytes with access %v, want %d and local+remote write", len(reg.Bytes()), reg.Access(), size)
	}
	if _, err := ra.RegisterMR(nil, verbs.AccessLocalWrite); err == nil {
		t.Errorf("RegisterMR(nil) succeeded")
	}
	// b writes through a's QP's peer, into the registration on a; read through orig.
	src := b.mr.Bytes()
	pattern(src, 5)
	postSend(t, b.qp, &verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Signaled: true,
		SG: []verbs.SGE{{MR: b.mr, Offset: 10, Length: size}}, RemoteAddr: reg.Addr(), RKey: reg.RKey()})
	wantWC(t, waitWC(t, env, b.scq, 1)[0], 1, verbs.WCSuccess, verbs.WCWrite)
	sync1(t, env, b, a, 2)
	if i := firstDiff(orig.Bytes(), src[10:10+size]); i >= 0 {
		t.Fatalf("original region differs at offset %d after a write through the registration", i)
	}
	// The registration is a local source on a's QP: a writes it back into b's region.
	copy(orig.Bytes(), "registered")
	postSend(t, a.qp, &verbs.SendWR{ID: 3, Opcode: verbs.OpWrite, Signaled: true,
		SG: []verbs.SGE{{MR: reg, Offset: 0, Length: 10}}, RemoteAddr: a.remote.Addr + 100, RKey: a.remote.RKey})
	wantWC(t, waitWC(t, env, a.scq, 1)[0], 3, verbs.WCSuccess, verbs.WCWrite)
	sync1(t, env, a, b, 4)
	if got := string(b.mr.Bytes()[100:110]); got != "registered" {
		t.Fatalf("write from the registration delivered %q", got)
	}
	// Closing the original leaves the registration usable.
	orig.Close()
	pattern(src, 9)
	postSend(t, b.qp, &verbs.SendWR{ID: 5, Opcode: verbs.OpWrite, Signaled: true,
		SG: []verbs.SGE{{MR: b.mr, Offset: 0, Length: 64}}, RemoteAddr: reg.Addr(), RKey: reg.RKey()})
	wantWC(t, waitWC(t, env, b.scq, 1)[0], 5, verbs.WCSuccess, verbs.WCWrite)
	sync1(t, env, b, a, 6)
	if i := firstDiff(reg.Bytes()[:64], src[:64]); i >= 0 {
		t.Fatalf("registration differs at offset %d after its original closed", i)
	}
}
