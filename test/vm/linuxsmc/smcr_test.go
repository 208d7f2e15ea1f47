//go:build linuxsmc && ibv

// smcr against Linux: the smcr engine, on rxe1 through the ibv provider, meets
// Linux's own AF_SMC over SMC-R version 2 in the soft-RoCE VM, as server of a
// Linux client and as client of a Linux server (issue #36, proof step 2). The
// SMC option goes on smcr's SYN and is echoed on its SYN-ACK by smcr's eBPF
// programs (package bpf), as smcrd has them: a Linux peer falls back without it.
// All in the guest's first network namespace over 127.0.0.1, since 6.1's rxe
// routes there only (FINDINGS.md of shared/probes/smc-v2-rxe).

package linuxsmc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/bpf"
	"github.com/smcr-io/smcr/internal/testlog"
	"github.com/smcr-io/smcr/smcr"
	"github.com/smcr-io/smcr/smcr/clc"
	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/ibv"
)

const (
	smcrPort    = 5001 // smcr's server, for Linux's client
	linuxPort   = 5002 // Linux's server, for smcr's client
	upBytes     = 2 << 20
	downBytes   = 1 << 20
	nConns      = 3
	streamBytes = transfer // one way, as Linux against Linux moves it, for a figure beside it
	idleTime    = 4 * time.Second
	testLinkSec = "1" // Linux's net.smc.smcr_testlink_time while Linux tests our links
	testLinkDef = "30"
	sysctlTest  = "/proc/sys/net/smc/smcr_testlink_time"
)

