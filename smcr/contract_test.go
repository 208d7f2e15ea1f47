// Tests of the contracts a Conn and a Listener keep for the Go code above them:
// net.Conn (x/net's conformance suite, deadlines, addresses, a cancelled
// Dial), net.Listener (surviving EMFILE), and net/http unchanged over both.

package smcr

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/smcr-io/smcr/smcr/verbs"
	"golang.org/x/net/nettest"
	"golang.org/x/sys/unix"
)

// TestNetConnContract runs x/net's net.Conn conformance suite (nettest.TestConn:
// basic and racy I/O, concurrent methods, past, present and future deadlines,
// Close unblocking I/O) over SMC-R connections, on the in-memory fake and on
// each real provider. (Its timeout checks stop at net.Error's Timeout;
// TestDeadlines checks os.ErrDeadlineExceeded too.)
func TestNetConnContract(t *testing.T) {
	run := func(t *testing.T, p *pair) {
		nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
			c, s := p.connect(t)
			mustSMC(t, c, s)
			return c, s, func() { c.Close(); s.Close() }, nil
		})
	}
	t.Run("mem", func(t *testing.T) { run(t, memPair(t)) })
	for _, pr := range providers {
		t.Run(pr.name, func(t *testing.T) { run(t, providerPair(t, pr.open, Config{})) })
	}
}

// TestConnAddrs: a Conn's addresses are its TCP connection's, so each end's
// local address is the other's remote one, over SMC-R and after a fallback.
func TestConnAddrs(t *testing.T) {
	check := func(t *testing.T, c, s *Conn) {
		t.Helper()
		if c.LocalAddr().String() != s.RemoteAddr().String() || c.RemoteAddr().String() != s.LocalAddr().String() ||
			c.RemoteAddr().String() != c.TCP().RemoteAddr().String() {
			t.Errorf("client %v -> %v, server %v <- %v", c.LocalAddr(), c.RemoteAddr(), s.LocalAddr(), s.RemoteAddr())
		}
	}
	p := memPair(t)
	c, s := p.connect(t)
	mustSMC(t, c, s)
	check(t, c, s)
	// No devices on the server: it declines, and both ends are plain TCP.
	fb := newPair(t, Config{Devices: memDevices(t, verbs.KindSoft)}, Config{})
	c, s = fb.connect(t)
	if c.Mode() != ModeFallback || s.Mode() != ModeFallback {
		t.Fatalf("modes %v %v, want fallbacks", c.Mode(), s.Mode())
	}
	check(t, c, s)
}

// TestDialCancelled: a Dial whose context ends during CLC (a server that
// accepts and never answers) returns the context's error at once, not a
// fallback after the CLC timeout, and leaves nothing behind in the engine.
func TestDialCancelled(t *testing.T) {
	e := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft), CLCTimeout: 10 * time.Second})
	addr := rawServer(t, func(c net.Conn) {
		defer c.Close()
		io.Copy(io.Discard, c) // reads the Proposal, answers nothing
	})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	c, err := e.Dial(ctx, "tcp", addr)
	if c != nil || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("dial returned %v, %v after %v; want the context's deadline at once", c, err, time.Since(start))
	}
	eventually(t, "nothing left", func() bool {
		st := e.Stats()
		return len(e.Conns()) == 0 && st.MemoryInUse == 0
	})
	if st := e.Stats(); st.HandshakeErrors != 1 || len(st.Fallback) != 0 {
		t.Errorf("stats %+v: want one handshake error, no fallback", st)
	}
}

// TestListenerSurvivesEMFILE: an accept that fails for lack of file
// descriptors does not close the Listener under its application: once
// descriptors are free again, the waiting connection and new ones are served.
func TestListenerSurvivesEMFILE(t *testing.T) {
	failed := make(chan struct{}, 1)
	logged := slog.New(hookHandler{msg: "smcr: accept failed; retrying", seen: failed})
	srv := Config{Devices: memDevices(t, verbs.KindSoft), Logger: logged}
	p := newPair(t, Config{Devices: memDevices(t, verbs.KindSoft)}, srv)
	// The client's socket is made first: its connect takes no descriptor, so
	// with the limit at the lowest free one, only the accept goes without.
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Closed once: a second close would hit whatever took the number next (the
	// TCP socket of a connection still closing, closed later under the test that
	// reused the number).
	closed := false
	defer func() {
		if !closed {
			unix.Close(fd)
		}
	}()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	restore := func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) }
	defer restore()
	low := old
	low.Cur = uint64(lowestFreeFD(t))
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatalf("lower RLIMIT_NOFILE to %d: %v", low.Cur, err)
	}
	// A goroutine of an earlier test may have closed a descriptor since: fill
	// every hole under the limit, or the accept would take it.
	for {
		d, err := unix.Dup(0)
		if err != nil {
			break
		}
		defer unix.Close(d)
	}
	ap := p.ln.Addr().(*net.TCPAddr).AddrPort()
	err = unix.Connect(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()})
	if err == nil {
		select {
		case <-failed: // the listener tried to accept, and failed
		case <-time.After(waitLimit):
			err = errors.New("the listener logged no failed accept")
		}
	}
	restore()
	if err != nil {
		t.Fatal(err)
	}
	// The waiting connection is accepted now (its client silent, then gone:
	// plain TCP after CLC), then new ones.
	unix.Close(fd)
	closed = true
	s, err := p.ln.AcceptSMC()
	if err != nil {
		t.Fatalf("accept after the descriptors came back: %v", err)
	}
	s.Close()
	c, s := p.connect(t)
	mustSMC(t, c, s)
	echoOK(t, c, s)
}

