package preload

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/rmb"
)

// tcpSmcrd is a fake smcrd that takes every socket and decides every connection
// plain TCP (its CLC "failed"), handing back readAhead bytes it read from an
// accepted socket first, as smcrd's CLC does when the peer is not SMC-R. A
// client whose connect fails is decided FAILED.
type tcpSmcrd struct {
	t         *testing.T
	path      string
	ln        *net.UnixListener
	readAhead int
	wg        sync.WaitGroup
	mu        sync.Mutex
	chans     map[*net.UnixConn]bool
	handed    int // bytes read ahead and handed back
	// hold, when not nil, holds clients' DECIDED back until it closes.
	hold chan struct{}
}

func startTCPSmcrd(t *testing.T, readAhead int) *tcpSmcrd {
	t.Helper()
	dir := t.TempDir()
	f := &tcpSmcrd{t: t, path: filepath.Join(dir, "direct.sock"), readAhead: readAhead, chans: map[*net.UnixConn]bool{}}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: f.path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	f.ln = ln
	stop := f.policy(f.path + ".policy")
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			ch, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.chans[ch] = true
			f.mu.Unlock()
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				defer ch.Close()
				f.serve(ch)
			}()
		}
	}()
	t.Cleanup(func() {
		stop()
		ln.Close()
		f.mu.Lock()
		for ch := range f.chans {
			ch.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f
}

// policy writes the policy page (every port listed) and beats it until stop.
func (f *tcpSmcrd) policy(path string) (stop func()) {
	file, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		f.t.Fatal(err)
	}
	defer file.Close()
	if err := file.Truncate(rmb.PolicySize); err != nil {
		f.t.Fatal(err)
	}
	mem, err := unix.Mmap(int(file.Fd()), 0, rmb.PolicySize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.t.Fatal(err)
	}
	p, err := rmb.InitPolicy(mem)
	if err != nil {
		f.t.Fatal(err)
	}
	p.SetPorts(func(uint16) bool { return true })
	p.SetEnabled(true)
	beat := func() {
		var ts unix.Timespec
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
		p.Beat(uint64(ts.Nano()))
	}
	beat()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				beat()
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
		unix.Munmap(mem)
	}
}

func recvMsg(ch *net.UnixConn) (rmb.Msg, int, error) {
	buf := make([]byte, rmb.MsgHeaderLen+rmb.MsgMaxPayload)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := ch.ReadMsgUnix(buf, oob)
	if err != nil {
		return rmb.Msg{}, -1, err
	}
	fd := -1
	if cms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, cm := range cms {
			if fds, err := unix.ParseUnixRights(&cm); err == nil {
				for _, x := range fds {
					if fd < 0 {
						fd = x
					} else {
						unix.Close(x)
					}
				}
			}
		}
	}
	if n == 0 {
		return rmb.Msg{}, fd, errors.New("eof")
	}
	m, _, err := rmb.ParseMsg(buf[:n])
	return m, fd, err
}

func sendMsg(ch *net.UnixConn, m rmb.Msg, payload []byte) error {
	_, _, err := ch.WriteMsgUnix(m.Append(nil, payload), nil, nil)
	return err
}

func (f *tcpSmcrd) serve(ch *net.UnixConn) {
	m, fd, err := recvMsg(ch)
	if err != nil || fd < 0 {
		return
	}
	defer unix.Close(fd)
	if sendMsg(ch, rmb.Msg{Type: rmb.MsgReply}, nil) != nil {
		return
	}
	switch m.Type {
	case rmb.MsgListener:
		for {
			if _, _, err := recvMsg(ch); err != nil {
				return
			}
		}
	case rmb.MsgClient:
		if m, _, err := recvMsg(ch); err != nil || m.Type != rmb.MsgConnecting {
			return
		}
		f.mu.Lock()
		hold := f.hold
		f.mu.Unlock()
		if hold != nil {
			<-hold
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		if _, err := unix.Poll(pfd, 10000); err != nil {
			return
		}
		if e, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); e != 0 {
			sendMsg(ch, rmb.Msg{Type: rmb.MsgDecided, Mode: rmb.ModeFailed, Status: -int32(e)}, nil)
			return
		}
		sendMsg(ch, rmb.Msg{Type: rmb.MsgDecided, Mode: rmb.ModeTCP}, nil)
	case rmb.MsgAccepted:
		var prefix []byte
		if f.readAhead > 0 {
			buf := make([]byte, f.readAhead)
			deadline := time.Now().Add(200 * time.Millisecond)
			for len(prefix) < f.readAhead && time.Now().Before(deadline) {
				pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
				unix.Poll(pfd, 20)
				n, err := unix.Read(fd, buf[:f.readAhead-len(prefix)])
				if n > 0 {
					prefix = append(prefix, buf[:n]...)
				}
				if n == 0 && err == nil {
					break
				}
			}
		}
		f.mu.Lock()
		f.handed += len(prefix)
		f.mu.Unlock()
		sendMsg(ch, rmb.Msg{Type: rmb.MsgDecided, Mode: rmb.ModeTCP}, prefix)
	}
}

// TestFallback: connections smcrd decides plain TCP, with bytes its CLC read
// ahead handed back first, look to programs as the kernel's.
func TestFallback(t *testing.T) {
	build(t)
	f := startTCPSmcrd(t, 0)
	m := mode{name: "tcp", lib: "libsmcr-preload.so", socket: f.path}
	compareReady(t, m, false)
	echoAll(t, m, false)

	f5 := startTCPSmcrd(t, 5)
	for _, lib := range []string{"libsmcr-preload.so", "libsmcr-preload-ubsan.so"} {
		m := mode{name: "tcp-prefix", lib: lib, socket: f5.path}
		compareReady(t, m, false)
		for _, how := range []string{"poll", "epoll", "select", "peek", "waitall"} {
			f5.mu.Lock()
			before := f5.handed
			f5.mu.Unlock()
			out, errOut, err := run(t, m, "prefix", how)
			if err != nil {
				t.Errorf("prefix %s %s: %v\nstdout: %s\nstderr: %s", lib, how, err, out, errOut)
			}
			f5.mu.Lock()
			if f5.handed-before != 5 {
				t.Errorf("prefix %s %s: the fake read %d bytes ahead, want 5", lib, how, f5.handed-before)
			}
			f5.mu.Unlock()
		}
	}
}

// TestConnectSndTimeo: a blocking connect whose decision smcrd holds back gives
// up at SO_SNDTIMEO with EINPROGRESS, as the kernel's connect does.
func TestConnectSndTimeo(t *testing.T) {
	build(t)
	f := startTCPSmcrd(t, 0)
	hold := make(chan struct{})
	f.mu.Lock()
	f.hold = hold
	f.mu.Unlock()
	t.Cleanup(func() { close(hold) }) // before startTCPSmcrd's cleanup waits for serve
	out, errOut, err := run(t, mode{name: "held", lib: "libsmcr-preload.so", socket: f.path}, "sndtimeo")
	if want := "connect -1 Operation now in progress in time\n"; err != nil || out != want {
		t.Errorf("sndtimeo: %v\nstdout: %q, want %q\nstderr: %s", err, out, want, errOut)
	}
}
