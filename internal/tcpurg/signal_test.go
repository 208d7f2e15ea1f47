package tcpurg

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/internal/nstest"
)

// TestReadMarkedSignalPending: Linux's recvmsg at the urgent mark, on a
// non-blocking socket with a signal pending for the thread, says EAGAIN though
// the byte is there, and the socket will not become readable again. The Go
// runtime signals its threads often (SIGURG preempts, the GC scans), so a
// reader that took that EAGAIN for "no data" waited forever, one urgent byte
// in some thousands. Here a goroutine signals the reader's thread without
// pause while the reader meets mark after mark.
func TestReadMarkedSignalPending(t *testing.T) {
	w, r := nstest.TCPPair(t)
	rd, err := NewReader(r)
	if err != nil {
		t.Fatal(err)
	}
	const rounds = 5000
	tid := make(chan int)
	var stop atomic.Bool
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid <- unix.Gettid()
		buf := make([]byte, 16)
		for i := range rounds {
			r.SetReadDeadline(time.Now().Add(2 * time.Second))
			for got := 0; got < 2; {
				n, urgent, err := rd.ReadMarked(buf)
				if err != nil {
					done <- err
					return
				}
				if urgent != (got == 1) || n != 1 {
					t.Errorf("round %d: read %q, urgent %v", i, buf[:n], urgent)
				}
				got += n
			}
			r.Write([]byte{'k'}) // the writer's go-ahead
		}
		done <- nil
	}()
	reader := <-tid
	go func() {
		for !stop.Load() {
			unix.Tgkill(unix.Getpid(), reader, unix.SIGURG)
		}
	}()
	defer stop.Store(true)
	ack := make([]byte, 1)
	for i := range rounds {
		w.Write([]byte{'x'})
		if err := WriteUrgent(w, '!'); err != nil {
			t.Fatal(err)
		}
		w.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := w.Read(ack); err != nil {
			t.Fatalf("round %d: the reader did not see the urgent byte: %v (reader: %v)", i, err, <-done)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
