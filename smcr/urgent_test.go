package smcr

import (
	"bytes"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// markedStream reads r to EOF with ReadMarked and returns the bytes and the
// offsets of the bytes reported urgent, each also sent on seen; it fails on an
// urgent read of more than one byte.
func markedStream(t *testing.T, r *Conn, seen chan<- int) ([]byte, []int) {
	t.Helper()
	r.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got []byte
	var marks []int
	buf := make([]byte, 4096)
	for {
		n, urgent, err := r.ReadMarked(buf)
		if urgent {
			if n != 1 {
				t.Fatalf("urgent read of %d bytes", n)
			}
			marks = append(marks, len(got))
			seen <- len(got)
		}
		got = append(got, buf[:n]...)
		if err == io.EOF {
			return got, marks
		}
		if err != nil {
			t.Fatalf("read after %d bytes: %v", len(got), err)
		}
	}
}

// writeWithUrgent writes the pieces of a stream, each ending in an urgent byte
// when its flag says so, then half-closes. After an urgent byte it waits until the
// reader has seen it: a later one would move the mark, which TCP keeps only one of.
func writeWithUrgent(t *testing.T, w *Conn, pieces []string, urgent []bool, seen <-chan int) {
	for i, p := range pieces {
		if urgent[i] {
			if _, err := w.Write([]byte(p[:len(p)-1])); err != nil {
				t.Errorf("write: %v", err)
				return
			}
			if err := w.WriteUrgent(p[len(p)-1]); err != nil {
				t.Errorf("write urgent: %v", err)
				return
			}
			<-seen
			continue
		}
		if _, err := w.Write([]byte(p)); err != nil {
			t.Errorf("write: %v", err)
			return
		}
	}
	w.CloseWrite()
}

// TestUrgentData: urgent bytes keep their place in the stream and are reported at
// it, over SMC-R (the CDC flag on the CDC that first announces the byte, as
// Linux reads it) and over TCP after a fallback (the kernel's mark); one sits at
// the RMBE's last byte, so the mark meets the ring's wrap.
func TestUrgentData(t *testing.T) {
	const rmbSize = 16 << 10
	pieces := []string{"before!", "after", string(bytes.Repeat([]byte{'x'}, rmbSize-len("before!after")-1)) + "#", "wrapped", "?", "end"}
	urgent := []bool{true, false, true, false, true, false}
	var want []byte
	var wantMarks []int
	for i, p := range pieces {
		want = append(want, p...)
		if urgent[i] {
			wantMarks = append(wantMarks, len(want)-1)
		}
	}
	if wantMarks[1] != rmbSize-1 {
		t.Fatalf("test: second mark at %d, want the ring's last byte", wantMarks[1])
	}
	for _, mode := range []string{"smc-r", "fallback"} {
		t.Run(mode, func(t *testing.T) {
			cli := Config{Devices: memDevices(t, verbs.KindSoft), RMBSize: rmbSize}
			if mode == "fallback" {
				cli = Config{}
			}
			p := newPair(t, cli, Config{Devices: memDevices(t, verbs.KindSoft), RMBSize: rmbSize, CLCTimeout: 200 * time.Millisecond})
			// The CDC that first announces an urgent byte carries the flag,
			// and the byte is the last one it announces.
			var mu sync.Mutex
			var flagged []uint64
			hook := func(c *Conn, m *rmb.CDC) {
				if m.Flags&rmb.FlagUrgentPresent != 0 {
					mu.Lock()
					flagged = append(flagged, uint64(m.Prod.Wrap)*rmbSize+uint64(m.Prod.Count))
					mu.Unlock()
				}
			}
			testHookCDC.Store(&hook)
			t.Cleanup(func() { testHookCDC.Store(nil) })
			c, s := p.connect(t)
			if want := map[string]Mode{"smc-r": ModeSMCR, "fallback": ModeFallback}[mode]; c.Mode() != want {
				t.Fatalf("mode %v", c.Mode())
			}
			seen := make(chan int, len(pieces))
			go writeWithUrgent(t, c, pieces, urgent, seen)
			got, marks := markedStream(t, s, seen)
			if !bytes.Equal(got, want) {
				t.Fatalf("got %d bytes, want %d (or other content)", len(got), len(want))
			}
			if !slices.Equal(marks, wantMarks) {
				t.Fatalf("urgent bytes at %v, want %v", marks, wantMarks)
			}
			mu.Lock()
			defer mu.Unlock()
			if mode == "smc-r" {
				var wantFlagged []uint64
				for _, m := range wantMarks {
					wantFlagged = append(wantFlagged, uint64(m)+1)
				}
				if !slices.Equal(flagged, wantFlagged) {
					t.Errorf("CDCs with the urgent flag announce up to %v, want %v", flagged, wantFlagged)
				}
			}
		})
	}
}

// TestUrgentAcrossContinuation: an urgent byte whose CDC died with the link is resent over TCP still marked.
func TestUrgentAcrossContinuation(t *testing.T) {
	_, c, s, d1 := singleLinkPair(t, nil)
	// The server takes no notice of the CDCs for "ab" (they land unannounced),
	// and the link fails before the one for the urgent byte: all three are resent.
	ignore := func(x *Conn, m *rmb.CDC) {
		if x == s {
			m.Prod = rmb.Cursor{}
		}
	}
	testHookCDC.Store(&ignore)
	t.Cleanup(func() { testHookCDC.Store(nil) })
	c.Write([]byte("ab"))
	failOnCursors(t, c, d1)
	if err := c.WriteUrgent('!'); err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("cd")) // over TCP
	c.CloseWrite()
	got, marks := markedStream(t, s, make(chan int, 1))
	if string(got) != "ab!cd" || !slices.Equal(marks, []int{2}) {
		t.Fatalf("read %q, urgent bytes at %v; want \"ab!cd\", [2]", got, marks)
	}
}

// TestUrgentReadReportsConsumption: the Read that takes an urgent byte sends our
// consumer cursor at once, however little was read since the last one: a Linux
// writer sends nothing after urgent data until its peer has confirmed consuming
// every byte (smc_tx's urg_tx_pend), and a few bytes are far from the 10% rule.
func TestUrgentReadReportsConsumption(t *testing.T) {
	p := memPair(t)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	if _, err := s.Write([]byte("ab")); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteUrgent('!'); err != nil {
		t.Fatal(err)
	}
	s.CloseWrite()
	got, marks := markedStream(t, c, make(chan int, 1))
	if string(got) != "ab!" || !slices.Equal(marks, []int{2}) {
		t.Fatalf("read %q, urgent bytes at %v", got, marks)
	}
	eventually(t, "the writer sees the urgent byte consumed", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.txCons == s.txProd
	})
}
