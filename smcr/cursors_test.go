package smcr

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/rmb"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// cursorRing is the RMB size of the cursor tests: small, so streams wrap and
// fill the rings many times.
const cursorRing = 16 << 10

// cursorApp drives a cursor-driven Conn as smcrd's direct mode does: it
// copies into the send buffer and out of the RMB itself, and waits on the
// cursor notification.
type cursorApp struct {
	c              *Conn
	txWoke, rxWoke chan struct{}
}

func newCursorApp(c *Conn) *cursorApp {
	a := &cursorApp{c: c, txWoke: make(chan struct{}, 1), rxWoke: make(chan struct{}, 1)}
	c.SetCursorNotify(func() {
		wake(a.txWoke)
		wake(a.rxWoke)
	})
	return a
}

// write copies p into the send buffer as space frees and posts it.
func (a *cursorApp) write(p []byte) error {
	buf := a.c.SendBuffer()
	size := uint64(len(buf))
	for len(p) > 0 {
		cur := a.c.Cursors()
		if cur.WriteErr != nil {
			return cur.WriteErr
		}
		free := cur.PeerConsumed + size - cur.Produced
		if free == 0 {
			select {
			case <-a.txWoke:
			case <-time.After(waitLimit):
				return errors.New("no room within the wait limit")
			}
			continue
		}
		n := min(free, uint64(len(p)))
		var w [2]rmb.Span
		k := 0
		for _, s := range rmb.AppendSpans(w[:0], cur.Produced, uint32(n), uint32(size)) {
			k += copy(buf[s.Off:s.End()], p[k:])
		}
		if err := a.c.PostProduced(cur.Produced + n); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// readAll reads until the stream ends, and returns the bytes and what ended
// it (io.EOF for a whole stream).
func (a *cursorApp) readAll() ([]byte, error) {
	buf := a.c.RecvBuffer()
	var got []byte
	for {
		cur := a.c.Cursors()
		if n := cur.PeerProduced - cur.Consumed; n > 0 {
			first, second := rmb.Split(cur.Consumed, uint32(n), uint32(len(buf)))
			got = append(got, buf[first.Off:first.End()]...)
			got = append(got, buf[second.Off:second.End()]...)
			if err := a.c.Consumed(cur.PeerProduced); err != nil {
				return got, err
			}
			continue
		}
		if cur.ReadErr != nil {
			return got, cur.ReadErr
		}
		select {
		case <-a.rxWoke:
		case <-time.After(waitLimit):
			return got, errors.New("no bytes within the wait limit")
		}
	}
}

// cursorConns connects a client and a server over devices of open, each
// cursor-driven as asked.
func cursorConns(t *testing.T, open func(testing.TB) verbs.Device, cliCursors, srvCursors bool) (cli, srv *Conn) {
	t.Helper()
	dc, ds := open(t), open(t)
	t.Cleanup(func() { dc.Close(); ds.Close() })
	ec := newEngine(t, Config{Devices: []verbs.Device{dc}, RMBSize: cursorRing})
	es := newEngine(t, Config{Devices: []verbs.Device{ds}, RMBSize: cursorRing})
	cli, srv = connectWith(t, ec, es, ClientOptions{Cursors: cliCursors}, ServerOptions{Cursors: srvCursors})
	mustSMC(t, cli, srv)
	t.Cleanup(func() {
		// Closed before the engines: their buffers go back to the provider,
		// not to the pool (an application may still map them).
		cli.Close()
		srv.Close()
		eventually(t, "buffers released", func() bool {
			return ec.Stats().MemoryInUse == 0 && es.Stats().MemoryInUse == 0
		})
		for _, end := range []struct {
			e       *Engine
			cursors bool
		}{{ec, cliCursors}, {es, srvCursors}} {
			if pooled := end.e.Stats().MemoryPooled; end.cursors && pooled != 0 {
				t.Errorf("cursor-driven buffers pooled: %d bytes", pooled)
			}
		}
	})
	return cli, srv
}

// TestCursorsStream: cursor-driven ends carry streams both ways at once
// through rings they wrap and fill many times, to a cursor-driven peer and to
// one that reads and writes as a net.Conn; the bytes arrive whole and in
// order, then EOF after the half-close.
func TestCursorsStream(t *testing.T) {
	const total = 1 << 20
	for _, pr := range providers {
		for _, peerCursors := range []bool{true, false} {
			name := pr.name + "/cursors-peer"
			if !peerCursors {
				name = pr.name + "/conn-peer"
			}
			t.Run(name, func(t *testing.T) {
				cli, srv := cursorConns(t, pr.open, true, peerCursors)
				a := newCursorApp(cli)
				if got := len(a.c.SendBuffer()); got != cursorRing {
					t.Fatalf("send buffer of %d bytes, want %d", got, cursorRing)
				}
				up, down := randomBytes(31, total), randomBytes(32, total)
				errc := make(chan error, 4)
				go func() {
					err := a.write(up)
					if err == nil {
						err = cli.CloseWrite()
					}
					errc <- err
				}()
				go func() {
					got, err := a.readAll()
					errc <- checkStream("to the cursor-driven end", got, down, err)
				}()
				if peerCursors {
					b := newCursorApp(srv)
					go func() {
						err := b.write(down)
						if err == nil {
							err = srv.CloseWrite()
						}
						errc <- err
					}()
					go func() {
						got, err := b.readAll()
						errc <- checkStream("from the cursor-driven end", got, up, err)
					}()
				} else {
					go func() {
						_, err := srv.Write(down)
						if err == nil {
							err = srv.CloseWrite()
						}
						errc <- err
					}()
					go func() {
						got, err := io.ReadAll(srv)
						if err == nil {
							err = io.EOF
						}
						errc <- checkStream("from the cursor-driven end", got, up, err)
					}()
				}
				for range 4 {
					if err := within(t, errc, "the streams"); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

// checkStream is nil when got is want, ended by EOF.
func checkStream(what string, got, want []byte, err error) error {
	if err != io.EOF {
		return errors.Join(errors.New(what+": ended by"), err)
	}
	if !bytes.Equal(got, want) {
		return errors.New(what + ": bytes differ")
	}
	return nil
}

// TestCursorsFullRing: a writer fills the peer's whole RMBE, can post nothing
// past it, and learns through the notification when the peer consumed; the
// cursor calls refuse positions outside their rings.
func TestCursorsFullRing(t *testing.T) {
	for _, pr := range providers {
		t.Run(pr.name, func(t *testing.T) {
			cli, srv := cursorConns(t, pr.open, true, true)
			a, b := newCursorApp(cli), newCursorApp(srv)
			data := randomBytes(41, cursorRing)
			copy(cli.SendBuffer(), data)
			if err := cli.PostProduced(cursorRing + 1); err == nil {
				t.Fatal("posted past the free space")
			}
			if err := cli.PostProduced(cursorRing); err != nil {
				t.Fatal(err)
			}
			if err := cli.PostProduced(cursorRing - 1); err == nil {
				t.Fatal("producer cursor went back")
			}
			// The server's RMB fills: all of it readable, nothing free.
			for srv.Cursors().PeerProduced != cursorRing {
				within(t, b.rxWoke, "the server's RMB filling")
			}
			if got := srv.RecvBuffer(); !bytes.Equal(got, data) {
				t.Fatal("the RMB holds other bytes than were posted")
			}
			if err := srv.Consumed(cursorRing + 1); err == nil {
				t.Fatal("consumed past the readable bytes")
			}
			if cur := cli.Cursors(); cur.Produced-cur.PeerConsumed != cursorRing {
				t.Fatalf("cursors %+v: the ring should be full", cur)
			}
			if err := cli.PostProduced(cursorRing + 1); err == nil {
				t.Fatal("posted into a full ring")
			}
			if err := srv.Consumed(cursorRing); err != nil {
				t.Fatal(err)
			}
			// A full ring asked for the consumer cursor at once.
			for cli.Cursors().PeerConsumed != cursorRing {
				within(t, a.txWoke, "the client's ring emptying")
			}
			// Wrapped: the next bytes start at the ring's start again.
			more := randomBytes(42, 100)
			if err := a.write(more); err != nil {
				t.Fatal(err)
			}
			for srv.Cursors().PeerProduced != cursorRing+100 {
				within(t, b.rxWoke, "the bytes after the wrap")
			}
			if got := srv.RecvBuffer()[:100]; !bytes.Equal(got, more) {
				t.Fatal("the bytes after the wrap differ")
			}
		})
	}
}

// TestCursorsAbort: an abort reaches the peer's cursors as a reset, for its
// reads and its writes; the aborting end posts nothing more.
func TestCursorsAbort(t *testing.T) {
	for _, pr := range providers {
		t.Run(pr.name, func(t *testing.T) {
			cli, srv := cursorConns(t, pr.open, true, true)
			b := newCursorApp(srv)
			if err := cli.Abort(); err != nil {
				t.Fatal(err)
			}
			for srv.Cursors().ReadErr == nil {
				within(t, b.rxWoke, "the abort")
			}
			cur := srv.Cursors()
			if !errors.Is(cur.ReadErr, ErrReset) || !errors.Is(cur.WriteErr, ErrReset) {
				t.Fatalf("after the peer's abort: read %v, write %v; want %v", cur.ReadErr, cur.WriteErr, ErrReset)
			}
			if err := srv.PostProduced(1); !errors.Is(err, ErrReset) {
				t.Fatalf("post after the peer's abort: %v, want %v", err, ErrReset)
			}
			if err := cli.PostProduced(1); !errors.Is(err, ErrAborted) {
				t.Fatalf("post after our abort: %v, want %v", err, ErrAborted)
			}
		})
	}
}

// TestCursorsNotDriven: a Conn made without the option refuses the cursor
// calls and shows no buffers.
func TestCursorsNotDriven(t *testing.T) {
	cli, srv := cursorConns(t, providers[0].open, false, true)
	if err := cli.PostProduced(1); !errors.Is(err, ErrNotCursorDriven) {
		t.Fatalf("PostProduced: %v, want %v", err, ErrNotCursorDriven)
	}
	if err := cli.Consumed(0); !errors.Is(err, ErrNotCursorDriven) {
		t.Fatalf("Consumed: %v, want %v", err, ErrNotCursorDriven)
	}
	if cli.SendBuffer() != nil || cli.RecvBuffer() != nil {
		t.Fatal("buffers of a Conn that is not cursor-driven")
	}
	if srv.SendBuffer() == nil || srv.RecvBuffer() == nil {
		t.Fatal("no buffers on the cursor-driven end")
	}
}

// TestCursorsBufferFiles: over shm, another mapping of the buffers' files
// (a library's, in smcrd's direct mode) puts bytes into the send buffer and
// finds the peer's in the RMB; soft keeps its buffers in no file.
func TestCursorsBufferFiles(t *testing.T) {
	for _, pr := range providers {
		t.Run(pr.name, func(t *testing.T) {
			cli, srv := cursorConns(t, pr.open, true, true)
			b := newCursorApp(srv)
			cs, _, err := cli.DupBufferFiles()
			if pr.name != "shm" {
				if !errors.Is(err, errors.ErrUnsupported) {
					t.Fatalf("files of %s buffers: %v, want %v", pr.name, err, errors.ErrUnsupported)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			_, sr, err := srv.DupBufferFiles()
			if err != nil {
				t.Fatal(err)
			}
			send := mapBufferFile(t, cs)
			recv := mapBufferFile(t, sr)
			data := randomBytes(51, 1000)
			copy(send, data)
			if err := cli.PostProduced(uint64(len(data))); err != nil {
				t.Fatal(err)
			}
			for srv.Cursors().PeerProduced != uint64(len(data)) {
				within(t, b.rxWoke, "the bytes written through the file")
			}
			if !bytes.Equal(recv[:len(data)], data) {
				t.Fatal("the RMB's file holds other bytes than the send buffer's")
			}
		})
	}
}

// mapBufferFile maps f for the test and closes its descriptor.
func mapBufferFile(t *testing.T, f BufferFile) []byte {
	t.Helper()
	defer unix.Close(f.FD)
	if f.Len != cursorRing {
		t.Fatalf("buffer of %d bytes, want %d", f.Len, cursorRing)
	}
	mem, err := unix.Mmap(f.FD, f.Off, f.Len, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return mem
}

// TestCursorsContinuation: when the link fails, a cursor-driven connection
// continues over TCP as any other: the cursor calls stop with ErrContinued,
// bytes the application had not posted go by Write, and Read returns what
// the RMB held unread, then the TCP stream's; its buffers stay until Close.
func TestCursorsContinuation(t *testing.T) {
	d1, d2 := twoDevices(t)
	ec := newEngine(t, Config{Devices: []verbs.Device{d1}, RMBSize: cursorRing})
	es := newEngine(t, Config{Devices: []verbs.Device{d2}, RMBSize: cursorRing})
	cli, srv := connectWith(t, ec, es, ClientOptions{Cursors: true}, ServerOptions{})
	t.Cleanup(func() { cli.Close(); srv.Close() })
	mustSMC(t, cli, srv)
	a := newCursorApp(cli)
	posted := randomBytes(61, 3*cursorRing)
	errc := make(chan error, 1)
	go func() { errc <- a.write(posted) }()
	readCheck(t, srv, posted)
	if err := within(t, errc, "the cursor writes"); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Write([]byte("unread")); err != nil {
		t.Fatal(err)
	}
	for cli.Cursors().PeerProduced != 6 {
		within(t, a.rxWoke, "the unread bytes")
	}
	d1.Fail()
	for !cli.Cursors().Continued {
		within(t, a.txWoke, "the continuation")
	}
	cur := cli.Cursors()
	pending := randomBytes(62, 500)
	buf := cli.SendBuffer()
	var w [2]rmb.Span
	k := 0
	for _, s := range rmb.AppendSpans(w[:0], cur.Produced, uint32(len(pending)), uint32(len(buf))) {
		k += copy(buf[s.Off:s.End()], pending[k:])
	}
	if err := cli.PostProduced(cur.Produced + uint64(len(pending))); !errors.Is(err, ErrContinued) {
		t.Fatalf("post after the continuation: %v, want %v", err, ErrContinued)
	}
	if _, err := cli.Write(pending); err != nil {
		t.Fatal(err)
	}
	readCheck(t, srv, pending)
	readCheck(t, cli, []byte("unread"))
	if _, err := srv.Write([]byte("over tcp")); err != nil {
		t.Fatal(err)
	}
	readCheck(t, cli, []byte("over tcp"))
	if cli.SendBuffer() == nil || cli.RecvBuffer() == nil {
		t.Fatal("a cursor-driven connection's buffers were shed before its Close")
	}
	cli.Close()
	srv.Close()
	eventually(t, "released", func() bool {
		return ec.Stats().MemoryInUse == 0 && es.Stats().MemoryInUse == 0
	})
}

// readCheck reads len(want) bytes from c and compares them with want.
func readCheck(t *testing.T, c io.Reader, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("read other bytes than were written")
	}
}

// TestCursorsUrgent: a cursor-driven end posts urgent data (PostUrgent) that a
// net.Conn peer's ReadMarked reports at its place, and reports the peer's
// urgent byte (WriteUrgent) in Cursors.PeerUrgent until it consumed past it.
func TestCursorsUrgent(t *testing.T) {
	pr := providers[0]
	cli, srv := cursorConns(t, pr.open, true, false)
	a := newCursorApp(cli)
	if err := a.write([]byte("ab")); err != nil {
		t.Fatal(err)
	}
	buf := cli.SendBuffer()
	at := cli.Cursors().Produced
	buf[at%uint64(len(buf))] = '!'
	if err := cli.PostUrgent(at); err == nil {
		t.Fatal("PostUrgent of no byte accepted")
	}
	if err := cli.PostUrgent(at + 1); err != nil {
		t.Fatal(err)
	}
	if err := a.write([]byte("cd")); err != nil {
		t.Fatal(err)
	}
	var got []byte
	var marks []int
	p := make([]byte, 16)
	for len(got) < 5 {
		srv.SetReadDeadline(time.Now().Add(waitLimit))
		n, urgent, err := srv.ReadMarked(p)
		if err != nil {
			t.Fatal(err)
		}
		if urgent {
			marks = append(marks, len(got))
		}
		got = append(got, p[:n]...)
	}
	if string(got) != "ab!cd" || len(marks) != 1 || marks[0] != 2 {
		t.Fatalf("read %q with urgent bytes at %v, want \"ab!cd\" with one at 2", got, marks)
	}

	if _, err := srv.Write([]byte("xy")); err != nil {
		t.Fatal(err)
	}
	if err := srv.WriteUrgent('z'); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the urgent byte arrived", func() bool { return cli.Cursors().PeerProduced == 3 })
	if u := cli.Cursors().PeerUrgent; u != 3 {
		t.Fatalf("PeerUrgent %d, want 3 (just past \"xyz\")", u)
	}
	if err := cli.Consumed(2); err != nil {
		t.Fatal(err)
	}
	if u := cli.Cursors().PeerUrgent; u != 3 {
		t.Fatalf("PeerUrgent %d before the urgent byte was consumed, want 3", u)
	}
	if err := cli.Consumed(3); err != nil {
		t.Fatal(err)
	}
	if u := cli.Cursors().PeerUrgent; u != 0 {
		t.Fatalf("PeerUrgent %d once consumed past, want 0", u)
	}
}

// TestCursorsRelease: Release hands a cursor-driven connection to its TCP
// socket, held by another (a dup here, as the program's own socket in the
// direct mode): the bytes the application had not consumed come again on the
// socket, followed by what the peer writes after; the peer reads every byte
// the application posted, then what it writes on the socket, and no end
// when the engine closes its Conn.
func TestCursorsRelease(t *testing.T) {
	d1, d2 := twoDevices(t)
	ec := newEngine(t, Config{Devices: []verbs.Device{d1}, RMBSize: cursorRing})
	es := newEngine(t, Config{Devices: []verbs.Device{d2}, RMBSize: cursorRing})
	cli, srv := connectWith(t, ec, es, ClientOptions{Cursors: true}, ServerOptions{})
	t.Cleanup(func() { cli.Close(); srv.Close() })
	mustSMC(t, cli, srv)
	a := newCursorApp(cli)
	posted := randomBytes(71, 3*cursorRing+17)
	errc := make(chan error, 1)
	go func() { errc <- a.write(posted) }()
	readCheck(t, srv, posted[:len(posted)-cursorRing/2])
	if err := within(t, errc, "the cursor writes"); err != nil {
		t.Fatal(err)
	}
	// The server reads the rest, half an RMB, only after the release.
	sent := randomBytes(72, 1000)
	if _, err := srv.Write(sent); err != nil {
		t.Fatal(err)
	}
	for cli.Cursors().PeerProduced != uint64(len(sent)) {
		within(t, a.rxWoke, "the server's bytes")
	}
	const taken = 300
	if err := cli.Consumed(taken); err != nil {
		t.Fatal(err)
	}
	f, err := cli.TCP().(*net.TCPConn).File()
	if err != nil {
		t.Fatal(err)
	}
	own, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	own.SetDeadline(time.Now().Add(10 * time.Second)) // a lost byte fails the test, no hang
	if err := cli.Release(taken); err != nil {
		t.Fatal(err)
	}
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Write([]byte("after")); err != nil {
		t.Fatal(err)
	}
	readCheck(t, own, append(sent[taken:len(sent):len(sent)], "after"...))
	readCheck(t, srv, posted[len(posted)-cursorRing/2:])
	if _, err := own.Write([]byte("back over tcp")); err != nil {
		t.Fatal(err)
	}
	readCheck(t, srv, []byte("back over tcp"))
	if err := cli.Release(taken); err == nil {
		t.Error("a second release succeeded")
	}
	own.(*net.TCPConn).CloseWrite()
	if b, err := io.ReadAll(srv); err != nil || len(b) != 0 {
		t.Errorf("after the socket's FIN: %q, %v; want EOF", b, err)
	}
	eventually(t, "released", func() bool {
		return ec.Stats().MemoryInUse == 0
	})
}

// TestCursorsReleaseRefused: a connection cannot be released with its
// consumer cursor out of range, to a peer without our extensions (it goes on
// untouched), once it continues over TCP already, nor when not cursor-driven.
func TestCursorsReleaseRefused(t *testing.T) {
	d1, d2 := twoDevices(t)
	ec := newEngine(t, Config{Devices: []verbs.Device{d1}, RMBSize: cursorRing})
	es := newEngine(t, Config{Devices: []verbs.Device{d2}, RMBSize: cursorRing})
	cli, srv := connectWith(t, ec, es, ClientOptions{Cursors: true}, ServerOptions{})
	t.Cleanup(func() { cli.Close(); srv.Close() })
	mustSMC(t, cli, srv)
	if err := cli.Release(1); err == nil {
		t.Error("released past the peer's bytes")
	}
	a := newCursorApp(cli)
	// A peer without our extensions (Linux) cannot continue over TCP: the
	// connection goes on over SMC-R, untouched.
	cli.mu.Lock()
	cli.cont.smcx = false
	cli.mu.Unlock()
	if err := cli.Release(0); !errors.Is(err, ErrNoRelease) {
		t.Errorf("release to a peer without SMCX: %v, want %v", err, ErrNoRelease)
	}
	cli.mu.Lock()
	cli.cont.smcx = true
	cli.mu.Unlock()
	if err := a.write([]byte("still smc-r")); err != nil {
		t.Fatal(err)
	}
	readCheck(t, srv, []byte("still smc-r"))
	if cli.Cursors().Continued {
		t.Error("a refused release continued over TCP")
	}
	d1.Fail()
	for !cli.Cursors().Continued {
		within(t, a.txWoke, "the continuation")
	}
	if err := cli.Release(0); !errors.Is(err, ErrNoRelease) {
		t.Errorf("release after the continuation: %v, want %v", err, ErrNoRelease)
	}
	if err := srv.Release(0); !errors.Is(err, ErrNotCursorDriven) {
		t.Errorf("release of a conn not cursor-driven: %v", err)
	}
}
