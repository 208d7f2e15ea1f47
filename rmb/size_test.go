package rmb

import (
	"errors"
	"testing"
)

func TestSizeCodeBytes(t *testing.T) {
	for _, tc := range []struct {
		c    SizeCode
		want uint32
	}{
		{0, 16 << 10}, {1, 32 << 10}, {2, 64 << 10}, {3, 128 << 10}, {4, 256 << 10},
		{5, 512 << 10}, {15, 512 << 20}, {16, 0}, {255, 0},
	} {
		if got := tc.c.Bytes(); got != tc.want {
			t.Errorf("SizeCode(%d).Bytes() = %d, want %d", tc.c, got, tc.want)
		}
	}
}

func TestSizeCodeFor(t *testing.T) {
	for _, tc := range []struct {
		bytes int
		want  SizeCode
	}{
		{-1, 0}, {0, 0}, {1, 0}, {16384, 0}, {16385, 1}, {32768, 1}, {32769, 2},
		{65536, 2}, {100000, 3}, {262144, 4}, {300000, 5}, {524288, 5},
		{524289, 5}, {10 << 20, 5}, // capped at 512 KiB
	} {
		if got := SizeCodeFor(tc.bytes); got != tc.want {
			t.Errorf("SizeCodeFor(%d) = %d, want %d", tc.bytes, got, tc.want)
		}
	}
	for _, tc := range []struct {
		bytes int
		max   SizeCode
		want  SizeCode
	}{
		{1 << 20, 6, 6}, {1<<20 + 1, 6, 6}, {1 << 20, 7, 6}, {1 << 20, 0, 0},
		{1 << 40, 20, 15}, // the nibble caps any configured maximum
	} {
		if got := SizeCodeForMax(tc.bytes, tc.max); got != tc.want {
			t.Errorf("SizeCodeForMax(%d, %d) = %d, want %d", tc.bytes, tc.max, got, tc.want)
		}
	}
	// Minimality: below the cap, the code is the smallest whose size holds the request.
	for n := 1; n <= 600<<10; n += 997 {
		c := SizeCodeForMax(n, MaxSizeCode)
		if c.Bytes() < uint32(n) {
			t.Fatalf("SizeCodeForMax(%d) = %d: %d bytes is too small", n, c, c.Bytes())
		}
		if c > 0 && (c-1).Bytes() >= uint32(n) {
			t.Fatalf("SizeCodeForMax(%d) = %d: code %d would do", n, c, c-1)
		}
	}
}

func TestDecodeSizeCode(t *testing.T) {
	for _, tc := range []struct {
		code uint8
		max  SizeCode
		want uint32
		err  bool
	}{
		{0, DefaultMaxSizeCode, 16 << 10, false},
		{5, DefaultMaxSizeCode, 512 << 10, false},
		{6, DefaultMaxSizeCode, 0, true},
		{6, 6, 1 << 20, false},
		{15, MaxSizeCode, 512 << 20, false},
		{16, MaxSizeCode, 0, true},
		{15, 200, 512 << 20, false},
		{16, 200, 0, true}, // a configured max above 15 cannot widen the nibble
	} {
		got, err := DecodeSizeCode(tc.code, tc.max)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("DecodeSizeCode(%d, %d) = %d, %v; want %d, error %v", tc.code, tc.max, got, err, tc.want, tc.err)
		}
		if err != nil && !errors.Is(err, ErrSizeCode) {
			t.Errorf("DecodeSizeCode(%d, %d) error %v is not ErrSizeCode", tc.code, tc.max, err)
		}
	}
}
