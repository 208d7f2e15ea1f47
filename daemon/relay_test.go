// Tests of the relay (half-close, reset, stop: RFC 7609 §4.4 close ordering as the
// application sees it) and of the peer cache.

package daemon

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/internal/nstest"
	"github.com/smcr-io/smcr/internal/tcpurg"
	"github.com/smcr-io/smcr/smcr"
	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/shm"
)

// pipeConn is a net.Pipe end with CloseWrite, standing in for an smcr.Conn (not a
// *net.TCPConn, so the relay copies through its buffer instead of splicing).
type pipeConn struct {
	net.Conn
	w *io.PipeWriter
	r *io.PipeReader
}

func (p *pipeConn) Read(b []byte) (int, error)  { return p.r.Read(b) }
func (p *pipeConn) Write(b []byte) (int, error) { return p.w.Write(b) }
func (p *pipeConn) CloseWrite() error           { return p.w.Close() }
func (p *pipeConn) Close() error {
	p.w.CloseWithError(net.ErrClosed)
	p.r.CloseWithError(net.ErrClosed)
	return nil
}

func halfPipes() (*pipeConn, *pipeConn) {
	r1, w1 := io.Pipe()
	r2, w2 := io.Pipe()
	a, b := net.Pipe()
	a.Close()
	b.Close()
	return &pipeConn{Conn: a, r: r1, w: w2}, &pipeConn{Conn: b, r: r2, w: w1}
}

// relayEnds returns the application's connection and smcrd's end of it, and the
// peer's pair: TCP to splice between, or (copy) halfPipes standing in for an
// smcr.Conn.
func relayEnds(t *testing.T, mode string) (app, appSide *net.TCPConn, peer, peerSide net.Conn) {
	app, appSide = nstest.TCPPair(t)
	if mode == "splice" {
		peer, peerSide = nstest.TCPPair(t)
	} else {
		peer, peerSide = halfPipes()
		t.Cleanup(func() { peer.Close(); peerSide.Close() }) // (TCPPair closes its own)
	}
	return app, appSide, peer, peerSide
}

