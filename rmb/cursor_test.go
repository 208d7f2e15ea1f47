package rmb

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// pos returns the cursor of absolute stream offset x in a ring of size bytes: the
// reference model the cursor arithmetic is checked against.
func pos(x uint64, size uint32) Cursor {
	return Cursor{Wrap: uint16(x / uint64(size)), Count: uint32(x % uint64(size))}
}

func TestCursorAdd(t *testing.T) {
	const size = 100
	for _, tc := range []struct {
		name string
		c    Cursor
		n    uint32
		want Cursor
	}{
		{"within", Cursor{0, 10}, 20, Cursor{0, 30}},
		{"to last byte", Cursor{0, 10}, 89, Cursor{0, 99}},
		{"exactly to end", Cursor{0, 10}, 90, Cursor{1, 0}},
		{"across end", Cursor{4, 95}, 10, Cursor{5, 5}},
		{"zero", Cursor{7, 42}, 0, Cursor{7, 42}},
		{"whole ring", Cursor{7, 42}, size, Cursor{8, 42}},
		{"several wraps", Cursor{0, 50}, 3*size + 60, Cursor{4, 10}},
		{"u16 wrap count wraps", Cursor{0xffff, 99}, 1, Cursor{0, 0}},
		{"u16 wrap count wraps mid-ring", Cursor{0xffff, 60}, 70, Cursor{0, 30}},
		{"u16 several", Cursor{0xfffe, 0}, 5 * size, Cursor{3, 0}},
	} {
		if got := tc.c.Add(tc.n, size); got != tc.want {
			t.Errorf("%s: %v.Add(%d) = %v, want %v", tc.name, tc.c, tc.n, got, tc.want)
		}
	}
	// Large rings and counts must not overflow 32 bits.
	big := SizeCode(MaxSizeCode).Bytes()
	if got, want := (Cursor{1, big - 1}).Add(big, big), (Cursor{2, big - 1}); got != want {
		t.Errorf("512 MiB ring: Add = %v, want %v", got, want)
	}
	if got, want := (Cursor{0, 1<<32 - 2}).Add(1<<32-1, 1<<32-1), (Cursor{1, 1<<32 - 2}); got != want {
		t.Errorf("max uint32 ring: Add = %v, want %v", got, want)
	}
}

func TestCursorDiffAndLess(t *testing.T) {
	const size = 100
	for _, tc := range []struct {
		name string
		a, b Cursor
		want int64
	}{
		{"same", Cursor{3, 5}, Cursor{3, 5}, 0},
		{"same wrap", Cursor{3, 5}, Cursor{3, 50}, 45},
		{"same wrap backwards", Cursor{3, 50}, Cursor{3, 5}, -45},
		{"across end", Cursor{3, 90}, Cursor{4, 10}, 20},
		{"across end backwards", Cursor{4, 10}, Cursor{3, 90}, -20},
		{"full ring", Cursor{3, 42}, Cursor{4, 42}, size},
		{"two wraps", Cursor{3, 99}, Cursor{5, 0}, 101},
		{"across u16 wrap", Cursor{0xffff, 90}, Cursor{0, 10}, 20},
		{"across u16 wrap backwards", Cursor{0, 10}, Cursor{0xffff, 90}, -20},
		{"full ring across u16", Cursor{0xffff, 0}, Cursor{0, 0}, size},
		{"half the wrap space", Cursor{0, 0}, Cursor{0x7fff, 0}, 0x7fff * size},
	} {
		if got := tc.a.Diff(tc.b, size); got != tc.want {
			t.Errorf("%s: %v.Diff(%v) = %d, want %d", tc.name, tc.a, tc.b, got, tc.want)
		}
		if got, want := tc.a.Less(tc.b), tc.want > 0; got != want {
			t.Errorf("%s: %v.Less(%v) = %v, want %v", tc.name, tc.a, tc.b, got, want)
		}
		if got, want := tc.a.LessEq(tc.b), tc.want >= 0; got != want {
			t.Errorf("%s: %v.LessEq(%v) = %v, want %v", tc.name, tc.a, tc.b, got, want)
		}
	}
}

