package smcr

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/internal/tcpurg"
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
		return s.tx.InFlight() == 0
	})
}

// TestUrgentReadAhead: an urgent byte that CLC's reader takes from the socket
// before the application reads keeps its mark. A plain read that begins at the
// mark takes the urgent byte inline with what follows, so each of these lost
// it: a client that speaks no CLC and whose first byte is urgent, and a client
// we declined, whose bytes our check for a crossing CLC message reads first.
func TestUrgentReadAhead(t *testing.T) {
	other := func(netip.Addr) (netip.Prefix, bool) { return netip.MustParsePrefix("10.1.0.0/16"), true }
	for _, declined := range []bool{false, true} {
		t.Run(fmt.Sprintf("declined=%v", declined), func(t *testing.T) {
			e := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft)})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			// The client: raw TCP, or an engine in another subnet, which the
			// server declines (version 1's same-subnet rule).
			client := make(chan net.Conn, 1)
			go func() {
				if !declined {
					c, err := net.Dial("tcp", ln.Addr().String())
					if err != nil {
						t.Error(err)
					}
					client <- c
					return
				}
				ce := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft), Prefixes: other})
				c, err := ce.Dial(context.Background(), "tcp", ln.Addr().String())
				if err != nil {
					t.Error(err)
				}
				client <- c
			}()
			conn, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			srv := conn.(*net.TCPConn)
			tcpurg.SetInline(srv) // as smcrd's listeners are
			write := func(c net.Conn) {
				t.Helper()
				if c == nil {
					t.FailNow()
				}
				var err error
				if sc, ok := c.(*Conn); ok {
					err = sc.WriteUrgent('x')
				} else {
					err = tcpurg.WriteUrgent(c.(*net.TCPConn), 'x')
				}
				if err != nil {
					t.Fatal(err)
				}
				c.Write([]byte("23"))
				c.(interface{ CloseWrite() error }).CloseWrite()
				waitQueued(t, srv, 3)
			}
			var s *Conn
			if declined {
				if s, err = e.Server(context.Background(), srv); err != nil {
					t.Fatal(err)
				}
				c := within(t, client, "the client's dial")
				defer c.Close()
				write(c)
			} else {
				c := within(t, client, "the client's dial")
				defer c.Close()
				write(c)
				if s, err = e.Server(context.Background(), srv); err != nil {
					t.Fatal(err)
				}
			}
			defer s.Close()
			if s.Mode() != ModeFallback || s.Decline().Sent != declined {
				t.Fatalf("server %v %+v", s.Mode(), s.Decline())
			}
			got, marks := markedStream(t, s, make(chan int, 1))
			if string(got) != "x23" || !slices.Equal(marks, []int{0}) {
				t.Fatalf("read %q, urgent bytes at %v; want \"x23\", [0]", got, marks)
			}
		})
	}
}

// waitQueued waits until c's receive queue holds n bytes at least.
func waitQueued(t *testing.T, c *net.TCPConn, n int) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	queued := func() bool {
		q := 0
		rc.Control(func(fd uintptr) { q, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		return q >= n
	}
	if waitFor(waitLimit, queued) {
		return
	}
	t.Fatalf("fewer than %d bytes queued after %v", n, waitLimit)
}
