package smcr

import (
	"bytes"
	"context"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/smcr-io/smcr/llc"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// TestBufferReuse runs connections one after another on one link group: each
// after the first takes the RMB and send buffer the last one left in the pool
// (no new memory regions), streams hash-checked data both ways through them, and
// a change of max_memory or rmb_size is honoured by freeing the pool.
func TestBufferReuse(t *testing.T) {
	dc, ds := twoDevices(t)
	const size = 64 << 10
	p := newPair(t, Config{Devices: []verbs.Device{dc}, RMBSize: size}, Config{Devices: []verbs.Device{ds}, RMBSize: size})
	released := func() bool {
		return len(p.cli.Conns()) == 0 && len(p.srv.Conns()) == 0 && p.cli.Stats().MemoryInUse == 0 && p.srv.Stats().MemoryInUse == 0
	}
	const rounds = 5
	var mrs [2]int
	var rkeys [2]uint32
	for i := range rounds {
		c, s := p.connect(t)
		mustSMC(t, c, s)
		if got := [2]uint32{c.rmb.RKey(), s.rmb.RKey()}; i == 0 {
			rkeys = got
		} else if got != rkeys {
			t.Fatalf("round %d: RMB rkeys %x, first round %x: not the pooled RMBs", i, got, rkeys)
		}
		stream(t, c, s, 3*size+123, uint64(i))
		stream(t, s, c, 2*size+7, uint64(i)+100)
		c.Close()
		s.Close()
		eventually(t, "connections released", released)
		if i == 0 {
			mrs = [2]int{dc.Live().MRs, ds.Live().MRs}
		} else if got := [2]int{dc.Live().MRs, ds.Live().MRs}; got != mrs {
			t.Fatalf("round %d: memory regions %v, after the first round %v: buffers were not reused", i, got, mrs)
		}
	}
	for _, e := range []*Engine{p.cli, p.srv} {
		st := e.Stats()
		if st.RxReuses != rounds-1 || st.TxReuses != rounds-1 {
			t.Errorf("reuses rx %d tx %d, want %d each", st.RxReuses, st.TxReuses, rounds-1)
		}
		if st.MemoryPooled != 2*size {
			t.Errorf("memory pooled %d, want an RMB and a send buffer (%d)", st.MemoryPooled, 2*size)
		}
	}

	// Room for exactly one connection of a new RMB size: the pool, of the old
	// size, must make way.
	for _, e := range []*Engine{p.cli, p.srv} {
		if err := e.SetRMBSize(2 * size); err != nil {
			t.Fatal(err)
		}
		if err := e.SetMaxMemory(4 * size); err != nil {
			t.Fatal(err)
		}
	}
	c, s := p.connect(t)
	mustSMC(t, c, s)
	stream(t, c, s, 5*size, 77)
	for _, e := range []*Engine{p.cli, p.srv} {
		if st := e.Stats(); st.MemoryPooled != 0 || st.MemoryInUse != 4*size {
			t.Errorf("after a new size under a tight max_memory: pooled %d, in use %d; want 0 and %d", st.MemoryPooled, st.MemoryInUse, 4*size)
		}
	}
	c.Close()
	s.Close()
}

// TestBufferReuseChurn opens and closes short connections from 8 goroutines as
// fast as it can: buffers go in and out of the pool concurrently, every echo is
// checked, and no link may fail, even after the LLC timeout has passed for any
// CONFIRM_RKEY response still pending; and the 8 first dials, concurrent, share
// one first contact.
func TestBufferReuseChurn(t *testing.T) {
	cfg := func() Config {
		return Config{Devices: memDevices(t, verbs.KindSoft), RMBSize: 16 << 10, LLCTimeout: 300 * time.Millisecond}
	}
	p := newPair(t, cfg(), cfg())
	p.echoAll()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				c, err := p.cli.Dial(ctx, "tcp", p.ln.Addr().String())
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
				b := []byte{byte(w), byte(i)}
				c.Write(b)
				if _, err := io.ReadFull(c, b); err != nil {
					t.Error(err)
				}
				c.Close()
			}
		}()
	}
	wg.Wait()
	// Every CONFIRM_RKEY and DELETE_RKEY answered, or timed out and failed
	// its link.
	eventually(t, "no LLC response pending", func() bool {
		return goroutinesIn("smcr.(*link).announceRKey.func") == 0 && goroutinesIn("smcr.(*link).request(") == 0
	})
	for _, e := range []*Engine{p.cli, p.srv} {
		st := e.Stats()
		if st.FirstContact != 1 || st.LinkGroups != 1 || st.Continued != 0 {
			t.Fatalf("first contacts %d, link groups %d, continued %d; want 1, 1, 0 (one group, no link failed)", st.FirstContact, st.LinkGroups, st.Continued)
		}
		if st.RxReuses == 0 {
			t.Fatalf("no RMB reused")
		}
	}
}

