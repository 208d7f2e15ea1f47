package rmb

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestSplit(t *testing.T) {
	const size = 100
	for _, tc := range []struct {
		name          string
		pos           uint64
		n             uint32
		first, second Span
	}{
		{"empty", 30, 0, Span{}, Span{}},
		{"within", 30, 20, Span{30, 20}, Span{}},
		{"to the end", 290, 10, Span{90, 10}, Span{}},
		{"wraps", 290, 25, Span{90, 10}, Span{0, 15}},
		{"whole ring from the middle", 290, size, Span{90, 10}, Span{0, 90}},
		{"whole ring from 0", 200, size, Span{0, 100}, Span{}},
		{"clipped to the ring", 290, 3 * size, Span{90, 10}, Span{0, 90}},
		{"at last byte", 99, 2, Span{99, 1}, Span{0, 1}},
	} {
		f, s := Split(tc.pos, tc.n, size)
		if f != tc.first || s != tc.second {
			t.Errorf("%s: Split(%v, %d) = %v %v, want %v %v", tc.name, tc.pos, tc.n, f, s, tc.first, tc.second)
		}
		var w [2]Span
		got := AppendSpans(w[:0], tc.pos, tc.n, size)
		var want []Span
		for _, sp := range []Span{tc.first, tc.second} {
			if sp.Len > 0 {
				want = append(want, sp)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: AppendSpans = %v, want %v", tc.name, got, want)
		}
	}
	// Nothing to place needs no ring: a connection in setup has none yet.
	if f, s := Split(5, 0, 0); f != (Span{}) || s != (Span{}) {
		t.Errorf("Split(5, 0, 0) = %v %v, want nothing", f, s)
	}
	if got := (Span{90, 10}).End(); got != 100 {
		t.Errorf("End = %d, want 100", got)
	}
}

func TestProducer(t *testing.T) {
	p := NewProducer(100)
	if p.Free() != 100 || p.InFlight() != 0 {
		t.Fatalf("fresh producer: free %d in flight %d", p.Free(), p.InFlight())
	}
	f, s := p.Spans(150)
	if f != (Span{0, 100}) || s != (Span{}) {
		t.Fatalf("Spans(150) on empty ring = %v %v", f, s)
	}
	if c, err := p.Produce(70); err != nil || c != (Cursor{0, 70}) {
		t.Fatalf("Produce(70) = %v, %v", c, err)
	}
	if _, err := p.Produce(31); !errors.Is(err, ErrOverrun) {
		t.Fatalf("Produce past free space: err = %v, want ErrOverrun", err)
	}
	if p.Cursor() != (Cursor{0, 70}) {
		t.Fatalf("failed Produce moved the cursor to %v", p.Cursor())
	}
	// The peer consumes 50: 80 free, and the next write wraps.
	if freed, stale, err := p.OnPeerConsumer(Cursor{0, 50}); freed != 50 || stale || err != nil {
		t.Fatalf("OnPeerConsumer(0:50) = %d, %v, %v", freed, stale, err)
	}
	if p.Free() != 80 {
		t.Fatalf("free = %d, want 80", p.Free())
	}
	f, s = p.Spans(1000)
	if f != (Span{70, 30}) || s != (Span{0, 50}) {
		t.Fatalf("Spans = %v %v, want {70 30} {0 50}", f, s)
	}
	if c, err := p.Produce(80); err != nil || c != (Cursor{1, 50}) {
		t.Fatalf("Produce(80) = %v, %v", c, err)
	}
	if p.Free() != 0 {
		t.Fatalf("full ring: free = %d", p.Free())
	}
	if f, s := p.Spans(10); f.Len+s.Len != 0 {
		t.Fatalf("full ring: Spans = %v %v", f, s)
	}

	// A replayed older cursor is stale and changes nothing.
	if freed, stale, err := p.OnPeerConsumer(Cursor{0, 20}); freed != 0 || !stale || err != nil {
		t.Fatalf("stale OnPeerConsumer = %d, %v, %v", freed, stale, err)
	}
	// The same cursor again is not stale, just no progress.
	if freed, stale, err := p.OnPeerConsumer(Cursor{0, 50}); freed != 0 || stale || err != nil {
		t.Fatalf("repeated OnPeerConsumer = %d, %v, %v", freed, stale, err)
	}
	// Consuming past the producer cursor is a protocol error.
	_, _, err := p.OnPeerConsumer(Cursor{1, 51})
	var ce *CursorError
	if !errors.Is(err, ErrPeerCursor) || !errors.As(err, &ce) || ce.Which != "consumer" || ce.Got != (Cursor{1, 51}) {
		t.Fatalf("consumer past producer: err = %v", err)
	}
	// An offset outside the ring is a protocol error.
	if _, _, err := p.OnPeerConsumer(Cursor{1, 100}); !errors.Is(err, ErrPeerCursor) {
		t.Fatalf("offset outside ring: err = %v", err)
	}
	if p.PeerConsumer() != (Cursor{0, 50}) || p.Free() != 0 {
		t.Fatalf("rejected cursors changed state: peer consumer %v free %d", p.PeerConsumer(), p.Free())
	}
	// Everything consumed, across the wrap.
	if freed, _, err := p.OnPeerConsumer(Cursor{1, 50}); freed != 100 || err != nil {
		t.Fatalf("OnPeerConsumer(1:50) = %d, %v", freed, err)
	}
	if p.Free() != 100 {
		t.Fatalf("free = %d, want 100", p.Free())
	}
}

func TestConsumer(t *testing.T) {
	c := NewConsumer(100)
	if c.Readable() != 0 {
		t.Fatalf("fresh consumer readable %d", c.Readable())
	}
	if _, err := c.Consume(1); !errors.Is(err, ErrOverrun) {
		t.Fatalf("Consume on empty ring: err = %v", err)
	}
	// The peer may fill the whole ring, not one byte more.
	_, _, err := c.OnPeerProducer(Cursor{1, 1})
	var ce *CursorError
	if !errors.As(err, &ce) || !errors.Is(err, ErrPeerCursor) || ce.Which != "producer" || ce.Limit != (Cursor{1, 0}) {
		t.Fatalf("producer past free space: err = %v", err)
	}
	if _, _, err := c.OnPeerProducer(Cursor{0, 100}); !errors.Is(err, ErrPeerCursor) {
		t.Fatalf("offset outside ring: err = %v", err)
	}
	if added, stale, err := c.OnPeerProducer(Cursor{1, 0}); added != 100 || stale || err != nil {
		t.Fatalf("OnPeerProducer(1:0) = %d, %v, %v", added, stale, err)
	}
	f, s := c.Spans(1000)
	if f != (Span{0, 100}) || s != (Span{}) {
		t.Fatalf("Spans = %v %v", f, s)
	}
	// Read 9 bytes: 9% is not worth a CDC, unless the peer asks.
	if _, err := c.Consume(9); err != nil {
		t.Fatal(err)
	}
	if c.UpdateDue(false) {
		t.Fatal("update due after 9% consumed")
	}
	if !c.UpdateDue(true) {
		t.Fatal("update not due although requested")
	}
	if _, err := c.Consume(1); err != nil {
		t.Fatal(err)
	}
	if !c.UpdateDue(false) || c.Unconfirmed() != 10 {
		t.Fatalf("10%% consumed: due %v unconfirmed %d", c.UpdateDue(false), c.Unconfirmed())
	}
	if got := c.Report(); got != (Cursor{0, 10}) {
		t.Fatalf("Report = %v, want 0:10", got)
	}
	if c.UpdateDue(false) || c.Unconfirmed() != 0 || c.Confirmed() != (Cursor{0, 10}) || c.ConfirmedPos() != 10 {
		t.Fatalf("after Report: due %v unconfirmed %d confirmed %v", c.UpdateDue(false), c.Unconfirmed(), c.Confirmed())
	}
	// The peer learnt of 10 free bytes: it may now write up to 1:10, and that wraps.
	if _, _, err := c.OnPeerProducer(Cursor{1, 11}); !errors.Is(err, ErrPeerCursor) {
		t.Fatalf("producer past the confirmed space: err = %v", err)
	}
	if added, _, err := c.OnPeerProducer(Cursor{1, 10}); added != 10 || err != nil {
		t.Fatalf("OnPeerProducer(1:10) = %d, %v", added, err)
	}
	f, s = c.Spans(95)
	if f != (Span{10, 90}) || s != (Span{0, 5}) {
		t.Fatalf("Spans(95) = %v %v, want {10 90} {0 5}", f, s)
	}
	if added, stale, err := c.OnPeerProducer(Cursor{0, 99}); added != 0 || !stale || err != nil {
		t.Fatalf("stale producer = %d, %v, %v", added, stale, err)
	}
	if c.PeerProducer() != (Cursor{1, 10}) || c.Readable() != 100 {
		t.Fatalf("state after stale cursor: peer producer %v readable %d", c.PeerProducer(), c.Readable())
	}
}

// TestRingAcrossU16Wrap drives both ends through the point where the wrap counts
// themselves wrap from 65535 to 0.
func TestRingAcrossU16Wrap(t *testing.T) {
	const size = 16
	const start = 0xffff*size + 10 // cursor 65535:10
	p := Producer{size: size, prod: start, peerCons: start}
	c := Consumer{size: size, cons: start, peerProd: start, confirmed: start}
	f, s := p.Spans(size)
	if f != (Span{10, 6}) || s != (Span{0, 10}) {
		t.Fatalf("Spans = %v %v", f, s)
	}
	pc, err := p.Produce(size)
	if err != nil || pc != (Cursor{0, 10}) {
		t.Fatalf("Produce = %v, %v", pc, err)
	}
	if added, stale, err := c.OnPeerProducer(pc); added != size || stale || err != nil {
		t.Fatalf("OnPeerProducer(%v) = %d, %v, %v", pc, added, stale, err)
	}
	cc, err := c.Consume(12)
	if err != nil || cc != (Cursor{0, 6}) {
		t.Fatalf("Consume = %v, %v", cc, err)
	}
	if freed, stale, err := p.OnPeerConsumer(cc); freed != 12 || stale || err != nil {
		t.Fatalf("OnPeerConsumer(%v) = %d, %v, %v", cc, freed, stale, err)
	}
	// A cursor from before the wrap is now stale, not a huge jump forwards.
	if _, stale, err := p.OnPeerConsumer(Cursor{0xffff, 12}); !stale || err != nil {
		t.Fatalf("pre-wrap cursor: stale %v err %v", stale, err)
	}
	if p.Free() != 12 || c.Readable() != 4 {
		t.Fatalf("free %d readable %d, want 12 and 4", p.Free(), c.Readable())
	}
}

// TestRingModel runs random sequences of writes, reads, CDC deliveries (with stale
// replays) and consumer-cursor updates between a Producer and a Consumer over a real
// byte ring, checking against a reference model of absolute stream offsets that no
// byte is lost, duplicated, reordered or overwritten before it was read, and that
// consumer-cursor updates follow the 10% rule.
func TestRingModel(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 30
	}
	for seed := range seeds {
		ringModelRun(t, uint64(seed))
		if t.Failed() {
			return
		}
	}
}

func ringModelRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	size := []uint32{1, 2, 7, 10, 97, 1000, 16 << 10}[rng.IntN(7)]
	// Start anywhere, including just before the u16 wrap-count wrap.
	var base uint64
	switch rng.IntN(3) {
	case 1:
		base = uint64(size)*0xffff - uint64(rng.IntN(int(size)*2+1))
	case 2:
		base = rng.Uint64N(uint64(size) << 16)
	}
	p := Producer{size: size, prod: base, peerCons: base}
	c := Consumer{size: size, cons: base, peerProd: base, confirmed: base}

	ring := make([]byte, size)
	owner := make([]uint64, size) // stream offset of the byte each slot holds
	pattern := func(x uint64) byte { return byte(x*131 + x>>7 + seed) }

	// Model: absolute stream offsets.
	written := base             // bytes produced
	read := base                // bytes consumed
	confirmed := base           // consumer cursor sent to the producer
	peerCons := base            // consumer cursor the producer has accepted
	peerProd := base            // producer cursor the consumer has accepted
	var toCons, toProd []uint64 // CDCs in flight, in order
	var sentProd, sentCons []uint64
	requested := false

	check := func(what string) {
		t.Helper()
		if got, want := p.Free(), uint32(uint64(size)-(written-peerCons)); got != want {
			t.Fatalf("seed %d %s: Free = %d, model %d", seed, what, got, want)
		}
		if got, want := c.Readable(), uint32(peerProd-read); got != want {
			t.Fatalf("seed %d %s: Readable = %d, model %d", seed, what, got, want)
		}
		if got, want := c.Unconfirmed(), uint32(read-confirmed); got != want {
			t.Fatalf("seed %d %s: Unconfirmed = %d, model %d", seed, what, got, want)
		}
		if p.Cursor() != pos(written, size) || c.Cursor() != pos(read, size) {
			t.Fatalf("seed %d %s: cursors %v %v, model %v %v", seed, what,
				p.Cursor(), c.Cursor(), pos(written, size), pos(read, size))
		}
	}

	write := func(n uint32) uint32 {
		f, s := p.Spans(n)
		total := f.Len + s.Len
		if want := min(n, p.Free()); total != want {
			t.Fatalf("seed %d: Spans(%d) cover %d bytes, want %d", seed, n, total, want)
		}
		x := written
		for _, sp := range []Span{f, s} {
			for off := sp.Off; off < sp.End(); off++ {
				if off != uint32(x%uint64(size)) {
					t.Fatalf("seed %d: span offset %d for stream byte %d", seed, off, x)
				}
				if x >= uint64(size)+base && owner[off] >= read {
					t.Fatalf("seed %d: overwriting unread stream byte %d (read up to %d)", seed, owner[off], read)
				}
				ring[off] = pattern(x)
				owner[off] = x
				x++
			}
		}
		if _, err := p.Produce(total); err != nil {
			t.Fatalf("seed %d: Produce(%d): %v", seed, total, err)
		}
		written += uint64(total)
		if total > 0 {
			toCons = append(toCons, written)
			sentProd = append(sentProd, written)
		}
		return total
	}
	deliverToCons := func() {
		if len(toCons) == 0 {
			return
		}
		x := toCons[0]
		toCons = toCons[1:]
		added, stale, err := c.OnPeerProducer(pos(x, size))
		if err != nil || stale || uint64(added) != x-peerProd {
			t.Fatalf("seed %d: OnPeerProducer(%d) = %d, %v, %v (model at %d)", seed, x, added, stale, err, peerProd)
		}
		peerProd = x
	}
	readSome := func(n uint32) uint32 {
		f, s := c.Spans(n)
		total := f.Len + s.Len
		if want := min(n, c.Readable()); total != want {
			t.Fatalf("seed %d: consumer Spans(%d) cover %d, want %d", seed, n, total, want)
		}
		x := read
		for _, sp := range []Span{f, s} {
			for off := sp.Off; off < sp.End(); off++ {
				if owner[off] != x || ring[off] != pattern(x) {
					t.Fatalf("seed %d: slot %d holds stream byte %d (%#x), want %d (%#x)",
						seed, off, owner[off], ring[off], x, pattern(x))
				}
				x++
			}
		}
		if _, err := c.Consume(total); err != nil {
			t.Fatalf("seed %d: Consume(%d): %v", seed, total, err)
		}
		read += uint64(total)
		return total
	}
	maybeUpdate := func() uint32 {
		due := c.UpdateDue(requested)
		tenPercent := (read-confirmed)*10 >= uint64(size)
		if due != (requested || tenPercent) {
			t.Fatalf("seed %d: UpdateDue(%v) = %v with %d of %d unconfirmed", seed, requested, due, read-confirmed, size)
		}
		if !due {
			return 0
		}
		if got := c.Report(); got != pos(read, size) {
			t.Fatalf("seed %d: Report = %v, model %v", seed, got, pos(read, size))
		}
		n := uint32(read - confirmed)
		confirmed = read
		requested = false
		toProd = append(toProd, read)
		sentCons = append(sentCons, read)
		return n
	}
	deliverToProd := func() {
		if len(toProd) == 0 {
			return
		}
		x := toProd[0]
		toProd = toProd[1:]
		freed, stale, err := p.OnPeerConsumer(pos(x, size))
		if err != nil || stale || uint64(freed) != x-peerCons {
			t.Fatalf("seed %d: OnPeerConsumer(%d) = %d, %v, %v (model at %d)", seed, x, freed, stale, err, peerCons)
		}
		peerCons = x
	}
	replayStale := func() {
		// An old CDC arrives again: ignored, state unchanged.
		if len(sentProd) > 1 {
			x := sentProd[rng.IntN(len(sentProd))]
			if x < peerProd {
				if added, stale, err := c.OnPeerProducer(pos(x, size)); added != 0 || !stale || err != nil {
					t.Fatalf("seed %d: replayed producer %d = %d, %v, %v", seed, x, added, stale, err)
				}
			}
		}
		if len(sentCons) > 1 {
			x := sentCons[rng.IntN(len(sentCons))]
			if x < peerCons {
				if freed, stale, err := p.OnPeerConsumer(pos(x, size)); freed != 0 || !stale || err != nil {
					t.Fatalf("seed %d: replayed consumer %d = %d, %v, %v", seed, x, freed, stale, err)
				}
			}
		}
	}

	steps := 2000
	for range steps {
		switch rng.IntN(6) {
		case 0:
			write(rng.Uint32N(size*2) + 1)
			if p.Free() == 0 && rng.IntN(4) == 0 {
				requested = true // a blocked writer may ask for an update
			}
		case 1:
			deliverToCons()
		case 2:
			readSome(rng.Uint32N(size*2) + 1)
		case 3:
			maybeUpdate()
		case 4:
			deliverToProd()
		case 5:
			replayStale()
		}
		check("step")
	}

	// Drain: with the 10% rule and no requests, a blocked writer still makes progress.
	requested = false
	for len(toCons) > 0 {
		deliverToCons()
	}
	for len(toProd) > 0 {
		deliverToProd()
	}
	target := written + uint64(size)*5 + 3
	for round := 0; written < target || read < written; round++ {
		if round > 1000 {
			t.Fatalf("seed %d: no progress: written %d read %d target %d", seed, written, read, target)
		}
		moved := write(uint32(min(uint64(size), target-written)))
		for len(toCons) > 0 {
			deliverToCons()
		}
		moved += readSome(size)
		moved += maybeUpdate() // an update alone unblocks the writer
		for len(toProd) > 0 {
			deliverToProd()
		}
		check("drain")
		if moved == 0 && (written < target || read < written) {
			t.Fatalf("seed %d: deadlock: written %d read %d free %d readable %d unconfirmed %d",
				seed, written, read, p.Free(), c.Readable(), c.Unconfirmed())
		}
	}
}