// TestCursorModel checks Add, Diff and Less against absolute stream offsets, for
// random offsets anywhere in the 2^16-wrap space, including across the u16 wrap.
func TestCursorModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		size := []uint32{1, 3, 100, 16 << 10, 512 << 10, MaxSizeCode.Bytes()}[rng.IntN(6)]
		space := uint64(size) << 16 // offsets modulo this are what a cursor can name
		x := rng.Uint64N(space)
		n := rng.Uint64N(uint64(size) * 3)
		a := pos(x, size)
		if !a.Valid(size) {
			t.Fatalf("model cursor %v invalid for %d", a, size)
		}
		if got, want := a.Add(uint32(n), size), pos((x+n)%space, size); got != want {
			t.Fatalf("size %d: %v.Add(%d) = %v, want %v", size, a, n, got, want)
		}
		// d within the unambiguous half of the wrap space.
		d := int64(rng.Uint64N(space/2)) - int64(space/4)
		b := pos(uint64((int64(x)+d+int64(space)))%space, size)
		if got := a.Diff(b, size); got != d {
			t.Fatalf("size %d: %v.Diff(%v) = %d, want %d", size, a, b, got, d)
		}
		if got := b.Diff(a, size); got != -d {
			t.Fatalf("size %d: %v.Diff(%v) = %d, want %d", size, b, a, got, -d)
		}
		if a.Less(b) != (d > 0) || b.Less(a) != (d < 0) {
			t.Fatalf("size %d: Less(%v, %v) disagrees with distance %d", size, a, b, d)
		}
	}
}

func TestCursorValid(t *testing.T) {
	if !(Cursor{9, 99}).Valid(100) {
		t.Error("99 in a 100-byte ring reported invalid")
	}
	if (Cursor{0, 100}).Valid(100) {
		t.Error("100 in a 100-byte ring reported valid")
	}
	if (Cursor{}).Valid(0) {
		t.Error("any cursor in a 0-byte ring reported valid")
	}
}

func TestCursorPos(t *testing.T) {
	const size = 100
	for _, tc := range []struct {
		name  string
		c     Cursor
		ref   uint64
		want  uint64
		stale bool
	}{
		{"same ring", Cursor{2, 50}, 230, 250, false},
		{"at ref", Cursor{2, 30}, 230, 230, false},
		{"next ring", Cursor{3, 10}, 290, 310, false},
		{"behind in the ring", Cursor{2, 10}, 230, 0, true},
		{"a ring behind", Cursor{1, 90}, 230, 0, true},
		{"across the u16 wrap", Cursor{0, 5}, 0xffff*size + 90, 0x10000*size + 5, false},
		{"behind across the u16 wrap", Cursor{0xffff, 80}, 0x10000*size + 5, 0, true},
	} {
		got, stale, err := tc.c.Pos(tc.ref, size)
		if err != nil || stale != tc.stale || got != tc.want {
			t.Errorf("%s: %v.Pos(%d) = %d, %v, %v; want %d, %v", tc.name, tc.c, tc.ref, got, stale, err, tc.want, tc.stale)
		}
		if !tc.stale && CursorAt(got, size) != tc.c {
			t.Errorf("%s: CursorAt(%d) = %v, want %v", tc.name, got, CursorAt(got, size), tc.c)
		}
	}
	var ce *CursorError
	if _, _, err := (Cursor{0, size}).Pos(0, size); !errors.As(err, &ce) || !errors.Is(err, ErrPeerCursor) {
		t.Errorf("count outside the ring: err = %v", err)
	}
	if _, _, err := (Cursor{}).Pos(0, 0); !errors.Is(err, ErrPeerCursor) {
		t.Errorf("no ring: err = %v", err)
	}
	if got := CursorAt(12345, 0); got != (Cursor{}) {
		t.Errorf("CursorAt in no ring = %v", got)
	}
}

// FuzzCursorPos checks the conversion of a peer's cursor to a position: never one
// behind ref, never a count outside the ring, and the cursor of a position converts
// back to it.
func FuzzCursorPos(f *testing.F) {
	f.Add(uint16(0), uint32(100), uint64(50), uint8(0))
	f.Add(uint16(0xffff), uint32(0), uint64(0xffff<<14), uint8(0))
	f.Add(uint16(1), uint32(16383), uint64(1<<14), uint8(5))
	f.Fuzz(func(t *testing.T, wrap uint16, count uint32, ref uint64, code uint8) {
		size := SizeCode(code % 6).Bytes()
		ref %= 1 << 40
		p, stale, err := (Cursor{Wrap: wrap, Count: count}).Pos(ref, size)
		if (err != nil) != (count >= size) {
			t.Fatalf("cursor %d:%d in %d bytes: err %v", wrap, count, size, err)
		}
		if err != nil || stale {
			return
		}
		if p < ref || p%uint64(size) != uint64(count) || uint16(p/uint64(size)) != wrap {
			t.Fatalf("cursor %d:%d ref %d size %d gave %d", wrap, count, ref, size, p)
		}
		if back, st, err := CursorAt(p, size).Pos(ref, size); err != nil || st || back != p {
			t.Fatalf("round trip %d → %d", p, back)
		}
	})
}