// TestPendingRKeyPooledWhenAnswered: an RMB whose CONFIRM_RKEY still awaits its
// response joins the pool only once answered. Responses are matched by rkey: a
// next user announcing the same rkey meanwhile would take that response, and the
// first announcement would time out and fail the link. Short connections end
// before the answer is back (it takes a few wake-ups), so waiting, rather than
// freeing the RMB, is what lets them reuse buffers at all.
func TestPendingRKeyPooledWhenAnswered(t *testing.T) {
	p := memPair(t)
	first, fs := p.connect(t) // first contact: no CONFIRM_RKEY
	mustSMC(t, first, fs)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	if c.rkeyAnnounced == nil {
		t.Fatal("a link-group reuse sent no CONFIRM_RKEY")
	}
	pending := make(chan struct{}) // as if the response were still on its way
	c.mu.Lock()
	c.rkeyAnnounced = pending
	c.mu.Unlock()
	inUse := p.cli.Stats().MemoryInUse
	c.Close()
	s.Close()
	eventually(t, "released", func() bool { return len(p.cli.Conns()) == 1 && len(p.srv.Conns()) == 1 })
	if got, want := p.cli.Stats().MemoryPooled, int64(c.tx.Size()); got != want {
		t.Fatalf("client pooled %d bytes before the answer, want only the send buffer (%d)", got, want)
	}
	// In use counts what is not pooled: the send buffer went to the pool, the
	// RMB waiting for its answer still holds its share.
	if got, want := p.cli.Stats().MemoryInUse, inUse-int64(c.tx.Size()); got != want {
		t.Errorf("client memory in use %d before the answer, want %d", got, want)
	}
	if got, want := p.srv.Stats().MemoryPooled, int64(s.rx.Size())+int64(s.tx.Size()); got != want {
		t.Fatalf("server pooled %d bytes, want its RMB and send buffer (%d)", got, want)
	}
	close(pending)
	want := int64(c.rx.Size()) + int64(c.tx.Size())
	eventually(t, "RMB pooled once answered", func() bool { return p.cli.Stats().MemoryPooled == want })
	c2, s2 := p.connect(t)
	mustSMC(t, c2, s2)
	if c2.rmb.RKey() != c.rmb.RKey() {
		t.Errorf("next connection's RMB rkey %x, want the pooled one %x", c2.rmb.RKey(), c.rmb.RKey())
	}
	stream(t, c2, s2, 100000, 9)
	for _, x := range []*Conn{c2, s2, first, fs} {
		x.Close()
	}
}

// onlyGroup returns e's only link group.
func onlyGroup(t *testing.T, e *Engine) *linkGroup {
	t.Helper()
	e.mu.Lock()
	lgs := slices.Clone(e.lgs)
	e.mu.Unlock()
	if len(lgs) != 1 {
		t.Fatalf("%d link groups, want 1", len(lgs))
	}
	return lgs[0]
}

// peerRMBs counts the peer RMBs e's only link group knows.
func peerRMBs(t *testing.T, e *Engine) int {
	t.Helper()
	lg := onlyGroup(t, e)
	lg.mu.RLock()
	defer lg.mu.RUnlock()
	return lg.peerRMBs.rmbs()
}

