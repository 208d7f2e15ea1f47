package daemon

import (
	"errors"
	"net"
	"os"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOwnedBy: a connection smcrd dials for an application is the
// application's user's, as the firewall's owner matches see it, and carries
// bytes; sock_diag tells a socket's user. smcrd's connections were root's,
// whoever's the application was.
func TestOwnedBy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a socket of another user")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("ok"))
			c.Close()
		}
	}()
	none := func(string, string, syscall.RawConn) error { return nil }
	for _, uid := range []uint32{0, 4242} {
		dl := net.Dialer{Control: urgentInline(ownedBy(uid, none))}
		c, err := dl.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatalf("dial as %d: %v", uid, err)
		}
		tcp := c.(*net.TCPConn)
		got, err := socketUID(tcp.LocalAddr().(*net.TCPAddr).AddrPort(), tcp.RemoteAddr().(*net.TCPAddr).AddrPort())
		if err != nil || got != uid {
			t.Errorf("dialed as %d: socket's user %d, %v", uid, got, err)
		}
		var b [2]byte
		if _, err := c.Read(b[:]); err != nil || string(b[:]) != "ok" {
			t.Errorf("dialed as %d: read %q, %v", uid, b, err)
		}
		c.Close()
	}
	if euid := os.Geteuid(); euid != 0 {
		t.Errorf("euid %d after", euid)
	}
}

// TestAsUserWithoutCapSetuid: without CAP_SETUID, setfsuid changes nothing
// and says so by no error: asUser refuses rather than create a socket that
// would be smcrd's to the firewall.
func TestAsUserWithoutCapSetuid(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: CAP_SETUID to drop")
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		data[0].Effective &^= 1 << unix.CAP_SETUID
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		ran := false
		err := asUser(4242, func() { ran = true })
		if ran {
			err = errors.New("do ran without the user")
		}
		errc <- err
	}()
	if err := <-errc; !errors.Is(err, errNotAsUser) {
		t.Errorf("asUser without CAP_SETUID: %v, want errNotAsUser", err)
	}
}
