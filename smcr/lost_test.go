package smcr

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/smcr-io/smcr/smcr/clc"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// TestClientConnLost: a server that resets or closes the TCP connection once
// it read the Proposal (a Linux server refusing it, an smcrd finding nothing
// listening) fails the handshake, as Linux's client does: there is nothing to
// fall back onto. Before, Dial handed out a fallback whose first Read failed,
// and the engine counted a fallback. A server that answers with bytes of its
// own and then closes is plain TCP: the bytes reach the application.
func TestClientConnLost(t *testing.T) {
	for _, tc := range []struct {
		name  string
		serve func(c *net.TCPConn)
		want  error // nil: a fallback carrying "bye"
	}{
		{"reset", func(c *net.TCPConn) { c.SetLinger(0); c.Close() }, syscall.ECONNRESET},
		{"closed", func(c *net.TCPConn) { c.Close() }, io.EOF},
		{"plain server closes", func(c *net.TCPConn) { c.Write([]byte("bye")); c.Close() }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, Config{Devices: memDevices(t, verbs.KindSoft)})
			addr := rawServer(t, func(c net.Conn) {
				if _, err := clc.ReadMessage(c, clcMaxLen); err != nil {
					t.Errorf("server: read proposal: %v", err)
				}
				tc.serve(c.(*net.TCPConn))
			})
			c, err := e.Dial(context.Background(), "tcp", addr)
			if tc.want == nil {
				if err != nil || c.Mode() != ModeFallback {
					t.Fatalf("dial: %v; want a fallback", err)
				}
				defer c.Close()
				if b, err := io.ReadAll(c); string(b) != "bye" || err != nil {
					t.Fatalf("read %q, %v; want the server's bytes", b, err)
				}
				return
			}
			if c != nil {
				c.Close()
				t.Fatalf("dial: a %v connection (%+v); want an error wrapping %v", c.Mode(), c.Decline(), tc.want)
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("dial: %v; want an error wrapping %v", err, tc.want)
			}
			if s := e.Stats(); s.Handled != 1 || s.HandshakeErrors != 1 || len(s.Fallback) != 0 || s.SMC != 0 {
				t.Errorf("stats %+v: want one handled, a handshake error, no fallback", s)
			}
			if cs := e.Conns(); len(cs) != 0 {
				t.Errorf("engine still lists %+v", cs)
			}
		})
	}
}

// TestServerConnLost: a client lost after its Proposal (it spoke CLC, so it is
// no plain client) ends the server's handshake, and the Listener hands nothing
// to Accept, as Linux's listener drops it; a fallback accepted would only fail
// at its first Read. A proxy between the two engines resets the server's side
// as soon as the Accept passes.
func TestServerConnLost(t *testing.T) {
	p := memPair(t)
	proxy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	go func() {
		cli, err := proxy.Accept()
		if err != nil {
			return
		}
		defer cli.Close()
		srv, err := net.Dial("tcp", p.ln.Addr().String())
		if err != nil {
			t.Error(err)
			return
		}
		go io.Copy(srv, cli) // the Proposal
		if _, err := clc.ReadMessage(srv, clcMaxLen); err != nil {
			t.Errorf("proxy: read accept: %v", err)
		}
		srv.(*net.TCPConn).SetLinger(0)
		srv.Close()
	}()
	accepted := make(chan *Conn, 1)
	go func() {
		s, _ := p.ln.AcceptSMC()
		accepted <- s
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, err := p.cli.Dial(ctx, "tcp", proxy.Addr().String()); err == nil {
		defer c.Close()
	}
	if !waitFor(waitLimit, func() bool { return p.srv.Stats().HandshakeErrors != 0 && len(p.srv.Conns()) == 0 }) {
		t.Fatalf("server: stats %+v, conns %+v", p.srv.Stats(), p.srv.Conns())
	}
	// Its handshake's goroutine gone, a connection it handed out would have
	// taken the Accept out of its wait.
	eventually(t, "the server's handshake over", func() bool { return goroutinesIn("smcr.(*Listener).loop.func") == 0 })
	select {
	case s := <-accepted:
		t.Fatalf("accepted %v (%+v): a lost connection", s.Mode(), s.Decline())
	default:
		if !goroutineWaitingIn("smcr.(*Listener).AcceptSMC(", "select") {
			t.Fatal("the Accept took a connection: a lost one")
		}
	}
	if s := p.srv.Stats(); len(s.Fallback) != 0 || s.SMC != 0 {
		t.Errorf("server stats %+v: want no fallback, no SMC-R", s)
	}
}

// TestPendingInputLeavesError: asking whether a reset connection has input
// must leave the reset for the read. A peek took it, and CLC then read a
// reset connection as one the peer had closed.
func TestPendingInputLeavesError(t *testing.T) {
	cli, srv := tcpPair(t)
	if pendingInput(cli) {
		t.Fatal("input pending on a fresh connection")
	}
	srv.(*net.TCPConn).SetLinger(0)
	srv.Close()
	awaitInput(t, cli) // the reset
	pendingInput(cli)
	if _, err := cli.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after pendingInput: %v, want the reset", err)
	}
}