// loadBPF loads smcr's eBPF programs on the root cgroup and lo, with port
// listed as a port of the direct mode: sk_lookup leaves SYNs to it alone, and
// sockops echoes the option on the SYN-ACKs of a tagged listener there.
func loadBPF(t *testing.T, port uint16) *bpf.Loader {
	t.Helper()
	pin := fmt.Sprintf("%s-linuxsmc-%d", bpf.DefaultPinDir, port)
	l, err := bpf.Load(bpf.Options{Interfaces: []string{loopback}, PinDir: pin, ClsBPF: true})
	if err != nil {
		t.Fatalf("load bpf: %v", err)
	}
	t.Cleanup(func() { l.Remove(); l.Close() })
	if err := l.SetPorts([]bpf.PortRange{{Lo: port, Hi: port}}); err != nil {
		t.Fatal(err)
	}
	if err := l.SetAlive(time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := l.AddDirectPort(port); err != nil {
		t.Fatal(err)
	}
	return l
}

// listenSMCR listens on 127.0.0.1:port for the engine's server, with the
// option echoed on its SYN-ACKs (l, loadBPF's for port).
func listenSMCR(t *testing.T, l *bpf.Loader, port int) net.Listener {
	t.Helper()
	lc := net.ListenConfig{Control: l.Control(bpf.Tag{SMCOption: true})}
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp4", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// serveOnce accepts one connection on ln, runs CLC as e's server, has check
// judge the outcome and then serves it (serve, with down bytes back); the
// result comes on the channel.
func serveOnce(e *smcr.Engine, ln net.Listener, i, down int, check func(*smcr.Conn) error) <-chan error {
	served := make(chan error, 1)
	go func() {
		tcp, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		c, err := e.ServerWith(context.Background(), tcp, smcr.ServerOptions{})
		if err != nil {
			served <- err
			return
		}
		if err := check(c); err != nil {
			c.Close()
			served <- err
			return
		}
		_, err = serve(c, i, down)
		served <- err
	}()
	return served
}

// newEngine opens rxe1 (on lo) and makes an engine of it with the User EIDs
// given; testLink is its TEST_LINK interval (negative: off).
func newEngine(t *testing.T, name string, testLink time.Duration, ueids ...string) *smcr.Engine {
	t.Helper()
	log := slog.New(slog.NewTextHandler(testlog.Writer(t), &slog.HandlerOptions{Level: slog.LevelDebug})).With("engine", name)
	dev, err := ibv.Open(ibv.Config{Interface: loopback, GIDIndex: -1, Logger: log})
	if err != nil {
		t.Fatalf("open the rdma device of %s: %v", loopback, err)
	}
	e, err := smcr.NewEngine(smcr.Config{
		Devices: []verbs.Device{dev}, UEIDs: ueids,
		// Linux waits 6 s for each CLC message and 2 s for LLC; TCG is slow.
		CLCTimeout: 30 * time.Second, LLCTimeout: 10 * time.Second, TestLinkInterval: testLink, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	// The device stays open: the engine frees a link's verbs objects in a
	// goroutine that may outlive Close, and closing the context under them
	// would crash it (test/vm/engine counts them to close it safely); the
	// guest is thrown away after the suite.
	t.Cleanup(func() { e.Close() })
	return e
}

// payload is connection i's bytes in one direction.
func payload(i, dir, n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{36, byte(i), byte(dir)}).Read(b)
	return b
}

// serve is one connection's server side: it reads the client's bytes to EOF,
// exchange moves connection i's bytes: srv serves (reads up bytes, writes down)
// while cli talks, closes its write side (closeWrite), then closes; it fails t
// on either end's error, naming the server who.
func exchange(t *testing.T, i int, srv, cli io.ReadWriteCloser, up, down int, closeWrite func() error, who string) {
	t.Helper()
	served := make(chan error, 1)
	go func() {
		n, err := serve(srv, i, down)
		if err == nil && n != int64(up) {
			err = fmt.Errorf("read %d bytes, want %d", n, up)
		}
		served <- err
	}()
	err := talk(cli, i, up, down, closeWrite)
	cli.Close()
	if err != nil {
		t.Fatalf("connection %d: %v", i, err)
	}
	if err := <-served; err != nil {
		t.Fatalf("%s %d: %v", who, i, err)
	}
}

// answers with their sha256 and down bytes of its own, and closes.
func serve(rw io.ReadWriteCloser, i, down int) (int64, error) {
	defer rw.Close()
	h := sha256.New()
	n, err := io.Copy(h, rw)
	if err != nil {
		return n, fmt.Errorf("read: %w", err)
	}
	if _, err := rw.Write(append(h.Sum(nil), payload(i, 1, down)...)); err != nil {
		return n, fmt.Errorf("write: %w", err)
	}
	return n, nil
}

// talk is one connection's client side: up bytes, half-close, then the
// server's digest and its down bytes, checked.
func talk(rw io.ReadWriter, i, up, down int, closeWrite func() error) error {
	b := payload(i, 0, up)
	if _, err := rw.Write(b); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if err := closeWrite(); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	got, err := io.ReadAll(rw)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	want := sha256.Sum256(b)
	if len(got) != 32+down || !bytes.Equal(got[:32], want[:]) || !bytes.Equal(got[32:], payload(i, 1, down)) {
		return fmt.Errorf("got %d bytes (want %d), digest %x (want %x) or data differ", len(got), 32+down, got[:min(32, len(got))], want)
	}
	return nil
}

// linuxView waits up to 5 s for Linux's smc_diag to list an SMC-R socket that
// match accepts, as smcss would show it, and returns it.
func linuxView(t *testing.T, what string, match func(smcDiag) bool) smcDiag {
	t.Helper()
	var all []smcDiag
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var err error
		if all, err = smcSockets(); err != nil {
			t.Fatal(err)
		}
		for _, d := range all {
			if match(d) {
				return d
			}
		}
	}
	t.Fatalf("smc_diag lists no %s: %+v", what, all)
	return smcDiag{}
}

// isSMCR checks a socket Linux lists: SMC-R, on rxe1, with a peer GID.
func isSMCR(t *testing.T, d smcDiag, role uint8) {
	t.Helper()
	if d.Mode != smcDiagModeSMCR || d.IBDevice != rxeOnLo || d.PeerGID == "" || d.Role != role {
		t.Fatalf("Linux lists %+v: want SMC-R (mode %d) on %s with a peer GID, role %d", d, smcDiagModeSMCR, rxeOnLo, role)
	}
}

func setSysctl(t *testing.T, path, v string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
		t.Fatal(err)
	}
}

// readErr reads r until it fails and returns the error, nil at EOF.
func readErr(r io.Reader) error {
	_, err := io.Copy(io.Discard, r)
	return err
}

// TestLinuxClientSMCRServer: Linux's AF_SMC client connects to the smcr engine's
// server nConns times, one after another: the first is first contact (CLC of
// version 2, CONFIRM_LINK of LLC version 2), the others join its link group.
// Each carries upBytes up and downBytes down, checked by hash, and closes in
// order; Linux's SO_DOMAIN stays AF_SMC (no fallback), Linux's smc_diag lists
// it as SMC-R on rxe1 with our GID as peer, and the engine's side is SMC-R.
// Then the link group idles with Linux testing it every second (TEST_LINK,
// answered), carries a stream of streamBytes for a figure, and a connection
// the engine aborts ends Linux's with an error, not an EOF.
func TestLinuxClientSMCRServer(t *testing.T) {
	setupKernel(t)
	setSysctl(t, sysctlTest, testLinkSec) // read when a link comes up
	defer setSysctl(t, sysctlTest, testLinkDef)
	l := loadBPF(t, smcrPort)
	e := newEngine(t, "server", -1, testUEID) // only Linux tests the link
	ln := listenSMCR(t, l, smcrPort)
	type accepted struct {
		conn *smcr.Conn
		err  error
	}
	conns := make(chan accepted, 1)
	go func() {
		for {
			tcp, err := ln.Accept()
			if err != nil {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			c, err := e.ServerWith(ctx, tcp, smcr.ServerOptions{})
			cancel()
			conns <- accepted{c, err}
		}
	}()
	// dial connects Linux's client and returns its socket and the engine's side.
	dial := func(i int) (int, *os.File, *smcr.Conn) {
		t.Helper()
		fd := smcSocket(t)
		if err := unix.Connect(fd, &unix.SockaddrInet4{Port: smcrPort, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			t.Fatalf("connect %d: %v", i, err)
		}
		a := <-conns
		if a.err != nil {
			t.Fatalf("handshake %d: %v", i, a.err)
		}
		if d := domain(t, fd); a.conn.Mode() != smcr.ModeSMCR || d != afSMC {
			t.Fatalf("connection %d: smcr mode %v (decline %v), Linux SO_DOMAIN %d", i, a.conn.Mode(), a.conn.Decline(), d)
		}
		return fd, os.NewFile(uintptr(fd), "smc-client"), a.conn
	}
	run := func(i, up, down int) time.Duration {
		t.Helper()
		t0 := time.Now()
		fd, f, c := dial(i)
		if i == 0 {
			sa, _ := unix.Getsockname(fd)
			port := sa.(*unix.SockaddrInet4).Port
			d := linuxView(t, "client socket", func(d smcDiag) bool { return int(d.SPort) == port && d.DPort == smcrPort })
			isSMCR(t, d, 0)
			t.Logf("Linux's smc_diag: %+v", d)
		}
		exchange(t, i, c, f, up, down, func() error { return unix.Shutdown(fd, unix.SHUT_WR) }, "server")
		return time.Since(t0)
	}
	start := time.Now()
	for i := range nConns {
		t.Logf("connection %d: connect..close %v", i, run(i, upBytes, downBytes).Round(time.Millisecond))
	}
	elapsed := time.Since(start)

	// Idle: Linux tests the link (smcr_testlink_time 1 s); the engine answers.
	before := e.Stats()
	time.Sleep(idleTime)
	after := e.Stats()
	if after.LLCReceived <= before.LLCReceived || after.LLCSent <= before.LLCSent || after.LinkGroups != 1 {
		t.Fatalf("idle %v with Linux testing every %ss: llc received %d -> %d, sent %d -> %d, %d link groups",
			idleTime, testLinkSec, before.LLCReceived, after.LLCReceived, before.LLCSent, after.LLCSent, after.LinkGroups)
	}
	t.Logf("idle %v: Linux's TEST_LINKs answered: llc received %d -> %d, sent %d -> %d",
		idleTime, before.LLCReceived, after.LLCReceived, before.LLCSent, after.LLCSent)

	d := run(nConns, streamBytes, 0)
	t.Logf("linux client -> smcr server stream: %d bytes in %v (%.1f MB/s), connect to close", streamBytes,
		d.Round(time.Millisecond), float64(streamBytes)/d.Seconds()/1e6)

	// Abort: the engine's Abort ends Linux's connection with ECONNRESET.
	// Linux's read then says EOF (smc_rx_recvmsg looks at SOCK_DONE before
	// sk_err), and the reset waits in SO_ERROR.
	fd, f, c := dial(nConns + 1)
	if _, err := f.Write([]byte("before the abort")); err != nil {
		t.Fatal(err)
	}
	if err := c.Abort(); err != nil {
		t.Fatal(err)
	}
	f.SetReadDeadline(time.Now().Add(30 * time.Second))
	err := readErr(f)
	soErr, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	f.Close()
	if errors.Is(err, os.ErrDeadlineExceeded) || (!errors.Is(err, unix.ECONNRESET) && unix.Errno(soErr) != unix.ECONNRESET) {
		t.Fatalf("Linux's read after smcr's abort: %v, SO_ERROR %v; want a reset", err, unix.Errno(soErr))
	}
	t.Logf("smcr aborted: Linux's read says %v, SO_ERROR %v", err, unix.Errno(soErr))

	st := e.Stats()
	if st.LinkGroups != 1 || len(st.Fallback) > 0 || st.SMCV2 != st.SMC || st.SMC != nConns+2 {
		t.Errorf("%d link groups (want the one all connections shared), fallbacks %v, SMC-R %d of which v2 %d (want %d, all v2)",
			st.LinkGroups, st.Fallback, st.SMC, st.SMCV2, nConns+2)
	}
	t.Logf("linux client -> smcr server, smc-r v2 over %s: %d connections, %d bytes up, %d down each, sha256 equal, %v, stats %+v",
		rxeOnLo, nConns, upBytes, downBytes, elapsed.Round(time.Millisecond), st)
}

// TestSMCRClientLinuxServer: the smcr engine's client connects to Linux's
// AF_SMC server nConns times: a Proposal of versions 1 and 2 with the User EID
// and rxe1's RoCE v2 GID, Linux's Accept of version 2, a Confirm with the GID
// list, LLC version 2 (Linux's ADD_LINK rejected: one device), then data both
// ways checked by hash and an orderly close; Linux's smc_diag lists its side as
// SMC-R (server). Then the link group idles while the engine tests it every
// second (TEST_LINK answered by Linux), and a Linux server that closes with
// bytes unread aborts the connection: the engine's reader gets an error.
func TestSMCRClientLinuxServer(t *testing.T) {
	setupKernel(t)
	l := loadBPF(t, linuxPort)
	e := newEngine(t, "client", time.Second, testUEID)
	lfd := smcSocket(t)
	defer unix.Close(lfd)
	unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(lfd, &unix.SockaddrInet4{Port: linuxPort, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("bind: %v", err)
	}
	if err := unix.Listen(lfd, nConns); err != nil {
		t.Fatalf("listen: %v", err)
	}
	type accepted struct {
		fd  int
		err error
	}
	fds := make(chan accepted, 1)
	go func() {
		for {
			fd, _, err := unix.Accept(lfd)
			fds <- accepted{fd, err}
			if err != nil {
				return
			}
		}
	}()
	dl := net.Dialer{Control: l.Control(bpf.Tag{SMCOption: true})}
	dial := func(i int) (*smcr.Conn, int) {
		t.Helper()
		tcp, err := dl.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", linuxPort))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		c, err := e.ClientWith(ctx, tcp, smcr.ClientOptions{Standard: true})
		cancel()
		if err != nil {
			t.Fatalf("handshake %d: %v", i, err)
		}
		if c.Mode() != smcr.ModeSMCR {
			t.Fatalf("connection %d: mode %v, decline %v", i, c.Mode(), c.Decline())
		}
		a := <-fds
		if a.err != nil {
			t.Fatalf("linux accept %d: %v", i, a.err)
		}
		if d, _ := unix.GetsockoptInt(a.fd, unix.SOL_SOCKET, soDomain); d != afSMC {
			t.Fatalf("connection %d: Linux's SO_DOMAIN %d, fell back", i, d)
		}
		return c, a.fd
	}
	run := func(i, up, down int) time.Duration {
		t.Helper()
		t0 := time.Now()
		c, fd := dial(i)
		if i == 0 {
			port := c.LocalAddr().(*net.TCPAddr).Port
			d := linuxView(t, "server socket", func(d smcDiag) bool { return d.SPort == linuxPort && int(d.DPort) == port })
			isSMCR(t, d, 1)
			t.Logf("Linux's smc_diag: %+v", d)
		}
		exchange(t, i, os.NewFile(uintptr(fd), "smc-server"), c, up, down, c.CloseWrite, "linux server")
		return time.Since(t0)
	}
	start := time.Now()
	for i := range nConns {
		t.Logf("connection %d: connect..close %v", i, run(i, upBytes, downBytes).Round(time.Millisecond))
	}
	elapsed := time.Since(start)

	// Idle: the engine tests the link every second; Linux answers.
	idleFrom := time.Now()
	time.Sleep(idleTime)
	lgs := e.LinkGroups()
	if len(lgs) != 1 || len(lgs[0].Links) != 1 || !lgs[0].Links[0].Tested.After(idleFrom) {
		t.Fatalf("after %v idle: link groups %+v, want one whose link Linux answered a TEST_LINK", idleTime, lgs)
	}
	t.Logf("idle %v: TEST_LINK answered by Linux, rtt %v", idleTime, lgs[0].Links[0].RTT)

	d := run(nConns, streamBytes, 0)
	t.Logf("smcr client -> linux server stream: %d bytes in %v (%.1f MB/s), connect to close", streamBytes,
		d.Round(time.Millisecond), float64(streamBytes)/d.Seconds()/1e6)

	// Abort: Linux's server closes with our bytes unread (smc_close_final
	// sends peer_conn_abort then); the engine's reader gets an error.
	c, fd := dial(nConns + 1)
	if _, err := c.Write([]byte("never read")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the bytes reach Linux's RMB
	unix.Close(fd)
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	err := readErr(c)
	c.Close()
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("smcr's read after Linux's abort: %v, want a reset", err)
	}
	t.Logf("Linux aborted: smcr's read says %v", err)

	st := e.Stats()
	if st.LinkGroups != 1 || st.SMCV2 != st.SMC || st.SMC != nConns+2 {
		t.Errorf("%d link groups (want the one all connections shared), SMC-R %d of which v2 %d (want %d, all v2)",
			st.LinkGroups, st.SMC, st.SMCV2, nConns+2)
	}
	t.Logf("smcr client -> linux server, smc-r v2 over %s: %d connections, %d bytes up, %d down each, sha256 equal, %v, stats %+v",
		rxeOnLo, nConns, upBytes, downBytes, elapsed.Round(time.Millisecond), st)
}

// TestLinuxNoCommonEID: without a User EID in common with Linux there is no
// SMC-R (Linux has no version-1 device on rxe), and every byte goes over TCP:
// smcr's server declines Linux's version-2 Proposal with 0x03030008 (no common
// User EID), or, with no User EID at all, as before version 2 (0x03070000,
// the version-1 subnet rule a version-2-only Proposal cannot meet); Linux's
// server declines smcr's Proposal of versions 1 and 2. Both sides fall back.
func TestLinuxNoCommonEID(t *testing.T) {
	setupKernel(t)
	const port = 5004
	l := loadBPF(t, port)
	ln := listenSMCR(t, l, port)
	for i, tc := range []struct {
		ueids []string
		want  smcr.DeclineCode
	}{
		{[]string{"SMCR-VM.SOMEONE-ELSE"}, clc.DeclineNoUEID},
		{nil, clc.DeclineIPSubnetMismatch},
	} {
		e := newEngine(t, fmt.Sprint("server", i), -1, tc.ueids...)
		served := serveOnce(e, ln, i, 64<<10, func(c *smcr.Conn) error {
			if c.Mode() != smcr.ModeFallback || c.Decline().Code != tc.want || c.Decline().Side != smcr.SideLocal {
				return fmt.Errorf("mode %v, decline %v; want our fallback with %v", c.Mode(), c.Decline(), tc.want)
			}
			return nil
		})
		fd := smcSocket(t)
		if err := unix.Connect(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			t.Fatalf("connect: %v", err)
		}
		d := domain(t, fd)
		f := os.NewFile(uintptr(fd), "smc-client")
		err := talk(f, i, 256<<10, 64<<10, func() error { return unix.Shutdown(fd, unix.SHUT_WR) })
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if err := <-served; err != nil {
			t.Fatalf("server: %v", err)
		}
		if d == afSMC {
			t.Fatalf("Linux's client still AF_SMC with no EID in common: SO_DOMAIN %d", d)
		}
		t.Logf("no common eid: smcr server (user eids %q) declined %v, Linux fell back (SO_DOMAIN %d), bytes intact", tc.ueids, tc.want, d)
	}

	// smcr's client with another User EID: Linux's server declines.
	e := newEngine(t, "client", -1, "SMCR-VM.SOMEONE-ELSE")
	lfd := smcSocket(t)
	defer unix.Close(lfd)
	unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(lfd, &unix.SockaddrInet4{Port: port + 1, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("bind: %v", err)
	}
	if err := unix.Listen(lfd, 1); err != nil {
		t.Fatalf("listen: %v", err)
	}
	served := make(chan error, 1)
	go func() {
		fd, _, err := unix.Accept(lfd)
		if err != nil {
			served <- err
			return
		}
		if d, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, soDomain); d == afSMC {
			served <- fmt.Errorf("Linux's server still AF_SMC with no EID in common")
			unix.Close(fd)
			return
		}
		_, err = serve(os.NewFile(uintptr(fd), "smc-server"), 9, 64<<10)
		served <- err
	}()
	dl := net.Dialer{Control: l.Control(bpf.Tag{SMCOption: true})}
	tcp, err := dl.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", port+1))
	if err != nil {
		t.Fatal(err)
	}
	c, err := e.ClientWith(context.Background(), tcp, smcr.ClientOptions{Standard: true})
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode() != smcr.ModeFallback || c.Decline().Side != smcr.SidePeer {
		t.Fatalf("smcr client: mode %v, decline %v; want Linux's Decline", c.Mode(), c.Decline())
	}
	err = talk(c, 9, 256<<10, 64<<10, c.CloseWrite)
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("linux server: %v", err)
	}
	t.Logf("no common eid: Linux's server declined smcr's proposal: %v; bytes intact over TCP", c.Decline())
}
