package control_test

import (
	"net/netip"
	"testing"

	"github.com/smcr-io/smcr/control"
)

func TestParsePeer(t *testing.T) {
	for in, want := range map[string]string{
		"198.18.0.9":            "198.18.0.9:0",
		"198.18.0.9:6379":       "198.18.0.9:6379",
		"[2001:db8::7]:443":     "[2001:db8::7]:443",
		"2001:db8::7":           "[2001:db8::7]:0",
		"::ffff:198.18.0.9":     "198.18.0.9:0",
		"[::ffff:198.18.0.9]:1": "198.18.0.9:1",
	} {
		if got, err := control.ParsePeer(in); err != nil || got.String() != want {
			t.Errorf("ParsePeer(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"", "frob", "198.18.0.9:0", "198.18.0.9:http", "fe80::1%eth0", "[fe80::1%eth0]:80", "198.18.0.9:65536"} {
		if got, err := control.ParsePeer(in); err == nil {
			t.Errorf("ParsePeer(%q) = %v, want an error", in, got)
		}
	}
}

func TestPeerNamed(t *testing.T) {
	dst := netip.MustParseAddrPort("198.18.0.9:6379")
	for _, c := range []struct {
		peers []string
		want  bool
	}{
		{nil, true},
		{[]string{"198.18.0.9"}, true},
		{[]string{"198.18.0.9:6379"}, true},
		{[]string{"198.18.0.9:5201"}, false},
		{[]string{"198.18.0.10", "198.18.0.9:5201"}, false},
		{[]string{"198.18.0.10", "198.18.0.9:6379"}, true},
	} {
		var peers []netip.AddrPort
		for _, p := range c.peers {
			ap, err := control.ParsePeer(p)
			if err != nil {
				t.Fatal(err)
			}
			peers = append(peers, ap)
		}
		if got := control.PeerNamed(peers, dst); got != c.want {
			t.Errorf("PeerNamed(%v, %s) = %v, want %v", c.peers, dst, got, c.want)
		}
	}
}

// FuzzParsePeer: what ParsePeer accepts has no zone and no IPv4-mapped
// address, and reads back the same from its own form (an address alone for
// port 0).
func FuzzParsePeer(f *testing.F) {
	for _, s := range []string{"198.18.0.9", "198.18.0.9:6379", "[2001:db8::7]:443", "::ffff:1.2.3.4", "fe80::1%eth0", "1.2.3.4:0", "[::1]:x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		ap, err := control.ParsePeer(in)
		if err != nil {
			return
		}
		if ap.Addr().Zone() != "" || ap.Addr().Is4In6() {
			t.Fatalf("ParsePeer(%q) = %v: a zone or a mapped address", in, ap)
		}
		form := ap.String()
		if ap.Port() == 0 {
			form = ap.Addr().String()
		}
		if back, err := control.ParsePeer(form); err != nil || back != ap {
			t.Fatalf("ParsePeer(%q) = %v, whose form %q reads back as %v, %v", in, ap, form, back, err)
		}
	})
}