// lowestFreeFD is the lowest descriptor number the process does not use.
func lowestFreeFD(t *testing.T) int {
	t.Helper()
	// The kernel hands out the lowest free descriptor. (Listing /proc/self/fd
	// would count the listing's own descriptor, closed again after it.)
	fd, err := unix.Dup(0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	return fd
}

// hookHandler is a slog handler that signals seen once a record with msg is
// logged.
type hookHandler struct {
	msg  string
	seen chan<- struct{}
}

func (h hookHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h hookHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h hookHandler) WithGroup(string) slog.Handler            { return h }
func (h hookHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		select {
		case h.seen <- struct{}{}:
		default:
		}
	}
	return nil
}

// TestHTTPOverSMCR: net/http, unchanged, serves on a Listener and fetches
// through an Engine's Dial: keep-alive requests share one SMC-R connection,
// bodies arrive whole, and Shutdown closes the Listener as a TCP one.
func TestHTTPOverSMCR(t *testing.T) {
	p := memPair(t)
	body := bytes.Repeat([]byte("smc-r "), 100000) // 600 KB: many RMB laps
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("X-Got", strconv.Itoa(len(in)))
		w.Write(body)
	})}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(p.ln) }()
	var dials []*Conn
	var mu sync.Mutex
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := p.cli.Dial(ctx, network, addr)
		if err == nil {
			mu.Lock()
			dials = append(dials, c)
			mu.Unlock()
		}
		return c, err
	}}}
	defer client.CloseIdleConnections()
	url := "http://" + p.ln.Addr().String() + "/"
	for i := range 5 {
		resp, err := client.Post(url, "application/octet-stream", bytes.NewReader(body[:i*1000]))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.Equal(got, body) || resp.Header.Get("X-Got") != strconv.Itoa(i*1000) {
			t.Fatalf("request %d: %d bytes (%v), server got %s", i, len(got), err, resp.Header.Get("X-Got"))
		}
	}
	mu.Lock()
	if len(dials) != 1 || dials[0].Mode() != ModeSMCR {
		t.Errorf("%d connections dialled, want one over SMC-R", len(dials))
	}
	mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Serve returned %v", err)
	}
}

// TestIPv6: Dial and Listen over IPv6 take SMC-R as over IPv4 (the Proposal's
// IPv6 prefixes matched against the server's subnet).
func TestIPv6(t *testing.T) {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	ln.Close()
	cli := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft)})
	srv := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft)})
	l, err := srv.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := &pair{cli: cli, srv: srv, ln: l}
	c, s := p.connect(t)
	mustSMC(t, c, s)
	if a := c.RemoteAddr().(*net.TCPAddr); a.IP.To4() != nil {
		t.Fatalf("connected over %v, not IPv6", a)
	}
	echoOK(t, c, s)
	streamPairs(t, [][2]*Conn{{c, s}}, 1<<20, 3, func() {})
}

// TestTCPNetworksOnly: Dial and Listen refuse networks SMC-R cannot ride on,
// with a net.UnknownNetworkError, as net.Dial does for a network it lacks.
func TestTCPNetworksOnly(t *testing.T) {
	e := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft)})
	for _, network := range []string{"udp", "unix", "ip4:tcp", ""} {
		var unknown net.UnknownNetworkError
		if c, err := e.Dial(context.Background(), network, "127.0.0.1:9"); c != nil || !errors.As(err, &unknown) {
			t.Errorf("Dial(%q): %v, %v; want an unknown network", network, c, err)
		}
		if l, err := e.Listen(network, "127.0.0.1:0"); l != nil || !errors.As(err, &unknown) {
			t.Errorf("Listen(%q): %v, %v; want an unknown network", network, l, err)
		}
	}
}