// TestReuseSkipsConfirmRkey: a connection that gets a pooled RMB sends no
// CONFIRM_RKEY, and neither end waits for one: the peer kept the RMB since the
// connection that announced it (as Linux's is_conf_rkey). Its setup sends no LLC
// message at all, and its data lands.
func TestReuseSkipsConfirmRkey(t *testing.T) {
	p := memPair(t)
	keep, ks := p.connect(t) // first contact: holds the group
	mustSMC(t, keep, ks)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	if c.rkeyAnnounced == nil || s.rkeyAnnounced == nil {
		t.Fatal("a connection with new RMBs sent no CONFIRM_RKEY")
	}
	c.Close()
	s.Close()
	eventually(t, "RMBs pooled", func() bool {
		return p.cli.Stats().MemoryPooled == int64(c.rx.Size())+int64(c.tx.Size()) && p.srv.Stats().MemoryPooled == int64(s.rx.Size())+int64(s.tx.Size())
	})
	if got := [2]int{peerRMBs(t, p.cli), peerRMBs(t, p.srv)}; got != [2]int{2, 2} {
		t.Fatalf("peer RMBs known (client, server) %v after a release, want 2 each: kept, not forgotten", got)
	}
	llc := [2]uint64{p.cli.Stats().LLCSent, p.srv.Stats().LLCSent}
	c2, s2 := p.connect(t)
	mustSMC(t, c2, s2)
	if c2.rmb.RKey() != c.rmb.RKey() || s2.rmb.RKey() != s.rmb.RKey() {
		t.Fatal("the next connection did not get the pooled RMBs")
	}
	if c2.rkeyAnnounced != nil || s2.rkeyAnnounced != nil {
		t.Error("a pooled RMB was announced again")
	}
	if got := [2]uint64{p.cli.Stats().LLCSent, p.srv.Stats().LLCSent}; got != llc {
		t.Errorf("LLC messages sent (client, server) went from %v to %v in a reusing setup, want none", llc, got)
	}
	stream(t, c2, s2, 300000, 1)
	stream(t, s2, c2, 300000, 2)
	for _, x := range []*Conn{c2, s2, keep, ks} {
		x.Close()
	}
}

// TestDeleteRkeyWithdraws: RMBs that do not fit the pool are deregistered and
// withdrawn with DELETE_RKEY, so each end knows exactly the RMBs the other
// still holds (the one in use and the pooled ones), and a DELETE_RKEY for an
// rkey the peer never knew is answered negative without harm.
func TestDeleteRkeyWithdraws(t *testing.T) {
	p := memPair(t)
	keep, ks := p.connect(t)
	mustSMC(t, keep, ks)
	const n = maxPooled + 4
	var conns []*Conn
	for range n {
		c, s := p.connect(t)
		mustSMC(t, c, s)
		conns = append(conns, c, s)
	}
	if got := [2]int{peerRMBs(t, p.cli), peerRMBs(t, p.srv)}; got != [2]int{n + 1, n + 1} {
		t.Fatalf("peer RMBs known (client, server) %v with %d connections, want %d each", got, n+1, n+1)
	}
	for _, x := range conns {
		x.Close()
	}
	const want = maxPooled + 1
	eventually(t, "the RMBs beyond the pool withdrawn on both ends", func() bool {
		return peerRMBs(t, p.cli) == want && peerRMBs(t, p.srv) == want
	})
	// An rkey the peer does not know: the response flags it, and the link lives.
	if r := withdrawRKey(t, onlyGroup(t, p.cli).primary(), 0xdeadbeef); !r.Negative() || !r.Failed(0) {
		t.Fatalf("DELETE_RKEY of an unknown rkey: negative %v, failed %v", r.Negative(), r.Failed(0))
	}
	if got := peerRMBs(t, p.srv); got != want {
		t.Errorf("server knows %d peer RMBs after an unknown rkey's withdrawal, want %d", got, want)
	}
	echoOK(t, keep, ks)
	// The pooled RMBs still serve, unannounced.
	c, s := p.connect(t)
	mustSMC(t, c, s)
	stream(t, c, s, 100000, 3)
	for _, x := range []*Conn{c, s, keep, ks} {
		x.Close()
	}
}

