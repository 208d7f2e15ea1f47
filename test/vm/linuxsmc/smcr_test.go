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
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/bpf"
	"github.com/smcr-io/smcr/smcr"
	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/ibv"
)

const (
	smcrPort  = 5001 // smcr's server, for Linux's client
	linuxPort = 5002 // Linux's server, for smcr's client
	upBytes   = 2 << 20
	downBytes = 1 << 20
	nConns    = 3
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

// newEngine opens rxe1 (on lo) and makes an engine of it with the test's User EID.
func newEngine(t *testing.T, name string) *smcr.Engine {
	t.Helper()
	log := slog.New(slog.NewTextHandler(&testWriter{t: t}, &slog.HandlerOptions{Level: slog.LevelDebug})).With("engine", name)
	dev, err := ibv.Open(ibv.Config{Interface: loopback, GIDIndex: -1, Logger: log})
	if err != nil {
		t.Fatalf("open the rdma device of %s: %v", loopback, err)
	}
	e, err := smcr.NewEngine(smcr.Config{
		Devices: []verbs.Device{dev}, UEIDs: []string{testUEID},
		// Linux waits 6 s for each CLC message and 2 s for LLC; TCG is slow.
		CLCTimeout: 30 * time.Second, LLCTimeout: 10 * time.Second, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.Close()
		time.Sleep(time.Second) // the links' teardown goroutines
		dev.Close()
	})
	return e
}

// testWriter sends log lines to t.Log while the test runs, to stderr after.
type testWriter struct {
	t    *testing.T
	mu   sync.Mutex
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return os.Stderr.Write(p)
	}
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// payload is connection i's bytes in one direction.
func payload(i, dir, n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{36, byte(i), byte(dir)}).Read(b)
	return b
}

// serve is one connection's server side: it reads the client's bytes to EOF,
// answers with their sha256 and downBytes of its own, and closes.
func serve(rw io.ReadWriteCloser, i int) (int64, [32]byte, error) {
	defer rw.Close()
	h := sha256.New()
	n, err := io.Copy(h, rw)
	if err != nil {
		return n, [32]byte{}, fmt.Errorf("read: %w", err)
	}
	sum := [32]byte(h.Sum(nil))
	if _, err := rw.Write(append(sum[:], payload(i, 1, downBytes)...)); err != nil {
		return n, sum, fmt.Errorf("write: %w", err)
	}
	return n, sum, nil
}

// talk is one connection's client side: upBytes, half-close, then the
// server's digest and its downBytes, checked.
func talk(rw io.ReadWriter, i int, closeWrite func() error) error {
	up := payload(i, 0, upBytes)
	if _, err := rw.Write(up); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if err := closeWrite(); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	got, err := io.ReadAll(rw)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	want := sha256.Sum256(up)
	if len(got) != 32+downBytes || !bytes.Equal(got[:32], want[:]) || !bytes.Equal(got[32:], payload(i, 1, downBytes)) {
		return fmt.Errorf("got %d bytes (want %d), digest %x (want %x) or data differ", len(got), 32+downBytes, got[:min(32, len(got))], want)
	}
	return nil
}