// FuzzPeerCursors feeds a peer's cursor to a Producer and a Consumer in any state
// they can be in, and checks that a cursor taken keeps the ring's invariants and one
// refused (stale or invalid) changes nothing.
func FuzzPeerCursors(f *testing.F) {
	f.Add(uint8(0), uint64(1000), uint32(100), uint32(50), uint16(0), uint32(0))
	f.Add(uint8(1), uint64(0xffff<<15), uint32(1<<15), uint32(1<<15), uint16(1), uint32(0))
	f.Fuzz(func(t *testing.T, code uint8, base uint64, a, b uint32, wrap uint16, count uint32) {
		size := SizeCode(code % 6).Bytes()
		base %= 1 << 40
		got := Cursor{Wrap: wrap, Count: count}

		// The producer: the peer has consumed up to base, we wrote up to a more.
		p := Producer{size: size, prod: base + uint64(a%(size+1)), peerCons: base}
		was := p
		freed, stale, err := p.OnPeerConsumer(got)
		switch {
		case err != nil || stale:
			if p != was || freed != 0 || err != nil && !errors.Is(err, ErrPeerCursor) {
				t.Fatalf("refused consumer cursor %v: %v, state %+v → %+v", got, err, was, p)
			}
		case p.peerCons < was.peerCons || p.peerCons > p.prod || p.PeerConsumer() != got ||
			uint64(freed) != p.peerCons-was.peerCons:
			t.Fatalf("consumer cursor %v taken as %d from %+v (freed %d)", got, p.peerCons, was, freed)
		}

		// The consumer: reported up to base, read a more, the peer wrote b beyond.
		cons := base + uint64(a%(size+1))
		c := Consumer{size: size, confirmed: base, cons: cons, peerProd: cons + uint64(b%(size-uint32(cons-base)+1))}
		cwas := c
		added, stale, err := c.OnPeerProducer(got)
		switch {
		case err != nil || stale:
			if c != cwas || added != 0 || err != nil && !errors.Is(err, ErrPeerCursor) {
				t.Fatalf("refused producer cursor %v: %v, state %+v → %+v", got, err, cwas, c)
			}
		case c.peerProd < cwas.peerProd || c.peerProd > c.confirmed+uint64(size) || c.PeerProducer() != got ||
			uint64(added) != c.peerProd-cwas.peerProd || c.Readable() > size:
			t.Fatalf("producer cursor %v taken as %d from %+v (added %d)", got, c.peerProd, cwas, added)
		}
	})
}
