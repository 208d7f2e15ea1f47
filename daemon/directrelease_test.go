package daemon

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/smcr-io/smcr/internal/nstest"
	"github.com/smcr-io/smcr/rmb"
)

// TestDirectRelease: the library asks for the release (SMCR_LIB_RELEASE) of a
// driven connection with bytes of the peer's left unread in the receive ring
// and bytes of its own not yet read by the peer: smcrd answers RELEASED and
// lets go, and the program's socket (a dup here) carries the rest both ways,
// the unread bytes first, none lost. Once again after the link failed and the
// connection continued over TCP, where the pumps carry the bytes and release
// it the same way once the program read what they took off the socket.
func TestDirectRelease(t *testing.T) {
	for _, fail := range []bool{false, true} {
		conn, peer, c, devs := cursorPair(t)
		t.Cleanup(func() { peer.Close() })
		own := programSocket(t, c)
		own.SetDeadline(time.Now().Add(20 * time.Second))
		dc := drivenConn(t, conn)
		var releases atomic.Uint64
		dc.releases = &releases
		dc.closeLibraryFds()
		go dc.run(nil)
		lib := ringLib{dc}

		mine := bytes.Repeat([]byte("library "), 1000)
		if _, err := lib.Write(mine); err != nil {
			t.Fatal(err)
		}
		readFull(t, peer, mine[:100])
		theirs := bytes.Repeat([]byte("peer "), 1000)
		if _, err := peer.Write(theirs); err != nil {
			t.Fatal(err)
		}
		if fail {
			(*devs)[0].Close()
			awaitContinued(t, conn, peer)
		}
		// The library reads a part (all of it after a continuation: the
		// pumps took the rest off the socket).
		taken := 300
		if fail {
			taken = len(theirs)
		}
		readFull(t, lib, theirs[:taken])

		dc.sh.LibFlags().Or(rmb.LibRelease)
		signal(dc.efdTx)
		for deadline := time.Now().Add(20 * time.Second); dc.sh.DFlags().Load()&(rmb.DReleased|rmb.DNoRelease|rmb.DError) == 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("continued %v: smcrd did not answer the release", fail)
			}
		}
		if f := dc.sh.DFlags().Load(); f&rmb.DReleased == 0 {
			t.Fatalf("continued %v: d_flags %#x, want RELEASED", fail, f)
		}
		select {
		case <-dc.rxDone:
		case <-time.After(10 * time.Second):
			t.Fatalf("continued %v: smcrd still carries the connection after the release", fail)
		}
		if releases.Load() != 1 {
			t.Errorf("continued %v: %d releases counted", fail, releases.Load())
		}
		if _, err := peer.Write([]byte("after")); err != nil {
			t.Fatal(err)
		}
		readFull(t, own, append(theirs[taken:len(theirs):len(theirs)], "after"...))
		readFull(t, peer, mine[100:])
		if _, err := own.Write([]byte("over the socket")); err != nil {
			t.Fatal(err)
		}
		readFull(t, peer, []byte("over the socket"))
		own.(*net.TCPConn).CloseWrite()
		if rest, err := io.ReadAll(peer); err != nil || len(rest) != 0 {
			t.Errorf("continued %v: after the socket's FIN the peer read %q, %v; want EOF", fail, rest, err)
		}
	}
}

// readFull reads len(want) bytes from r and compares them with want.
func readFull(t *testing.T, r io.Reader, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %q, want %q", got, want)
	}
}

// TestDirectReleasePumpsRefused: where the pumps carry a connection over the
// program's own socket, bytes the receive pump took off the socket and the
// program has not read cannot go back there: smcrd answers NO_RELEASE, and
// the connection goes on as it was, both ways, its receive pump started again.
// Once the program read them, the release is done.
func TestDirectReleasePumpsRefused(t *testing.T) {
	c, peer := nstest.TCPPair(t)
	own := programSocket(t, c) // c, the carrier, stands for smcrd's dup
	dc, err := newDirectConn(c, 64<<10, 64<<10, testProcWake(t), nil, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dc.release)
	var releases atomic.Uint64
	dc.releases = &releases
	dc.closeLibraryFds()
	go dc.run(nil)
	lib := ringLib{dc}
	peer.SetDeadline(time.Now().Add(20 * time.Second))

	if _, err := peer.Write([]byte("unread")); err != nil {
		t.Fatal(err)
	}
	for dc.sh.RxProd().Load() != 6 {
		time.Sleep(time.Millisecond)
	}
	ask := func() uint32 {
		t.Helper()
		dc.sh.LibFlags().Or(rmb.LibRelease)
		signal(dc.efdTx)
		var f uint32
		for deadline := time.Now().Add(10 * time.Second); f&(rmb.DReleased|rmb.DNoRelease|rmb.DError) == 0; f = dc.sh.DFlags().Load() {
			if time.Now().After(deadline) {
				t.Fatal("smcrd did not answer the release")
			}
			time.Sleep(time.Millisecond)
		}
		return f
	}
	if f := ask(); f&rmb.DNoRelease == 0 {
		t.Fatalf("d_flags %#x with 6 bytes unread, want NO_RELEASE", f)
	}
	readFull(t, lib, []byte("unread"))
	if _, err := peer.Write([]byte("more")); err != nil {
		t.Fatal(err)
	}
	readFull(t, lib, []byte("more"))
	if _, err := lib.Write([]byte("back")); err != nil {
		t.Fatal(err)
	}
	readFull(t, peer, []byte("back"))
	if releases.Load() != 0 {
		t.Errorf("%d releases counted after a refusal", releases.Load())
	}

	// Asked again (the library does not after a refusal, but smcrd answers
	// each ask), with nothing unread: released.
	dc.sh.LibFlags().And(^uint32(rmb.LibRelease))
	dc.sh.DFlags().And(^uint32(rmb.DNoRelease))
	if f := ask(); f&rmb.DReleased == 0 {
		t.Fatalf("d_flags %#x with nothing unread, want RELEASED", f)
	}
	select {
	case <-dc.rxDone:
	case <-time.After(10 * time.Second):
		t.Fatal("smcrd still carries the connection after the release")
	}
	if releases.Load() != 1 {
		t.Errorf("%d releases counted", releases.Load())
	}
	if _, err := peer.Write([]byte("on the socket")); err != nil {
		t.Fatal(err)
	}
	own.SetDeadline(time.Now().Add(10 * time.Second))
	readFull(t, own, []byte("on the socket"))
}
