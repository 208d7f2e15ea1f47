package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/internal/nstest"
	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// ringLib is the library's side of a direct connection's shared area, in Go:
// Write copies into the send ring and publishes tx_prod, Read takes from the
// receive ring and publishes rx_cons, each waking smcrd as preload/c/ring.c
// does.
type ringLib struct{ dc *directConn }

// await waits until smcrd publishes past seq.
func (l ringLib) await(seq uint32) error {
	for deadline := time.Now().Add(10 * time.Second); l.dc.sh.DSeq().Load() == seq; time.Sleep(20 * time.Microsecond) {
		if time.Now().After(deadline) {
			return errors.New("smcrd published nothing within 10s")
		}
	}
	return nil
}

func (l ringLib) Write(p []byte) (int, error) {
	sh := l.dc.sh
	ring := sh.TxRing()
	size := uint64(len(ring))
	total := 0
	for total < len(p) {
		seq := sh.DSeq().Load()
		if sh.DFlags().Load()&(rmb.DError|rmb.DTxClosed) != 0 {
			return total, errors.New("smcrd: the connection takes no more")
		}
		prod := sh.TxProd().Load()
		free := sh.TxCons().Load() + size - prod
		if free == 0 {
			if err := l.await(seq); err != nil {
				return total, err
			}
			continue
		}
		n := min(free, uint64(len(p)-total))
		var w [2]rmb.Span
		k := total
		for _, s := range rmb.AppendSpans(w[:0], prod, uint32(n), uint32(size)) {
			k += copy(ring[s.Off:s.End()], p[k:])
		}
		sh.TxProd().Store(prod + n)
		if sh.DTxWait().Load() != 0 {
			signal(l.dc.efdTx)
		}
		total += int(n)
	}
	return total, nil
}

func (l ringLib) Read(p []byte) (int, error) {
	sh := l.dc.sh
	ring := sh.RxRing()
	for {
		seq := sh.DSeq().Load()
		cons, prod := sh.RxCons().Load(), sh.RxProd().Load()
		if prod != cons {
			first, _ := rmb.Split(cons, uint32(prod-cons), uint32(len(ring)))
			n := copy(p, ring[first.Off:first.End()])
			sh.RxCons().Store(cons + uint64(n))
			if sh.DRxWait().Load() != 0 {
				signal(l.dc.efdRx)
			}
			return n, nil
		}
		switch f := sh.DFlags().Load(); {
		case f&rmb.DError != 0:
			return 0, errors.New("smcrd: the connection failed")
		case f&rmb.DEOF != 0:
			return 0, io.EOF
		}
		if err := l.await(seq); err != nil {
			return 0, err
		}
	}
}

// TestDirectDrive: a library whose rings are a cursor-driven connection's own
// buffers (shm), smcrd moving only the cursors: streams both ways arrive
// whole, wrapping the rings many times, and the library's close reaches the
// peer as its EOF. Once with the link failing mid-stream, where the
// connection continues over TCP and smcrd's pumps take over from the cursors.
func TestDirectDrive(t *testing.T) {
	for _, fail := range []bool{false, true} {
		conn, peer, _, devs := cursorPair(t)
		dc := drivenConn(t, conn)
		dc.closeLibraryFds() // this library uses smcrd's own view of the rings
		go dc.run(nil)
		lib := ringLib{dc}

		const size = 8 << 20
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); checkStream(t, "library to peer", lib, peer, size, 1) }()
		go func() { defer wg.Done(); checkStream(t, "peer to library", peer, lib, size, 2) }()
		if fail {
			for peer.Stats().RxBytes < size/4 {
				time.Sleep(time.Millisecond)
			}
			(*devs)[0].Close()
		}
		wg.Wait()
		if fail {
			awaitContinued(t, conn, peer)
		}

		dc.sh.LibFlags().Or(rmb.LibClosed)
		signal(dc.efdTx)
		if rest, err := io.ReadAll(peer); err != nil || len(rest) != 0 {
			t.Errorf("continued %v: the peer read %d bytes and %v after the library's close, want EOF", fail, len(rest), err)
		}
		peer.Close()
		select {
		case <-dc.rxDone:
		case <-time.After(10 * time.Second):
			t.Fatalf("continued %v: smcrd still carries the connection after both closed", fail)
		}
	}
}

