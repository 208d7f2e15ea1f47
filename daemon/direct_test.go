package daemon

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/internal/scm"
	"github.com/smcr-io/smcr/rmb"
)

// libClient plays libsmcr-preload.so's part of the exchange, in Go.
type libClient struct {
	t     *testing.T
	ch    *net.UnixConn
	fd    int // the program's socket
	sh    *rmb.Shared
	mem   []byte
	wake  libWake
	efdTx int
	efdRx int
}

func newDirectTestServer(t *testing.T) *DirectServer {
	t.Helper()
	s, err := NewDirectServer(DirectOptions{Path: filepath.Join(t.TempDir(), "direct.sock")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func dialChannel(t *testing.T, s *DirectServer) *net.UnixConn {
	t.Helper()
	ch, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: s.Path(), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	return ch
}

// connectDirect connects a new socket to addr as the library does, and
// returns what smcrd decided.
func connectDirect(t *testing.T, s *DirectServer, addr *net.TCPAddr) (*libClient, rmb.Msg) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	c := &libClient{t: t, ch: dialChannel(t, s), fd: fd, wake: newLibWake(t)}
	if err := sendDirect(c.ch, rmb.Msg{Type: rmb.MsgClient}, nil, []int{fd, c.wake.efd, c.wake.page}); err != nil {
		t.Fatal(err)
	}
	if m := c.recv(); m.Type != rmb.MsgReply || m.Status != 0 {
		t.Fatalf("reply to CLIENT: %+v", m)
	}
	sa := &unix.SockaddrInet4{Port: addr.Port}
	copy(sa.Addr[:], addr.IP.To4())
	if err := unix.Connect(fd, sa); err != nil && err != unix.EINPROGRESS {
		t.Fatal(err)
	}
	if err := sendDirect(c.ch, rmb.Msg{Type: rmb.MsgConnecting}, nil, nil); err != nil {
		t.Fatal(err)
	}
	return c, c.decided()
}

func (c *libClient) recv() rmb.Msg {
	c.t.Helper()
	m, fds, _, err := recvDirect(c.ch)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	return m
}

// decided reads DECIDED and, for SMC-R, maps the area.
func (c *libClient) decided() rmb.Msg {
	c.t.Helper()
	buf := make([]byte, rmb.MsgHeaderLen+rmb.MsgMaxPayload)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ch.ReadMsgUnix(buf, oob)
	if err != nil {
		c.t.Fatal(err)
	}
	m, _, err := rmb.ParseMsg(buf[:n])
	if err != nil || m.Type != rmb.MsgDecided {
		c.t.Fatalf("decided: %+v %v", m, err)
	}
	fds := scm.Rights(oob[:oobn])
	if m.Mode != rmb.ModeSMCR {
		return m
	}
	if len(fds) != 3 {
		c.t.Fatalf("DECIDED SMCR with %d descriptors", len(fds))
	}
	var st unix.Stat_t
	unix.Fstat(fds[0], &st)
	c.mem, err = unix.Mmap(fds[0], 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		c.t.Fatal(err)
	}
	unix.Close(fds[0])
	if c.sh, err = rmb.ViewShared(c.mem); err != nil {
		c.t.Fatal(err)
	}
	c.efdTx, c.efdRx = fds[1], fds[2]
	c.t.Cleanup(func() {
		unix.Munmap(c.mem)
		unix.Close(c.efdTx)
		unix.Close(c.efdRx)
	})
	return m
}

// libWake is the eventfd and wake page a library passes with its offers.
type libWake struct {
	efd, page int
	w         *rmb.Wake
}

func newLibWake(t *testing.T) libWake {
	t.Helper()
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(efd) })
	page, mem, err := sealedMemfd("test-wake", rmb.WakeSize)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Munmap(mem)
		unix.Close(page)
	})
	w, err := rmb.InitWake(mem)
	if err != nil {
		t.Fatal(err)
	}
	return libWake{efd: efd, page: page, w: w}
}

// waitLib sleeps until smcrd publishes, as the library's poll does: counted
// as a sleeper before its last look.
func (c *libClient) waitLib(ready func() bool) {
	c.sh.LibPollers().Add(1)
	defer c.sh.LibPollers().Add(^uint32(0))
	for {
		c.wake.w.Sleepers().Add(1)
		if ready() {
			c.wake.w.Sleepers().Add(^uint32(0))
			return
		}
		pfd := []unix.PollFd{{Fd: int32(c.wake.efd), Events: unix.POLLIN}}
		unix.Poll(pfd, 1000)
		c.wake.w.Sleepers().Add(^uint32(0))
		var b [8]byte
		unix.Read(c.wake.efd, b[:])
	}
}

