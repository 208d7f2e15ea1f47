package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/internal/nstest"
	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr"
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
		peer := <-srv
		if peer == nil || conn.Mode() != smcr.ModeSMCR {
			t.Fatalf("no SMC-R connection")
		}
		files, err := engineRingFiles(conn)
		if err != nil {
			t.Fatal(err)
		}
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
		dc, err := newDirectConn(conn, 0, 0, wake, files, slog.Default())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(dc.release) // its eventfds end the drive's readers
		dc.engine = conn
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
