package daemon

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

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

// TestWireOptions: options an application sets on its end come to smcrd's
// connection on the wire: those that came before smcrd followed the
// application's connection (the server side's inherited ones come while smcrd's
// connect to it completes) and those that come before the connection on the wire
// is there are held, then set; later ones are set as they come. Options for a
// connection nobody follows are dropped after a while.
func TestWireOptions(t *testing.T) {
	d := &Daemon{log: discard, wire: map[sockConn]*wireOptions{}, unclaimed: map[sockConn][]unclaimedOpt{}}
	var dl net.Dialer
	withOptions(&dl, nil, discard)
	leg := dialLoopback(t, "tcp4", "127.0.0.1:0", &dl) // smcrd's socket of the application's connection
	wire := dialLoopback(t, "tcp6", "[::1]:0", &dl)    // smcrd's connection on the wire
	ev := func(o bpf.Sockopt) bpf.SetSockopt {
		return bpf.SetSockopt{Local: sockConnOf(leg).local, Remote: sockConnOf(leg).remote, Sockopt: o}
	}
	d.claim(ev(tclass)) // before smcrd follows
	w, unfollow := d.follow(leg)
	d.claim(ev(tos4)) // an IPv6 connection's: not set
	d.claim(ev(bpf.Sockopt{Level: unix.SOL_SOCKET, Name: unix.SO_PRIORITY, Value: 6}))
	d.claim(ev(priority)) // the last one counts
	def := defaults(t)
	if got := wireState(t, wire); got != def {
		t.Fatalf("before attached: %v", got)
	}
	w.attach(wire, discard)
	if got, want := wireState(t, wire), [6]int{0x48, 3, 0, 0, def[4], def[5]}; got != want {
		t.Errorf("held options: %v, want %v", got, want)
	}
	for _, o := range append(keep, timeout) {
		d.claim(ev(o))
	}
	if got, want := wireState(t, wire), [6]int{0x48, 3, 4321, 1, 77, 4}; got != want {
		t.Errorf("options after attached: %v, want %v", got, want)
	}
	unfollow()
	d.claim(ev(bpf.Sockopt{Level: unix.SOL_SOCKET, Name: unix.SO_PRIORITY, Value: 5}))
	if got := wireState(t, wire); got[1] != 3 {
		t.Errorf("priority %d after unfollow, want 3 still", got[1])
	}
	wire.Close()
	w.add(stampedOpt{Sockopt: tclass}, discard) // closed: nothing to set it on, and no panic

	// Unclaimed options age out, looked at once a second at most.
	d.unclaimed = map[sockConn][]unclaimedOpt{}
	old := time.Now().Add(-2 * unclaimedAge)
	for i := range 100 {
		k := sockConn{netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(1000+i)), sockConnOf(leg).remote}
		d.unclaimed[k] = []unclaimedOpt{{old, stampedOpt{Sockopt: priority}}}
	}
	d.prunedAt = time.Now()
	d.claim(ev(priority))
	if len(d.unclaimed) != 101 {
		t.Errorf("%d sockets' options unclaimed right after a pruning, want 101", len(d.unclaimed))
	}
	d.prunedAt = old
	d.claim(ev(tos4))
	if len(d.unclaimed) != 1 || len(d.unclaimed[sockConnOf(leg)]) != 2 {
		t.Errorf("unclaimed after pruning: %v, want only the connection's two records", d.unclaimed)
	}
}

// TestWireOptionsOfAnEarlierConnection: options set on an earlier connection of
// the same 4-tuple (loopback reuses one in TIME_WAIT after a second) that smcrd
// reads only once the next connection began, held or read later, are not
// carried onto the next one's connection on the wire; its own are.
func TestWireOptionsOfAnEarlierConnection(t *testing.T) {
	d := &Daemon{log: discard, wire: map[sockConn]*wireOptions{}, unclaimed: map[sockConn][]unclaimedOpt{}}
	var dl net.Dialer
	withOptions(&dl, nil, discard)
	leg := dialLoopback(t, "tcp4", "127.0.0.1:0", &dl)
	wire := dialLoopback(t, "tcp4", "127.0.0.1:0", &dl)
	ev := func(at time.Duration, o bpf.Sockopt) bpf.SetSockopt {
		return bpf.SetSockopt{Local: sockConnOf(leg).local, Remote: sockConnOf(leg).remote, Sockopt: o, At: at}
	}
	const start = 10 * time.Second
	d.claim(ev(start-time.Second, tos4))         // the earlier connection's, before smcrd follows
	d.claim(ev(start+time.Millisecond, timeout)) // this one's, before smcrd follows
	w, unfollow := d.follow(leg)
	defer unfollow()
	d.claim(ev(start-time.Millisecond, priority)) // the earlier connection's, read late
	w.since(start, discard)
	d.claim(ev(start-time.Microsecond, keep[0])) // and later still
	d.claim(ev(start+2*time.Millisecond, bpf.Sockopt{Level: unix.SOL_SOCKET, Name: unix.SO_PRIORITY, Value: 6}))
	w.attach(wire, discard)
	def := defaults(t)
	if got, want := wireState(t, wire), [6]int{def[0], 6, 4321, def[3], def[4], def[5]}; got != want {
		t.Errorf("options on the wire: %v, want %v (only this connection's)", got, want)
	}
	d.claim(ev(start-time.Second, tos4)) // attached: still not carried
	d.claim(ev(start+time.Second, keep[2]))
	if got, want := wireState(t, wire), [6]int{def[0], 6, 4321, def[3], def[4], 4}; got != want {
		t.Errorf("options set as they come: %v, want %v", got, want)
	}
}