func (c *libClient) kick(efd int, flag *atomic.Uint32) {
	if flag.Load() != 0 {
		one := uint64(1)
		unix.Write(efd, (*[8]byte)(unsafe.Pointer(&one))[:])
	}
}

func (c *libClient) write(p []byte) {
	ring := c.sh.TxRing()
	size := uint64(len(ring))
	for len(p) > 0 {
		prod := c.sh.TxProd().Load()
		free := size - (prod - c.sh.TxCons().Load())
		if free == 0 {
			c.waitLib(func() bool { return c.sh.TxCons().Load()+size > prod || c.sh.DFlags().Load() != 0 })
			if c.sh.DFlags().Load()&rmb.DError != 0 {
				c.t.Fatalf("write: error %d", c.sh.DErrno().Load())
			}
			continue
		}
		n := min(uint64(len(p)), free)
		a, b := rmb.Split(prod, uint32(n), uint32(size))
		k := copy(ring[a.Off:a.End()], p)
		copy(ring[b.Off:b.End()], p[k:])
		c.sh.TxProd().Store(prod + n)
		c.kick(c.efdTx, c.sh.DTxWait())
		p = p[n:]
	}
}

// read reads until EOF.
func (c *libClient) readAll() []byte {
	var out []byte
	ring := c.sh.RxRing()
	size := uint64(len(ring))
	for {
		cons := c.sh.RxCons().Load()
		prod := c.sh.RxProd().Load()
		if prod == cons {
			f := c.sh.DFlags().Load()
			if f&rmb.DError != 0 {
				c.t.Fatalf("read: error %d", c.sh.DErrno().Load())
			}
			if f&rmb.DEOF != 0 && c.sh.RxProd().Load() == cons {
				return out
			}
			c.waitLib(func() bool { return c.sh.RxProd().Load() != cons || c.sh.DFlags().Load() != f })
			continue
		}
		a, b := rmb.Split(cons, uint32(prod-cons), uint32(size))
		out = append(out, ring[a.Off:a.End()]...)
		out = append(out, ring[b.Off:b.End()]...)
		c.sh.RxCons().Store(prod)
		c.kick(c.efdRx, c.sh.DRxWait())
	}
}

func (c *libClient) setFlag(f uint32) {
	c.sh.LibFlags().Or(f)
	c.kick(c.efdTx, c.sh.DTxWait())
}

