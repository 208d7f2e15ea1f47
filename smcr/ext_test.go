package smcr

import (
	"bytes"
	"encoding/hex"
	"testing"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// goldenOffers is one soft offer, built by hand from docs/protocol.md §1.
const goldenOffers = "03" + // kind soft
	"fe800000000000000000000000000001" + // GID
	"020000000001" + // MAC
	"03" + // MTU 1024
	"0e" + "3132372e302e302e313a34303030" // endpoint "127.0.0.1:4000"

func TestOffersGolden(t *testing.T) {
	b, _ := hex.DecodeString(goldenOffers)
	got, err := parseOffers(b)
	if err != nil || len(got) != 1 {
		t.Fatalf("%v %v", got, err)
	}
	o := got[0]
	if o.Kind != verbs.KindSoft || o.GID[0] != 0xfe || o.GID[15] != 1 || o.MAC[5] != 1 || o.MTU != verbs.MTU1024 || string(o.Endpoint) != "127.0.0.1:4000" {
		t.Fatalf("%+v", o)
	}
	enc, err := appendOffers(nil, got)
	if err != nil || !bytes.Equal(enc, b) {
		t.Fatalf("re-encoded %x", enc)
	}
	if _, err := parseOffers(b[:len(b)-1]); err == nil {
		t.Fatal("truncated endpoint accepted")
	}
}

func TestChosenGolden(t *testing.T) {
	b, _ := hex.DecodeString("02" + "03" + "616263")
	k, ep, err := parseChosen(b)
	if err != nil || k != verbs.KindSHM || string(ep) != "abc" {
		t.Fatalf("%v %q %v", k, ep, err)
	}
	if !bytes.Equal(appendChosen(nil, k, ep), b) {
		t.Fatal("round trip")
	}
	if _, _, err := parseChosen(b[:4]); err == nil {
		t.Fatal("short value accepted")
	}
}

func TestChoosePrefersFastest(t *testing.T) {
	e := &Engine{cfg: Config{Devices: []verbs.Device{fakeDev(verbs.KindSoft), fakeDev(verbs.KindSHM)}}}
	i, o, ok := e.choose([]offer{{Kind: verbs.KindSoft}, {Kind: verbs.KindSHM}, {Kind: verbs.KindRDMA}})
	if !ok || i != 1 || o.Kind != verbs.KindSHM {
		t.Fatalf("%d %v %v", i, o.Kind, ok)
	}
	if _, _, ok := e.choose([]offer{{Kind: verbs.KindRDMA}}); ok {
		t.Fatal("chose a provider we lack")
	}
}

// TestChooseAsksReachOnce: a device that can tell reachability (shm) is asked
// only while no link group runs to the offer's endpoint; a reusing setup
// pays no stat while its client waits.
func TestChooseAsksReachOnce(t *testing.T) {
	d := &reachDev{fakeDev: fakeDev(verbs.KindSHM)}
	e := &Engine{cfg: Config{Devices: []verbs.Device{d}}}
	o := offer{Kind: verbs.KindSHM, Endpoint: []byte("peer-a")}
	if _, _, ok := e.choose([]offer{o}); ok || d.asked != 1 {
		t.Fatalf("unreachable peer: chosen %v after %d questions", ok, d.asked)
	}
	e.lgs = []*linkGroup{{key: lgKey{kind: verbs.KindSHM, endpoint: "peer-a"}}}
	if _, got, ok := e.choose([]offer{o}); !ok || string(got.Endpoint) != "peer-a" || d.asked != 1 {
		t.Fatalf("linked peer: chosen %v after %d questions", ok, d.asked)
	}
	o.Endpoint = []byte("peer-b") // another endpoint of the same kind: asked again
	if _, _, ok := e.choose([]offer{o}); ok || d.asked != 2 {
		t.Fatalf("other peer: chosen %v after %d questions", ok, d.asked)
	}
}

type reachDev struct {
	fakeDev
	asked int
}

func (d *reachDev) Reachable([]byte) bool { d.asked++; return false }

type fakeDev verbs.Kind

func (k fakeDev) Kind() verbs.Kind                   { return verbs.Kind(k) }
func (fakeDev) Name() string                         { return "fake" }
func (fakeDev) Port() verbs.PortAttr                 { return verbs.PortAttr{} }
func (fakeDev) Endpoint() []byte                     { return nil }
func (fakeDev) AllocPD() (verbs.PD, error)           { return nil, verbs.ErrUnsupported }
func (fakeDev) CreateCQ(depth int) (verbs.CQ, error) { return nil, verbs.ErrUnsupported }
func (fakeDev) Close() error                         { return nil }

func FuzzParseOffers(f *testing.F) {
	b, _ := hex.DecodeString(goldenOffers)
	f.Add(b)
	f.Add(append(b, b...))
	f.Fuzz(func(t *testing.T, b []byte) {
		offers, err := parseOffers(b)
		if err != nil {
			return
		}
		if len(offers) > 8 {
			t.Fatalf("%d offers", len(offers))
		}
		enc, err := appendOffers(nil, offers)
		if err != nil || !bytes.Equal(enc, b) {
			t.Fatalf("parse then encode: %x, want %x", enc, b)
		}
	})
}

func FuzzParseChosen(f *testing.F) {
	f.Add([]byte{2, 3, 'a', 'b', 'c'})
	f.Add([]byte{1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		k, ep, err := parseChosen(b)
		if err == nil && !bytes.Equal(appendChosen(nil, k, ep), b) {
			t.Fatalf("round trip of %x", b)
		}
	})
}

func FuzzParseResync(f *testing.F) {
	b := resync{flags: 0x80, received: 12345}.encode()
	f.Add(b[:])
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseResync(b)
		if err != nil {
			return
		}
		if enc := r.encode(); !bytes.Equal(enc[:6], b[:6]) || !bytes.Equal(enc[8:], b[8:]) {
			t.Fatalf("round trip of %x", b)
		}
	})
}
