package smcr

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// TestPeerDirect: the direct mode's tlvDirect is agreed only when the client
// offers it, the server answers it, and the provider is shm; either side
// without it, or another provider, leaves both ends without.
func TestPeerDirect(t *testing.T) {
	for _, c := range []struct {
		name     string
		kind     verbs.Kind
		cli, srv []byte
		agreed   bool
	}{
		{"both over shm", verbs.KindSHM, []byte("client"), []byte("server"), true},
		{"client only", verbs.KindSHM, []byte("client"), nil, false},
		{"server only", verbs.KindSHM, nil, []byte("server"), false},
		{"soft", verbs.KindSoft, []byte("client"), []byte("server"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e1 := newEngine(t, Config{Devices: memDevices(t, c.kind)})
			e2 := newEngine(t, Config{Devices: memDevices(t, c.kind)})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			type res struct {
				c   *Conn
				err error
			}
			srv := make(chan res, 1)
			go func() {
				tcp, err := ln.Accept()
				if err != nil {
					srv <- res{nil, err}
					return
				}
				s, err := e2.ServerWith(ctx, tcp, ServerOptions{Direct: c.srv})
				srv <- res{s, err}
			}()
			tcp, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			cl, err := e1.ClientWith(ctx, tcp, ClientOptions{Direct: c.cli})
			if err != nil {
				t.Fatal(err)
			}
			r := <-srv
			if r.err != nil {
				t.Fatal(r.err)
			}
			defer cl.Close()
			defer r.c.Close()
			mustSMC(t, cl, r.c)
			gotC, gotS := cl.PeerDirect(), r.c.PeerDirect()
			if c.agreed {
				if !bytes.Equal(gotC, c.srv) || !bytes.Equal(gotS, c.cli) {
					t.Fatalf("client has %q, server %q; want %q, %q", gotC, gotS, c.srv, c.cli)
				}
			} else if gotC != nil || gotS != nil {
				t.Fatalf("agreed without both ends over shm: client %q, server %q", gotC, gotS)
			}
		})
	}
}
