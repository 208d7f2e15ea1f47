package tcpurg

import (
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/smcr-io/smcr/internal/nstest"
)

// TestReadMarked: with the urgent byte and the bytes after it already queued, a
// read stops before it, the next returns it alone and urgent, the rest follows;
// EOF and deadlines come back as from Read.
func TestReadMarked(t *testing.T) {
	w, r := nstest.TCPPair(t)
	if err := SetInline(r); err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("abc"))
	if err := WriteUrgent(w, '!'); err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("def"))
	time.Sleep(50 * time.Millisecond) // all of it queued at r
	w.CloseWrite()

	r.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	var got []string
	for {
		n, urgent, err := ReadMarked(r, buf)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		s := string(buf[:n])
		if urgent {
			s = "<" + s + ">"
		}
		got = append(got, s)
	}
	if len(got) != 3 || got[0] != "abc" || got[1] != "<!>" || got[2] != "def" {
		t.Fatalf("reads %q, want abc, <!>, def", got)
	}

	w2, r2 := nstest.TCPPair(t)
	_ = w2
	r2.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, _, err := ReadMarked(r2, buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("past the deadline: %v", err)
	}
}