// TestPeerRMBLimit: a peer that announces more RMBs than a group can hold is
// refused with a negative CONFIRM_RKEY response once the table is full; RMBs
// it knows can still be announced again, and a withdrawal makes room.
func TestPeerRMBLimit(t *testing.T) {
	p := memPair(t)
	keep, ks := p.connect(t)
	mustSMC(t, keep, ks)
	l := onlyGroup(t, p.cli).primary()
	announce := func(rkey uint32) (negative bool) {
		t.Helper()
		var r llc.ConfirmRkey
		ask(t, l, &llc.ConfirmRkey{RKey: rkey, Addr: 0x1000}, uint64(rkey), &r)
		return r.Negative()
	}
	known := peerRMBs(t, p.srv) // first contact's
	for i := range maxPeerRMBs - known {
		if announce(0x10000 + uint32(i)) {
			t.Fatalf("announcement %d refused below the limit", i)
		}
	}
	if !announce(0x20000) {
		t.Fatal("an RMB beyond the limit was accepted")
	}
	if announce(0x10000) {
		t.Fatal("an RMB the server knows was refused when announced again")
	}
	if got := peerRMBs(t, p.srv); got != maxPeerRMBs {
		t.Fatalf("server knows %d peer RMBs, want the limit %d", got, maxPeerRMBs)
	}
	if r := withdrawRKey(t, l, 0x10001); r.Negative() {
		t.Fatal("the withdrawal of a known rkey was answered negative")
	}
	if announce(0x20000) {
		t.Fatal("refused after a withdrawal made room")
	}
	echoOK(t, keep, ks)
	keep.Close()
	ks.Close()
}

// TestConfirmRkeyLateAnswer: a CONFIRM_RKEY that arrives when no response slot
// is free is applied once, in its order with a DELETE_RKEY that follows it;
// applied again when answered later, it brought back an RMB the peer had
// withdrawn.
func TestConfirmRkeyLateAnswer(t *testing.T) {
	p := memPair(t)
	keep, ks := p.connect(t)
	mustSMC(t, keep, ks)
	cl := onlyGroup(t, p.cli).primary()
	sl := onlyGroup(t, p.srv).primary()
	known := peerRMBs(t, p.srv)
	for i := range 50 {
		var held []uint16 // the server's response slots, as behind a backlog
		for range nLLCSlots / 2 {
			held = append(held, <-sl.llcSlots)
		}
		rkey := 0x30000 + uint32(i)
		if err := cl.sendLLC(&llc.ConfirmRkey{RKey: rkey, Addr: 0x1000}); err != nil {
			t.Fatal(err)
		}
		del := &llc.DeleteRkey{Count: 1}
		del.RKeys[0] = rkey
		if err := cl.sendLLC(del); err != nil {
			t.Fatal(err)
		}
		eventually(t, "both requests handled", func() bool { return sl.lateResps.Load() == 2 })
		for _, h := range held {
			sl.llcSlots <- h
		}
		eventually(t, "both answered", func() bool { return sl.lateResps.Load() == 0 })
		if got := peerRMBs(t, p.srv); got != known {
			t.Fatalf("round %d: the server knows %d peer RMBs after an announcement and its withdrawal, want %d", i, got, known)
		}
	}
	echoOK(t, keep, ks)
}

// ask sends the LLC request m on l, as the peer's end would, and decodes the
// response registered under key into resp.
func ask(t *testing.T, l *link, m llc.Message, key uint64, resp interface{ Decode([]byte) error }) {
	t.Helper()
	b, err := l.request(context.Background(), pendKey{t: m.Type(), key: key}, m, 5*time.Second)
	if err == nil {
		err = resp.Decode(b[:])
	}
	if err != nil {
		t.Fatalf("%v request: %v", m.Type(), err)
	}
}

// withdrawRKey sends DELETE_RKEY for rkey on l and returns the response.
func withdrawRKey(t *testing.T, l *link, rkey uint32) llc.DeleteRkey {
	t.Helper()
	m := &llc.DeleteRkey{Count: 1}
	m.RKeys[0] = rkey
	var r llc.DeleteRkey
	ask(t, l, m, uint64(rkey), &r)
	return r
}