// TestDirectDriveUrgent: the library's urgent byte (tx_urg) reaches the peer
// as urgent data at its place, and the peer's (WriteUrgent) comes to the
// library as rx_urg before the rx_prod that covers it, with SIGURG to the
// program's socket's owner; through the driver, and through the pumps once
// the connection continued over TCP.
func TestDirectDriveUrgent(t *testing.T) {
	for _, continued := range []bool{false, true} {
		conn, peer, c, devs := cursorPair(t)
		dc := drivenConn(t, conn)
		dc.sock = c // the program's socket, whose owner gets SIGURG
		owner := sigurgCatcher(t)
		setOwner(t, c, owner.Process.Pid)
		dc.closeLibraryFds()
		go dc.run(nil)
		t.Cleanup(func() { // before release: a failed check leaves the drive running
			dc.abort()
			select {
			case <-dc.rxDone:
			case <-time.After(10 * time.Second):
			}
		})
		if continued {
			(*devs)[0].Close()
			awaitContinued(t, conn, peer)
		}
		sh := dc.sh

		// The library: "ab" and "!" with MSG_OOB, then "cd".
		lib := ringLib{dc}
		ring := sh.TxRing()
		copy(ring, "ab!")
		sh.TxUrg().Store(3) // before the tx_prod that covers it
		sh.TxProd().Store(3)
		signal(dc.efdTx)
		if _, err := lib.Write([]byte("cd")); err != nil {
			t.Fatal(err)
		}
		peer.SetReadDeadline(time.Now().Add(10 * time.Second))
		readMarkedUntil(t, fmt.Sprintf("continued %v: library to peer", continued), peer.ReadMarked, "ab!cd", 2)

		// The peer: "xy", then "z" as urgent data.
		if _, err := peer.Write([]byte("xy")); err != nil {
			t.Fatal(err)
		}
		if err := peer.WriteUrgent('z'); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); sh.RxProd().Load() < 3; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("continued %v: the peer's bytes did not come", continued)
			}
		}
		if u := sh.RxUrg().Load(); u != 3 {
			t.Errorf("continued %v: rx_urg %d, want 3 (just past \"xyz\")", continued, u)
		}
		if !continued { // (over TCP the kernel sends one too)
			awaitSigurg(t, owner)
		}
		got := make([]byte, 3)
		if _, err := io.ReadFull(lib, got); err != nil || string(got) != "xyz" {
			t.Errorf("continued %v: the library read %q, %v", continued, got, err)
		}

		sh.LibFlags().Or(rmb.LibClosed)
		signal(dc.efdTx)
		peer.Close()
		select {
		case <-dc.rxDone:
		case <-time.After(10 * time.Second):
			t.Fatalf("continued %v: smcrd still carries the connection after both closed", continued)
		}
	}
}

// sigurgCatcher starts a process that exits once SIGURG reaches it: the
// owner of a program's socket. (The test process itself cannot tell: Go's
// runtime sends itself SIGURG to preempt.)
func sigurgCatcher(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", `trap 'exit 0' URG; echo ready; while :; do sleep 0.05; done`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line := make([]byte, 6)
	if _, err := io.ReadFull(out, line); err != nil {
		t.Fatalf("sigurg catcher: %v", err)
	}
	return cmd
}

// awaitSigurg fails the test unless the catcher exits (took SIGURG) soon.
func awaitSigurg(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("sigurg catcher: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the socket's owner had no SIGURG within 10s")
	}
}

// setOwner makes pid the owner of c's socket (fcntl F_SETOWN).
func setOwner(t *testing.T, c *net.TCPConn, pid int) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	rc.Control(func(fd uintptr) { _, serr = unix.FcntlInt(fd, unix.F_SETOWN, pid) })
	if serr != nil {
		t.Fatal(serr)
	}
}

// testProcWake is smcrd's side of a library process's eventfd and wake page.
func testProcWake(t *testing.T) *procWake {
	t.Helper()
	lw := newLibWake(t)
	dupe := func(fd int) int {
		d, err := unix.Dup(fd)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	wake, err := openProcWake(dupe(lw.efd), dupe(lw.page))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wake.close)
	return wake
}

// cursorPair connects a cursor-driven client Conn (the direct mode's) to a
// server over shm: both, the client's TCP connection and the devices, whose
// failure fails the link.
func cursorPair(t *testing.T) (conn, peer *smcr.Conn, tcp *net.TCPConn, devs *[]verbs.Device) {
	t.Helper()
	newEngine, _, devs := shmEngines(t)
	c, s := nstest.TCPPair(t)
	ce, se := newEngine(), newEngine()
	srv := make(chan *smcr.Conn, 1)
	go func() {
		p, err := se.Server(context.Background(), s)
		if err != nil {
			t.Error(err)
		}
		srv <- p
	}()
	conn, err := ce.ClientWith(context.Background(), c, smcr.ClientOptions{Cursors: true})
	if err != nil {
		t.Fatal(err)
	}
	peer = <-srv
	if peer == nil || conn.Mode() != smcr.ModeSMCR {
		t.Fatalf("no SMC-R connection")
	}
	return conn, peer, c, devs
}

// drivenConn is smcrd's side of a direct connection whose rings are conn's own
// buffers (cursor-driven); released at the test's end, which ends the drive's
// readers.
func drivenConn(t *testing.T, conn *smcr.Conn) *directConn {
	t.Helper()
	files, err := engineRingFiles(conn)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := newDirectConn(conn, 0, 0, testProcWake(t), files, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dc.release)
	dc.engine = conn
	return dc
}

// programSocket is the program's own descriptor of c's socket, of which c
// stands for smcrd's duplicate.
func programSocket(t *testing.T, c *net.TCPConn) net.Conn {
	t.Helper()
	f, err := c.File()
	if err != nil {
		t.Fatal(err)
	}
	own, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Close() })
	return own
}
