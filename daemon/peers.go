// Peer cache: which peers answered with SMC-R and which did not, for how long. A
// peer without SMC-R goes into the programs' negative cache so the next connections
// to it are not redirected at all (RFC 7609 §4.3 fallback, made cheap).
//
// A peer is a destination, address and port: a server host may offer SMC-R on
// some ports only (its smcrd's port_range_list, or Linux's SMC for some
// applications), and a port without must not take the others off SMC-R.

package daemon

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/smcr-io/smcr/control"
)

// maxPeers bounds the Go-side view; the bpf map is an LRU of its own.
const maxPeers = 4096

type peerEntry struct {
	capable bool
	reason  string
	expires time.Time
	hits    uint64
	// lastCapable is when a connection to the peer last went SMC-R, carried
	// over to the entries after; retries counts the short negative entries
	// since (incapable).
	lastCapable time.Time
	retries     uint
}

// retryFirst is how long a peer that had SMC-R lately stays in the negative
// cache when a connection to it goes without: most often its smcrd is
// restarting (an upgrade: while it drains and starts, its host answers
// without the option), and the whole TTL would keep every connection to it
// off SMC-R for that long (10 minutes by default). Each time it still answers
// without, the wait doubles, up to the TTL; a connection that goes SMC-R
// starts over. A peer that really dropped SMC-R costs a few more connections
// through smcrd's relay, never a failed one.
const retryFirst = 5 * time.Second

// peerCache is the daemon's view of its peers. negative, when set, also puts a
// non-capable peer into the programs' negative cache for the same TTL.
type peerCache struct {
	now      func() time.Time
	negative func(netip.AddrPort, time.Duration) error

	mu    sync.Mutex
	peers map[netip.AddrPort]*peerEntry // by unmapAP
}

func newPeerCache(now func() time.Time, negative func(netip.AddrPort, time.Duration) error) *peerCache {
	return &peerCache{now: now, negative: negative, peers: map[netip.AddrPort]*peerEntry{}}
}

// capable records that a connection to peer went SMC-R.
func (p *peerCache) capable(peer netip.AddrPort, ttl time.Duration) {
	now := p.now()
	p.set(peer, &peerEntry{capable: true, expires: now.Add(ttl), lastCapable: now})
}

// incapable records that peer did not speak SMC-R and tells the programs to connect
// to it directly until ttl passes, or sooner where it had SMC-R lately
// (retryFirst). It returns how long.
func (p *peerCache) incapable(peer netip.AddrPort, reason string, ttl time.Duration) (time.Duration, error) {
	peer = unmapAP(peer)
	now := p.now()
	e := &peerEntry{reason: reason, expires: now.Add(ttl)}
	p.mu.Lock()
	if old, ok := p.peers[peer]; ok && !old.lastCapable.IsZero() && now.Sub(old.lastCapable) < ttl {
		ttl = min(ttl, retryFirst<<min(old.retries, 16))
		e.expires, e.lastCapable, e.retries = now.Add(ttl), old.lastCapable, old.retries+1
		e.reason += fmt.Sprintf(" (had SMC-R %v ago: tried again after %v)", now.Sub(old.lastCapable).Round(time.Second), ttl)
	}
	p.mu.Unlock()
	p.set(peer, e)
	if p.negative != nil {
		return ttl, p.negative(peer, ttl)
	}
	return ttl, nil
}

// reasonKept is the reason of entries an earlier smcrd left in the pinned map.
const reasonKept = "not SMC-R capable when an earlier smcrd asked"

// restore shows entries already in the programs' negative cache, each with the
// time it has left.
func (p *peerCache) restore(negative map[netip.AddrPort]time.Duration, reason string) {
	now := p.now()
	for a, left := range negative {
		p.set(a, &peerEntry{reason: reason, expires: now.Add(left)})
	}
}

// forget takes the entries peers name (control.PeerNamed) out of the cache and
// returns those it held.
func (p *peerCache) forget(peers []netip.AddrPort) []netip.AddrPort {
	p.mu.Lock()
	defer p.mu.Unlock()
	var gone []netip.AddrPort
	for a := range p.peers {
		if control.PeerNamed(peers, a) {
			delete(p.peers, a)
			gone = append(gone, a)
		}
	}
	return gone
}

func (p *peerCache) set(peer netip.AddrPort, e *peerEntry) {
	peer = unmapAP(peer)
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.peers[peer]; ok {
		if e.capable && !old.capable && now.Before(old.expires) {
			// Another connection declined meanwhile: the programs send the
			// peer's connections direct until the entry expires, and the
			// view must say so.
			old.hits++
			return
		}
		e.hits = old.hits + 1
	} else {
		e.hits = 1
		if len(p.peers) >= maxPeers {
			p.expireLocked(now)
		}
		if len(p.peers) >= maxPeers {
			return // full of live entries: the bpf LRU still has the negative ones
		}
	}
	p.peers[peer] = e
}

func (p *peerCache) expireLocked(now time.Time) {
	for a, e := range p.peers {
		if !now.Before(e.expires) {
			delete(p.peers, a)
		}
	}
}

// list returns the live entries, sorted by address and port.
func (p *peerCache) list() []control.Peer {
	now := p.now()
	p.mu.Lock()
	p.expireLocked(now)
	out := make([]control.Peer, 0, len(p.peers))
	for a, e := range p.peers {
		out = append(out, control.Peer{Addr: a.Addr().String(), Port: a.Port(), Capable: e.capable, Reason: e.reason,
			ExpiresInSeconds: e.expires.Sub(now).Seconds(), Hits: e.hits})
	}
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b control.Peer) int {
		x, _ := netip.ParseAddr(a.Addr)
		y, _ := netip.ParseAddr(b.Addr)
		return netip.AddrPortFrom(x, a.Port).Compare(netip.AddrPortFrom(y, b.Port))
	})
	return out
}
