package drain

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"testing"
)

// sizes is a reader that records how many bytes each Read asked for.
type sizes struct {
	r     io.Reader
	asked []int
}

func (s *sizes) Read(p []byte) (int, error) {
	s.asked = append(s.asked, len(p))
	return s.r.Read(p)
}

func TestNReadsIntoTheBuffer(t *testing.T) {
	src := &sizes{r: bytes.NewReader(make([]byte, 1<<20))}
	buf := make([]byte, 256<<10)
	n, err := N(src, 600<<10, buf)
	if err != nil || n != 600<<10 {
		t.Fatalf("N = %d, %v; want %d, nil", n, err, 600<<10)
	}
	// Two full buffers, then the rest: never past n, never in 8 KiB pieces.
	want := []int{256 << 10, 256 << 10, 88 << 10}
	if !slices.Equal(src.asked, want) {
		t.Fatalf("reads asked for %v, want %v", src.asked, want)
	}
}

func TestNShort(t *testing.T) {
	n, err := N(bytes.NewReader(make([]byte, 100)), 101, make([]byte, 64))
	if n != 100 || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("N of a short stream = %d, %v; want 100, io.ErrUnexpectedEOF", n, err)
	}
	if n, err := N(bytes.NewReader(nil), 0, make([]byte, 1)); n != 0 || err != nil {
		t.Errorf("N of nothing = %d, %v", n, err)
	}
}

func TestAll(t *testing.T) {
	src := &sizes{r: bytes.NewReader(make([]byte, 1000))}
	n, err := All(src, make([]byte, 512))
	if n != 1000 || err != nil {
		t.Fatalf("All = %d, %v; want 1000, nil", n, err)
	}
	for _, a := range src.asked {
		if a != 512 {
			t.Fatalf("reads asked for %v, want 512 each", src.asked)
		}
	}
	boom := errors.New("boom")
	if _, err := All(io.MultiReader(bytes.NewReader([]byte{1}), errReader{boom}), make([]byte, 8)); !errors.Is(err, boom) {
		t.Errorf("All passed on %v, want %v", err, boom)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