func echoServer(t *testing.T) *net.TCPListener {
	t.Helper()
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			go func() {
				io.Copy(c, c)
				c.CloseWrite()
				io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	return ln
}

// TestDirectStream carries 4 MiB through the rings both ways (an echo server
// at the other end), shuts down writing, and reads the peer's EOF.
func TestDirectStream(t *testing.T) {
	s := newDirectTestServer(t)
	ln := echoServer(t)
	c, m := connectDirect(t, s, ln.Addr().(*net.TCPAddr))
	if m.Mode != rmb.ModeSMCR {
		t.Fatalf("decided %+v", m)
	}
	data := make([]byte, 4<<20)
	rand.Read(data)
	got := make(chan []byte)
	go func() { got <- c.readAll() }()
	c.write(data)
	c.setFlag(rmb.LibShutWR)
	var back []byte
	select {
	case back = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("no EOF")
	}
	if sha256.Sum256(back) != sha256.Sum256(data) {
		t.Fatalf("echo: %d bytes, differ", len(back))
	}
	c.setFlag(rmb.LibClosed)
	c.ch.Close()
	select {
	case <-s.Drained():
	case <-time.After(5 * time.Second):
		t.Fatal("connection not released after the program closed")
	}
}

// TestDirectConnectRefused: a connect that fails is DECIDED FAILED with its errno.
func TestDirectConnectRefused(t *testing.T) {
	s := newDirectTestServer(t)
	ln, _ := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	addr := ln.Addr().(*net.TCPAddr)
	ln.Close()
	_, m := connectDirect(t, s, addr)
	if m.Mode != rmb.ModeFailed || m.Status != -int32(unix.ECONNREFUSED) {
		t.Fatalf("decided %+v, want FAILED -ECONNREFUSED", m)
	}
}

// TestDirectRefusesOtherDescriptors: a channel reaches only a TCP socket it
// brings; a pipe, a Unix socket or nothing at all gets nothing.
func TestDirectRefusesOtherDescriptors(t *testing.T) {
	s := newDirectTestServer(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	udp, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(udp)
	tcp, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(tcp)
	lw := newLibWake(t)
	efd, page := lw.efd, lw.page
	// A memfd the library could shrink under smcrd's mapping, and one too short.
	unsealed, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(unsealed)
	unix.Ftruncate(unsealed, rmb.WakeSize)
	short, shortMem, err := sealedMemfd("short", 64)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(short)
	defer unix.Munmap(shortMem)
	// smcrd writes the second descriptor: it must be an eventfd; it maps the
	// third: a sealed wake page.
	for name, fds := range map[string][]int{"pipe": {int(r.Fd()), efd, page}, "udp": {udp, efd, page},
		"no eventfd": {tcp}, "pipe for eventfd": {tcp, int(w.Fd()), page}, "no wake page": {tcp, efd},
		"unsealed wake page": {tcp, efd, unsealed}, "short wake page": {tcp, efd, short},
		"pipe for wake page": {tcp, efd, int(w.Fd())}} {
		ch := dialChannel(t, s)
		if err := sendDirect(ch, rmb.Msg{Type: rmb.MsgClient}, nil, fds); err != nil {
			t.Fatal(err)
		}
		c := &libClient{t: t, ch: ch}
		if m := c.recv(); m.Type != rmb.MsgReply || m.Status != -int32(unix.EINVAL) {
			t.Errorf("%s: %+v, want REPLY -EINVAL", name, m)
		}
	}
	// No descriptor, or garbage: the channel is closed without an answer.
	for name, msg := range map[string][]byte{
		"no fd":   rmb.Msg{Type: rmb.MsgClient}.Append(nil, nil),
		"garbage": bytes.Repeat([]byte{0xff}, 40),
	} {
		ch := dialChannel(t, s)
		ch.Write(msg)
		ch.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := ch.Read(make([]byte, 64)); n != 0 || err == nil {
			t.Errorf("%s: answered %d bytes, %v", name, n, err)
		}
	}
}

// TestDirectPolicyPage: the page says what the server was told, and that smcrd
// is alive; Close turns it off.
func TestDirectPolicyPage(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("2001:db8::7")}
	s, err := NewDirectServer(DirectOptions{Path: filepath.Join(t.TempDir(), "d.sock"), Ports: func(p uint16) bool { return p == 5201 },
		Addrs: addrs, Memory: func() (int64, int64) { return 3 << 20, 256 << 20 }})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(s.Path() + ".policy")
	if err != nil {
		t.Fatal(err)
	}
	mem := make([]uint64, rmb.PolicySize/8)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&mem[0])), rmb.PolicySize), b)
	p, _ := rmb.InitPolicy(unsafe.Slice((*byte)(unsafe.Pointer(&mem[0])), rmb.PolicySize))
	if !p.Enabled() || !p.Port(5201) || p.Port(5202) || p.Heartbeat() == 0 {
		t.Fatalf("page: enabled %v, 5201 %v, 5202 %v, beat %d", p.Enabled(), p.Port(5201), p.Port(5202), p.Heartbeat())
	}
	if got := p.Addrs(); !slices.Equal(got, addrs) {
		t.Errorf("page: addresses %v, want %v", got, addrs)
	}
	if used, limit := p.Memory(); used != 3<<20 || limit != 256<<20 {
		t.Errorf("page: memory %d of %d", used, limit)
	}
	st, _ := os.Stat(s.Path() + ".policy")
	if st.Mode().Perm() != 0o644 {
		t.Errorf("policy page mode %v", st.Mode().Perm())
	}
	s.Close()
	if _, err := os.Stat(s.Path() + ".policy"); !os.IsNotExist(err) {
		t.Errorf("policy page left after Close: %v", err)
	}
}

// TestProcWakeSignal: smcrd writes a library's eventfd after a publish only
// while the wake page counts a sleeper, and counts every publish in pub.
func TestProcWakeSignal(t *testing.T) {
	lw := newLibWake(t)
	efd, err := unix.Dup(lw.efd)
	if err != nil {
		t.Fatal(err)
	}
	page, err := unix.Dup(lw.page)
	if err != nil {
		t.Fatal(err)
	}
	pw, err := openProcWake(efd, page)
	if err != nil {
		t.Fatal(err)
	}
	defer pw.close()
	written := func() bool {
		var b [8]byte
		n, _ := unix.Read(lw.efd, b[:])
		return n == 8
	}
	pw.signal()
	if written() {
		t.Error("eventfd written with no sleeper")
	}
	lw.w.Sleepers().Add(1)
	pw.signal()
	if !written() {
		t.Error("eventfd not written for a sleeper")
	}
	if got := lw.w.Pub().Load(); got != 2 {
		t.Errorf("pub %d after two publishes", got)
	}
}