// TestDowngradedBuffersReused: under a steady downgrade the pooled (smaller)
// RMB and the send buffer are reused, not freed and allocated anew each time.
func TestDowngradedBuffersReused(t *testing.T) {
	p := memPair(t)
	if err := p.srv.SetMaxMemory(defaultRMB * 3 / 2); err != nil {
		t.Fatal(err)
	}
	released := func() bool {
		return len(p.cli.Conns()) == 0 && len(p.srv.Conns()) == 0 && p.srv.Stats().MemoryInUse == 0
	}
	for i := range 4 {
		c, s := p.connect(t)
		mustSMC(t, c, s)
		echoCheck(t, c, s)
		c.Close()
		s.Close()
		eventually(t, "released", released)
		st := p.srv.Stats()
		t.Logf("round %d: server pooled %d in use %d, rx reuses %d, tx reuses %d, downgrades %d",
			i, st.MemoryPooled, st.MemoryInUse, st.RxReuses, st.TxReuses, st.RxDowngrades)
	}
	st := p.srv.Stats()
	if st.RxReuses != 3 || st.TxReuses != 3 || st.RxDowngrades != 4 {
		t.Errorf("server under a steady downgrade: rx reuses %d, tx reuses %d, downgrades %d; want 3, 3 and 4",
			st.RxReuses, st.TxReuses, st.RxDowngrades)
	}
}

// TestPooledBuffersCleared: a pooled RMB or send buffer reaches the next
// connection without the previous one's bytes, whether that stream stayed
// short of the buffer's end or wrapped around it (only the part a stream
// used is cleared).
func TestPooledBuffersCleared(t *testing.T) {
	const size = 16 << 10
	p := newPair(t, Config{Devices: memDevices(t, verbs.KindSoft), RMBSize: size}, Config{Devices: memDevices(t, verbs.KindSoft), RMBSize: size})
	secret := []byte("SECRET-OF-CONNECTION-ONE")
	// The second stream ends with the secret across the wrap: its tail at
	// the buffer's end, its head at the start.
	filler := bytes.Repeat([]byte{'f'}, size-len(secret)/2)
	for round, stream := range [][]byte{secret, append(filler, secret...)} {
		c, s := p.connect(t)
		mustSMC(t, c, s)
		if round > 0 {
			checkZero(t, round, c, s)
		}
		// Both ways, so all four buffers carry it; the filler, read, makes
		// room for the rest (an RMBE holds size).
		for _, part := range [][]byte{stream[:len(stream)-len(secret)], stream[len(stream)-len(secret):]} {
			for _, ends := range [][2]*Conn{{c, s}, {s, c}} {
				if _, err := ends[0].Write(part); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(ends[1], make([]byte, len(part))); err != nil {
					t.Fatal(err)
				}
			}
		}
		c.Close()
		s.Close()
		eventually(t, "released", func() bool {
			return len(p.cli.Conns()) == 0 && len(p.srv.Conns()) == 0 &&
				p.srv.Stats().MemoryPooled == 2*size && p.cli.Stats().MemoryPooled == 2*size
		})
	}
	c, s := p.connect(t)
	mustSMC(t, c, s)
	checkZero(t, 2, c, s)
	for _, e := range []*Engine{p.cli, p.srv} {
		if st := e.Stats(); st.RxReuses != 2 || st.TxReuses != 2 {
			t.Fatalf("buffers not reused: rx reuses %d, tx reuses %d", st.RxReuses, st.TxReuses)
		}
	}
}

// checkZero fails t unless the RMBs and send buffers of c and s, taken from
// the pool, hold no byte of an earlier connection.
func checkZero(t *testing.T, round int, c, s *Conn) {
	t.Helper()
	for _, b := range []struct {
		name string
		mem  []byte
	}{{"RMB (server)", s.rmb.Bytes()}, {"send buffer (server)", s.snd.Bytes()},
		{"RMB (client)", c.rmb.Bytes()}, {"send buffer (client)", c.snd.Bytes()}} {
		if i := slices.IndexFunc(b.mem, func(x byte) bool { return x != 0 }); i >= 0 {
			t.Errorf("after round %d the new connection's %s holds the previous connection's byte %q at %d of %d",
				round, b.name, b.mem[i], i, len(b.mem))
		}
	}
}

