package daemon

import (
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/bpf"
)

var (
	tos4     = bpf.Sockopt{Level: unix.IPPROTO_IP, Name: unix.IP_TOS, Value: 0x28}
	tclass   = bpf.Sockopt{Level: unix.IPPROTO_IPV6, Name: unix.IPV6_TCLASS, Value: 0x48}
	priority = bpf.Sockopt{Level: unix.SOL_SOCKET, Name: unix.SO_PRIORITY, Value: 3}
	keep     = []bpf.Sockopt{{Level: unix.SOL_SOCKET, Name: unix.SO_KEEPALIVE, Value: 1},
		{Level: unix.IPPROTO_TCP, Name: unix.TCP_KEEPIDLE, Value: 77},
		{Level: unix.IPPROTO_TCP, Name: unix.TCP_KEEPCNT, Value: 4}}
	timeout = bpf.Sockopt{Level: unix.IPPROTO_TCP, Name: unix.TCP_USER_TIMEOUT, Value: 4321}
)

// wireState is what the test reads back of a connection's options: traffic
// class (of the connection's family), priority, user timeout, keepalive, its
// idle time and count.
func wireState(t *testing.T, c *net.TCPConn) [6]int {
	t.Helper()
	tos := [2]int{unix.IPPROTO_IP, unix.IP_TOS}
	if c.LocalAddr().(*net.TCPAddr).IP.To4() == nil {
		tos = [2]int{unix.IPPROTO_IPV6, unix.IPV6_TCLASS}
	}
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var got [6]int
	rc.Control(func(fd uintptr) {
		for i, o := range [][2]int{tos, {unix.SOL_SOCKET, unix.SO_PRIORITY}, {unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT},
			{unix.SOL_SOCKET, unix.SO_KEEPALIVE}, {unix.IPPROTO_TCP, unix.TCP_KEEPIDLE}, {unix.IPPROTO_TCP, unix.TCP_KEEPCNT}} {
			if got[i], err = unix.GetsockoptInt(int(fd), o[0], o[1]); err != nil {
				t.Errorf("getsockopt %d/%d: %v", o[0], o[1], err)
			}
		}
	})
	return got
}

func dialLoopback(t *testing.T, network, addr string, dl *net.Dialer) *net.TCPConn {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Skipf("no %s loopback: %v", network, err)
	}
	t.Cleanup(func() { ln.Close() })
	c, err := dl.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// defaults is what wireState reads of a connection that set nothing: keepalive's
// timings are the system's.
func defaults(t *testing.T) [6]int {
	t.Helper()
	var d [6]int
	for i, name := range map[int]string{4: "tcp_keepalive_time", 5: "tcp_keepalive_probes"} {
		b, err := os.ReadFile("/proc/sys/net/ipv4/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if d[i], err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// TestWithOptions: smcrd's connection carries the options the application's
// socket had at its connect, set before its own connect, and nothing of Go's
// defaults (no keepalive the application did not ask for). A traffic class of
// the other family is not the connection's.
func TestWithOptions(t *testing.T) {
	all := append([]bpf.Sockopt{tos4, tclass, priority, timeout}, keep...)
	for _, tc := range []struct {
		name, network, addr string
		opts                []bpf.Sockopt
		want                [6]int // as wireState
	}{
		{"ipv4", "tcp4", "127.0.0.1:0", all, [6]int{0x28, 3, 4321, 1, 77, 4}},
		{"ipv6", "tcp6", "[::1]:0", all, [6]int{0x48, 3, 4321, 1, 77, 4}},
		{"none", "tcp4", "127.0.0.1:0", nil, defaults(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The tag and SO_REUSEADDR smcrd sets come first, still.
			controlled := false
			dl := net.Dialer{Control: func(string, string, syscall.RawConn) error { controlled = true; return nil }}
			withOptions(&dl, tc.opts, discard)
			c := dialLoopback(t, tc.network, tc.addr, &dl)
			if !controlled {
				t.Error("the dialer's own Control was not called")
			}
			if got := wireState(t, c); got != tc.want {
				t.Errorf("tos, priority, user timeout, keepalive, idle, count = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestWireOptions: options the application sets after its connect are held
// until smcrd's connection is dialled, then set on it, and set as they come
// after that.
func TestWireOptions(t *testing.T) {
	var w wireOptions
	w.add(tos4, discard)
	w.add(tclass, discard) // an IPv4 connection's: not set
	w.add(bpf.Sockopt{Level: unix.SOL_SOCKET, Name: unix.SO_PRIORITY, Value: 6}, discard)
	w.add(priority, discard) // the last one counts
	var dl net.Dialer
	withOptions(&dl, nil, discard)
	c := dialLoopback(t, "tcp4", "127.0.0.1:0", &dl)
	def := defaults(t)
	if got := wireState(t, c); got != def {
		t.Fatalf("before dialled: %v", got)
	}
	w.dialled(c, discard)
	if got, want := wireState(t, c), [6]int{0x28, 3, 0, 0, def[4], def[5]}; got != want {
		t.Errorf("held options: %v, want %v", got, want)
	}
	for _, o := range append(keep, timeout) {
		w.add(o, discard)
	}
	if got, want := wireState(t, c), [6]int{0x28, 3, 4321, 1, 77, 4}; got != want {
		t.Errorf("options after dialled: %v, want %v", got, want)
	}
	c.Close()
	w.add(tos4, discard) // closed: nothing to set it on, and no panic
}