// TestLinuxClientSMCRServer: Linux's AF_SMC client connects to the smcr engine's
// server nConns times, one after another: the first is first contact (CLC of
// version 2, CONFIRM_LINK of LLC version 2), the others join its link group.
// Each carries upBytes up and downBytes down, checked by hash, and closes in
// order. Linux's SO_DOMAIN stays AF_SMC (no fallback) and the engine's side is
// SMC-R of version 2.
func TestLinuxClientSMCRServer(t *testing.T) {
	setupKernel(t)
	l := loadBPF(t, smcrPort)
	e := newEngine(t, "server")
	lc := net.ListenConfig{Control: l.Control(bpf.Tag{SMCOption: true})}
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp4", fmt.Sprintf("127.0.0.1:%d", smcrPort))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type served struct {
		conn *smcr.Conn
		n    int64
		err  error
	}
	done := make(chan served, nConns)
	go func() {
		for i := range nConns {
			tcp, err := ln.Accept()
			if err != nil {
				done <- served{err: err}
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			c, err := e.ServerWith(ctx, tcp, smcr.ServerOptions{})
			cancel()
			if err != nil {
				done <- served{err: fmt.Errorf("handshake: %w", err)}
				continue
			}
			go func() {
				n, _, err := serve(c, i)
				done <- served{conn: c, n: n, err: err}
			}()
		}
	}()
	start := time.Now()
	for i := range nConns {
		fd := smcSocket(t)
		addr := &unix.SockaddrInet4{Port: smcrPort, Addr: [4]byte{127, 0, 0, 1}}
		t0 := time.Now()
		if err := unix.Connect(fd, addr); err != nil {
			t.Fatalf("connect %d: %v", i, err)
		}
		f := os.NewFile(uintptr(fd), "smc-client")
		d := domain(t, fd)
		err := talk(f, i, func() error { return unix.Shutdown(fd, unix.SHUT_WR) })
		f.Close()
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		s := <-done
		if s.err != nil && !errors.Is(s.err, io.EOF) {
			t.Fatalf("server %d: %v", i, s.err)
		}
		if s.conn.Mode() != smcr.ModeSMCR || d != afSMC {
			t.Fatalf("connection %d: smcr mode %v (decline %v), Linux SO_DOMAIN %d", i, s.conn.Mode(), s.conn.Decline(), d)
		}
		if s.n != upBytes {
			t.Fatalf("server %d read %d bytes, want %d", i, s.n, upBytes)
		}
		t.Logf("connection %d: connect..close %v", i, time.Since(t0).Round(time.Millisecond))
	}
	elapsed := time.Since(start)
	st := e.Stats()
	if st.LinkGroups != 1 {
		t.Errorf("%d link groups, want the one all connections shared", st.LinkGroups)
	}
	t.Logf("linux client -> smcr server, smc-r v2 over %s: %d connections, %d bytes up, %d down each, sha256 equal, %v, stats %+v",
		rxeOnLo, nConns, upBytes, downBytes, elapsed.Round(time.Millisecond), st)
}

// TestSMCRClientLinuxServer: the smcr engine's client connects to Linux's
// AF_SMC server nConns times: a Proposal of versions 1 and 2 with the User EID
// and rxe1's RoCE v2 GID, Linux's Accept of version 2, a Confirm with the GID
// list, LLC version 2 (Linux's ADD_LINK rejected: one device), then data both
// ways checked by hash and an orderly close.
func TestSMCRClientLinuxServer(t *testing.T) {
	setupKernel(t)
	l := loadBPF(t, linuxPort)
	e := newEngine(t, "client")
	lfd := smcSocket(t)
	defer unix.Close(lfd)
	unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(lfd, &unix.SockaddrInet4{Port: linuxPort, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("bind: %v", err)
	}
	if err := unix.Listen(lfd, nConns); err != nil {
		t.Fatalf("listen: %v", err)
	}
	type served struct {
		n      int64
		domain int
		err    error
	}
	done := make(chan served, nConns)
	go func() {
		for i := range nConns {
			fd, _, err := unix.Accept(lfd)
			if err != nil {
				done <- served{err: fmt.Errorf("accept: %w", err)}
				return
			}
			d, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, soDomain)
			n, _, err := serve(os.NewFile(uintptr(fd), "smc-server"), i)
			done <- served{n: n, domain: d, err: err}
		}
	}()
	dl := net.Dialer{Control: l.Control(bpf.Tag{SMCOption: true})}
	start := time.Now()
	for i := range nConns {
		t0 := time.Now()
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
		err = talk(c, i, c.CloseWrite)
		c.Close()
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		s := <-done
		if s.err != nil {
			t.Fatalf("linux server %d: %v", i, s.err)
		}
		if s.n != upBytes || s.domain != afSMC {
			t.Fatalf("linux server %d read %d bytes (want %d), SO_DOMAIN %d", i, s.n, upBytes, s.domain)
		}
		t.Logf("connection %d: connect..close %v", i, time.Since(t0).Round(time.Millisecond))
	}
	st := e.Stats()
	if st.LinkGroups != 1 {
		t.Errorf("%d link groups, want the one all connections shared", st.LinkGroups)
	}
	t.Logf("smcr client -> linux server, smc-r v2 over %s: %d connections, %d bytes up, %d down each, sha256 equal, %v, stats %+v",
		rxeOnLo, nConns, upBytes, downBytes, time.Since(start).Round(time.Millisecond), st)
}
