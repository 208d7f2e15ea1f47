// The SMCX provider-choice extension: which verbs providers a client offers and which
// one the server picked, carried in clc.Envelope TLVs. This project's extension of
// RFC 7609 §3.7.1/§3.7.2; byte layout in docs/protocol.md.

package smcr

import (
	"errors"
	"fmt"

	"github.com/smcr-io/smcr/smcr/clc"
	"github.com/smcr-io/smcr/smcr/verbs"
)

// TLV types of the SMCX envelope. Never renumber: they are on the wire.
const (
	tlvProviders clc.TLVType = 1 // Proposal: the providers the client offers
	tlvChosen    clc.TLVType = 2 // Accept: the provider the server picked
	// tlvDirect, in the Proposal and the Accept: this end is a program's own
	// socket in smcrd's direct mode, and the value tells the peer's smcrd
	// where to meet for the connection's memory (smcrd's business; the engine
	// only carries it). The server answers one only when it chose shm and its
	// end is direct too: both ends then agree (Conn.PeerDirect).
	tlvDirect clc.TLVType = 3
)

// maxDirectValue bounds a tlvDirect value: a nonce and a Unix socket's path.
const maxDirectValue = 16 + 108

// offerFixed is kind(1) gid(16) mac(6) mtu(1) endpoint-length(1).
const offerFixed = 25

// offer is one provider a client proposes: a device's identity and rendezvous.
type offer struct {
	Kind     verbs.Kind
	GID      [16]byte
	MAC      [6]byte
	MTU      verbs.MTU
	Endpoint []byte
}

var errExt = errors.New("smcr: malformed smcx extension")

func appendOffers(b []byte, offers []offer) ([]byte, error) {
	for _, o := range offers {
		if len(o.Endpoint) > 255 {
			return b, fmt.Errorf("smcr: endpoint of %d bytes: %w", len(o.Endpoint), errExt)
		}
		b = append(b, byte(o.Kind))
		b = append(b, o.GID[:]...)
		b = append(b, o.MAC[:]...)
		b = append(b, byte(o.MTU), byte(len(o.Endpoint)))
		b = append(b, o.Endpoint...)
	}
	return b, nil
}

// parseOffers parses a tlvProviders value; the endpoints share memory with b.
func parseOffers(b []byte) ([]offer, error) {
	var out []offer
	for len(b) > 0 {
		if len(b) < offerFixed || len(b) < offerFixed+int(b[24]) {
			return nil, fmt.Errorf("smcr: provider offer of %d bytes: %w", len(b), errExt)
		}
		if len(out) == 8 {
			return nil, fmt.Errorf("smcr: more than 8 provider offers: %w", errExt)
		}
		o := offer{Kind: verbs.Kind(b[0]), MTU: verbs.MTU(b[23])}
		copy(o.GID[:], b[1:17])
		copy(o.MAC[:], b[17:23])
		n := offerFixed + int(b[24])
		o.Endpoint = b[offerFixed:n]
		out = append(out, o)
		b = b[n:]
	}
	return out, nil
}

// chosen is the server's pick: kind(1) endpoint-length(1) endpoint.
func appendChosen(b []byte, k verbs.Kind, endpoint []byte) []byte {
	b = append(b, byte(k), byte(len(endpoint)))
	return append(b, endpoint...)
}

func parseChosen(b []byte) (verbs.Kind, []byte, error) {
	if len(b) < 2 || len(b) != 2+int(b[1]) {
		return 0, nil, fmt.Errorf("smcr: chosen provider of %d bytes: %w", len(b), errExt)
	}
	return verbs.Kind(b[0]), b[2:], nil
}

// kindRank orders providers by preference: real RDMA, then shared memory, then soft.
func kindRank(k verbs.Kind) int {
	switch k {
	case verbs.KindRDMA:
		return 3
	case verbs.KindSHM:
		return 2
	case verbs.KindSoft:
		return 1
	}
	return 0
}

// reacher is implemented by devices that can tell whether a peer's endpoint is
// reachable from here (shm: only on the same host).
type reacher interface {
	Reachable(endpoint []byte) bool
}

// choose picks the best offer we have a device for: the device index and the offer.
func (e *Engine) choose(offers []offer) (int, offer, bool) {
	best, bi, bo := 0, -1, offer{}
	for _, o := range offers {
		for i, d := range e.cfg.Devices {
			if d.Kind() != o.Kind || kindRank(o.Kind) <= best {
				continue
			}
			if r, ok := d.(reacher); ok && !e.linkedTo(o) && !r.Reachable(o.Endpoint) {
				continue
			}
			best, bi, bo = kindRank(o.Kind), i, o
		}
	}
	return bi, bo, bi >= 0
}

// linkedTo reports whether one of our link groups runs to o's endpoint: it was
// reachable then, and a group whose link fails is gone. Asking the device again
// costs every reusing setup a stat (shm) while the client waits for the Accept.
func (e *Engine) linkedTo(o offer) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, lg := range e.lgs {
		if lg.key.kind == o.Kind && lg.key.endpoint == string(o.Endpoint) {
			return true
		}
	}
	return false
}
