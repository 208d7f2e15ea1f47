// The local subnet a Proposal names and a server checks: the prefix of the
// interface address a connection uses, read from its network namespace and cached.
// RFC 7609 §3.5.1 (the Proposal's IP prefix), after Linux's smc_clc_prfx_set.

package smcr

import (
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// localPrefix is the subnet of tcp's local address: among listenerAddrs (a
// Listener's, read where it was made), else from Config.Prefixes or the default
// cache.
func (e *Engine) localPrefix(tcp net.Conn, listenerAddrs []net.Addr) netip.Prefix {
	var local netip.Addr
	switch a := tcp.LocalAddr().(type) {
	case *net.TCPAddr:
		local = a.AddrPort().Addr().Unmap()
	case nil:
		return netip.Prefix{}
	default: // a wrapper's own address type
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return netip.Prefix{}
		}
		local = ap.Addr().Unmap()
	}
	if p, ok := matchPrefix(listenerAddrs, local); ok {
		return p
	}
	var p netip.Prefix
	if e.cfg.prefixCache != nil {
		p, _ = e.cfg.prefixCache.lookupConn(tcp, local)
	} else {
		p, _ = e.cfg.Prefixes(local)
	}
	return p
}

// prefixCache finds the interface address equal to local and returns its subnet,
// from the addresses of a network namespace. It reads them again when the cached
// list is a second old or lacks local: reading them (a netlink dump) took about
// 35 µs of every Dial. A prefix changed on an address within that second can
// make one Proposal name the old subnet; the server then declines and the
// connection is plain TCP, nothing lost.
type prefixCache struct {
	addrs func() ([]net.Addr, error) // of the calling thread's namespace
	now   func() time.Time

	mu   sync.Mutex
	byNS map[nsKey]prefixEntry
}

// nsKey names a network namespace: by the netns cookie of a socket in it
// (SO_NETNS_COOKIE, one getsockopt), or by the inode of the calling thread's
// (a stat in /proc: 5–6 µs on these VMs, which every Dial paid).
type nsKey struct {
	cookie bool
	id     uint64
}

type prefixEntry struct {
	addrs []net.Addr
	at    time.Time
}

const (
	prefixTTL        = time.Second
	prefixNamespaces = 64 // entries kept before the cache starts over
)

func newPrefixCache(addrs func() ([]net.Addr, error), now func() time.Time) *prefixCache {
	return &prefixCache{addrs: addrs, now: now, byNS: make(map[nsKey]prefixEntry)}
}

// lookup is Config.Prefixes' default: the calling thread's namespace.
func (pc *prefixCache) lookup(local netip.Addr) (netip.Prefix, bool) {
	return pc.lookupIn(threadNS(), local, true)
}

// lookupConn looks local up in the namespace of tcp's socket. The addresses are
// read on the calling thread; they are kept under the socket's namespace only
// when the thread is in it too.
func (pc *prefixCache) lookupConn(tcp net.Conn, local netip.Addr) (netip.Prefix, bool) {
	ns, ok := socketNS(tcp)
	if !ok {
		return pc.lookup(local)
	}
	return pc.lookupIn(ns, local, false)
}

func (pc *prefixCache) lookupIn(ns nsKey, local netip.Addr, threadsOwn bool) (netip.Prefix, bool) {
	pc.mu.Lock()
	ent, ok := pc.byNS[ns]
	pc.mu.Unlock()
	if ok && pc.now().Sub(ent.at) < prefixTTL {
		if p, ok := matchPrefix(ent.addrs, local); ok {
			return p, true
		}
	}
	addrs, err := pc.addrs()
	if err != nil {
		return netip.Prefix{}, false
	}
	if threadsOwn || threadCookie() == ns {
		pc.mu.Lock()
		if len(pc.byNS) >= prefixNamespaces {
			clear(pc.byNS)
		}
		pc.byNS[ns] = prefixEntry{addrs: addrs, at: pc.now()}
		pc.mu.Unlock()
	}
	return matchPrefix(addrs, local)
}

// threadNS names the calling thread's namespace; without /proc, one entry
// stands for the process.
func threadNS() nsKey {
	var st syscall.Stat_t
	if syscall.Stat("/proc/thread-self/ns/net", &st) != nil {
		return nsKey{}
	}
	return nsKey{id: st.Ino}
}

// socketNS names the namespace of conn's socket by its netns cookie.
func socketNS(conn net.Conn) (nsKey, bool) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nsKey{}, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nsKey{}, false
	}
	var cookie uint64
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		cookie, gerr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	}); err != nil || gerr != nil {
		return nsKey{}, false // before Linux 5.14
	}
	return nsKey{cookie: true, id: cookie}, true
}

// threadCookie is the netns cookie of the calling thread's namespace, from a
// socket made for the question (on a cache miss only); zero when unknown.
func threadCookie() nsKey {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nsKey{}
	}
	defer unix.Close(fd)
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return nsKey{}
	}
	return nsKey{cookie: true, id: cookie}
}

func matchPrefix(addrs []net.Addr, local netip.Addr) (netip.Prefix, bool) {
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipn.IP)
		if !ok || ip.Unmap() != local {
			continue
		}
		ones, _ := ipn.Mask.Size()
		return netip.PrefixFrom(local, ones).Masked(), true
	}
	return netip.Prefix{}, false
}
