// Tests of the sd_notify datagram protocol against a real unixgram socket.

package sdnotify

import (
	"net"
	"path/filepath"
	"testing"
	"time"
)

func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func recv(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

func TestNotifyPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	c := listen(t, path)
	t.Setenv(EnvSocket, path)
	sent, err := Notify(Ready, Status("serving on /run/smcr/smcrd.sock"))
	if err != nil || !sent {
		t.Fatalf("Notify = %v, %v; want true, nil", sent, err)
	}
	if got, want := recv(t, c), "READY=1\nSTATUS=serving on /run/smcr/smcrd.sock"; got != want {
		t.Errorf("datagram %q, want %q", got, want)
	}
}

func TestNotifyAbstract(t *testing.T) {
	name := "@smcr-sdnotify-test-" + filepath.Base(t.TempDir())
	c := listen(t, "\x00"+name[1:])
	sent, err := NotifySocket(name, Stopping)
	if err != nil || !sent {
		t.Fatalf("NotifySocket = %v, %v; want true, nil", sent, err)
	}
	if got := recv(t, c); got != Stopping {
		t.Errorf("datagram %q, want %q", got, Stopping)
	}
}

func TestNotifyUnset(t *testing.T) {
	t.Setenv(EnvSocket, "")
	sent, err := Notify(Ready)
	if sent || err != nil {
		t.Errorf("Notify without %s = %v, %v; want false, nil", EnvSocket, sent, err)
	}
}

func TestNotifyErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, addr string
		assign     []string
	}{
		{"relative", "notify", []string{Ready}},
		{"no socket", filepath.Join(dir, "absent"), []string{Ready}},
		{"not an assignment", filepath.Join(dir, "absent"), []string{"READY"}},
		{"two lines", filepath.Join(dir, "absent"), []string{"STATUS=a\nREADY=1"}},
		{"empty", filepath.Join(dir, "absent"), nil},
	} {
		if sent, err := NotifySocket(tc.addr, tc.assign...); err == nil || sent {
			t.Errorf("%s: NotifySocket = %v, %v; want an error", tc.name, sent, err)
		}
	}
	if got := Status("a\nb"); got != "STATUS=a b" {
		t.Errorf("Status kept a newline: %q", got)
	}
}