// TestPooledSendBufferCounted: a setup whose send buffer comes from the pool
// reserves no share for it: the memory peak counts only what was held, and a
// tight max_memory does not free the pooled buffer to make room for itself.
func TestPooledSendBufferCounted(t *testing.T) {
	for _, limit := range []int64{0, 200 << 10} { // 200K: 32K new RMB + 64K pooled send buffer + 64K pooled old RMB fit
		const size = 64 << 10
		p := newPair(t, Config{Devices: memDevices(t, verbs.KindSoft), RMBSize: size}, Config{Devices: memDevices(t, verbs.KindSoft), RMBSize: size})
		c, s := p.connect(t)
		mustSMC(t, c, s)
		c.Close()
		s.Close()
		eventually(t, "pooled", func() bool { return len(p.cli.Conns()) == 0 && p.cli.Stats().MemoryPooled == 2*size })
		p.cli.SetRMBSize(size / 2)
		p.cli.SetMaxMemory(limit)
		p.cli.ResetStats()
		c2, s2 := p.connect(t)
		mustSMC(t, c2, s2)
		st := p.cli.Stats()
		if st.TxReuses != 1 {
			t.Errorf("max_memory %d: the pooled send buffer of the right size was freed, not reused (tx reuses %d)", limit, st.TxReuses)
		}
		if held := st.MemoryInUse + st.MemoryPooled; st.MemoryPeak > held {
			t.Errorf("max_memory %d: MemoryPeak %d, but at most %d bytes were ever held since the reset", limit, st.MemoryPeak, held)
		}
	}
}

// TestServerHoldUsesPool: the server's hold for the client's send buffer takes
// no new memory when one of the size is pooled, so a max_memory that fits one
// connection reuses both buffers.
func TestServerHoldUsesPool(t *testing.T) {
	const size = 64 << 10
	p := newPair(t, Config{Devices: memDevices(t, verbs.KindSoft), RMBSize: size}, Config{Devices: memDevices(t, verbs.KindSoft), RMBSize: size, MaxMemory: 2 * size})
	for range 3 {
		c, s := p.connect(t)
		mustSMC(t, c, s)
		echoCheck(t, c, s)
		c.Close()
		s.Close()
		eventually(t, "released", func() bool { return len(p.srv.Conns()) == 0 && p.srv.Stats().MemoryInUse == 0 })
	}
	st := p.srv.Stats()
	t.Logf("server rx reuses %d tx reuses %d pooled %d", st.RxReuses, st.TxReuses, st.MemoryPooled)
	if st.TxReuses != 2 {
		t.Errorf("server tx reuses %d, want 2", st.TxReuses)
	}
}

// TestMemoryInUseNeverNegative: Stats reads memory in use while pooled
// buffers are freed concurrently, and never finds less than nothing.
func TestMemoryInUseNeverNegative(t *testing.T) {
	e := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft)})
	lg := &linkGroup{e: e}
	var stop atomic.Bool
	var neg atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			if st := e.Stats(); st.MemoryInUse < 0 {
				neg.Store(st.MemoryInUse)
				return
			}
		}
	}()
	deadline := time.Now().Add(time.Second)
	for neg.Load() == 0 && time.Now().Before(deadline) {
		// A buffer as keep pools it, then as drainPool/take frees it.
		b := &pooledBuf{size: 64 << 10}
		e.reserve(int64(b.size))
		e.pooled.Add(int64(b.size))
		lg.free(b)
	}
	stop.Store(true)
	wg.Wait()
	if n := neg.Load(); n < 0 {
		t.Errorf("Stats().MemoryInUse = %d with nothing in use", n)
	}
}

// TestCloseFreesLateFrees: Engine.Close frees the buffers of declined
// connections waiting to be freed late, also one whose timer fired as Close
// took them (neither freed it before).
func TestCloseFreesLateFrees(t *testing.T) {
	clk := &fakeClock{}
	e := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft), Clock: clk})
	const n = 64 << 10
	e.reserve(n)
	c := &Conn{e: e, memHeld: n}
	e.freeLater(c)
	e.mu.Lock()
	done := goBlocked(t, func() { e.Close() })                 // waits for e.mu
	fired := goBlocked(t, func() { clk.Advance(time.Minute) }) // and so does the timer's callback
	e.mu.Unlock()
	within(t, done, "Close")
	within(t, fired, "the timer's callback")
	eventually(t, "the declined connection's memory freed", func() bool { return e.mem.Load() == 0 })
}