// TestRelayHalfClose: each side writes, half-closes, and still reads everything
// the other side sends after that; no byte is lost, in either relay mode.
func TestRelayHalfClose(t *testing.T) {
	for _, mode := range []string{"splice", "copy"} {
		t.Run(mode, func(t *testing.T) {
			app, appSide, peer, peerSide := relayEnds(t, mode)
			up := make([]byte, 3<<20)
			down := make([]byte, 1<<20+17)
			rand.Read(up)
			rand.Read(down)
			done := make(chan relayResult, 1)
			go func() { done <- relay(appSide, peer, nil, nil) }()

			// The application sends everything and half-closes first; the peer
			// answers only after it has seen EOF, as request/response protocols do.
			go func() {
				app.Write(up)
				app.CloseWrite()
			}()
			got, err := io.ReadAll(peerSide)
			if err != nil || !bytes.Equal(got, up) {
				t.Fatalf("peer got %d bytes (%v), want %d identical", len(got), err, len(up))
			}
			peerSide.Write(down)
			peerSide.(closeWriter).CloseWrite()
			back, err := io.ReadAll(app)
			if err != nil || !bytes.Equal(back, down) {
				t.Fatalf("application got %d bytes (%v), want %d identical", len(back), err, len(down))
			}
			select {
			case res := <-done:
				if res.Err != nil || res.AtoB != int64(len(up)) || res.BtoA != int64(len(down)) {
					t.Fatalf("relay result %+v", res)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("relay did not end after both half-closes")
			}
		})
	}
}

// TestRelayCountsAsItGoes: the connection table sees a relay's bytes while it
// runs, not only once it ends.
func TestRelayCountsAsItGoes(t *testing.T) {
	for _, mode := range []string{"splice", "copy"} {
		t.Run(mode, func(t *testing.T) {
			app, appSide, peer, peerSide := relayEnds(t, mode)
			var counts byteCounts
			stop := make(chan struct{})
			defer close(stop)
			go relay(appSide, peer, stop, &counts)
			go app.Write(make([]byte, 3000))
			if _, err := io.ReadFull(peerSide, make([]byte, 3000)); err != nil {
				t.Fatal(err)
			}
			go peerSide.Write(make([]byte, 700))
			if _, err := io.ReadFull(app, make([]byte, 700)); err != nil {
				t.Fatal(err)
			}
			// A count follows its write: the bytes may arrive a moment before.
			for i := 0; counts.tx.Load() != 3000 || counts.rx.Load() != 700; i++ {
				if i == 100 {
					t.Fatalf("while relaying: %d bytes out, %d in; want 3000 and 700", counts.tx.Load(), counts.rx.Load())
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// TestRelayIdleMemory: a relay that carried a burst each way, then a request
// and its answer, and went idle holds its small buffers only, not a large one
// per direction (which no memory budget counts: thousands of idle connections
// would hold gigabytes).
func TestRelayIdleMemory(t *testing.T) {
	const relays = 64
	burst := make([]byte, 1<<20+5)
	rand.Read(burst)
	heap := func() uint64 {
		runtime.GC()
		runtime.GC() // a sync.Pool keeps what it had until the second collection
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	before := heap()
	stop := make(chan struct{})
	defer close(stop)
	for range relays {
		app, appSide := nstest.TCPPair(t)
		peer, peerSide := halfPipes()
		go relay(appSide, peer, stop, nil)
		go app.Write(burst)
		go peerSide.Write(burst)
		for _, r := range []io.Reader{peerSide, app} {
			if _, err := io.ReadFull(r, make([]byte, len(burst))); err != nil {
				t.Fatal(err)
			}
		}
		for _, ends := range [][2]io.ReadWriter{{app, peerSide}, {peerSide, app}} {
			go ends[0].Write([]byte("request"))
			if _, err := io.ReadFull(ends[1], make([]byte, 7)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Signed: the package's earlier tests may free more meanwhile than the
	// relays hold.
	grown := int64(heap()) - int64(before)
	t.Logf("%d idle relays: heap grew %d KiB, %d KiB each", relays, grown>>10, grown/relays>>10)
	if per := grown / relays; per > 3*smallRelayBuf {
		t.Errorf("an idle relay holds %d KiB, want about %d", per>>10, 2*smallRelayBuf>>10)
	}
}

// TestRelayResetAborts: a reset on one side aborts the other instead of leaving it
// waiting for bytes that cannot come.
func TestRelayResetAborts(t *testing.T) {
	app, appSide := nstest.TCPPair(t)
	peer, peerSide := nstest.TCPPair(t)
	done := make(chan relayResult, 1)
	go func() { done <- relay(appSide, peer, nil, nil) }()
	peerSide.SetLinger(0)
	peerSide.Close() // RST
	app.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.ReadAll(app)
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("application read ended with %v, want a reset", err)
	}
	if res := <-done; res.Err == nil {
		t.Fatal("relay reported an orderly close after a reset")
	}
}

// TestRelayStop: closing stop aborts a relay whose ends are idle (drain timeout).
func TestRelayStop(t *testing.T) {
	_, appSide := nstest.TCPPair(t)
	peer, _ := nstest.TCPPair(t)
	stop := make(chan struct{})
	done := make(chan relayResult, 1)
	go func() { done <- relay(appSide, peer, stop, nil) }()
	close(stop)
	select {
	case res := <-done:
		if !errors.Is(res.Err, errStopped) {
			t.Fatalf("relay ended with %v, want errStopped", res.Err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("relay ignored stop")
	}
}

// TestPeerCache: entries by destination, address and port: a port without SMC-R
// leaves the same host's others alone; expiry, entries an earlier smcrd left,
// and forgetting an address (every port of it) or everything.
func TestPeerCache(t *testing.T) {
	now := time.Unix(1000, 0)
	var neg []netip.AddrPort
	p := newPeerCache(func() time.Time { return now }, func(dst netip.AddrPort, ttl time.Duration) error {
		if ttl != time.Minute {
			t.Errorf("negative ttl %v", ttl)
		}
		neg = append(neg, dst)
		return nil
	})
	x := netip.MustParseAddrPort("198.18.0.2:5201")
	y := netip.MustParseAddrPort("[::ffff:198.18.0.3]:5201")
	y2 := netip.MustParseAddrPort("198.18.0.3:6379")
	p.capable(x, time.Minute)
	p.capable(y2, time.Minute)
	p.incapable(y, reasonNoEcho, time.Minute)
	p.incapable(y, reasonNoEcho, time.Minute)
	if len(neg) != 2 || neg[0] != unmapAP(y) {
		t.Fatalf("negative cache got %v", neg)
	}
	l := p.list()
	if len(l) != 3 || l[0].Addr != "198.18.0.2" || l[0].Port != 5201 || !l[0].Capable || l[0].ExpiresInSeconds != 60 ||
		l[1].Addr != "198.18.0.3" || l[1].Port != 5201 || l[1].Capable || l[1].Hits != 2 || l[1].Reason != reasonNoEcho ||
		l[2].Addr != "198.18.0.3" || l[2].Port != 6379 || !l[2].Capable || l[2].Hits != 1 {
		t.Fatalf("list %+v", l)
	}
	now = now.Add(61 * time.Second)
	if l := p.list(); len(l) != 0 {
		t.Fatalf("expired entries listed: %+v", l)
	}

	// Entries an earlier smcrd left, then forgotten by address and all at once.
	z := netip.MustParseAddrPort("[2001:db8::7]:80")
	p.restore(map[netip.AddrPort]time.Duration{x: 30 * time.Second, z: time.Minute}, reasonKept)
	if l := p.list(); len(l) != 2 || l[0].Capable || l[0].Reason != reasonKept || l[0].ExpiresInSeconds != 30 || l[1].Addr != z.Addr().String() {
		t.Fatalf("restored %+v", l)
	}
	whole := func(a netip.Addr) netip.AddrPort { return netip.AddrPortFrom(a, 0) }
	if gone := p.forget([]netip.AddrPort{whole(z.Addr()), whole(y.Addr())}); len(gone) != 1 || gone[0] != z {
		t.Errorf("forget(%s, %s) = %v, want %s", z.Addr(), y.Addr(), gone, z)
	}
	p.capable(y, time.Minute)
	p.capable(y2, time.Minute)
	if gone := p.forget([]netip.AddrPort{y2}); len(gone) != 1 || gone[0] != y2 {
		t.Errorf("forget(%s) = %v, want it alone", y2, gone)
	}
	p.capable(y2, time.Minute)
	if gone := p.forget([]netip.AddrPort{whole(y2.Addr())}); len(gone) != 2 {
		t.Errorf("forget(%s) = %v, want both its ports", y2.Addr(), gone)
	}
	p.capable(y, time.Minute)
	if gone := p.forget(nil); len(gone) != 2 || len(p.list()) != 0 {
		t.Errorf("forget all = %v, left %+v", gone, p.list())
	}
}

// TestRelayUrgentData: urgent data (send with MSG_OOB) crosses the splicing relay
// as urgent data, at its place in the stream, and the bytes after it follow. A
// splice stops at the urgent mark: io.Copy waited there for readiness that never
// comes, or took the FIN's 0 for EOF.
func TestRelayUrgentData(t *testing.T) {
	app, appSide := nstest.TCPPair(t)
	peer, peerSide := nstest.TCPPair(t)
	done := make(chan relayResult, 1)
	go func() { done <- relay(appSide, peer, nil, nil) }()

	oob := func(c *net.TCPConn, b byte) {
		t.Helper()
		if err := tcpurg.WriteUrgent(c, b); err != nil { // send with MSG_OOB
			t.Fatal(err)
		}
	}
	// The receiver reads inline and asks where the mark is, as telnet does.
	if err := tcpurg.SetInline(peerSide); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	read := func(want string, markAt int) {
		t.Helper()
		var got []byte
		mark := -1
		peerSide.SetReadDeadline(time.Now().Add(5 * time.Second))
		for len(got) < len(want) {
			n, urgent, err := tcpurg.ReadMarked(peerSide, buf[:len(want)-len(got)])
			if urgent {
				mark = len(got)
			}
			got = append(got, buf[:n]...)
			if err != nil {
				t.Fatalf("read: %v after %q", err, got)
			}
		}
		if string(got) != want || mark != markAt {
			t.Fatalf("receiver got %q with the urgent mark at %d; want %q, mark at %d", got, mark, want, markAt)
		}
	}
	// The sender waits for the urgent byte to arrive before it sends more, as
	// a protocol that signals with it does: the relay must not sit at the mark.
	app.Write([]byte("before"))
	oob(app, '!')
	read("before!", len("before"))
	app.Write([]byte("after"))
	oob(app, '?')
	app.CloseWrite()
	read("after?", len("after"))
	peerSide.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := peerSide.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("after the last byte: %d, %v; want EOF", n, err)
	}
	got := []byte("before!after?")
	peerSide.CloseWrite()
	if res := <-done; res.Err != nil || res.AtoB != int64(len(got)) {
		t.Fatalf("relay: %+v", res)
	}
}

// TestAcceptStall: the heartbeat stops only when connections have waited in a
// listener's queue for the TTL with nothing accepted, and resumes with the next
// accept; a busy listener that keeps accepting never stalls.
func TestAcceptStall(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if n := acceptQueue(ln); n != 0 {
		t.Fatalf("empty queue reads %d", n)
	}
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	if n := acceptQueue(ln); n != 2 {
		t.Fatalf("queue with two connections reads %d", n)
	}

	const ttl = 3 * time.Second
	t0 := time.Unix(1000, 0)
	var s acceptStall
	look := func(at time.Duration, waiting int, lastAccept time.Duration, wantStalled, wantChanged bool) {
		t.Helper()
		if st, ch := s.update(t0.Add(at), waiting, t0.Add(lastAccept), ttl); st != wantStalled || ch != wantChanged {
			t.Fatalf("at %v (%d waiting, last accept at %v): stalled %v changed %v, want %v %v", at, waiting, lastAccept, st, ch, wantStalled, wantChanged)
		}
	}
	look(0, 0, -time.Minute, false, false)
	look(time.Second, 2, -time.Minute, false, false)           // waiting from now on
	look(3*time.Second, 2, -time.Minute, false, false)         // 2 s
	look(4*time.Second, 2, -time.Minute, true, true)           // 3 s, nothing accepted
	look(5*time.Second, 2, -time.Minute, true, false)          // still
	look(6*time.Second, 1, 5500*time.Millisecond, false, true) // an accept: resume
	look(8*time.Second, 1, 5500*time.Millisecond, false, false)
	look(9*time.Second, 1, 5500*time.Millisecond, true, true) // 3 s behind that accept
	look(10*time.Second, 0, 5500*time.Millisecond, false, true)
	// Busy: always something waiting, but accepts keep coming.
	for i := range 20 {
		at := 11*time.Second + time.Duration(i)*time.Second
		look(at, 5, at-100*time.Millisecond, false, false)
	}
}

// TestRelayResetWhileWriting: an application that resets its connection while
// smcrd is writing to it gives the peer a reset, not an orderly EOF, in both
// relay modes: the bytes the application had not sent are lost, and the peer
// must know.
func TestRelayResetWhileWriting(t *testing.T) {
	for _, mode := range []string{"splice", "copy"} {
		t.Run(mode, func(t *testing.T) {
			for range 10 {
				app, appSide, peer, peerSide := relayEnds(t, mode)
				done := make(chan relayResult, 1)
				go func() { done <- relay(appSide, peer, nil, nil) }()
				resetWhileFlooded(t, peerSide, app, done)
			}
		})
	}
}

// resetWhileFlooded has flood send more than the buffers hold toward rst, which
// does not read: the relay is blocked writing to rst when rst, after a word of
// its own, resets. flood must then read a reset, not an orderly EOF, and the
// relay report one. (Over TCP, flood stops writing at a deadline: a write of
// its own would take the reset's error from its read.)
func resetWhileFlooded(t *testing.T, flood net.Conn, rst *net.TCPConn, done <-chan relayResult) {
	t.Helper()
	flood.SetWriteDeadline(time.Now().Add(20 * time.Millisecond))
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := flood.Write(buf); err != nil {
				return
			}
		}
	}()
	if _, err := rst.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	rst.SetLinger(0)
	rst.Close() // RST
	if tcp, ok := flood.(*net.TCPConn); ok {
		tcp.SetReadDeadline(time.Now().Add(10 * time.Second))
	}
	got, err := io.ReadAll(flood)
	if err == nil {
		t.Fatalf("an orderly EOF after %q; the other end reset", got)
	}
	if res := <-done; res.Err == nil {
		t.Fatal("relay reported an orderly close after a reset")
	}
}

// TestRelayFINThenReset: an application that sends, shuts down writing and then
// resets, all before smcrd reads, gave every byte and its EOF: the peer gets
// them, as it would over TCP, and no reset in their place.
func TestRelayFINThenReset(t *testing.T) {
	for _, mode := range []string{"splice", "copy"} {
		t.Run(mode, func(t *testing.T) {
			app, appSide, peer, peerSide := relayEnds(t, mode)
			app.Write([]byte("all of it"))
			app.CloseWrite()
			time.Sleep(20 * time.Millisecond) // the FIN is in
			app.SetLinger(0)
			app.Close() // RST
			time.Sleep(20 * time.Millisecond)
			go relay(appSide, peer, nil, nil)
			got, err := io.ReadAll(peerSide)
			if err != nil || string(got) != "all of it" {
				t.Fatalf("peer got %q, %v; want every byte and EOF", got, err)
			}
		})
	}
}

// TestRelayUrgentBurst: urgent bytes that follow each other closely all arrive,
// with the bytes between them, in both relay modes. TCP keeps one urgent mark:
// a later urgent byte can move it on while the splicing relay stands at the
// earlier one, which is then ordinary data; the relay took that for an error
// and reset the connection.
func TestRelayUrgentBurst(t *testing.T) {
	for _, mode := range []string{"splice", "copy"} {
		t.Run(mode, func(t *testing.T) {
			app, appSide, peer, peerSide := relayEnds(t, mode)
			if tcp, ok := peerSide.(*net.TCPConn); ok {
				if err := tcpurg.SetInline(tcp); err != nil {
					t.Fatal(err)
				}
				tcp.SetReadDeadline(time.Now().Add(10 * time.Second))
			}
			done := make(chan relayResult, 1)
			go func() { done <- relay(appSide, peer, nil, nil) }()
			const rounds = 5000
			go func() {
				for range rounds {
					app.Write([]byte("ab"))
					tcpurg.WriteUrgent(app, '!')
				}
				app.CloseWrite()
			}()
			got, err := io.ReadAll(peerSide)
			if err != nil || len(got) != 3*rounds || !bytes.Equal(got, bytes.Repeat([]byte("ab!"), rounds)) {
				t.Fatalf("peer got %d bytes (%v), want %d: ab! %d times", len(got), err, 3*rounds, rounds)
			}
			peerSide.(closeWriter).CloseWrite()
			if res := <-done; res.Err != nil || res.AtoB != 3*rounds {
				t.Fatalf("relay: %+v", res)
			}
		})
	}
}

// TestPeerCacheCapableKeepsNegative: a connection that went SMC-R while another
// to the same peer declined does not make the peer show as capable while the
// programs' negative cache sends connections to it direct; once that entry
// expires, it does.
func TestPeerCacheCapableKeepsNegative(t *testing.T) {
	now := time.Unix(1000, 0)
	p := newPeerCache(func() time.Time { return now }, func(netip.AddrPort, time.Duration) error { return nil })
	x := netip.MustParseAddrPort("198.18.0.2:5201")
	p.incapable(x, "fallback", time.Minute)
	p.capable(x, time.Minute)
	if l := p.list(); len(l) != 1 || l[0].Capable || l[0].Reason != "fallback" || l[0].ExpiresInSeconds != 60 || l[0].Hits != 2 {
		t.Fatalf("capable during a negative entry: %+v, want it not capable for 60s, 2 hits", l)
	}
	now = now.Add(time.Minute)
	p.capable(x, time.Minute)
	if l := p.list(); len(l) != 1 || !l[0].Capable {
		t.Fatalf("capable after the negative entry expired: %+v", l)
	}
}

// TestPeerCacheRetriesLatelyCapable: a peer whose connections went SMC-R and
// then one did not (its smcrd restarting) is cached as without SMC-R for
// retryFirst, twice that the next time, up to the TTL; a connection that goes
// SMC-R starts over. A peer that had SMC-R longer than a TTL ago, or never,
// gets the TTL.
func TestPeerCacheRetriesLatelyCapable(t *testing.T) {
	now := time.Unix(1000, 0)
	var got []time.Duration
	p := newPeerCache(func() time.Time { return now }, func(_ netip.AddrPort, ttl time.Duration) error {
		got = append(got, ttl)
		return nil
	})
	x := netip.MustParseAddrPort("198.18.0.2:5201")
	step := func(d time.Duration) { now = now.Add(d) }
	p.capable(x, time.Minute)
	step(time.Second)
	p.incapable(x, reasonNoEcho, time.Minute) // 5 s
	step(6 * time.Second)
	p.incapable(x, reasonNoEcho, time.Minute) // 10 s
	step(11 * time.Second)
	p.incapable(x, reasonNoEcho, time.Minute) // 20 s
	step(21 * time.Second)
	p.incapable(x, reasonNoEcho, time.Minute) // 40 s
	step(41 * time.Second)
	p.incapable(x, reasonNoEcho, time.Minute) // had SMC-R 80 s ago: the TTL
	step(61 * time.Second)
	p.capable(x, time.Minute)
	p.incapable(x, reasonNoEcho, time.Minute) // started over
	want := []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, time.Minute, 5 * time.Second}
	if !slices.Equal(got, want) {
		t.Fatalf("negative entries for %v, want %v", got, want)
	}
	if l := p.list(); len(l) != 1 || l[0].Capable || l[0].ExpiresInSeconds != 5 || !strings.Contains(l[0].Reason, "had SMC-R") {
		t.Fatalf("list %+v: want x without SMC-R for 5 s, saying why so short", l)
	}
}

// fallbackPair returns an smcr.Conn that fell back to TCP (neither engine has a
// device) and its peer's end, the TCP socket under the peer's fallback.
func fallbackPair(t *testing.T) (*smcr.Conn, *net.TCPConn) {
	t.Helper()
	conn, _, s := smcrPair(t, func() *smcr.Engine {
		e, err := smcr.NewEngine(smcr.Config{CLCTimeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	})
	if conn.Mode() != smcr.ModeFallback {
		t.Fatalf("mode %v, want fallback", conn.Mode())
	}
	return conn, s
}

// smcrPair runs CLC over a TCP pair between two engines newEngine makes, the
// client's first: it returns the client's connection, the server's, and the
// TCP socket under the server's.
func smcrPair(t *testing.T, newEngine func() *smcr.Engine) (conn, peer *smcr.Conn, s *net.TCPConn) {
	t.Helper()
	c, s := nstest.TCPPair(t)
	ce, se := newEngine(), newEngine()
	type result struct {
		c   *smcr.Conn
		err error
	}
	srv := make(chan result, 1)
	go func() { c, err := se.Server(context.Background(), s); srv <- result{c, err} }()
	conn, err := ce.Client(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	r := <-srv
	if r.err != nil {
		t.Fatal(r.err)
	}
	return conn, r.c, s
}

// TestRelayFallbackResetWhileWriting: a peer that resets the TCP connection
// under an SMC-R connection that fell back, while smcrd is writing to it, gives
// the application a reset, not an orderly EOF.
func TestRelayFallbackResetWhileWriting(t *testing.T) {
	for range 10 {
		app, appSide := nstest.TCPPair(t)
		conn, peer := fallbackPair(t)
		done := make(chan relayResult, 1)
		go func() { done <- relay(appSide, conn, nil, nil) }()
		resetWhileFlooded(t, app, peer, done)
	}
}

// shmPair returns an SMC-R connection (shm) and its peer's end, and the
// client's device, whose close fails the link.
func shmPair(t *testing.T) (conn, peer *smcr.Conn, s *net.TCPConn, dev verbs.Device) {
	t.Helper()
	newEngine, _, devs := shmEngines(t)
	conn, peer, s = smcrPair(t, newEngine)
	if conn.Mode() != smcr.ModeSMCR || peer.Mode() != smcr.ModeSMCR {
		t.Fatalf("modes %v, %v; want SMC-R", conn.Mode(), peer.Mode())
	}
	return conn, peer, s, (*devs)[0]
}

// shmEngines returns what makes engines on shm devices of one directory, for
// smcrPair, and the engines and devices it made, in order (the client's first).
func shmEngines(t *testing.T) (newEngine func() *smcr.Engine, engines *[]*smcr.Engine, devs *[]verbs.Device) {
	dir := t.TempDir()
	engines, devs = new([]*smcr.Engine), new([]verbs.Device)
	return func() *smcr.Engine {
		d, err := shm.Open(shm.Config{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		e, err := smcr.NewEngine(smcr.Config{Devices: []verbs.Device{d}, RMBSize: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close(); d.Close() })
		*engines, *devs = append(*engines, e), append(*devs, d)
		return e
	}, engines, devs
}

// continuedPair returns an SMC-R connection (shm) that continued over TCP once
// its link group failed, and the TCP socket under its peer.
func continuedPair(t *testing.T) (*smcr.Conn, *net.TCPConn) {
	t.Helper()
	conn, peer, s, dev := shmPair(t)
	dev.Close() // the client's device goes: the link fails, both ends continue over TCP
	awaitContinued(t, conn, peer)
	return conn, s
}

func awaitContinued(t *testing.T, conns ...*smcr.Conn) {
	t.Helper()
	for _, c := range conns {
		for deadline := time.Now().Add(10 * time.Second); !c.Continued(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the connection did not continue over TCP")
			}
		}
	}
}

// TestRelaySMCR: between a socket and an SMC-R connection, streams both ways
// arrive whole, urgent bytes keep their marks, half-closes pass, and the
// counts are the bytes. Once with the link failing mid-stream, where the
// relay goes on over the continuation.
func TestRelaySMCR(t *testing.T) {
	for _, fail := range []bool{false, true} {
		app, appSide := nstest.TCPPair(t)
		conn, peer, _, dev := shmPair(t)
		done := make(chan relayResult, 1)
		go func() { done <- relay(appSide, conn, nil, nil) }()
		const size = 8 << 20
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); checkStream(t, "app to peer", app, peer, size, 1) }()
		go func() { defer wg.Done(); checkStream(t, "peer to app", peer, app, size, 2) }()
		if fail {
			for peer.Stats().RxBytes < size/4 {
				time.Sleep(time.Millisecond)
			}
			dev.Close()
		}
		wg.Wait()
		if fail {
			awaitContinued(t, conn, peer)
		}

		// Urgent bytes, each way, arrive marked.
		if err := tcpurg.SetInline(app); err != nil {
			t.Fatal(err)
		}
		app.Write([]byte("ab"))
		tcpurg.WriteUrgent(app, '!')
		readMarkedUntil(t, "peer", peer.ReadMarked, "ab!", 2)
		peer.Write([]byte("xy"))
		peer.WriteUrgent('#')
		readMarkedUntil(t, "app", func(p []byte) (int, bool, error) { return tcpurg.ReadMarked(app, p) }, "xy#", 2)

		app.CloseWrite()
		if n, err := peer.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("peer after the app's half-close: %d, %v", n, err)
		}
		peer.CloseWrite()
		if n, err := app.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("app after the peer's half-close: %d, %v", n, err)
		}
		if res := <-done; res.Err != nil || res.AtoB != size+3 || res.BtoA != size+3 {
			t.Fatalf("relay (link failing: %v): %+v, want %d bytes each way", fail, res, size+3)
		}
		peer.Close()
	}
}

// checkStream writes size random bytes to w and checks, by hash, that r reads
// them.
func checkStream(t *testing.T, what string, w io.Writer, r io.Reader, size int, seed byte) {
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*7) ^ seed ^ byte(i>>11)
	}
	go w.Write(data)
	h := sha256.New()
	if n, err := io.CopyN(h, r, int64(size)); err != nil {
		t.Errorf("%s: %d bytes, %v", what, n, err)
	}
	if got, want := h.Sum(nil), sha256.Sum256(data); !bytes.Equal(got, want[:]) {
		t.Errorf("%s: the bytes differ", what)
	}
}

// readMarkedUntil reads want through read and checks that the urgent mark is
// at markAt.
func readMarkedUntil(t *testing.T, what string, read func([]byte) (int, bool, error), want string, markAt int) {
	t.Helper()
	var got []byte
	mark := -1
	buf := make([]byte, 16)
	for len(got) < len(want) {
		n, urgent, err := read(buf[:len(want)-len(got)])
		if urgent {
			mark = len(got)
		}
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("%s: read %v after %q", what, err, got)
		}
	}
	if string(got) != want || mark != markAt {
		t.Fatalf("%s got %q with the mark at %d; want %q, mark at %d", what, got, mark, want, markAt)
	}
}

// TestRelayContinuedResetWhileWriting: as TestRelayFallbackResetWhileWriting,
// under an SMC-R connection that continued over TCP after its link failed.
func TestRelayContinuedResetWhileWriting(t *testing.T) {
	for range 5 {
		app, appSide := nstest.TCPPair(t)
		conn, peer := continuedPair(t)
		done := make(chan relayResult, 1)
		go func() { done <- relay(appSide, conn, nil, nil) }()
		resetWhileFlooded(t, app, peer, done)
	}
}

// TestEndedEarly: a connection the peer reset before smcrd read from it is told
// from one still open, and from one the peer only half-closed (its bytes and
// FIN still to carry).
func TestEndedEarly(t *testing.T) {
	open, _ := nstest.TCPPair(t)
	if err := endedEarly(open); err != nil {
		t.Errorf("open connection: %v, want nil", err)
	}

	halfClosed, peer := nstest.TCPPair(t)
	peer.Write([]byte("last bytes"))
	peer.CloseWrite()
	time.Sleep(20 * time.Millisecond) // the FIN is in
	if err := endedEarly(halfClosed); err != nil {
		t.Errorf("connection the peer half-closed: %v, want nil", err)
	}

	reset, peer := nstest.TCPPair(t)
	peer.SetLinger(0)
	peer.Close() // RST
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if err = endedEarly(reset); err != nil {
			break
		}
	}
	if !errors.Is(err, syscall.ECONNRESET) || !unreachable(err) {
		t.Errorf("connection the peer reset: %v, want ECONNRESET", err)
	}

	// A server that wrote and then reset: its bytes are still to be read, as
	// the application would have read them without smcrd.
	wrote, peer := nstest.TCPPair(t)
	peer.Write([]byte("banner"))
	peer.SetLinger(0)
	time.Sleep(20 * time.Millisecond) // the bytes are in
	peer.Close()                      // RST
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if closed, _, _ := closedState(wrote); closed {
			break
		}
	}
	if err := endedEarly(wrote); err != nil {
		t.Errorf("connection the peer wrote to and reset: %v, want nil (bytes to carry)", err)
	}
	b := make([]byte, 16)
	if n, err := wrote.Read(b); string(b[:n]) != "banner" {
		t.Errorf("read %q, %v; want the banner", b[:n], err)
	}
}

// TestRelayUrgentDuringSetup: urgent bytes an application sends before the
// relay begins (smcrd still connecting, or in CLC) all arrive, on the socket
// smcrd accepted and on the one it dialed. The kernel drops an urgent byte of
// a socket without SO_OOBINLINE from the stream when the next urgent byte
// comes while the first is the next to read: the relay made its sockets inline
// only as it began, and an application's first byte, urgent, was lost.
func TestRelayUrgentDuringSetup(t *testing.T) {
	send := func(c *net.TCPConn) {
		tcpurg.WriteUrgent(c, '1')
		c.Write([]byte("x"))
		tcpurg.WriteUrgent(c, '2')
		tcpurg.WriteUrgent(c, '3')
		c.CloseWrite()
		time.Sleep(20 * time.Millisecond) // in, while smcrd sets up
	}
	carry := func(t *testing.T, mode string, src *net.TCPConn) {
		t.Helper()
		_, _, peer, peerSide := relayEnds(t, mode)
		if tcp, ok := peerSide.(*net.TCPConn); ok {
			tcpurg.SetInline(tcp)
			tcp.SetReadDeadline(time.Now().Add(10 * time.Second))
		}
		go relay(src, peer, nil, nil)
		if got, err := io.ReadAll(peerSide); string(got) != "1x23" || err != nil {
			t.Errorf("peer got %q, %v; want %q", got, err, "1x23")
		}
		peerSide.(closeWriter).CloseWrite()
	}
	for _, mode := range []string{"splice", "copy"} {
		t.Run(mode+"/accepted", func(t *testing.T) {
			// The bytes come before smcrd accepts: the listener's
			// SO_OOBINLINE is its accepted sockets' from the start.
			lc := net.ListenConfig{Control: urgentInline(noControl)}
			ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			send(c.(*net.TCPConn))
			src, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			carry(t, mode, src.(*net.TCPConn))
		})
		t.Run(mode+"/dialed", func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			served := make(chan net.Conn, 1)
			go func() {
				s, err := ln.Accept()
				if err == nil {
					send(s.(*net.TCPConn))
				}
				served <- s
			}()
			defer func() {
				if s := <-served; s != nil {
					s.Close()
				}
			}()
			dl := net.Dialer{Control: urgentInline(noControl)}
			c, err := dl.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(40 * time.Millisecond) // the server's bytes are in
			carry(t, mode, c.(*net.TCPConn))
		})
	}
}

func noControl(string, string, syscall.RawConn) error { return nil }

// stallEnds returns the application's connection and smcrd's end of it, and
// the peer's pair, for the relay modes whose writes can wait for a receiver:
// TCP to splice between, an smcr.Conn fallen back to TCP, and one over SMC-R
// (shm). far is the peer's own end.
func stallEnds(t *testing.T, mode string) (app, appSide *net.TCPConn, peer, far net.Conn) {
	t.Helper()
	app, appSide = nstest.TCPPair(t)
	switch mode {
	case "splice":
		peer, far = nstest.TCPPair(t)
	case "fallback":
		peer, far = fallbackPair(t)
	case "smcr":
		c, p, _, _ := shmPair(t)
		t.Cleanup(func() { p.Close() })
		peer, far = c, p
	default:
		t.Fatal(mode)
	}
	return app, appSide, peer, far
}

// reset ends c as a TCP reset does (or an SMC-R abort).
func reset(c net.Conn) {
	if tcp, ok := c.(*net.TCPConn); ok {
		tcp.SetLinger(0)
	}
	abort(c)
}

// TestRelayResetWhileReceiverStalls: a reset (or an SMC-R abort) that comes
// while the relay's write to the other side waits, that side not reading, is
// passed on within watchEvery or so, as TCP would have passed it on at once:
// nothing else reads the reset side meanwhile, and the relay held both
// connections until the receiver read again.
func TestRelayResetWhileReceiverStalls(t *testing.T) {
	for _, mode := range []string{"splice", "fallback", "smcr"} {
		for _, who := range []string{"app", "peer"} {
			t.Run(mode+"/"+who+"-resets", func(t *testing.T) {
				app, appSide, peer, far := stallEnds(t, mode)
				done := make(chan relayResult, 1)
				go func() { done <- relay(appSide, peer, nil, nil) }()
				// The side that resets sends more than the buffers on the
				// way hold; the other never reads it.
				sender, receiver := net.Conn(app), far
				if who == "peer" {
					sender, receiver = far, app
				}
				go sender.Write(make([]byte, 64<<20))
				time.Sleep(300 * time.Millisecond)
				reset(sender)
				select {
				case res := <-done:
					if res.Err == nil {
						t.Errorf("relay ended without an error after a reset")
					}
				case <-time.After(4 * watchEvery):
					t.Fatalf("relay still running %v after the %s's reset, the %s not reading", 4*watchEvery, who, map[string]string{"app": "peer", "peer": "app"}[who])
				}
				// The receiver reads what came before, then the reset.
				receiver.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.Copy(io.Discard, receiver); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
					t.Errorf("receiver read %v, want a reset", err)
				}
			})
		}
	}
}

// TestRelayResetAfterFINWhileReceiverStalls: a reset that comes after the FIN
// (the application shut down writing, then closed with bytes unread) leaves
// every byte before the FIN to deliver: the stalled relay goes on, and the
// receiver reads them all, then EOF, as it would have over TCP.
func TestRelayResetAfterFINWhileReceiverStalls(t *testing.T) {
	app, appSide, peer, far := stallEnds(t, "splice")
	// Small buffers toward the receiver, so the relay waits early; a large
	// one at smcrd's end of the application, so the application's bytes and
	// FIN are all in before it resets.
	peer.(*net.TCPConn).SetWriteBuffer(64 << 10)
	far.(*net.TCPConn).SetReadBuffer(64 << 10)
	appSide.SetReadBuffer(8 << 20)
	up := make([]byte, 2<<20)
	rand.Read(up)
	done := make(chan relayResult, 1)
	go func() { done <- relay(appSide, peer, nil, nil) }()
	if _, err := app.Write(up); err != nil {
		t.Fatal(err)
	}
	app.CloseWrite()
	for deadline := time.Now().Add(5 * time.Second); tcpState(t, appSide) != tcpCloseWait; {
		if time.Now().After(deadline) {
			t.Fatal("the application's FIN did not come in")
		}
		time.Sleep(10 * time.Millisecond)
	}
	app.SetLinger(0)
	app.Close() // the reset, after the FIN
	select {
	case res := <-done:
		t.Fatalf("relay ended while the receiver stalled: %+v", res)
	case <-time.After(3 * watchEvery):
	}
	far.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(far)
	if err != nil || !bytes.Equal(got, up) {
		t.Fatalf("receiver read %d bytes (%v), want %d identical, then EOF", len(got), err, len(up))
	}
}

// tcpCloseWait is TCP_CLOSE_WAIT of the kernel's TCP states (tcp_states.h).
const tcpCloseWait = 8

func tcpState(t *testing.T, c *net.TCPConn) uint8 {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	rc.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.SOL_TCP, unix.TCP_INFO) })
	if err != nil {
		t.Fatal(err)
	}
	return info.State
}
