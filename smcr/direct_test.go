package smcr

import (
	"bytes"
	"testing"

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
			cl, srv := connectWith(t, e1, e2, ClientOptions{Direct: c.cli}, ServerOptions{Direct: c.srv})
			defer cl.Close()
			defer srv.Close()
			mustSMC(t, cl, srv)
			gotC, gotS := cl.PeerDirect(), srv.PeerDirect()
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
