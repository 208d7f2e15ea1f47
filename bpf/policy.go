// Policy: what smcrd's configuration puts into the maps the programs consult before
// redirecting a connection (port_range_list, the listed interfaces' prefixes, the
// negative peer cache of RFC 7609 fallbacks, liveness).

package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Config flags, as in c/maps.h.
const cfgCheckPrefix = 1

// PortRange is an inclusive range of TCP ports, one element of port_range_list.
type PortRange struct{ Lo, Hi uint16 }

// PrefixRule says whether destinations in Prefix are routed through a listed
// interface (Allow) and which local address that interface has (Src, shown by
// getsockname to redirected applications; may be invalid).
type PrefixRule struct {
	Prefix netip.Prefix
	Allow  bool
	Src    netip.Addr
}

// updateConfig changes smcr_config's one entry with fn. Its callers hold
// different locks (SetRedirect inUse, SetPrefixes mu): cfgMu keeps one's write
// from undoing the other's.
func (l *Loader) updateConfig(fn func(*smcrConfig)) error {
	l.cfgMu.Lock()
	defer l.cfgMu.Unlock()
	var c smcrConfig
	if err := l.objs.SmcrConfig.Lookup(uint32(0), &c); err != nil {
		return fmt.Errorf("bpf: read config: %w", err)
	}
	fn(&c)
	if err := l.objs.SmcrConfig.Update(uint32(0), &c, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("bpf: write config: %w", err)
	}
	return nil
}

// SetPorts replaces the set of ports whose connections are redirected and whose
// SYNs are inspected. An empty list turns both off.
func (l *Loader) SetPorts(ranges []PortRange) error {
	if err := l.hold(); err != nil {
		return err
	}
	defer l.inUse.RUnlock()
	var p smcrPorts
	for _, r := range ranges {
		if r.Lo > r.Hi {
			return fmt.Errorf("bpf: port range %d-%d: low above high", r.Lo, r.Hi)
		}
		for port := uint32(r.Lo); port <= uint32(r.Hi); port++ {
			p.Bits[port>>6] |= 1 << (port & 63)
		}
	}
	if err := l.objs.SmcrPorts.Update(uint32(0), &p, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("bpf: set ports: %w", err)
	}
	return nil
}

// SetRedirect sets smcrd's redirect listeners (on loopback): connect4 sends
// redirected IPv4 connections to v4, connect6 IPv6 ones to v6. An invalid address
// turns redirection off for that family.
func (l *Loader) SetRedirect(v4, v6 netip.AddrPort) error {
	if err := l.hold(); err != nil {
		return err
	}
	defer l.inUse.RUnlock()
	if v4.IsValid() && !v4.Addr().Unmap().Is4() {
		return fmt.Errorf("bpf: redirect listener %s: not IPv4", v4)
	}
	if v6.IsValid() && !v6.Addr().Is6() {
		return fmt.Errorf("bpf: redirect listener %s: not IPv6", v6)
	}
	return l.updateConfig(func(c *smcrConfig) {
		c.Redir4Addr, c.Redir4Port = 0, 0
		c.Redir6Addr, c.Redir6Port = [4]uint32{}, 0
		if v4.IsValid() {
			c.Redir4Addr = addrWords(v4.Addr().Unmap())[0]
			c.Redir4Port = netPort(v4.Port())
		}
		if v6.IsValid() {
			c.Redir6Addr = addrWords(v6.Addr())
			c.Redir6Port = netPort(v6.Port())
		}
	})
}

// SetAlive declares smcrd alive for ttl from now: smcrd calls it as a heartbeat
// (every ttl/3, say). ttl <= 0 declares it dead at once. While it is not alive,
// nothing is redirected or steered: applications connect as plain TCP.
func (l *Loader) SetAlive(ttl time.Duration) error {
	if err := l.hold(); err != nil {
		return err
	}
	defer l.inUse.RUnlock()
	var until uint64
	if ttl > 0 {
		until = monotonic() + uint64(ttl)
	}
	if err := l.objs.SmcrAlive.Update(uint32(0), until, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("bpf: set liveness: %w", err)
	}
	return nil
}

// AddNegative puts dst in the negative cache for ttl: connections to it (that
// address and port) are not redirected until then (it answered without SMC-R).
func (l *Loader) AddNegative(dst netip.AddrPort, ttl time.Duration) error {
	if err := l.hold(); err != nil {
		return err
	}
	defer l.inUse.RUnlock()
	until := monotonic() + uint64(max(ttl, 0))
	if err := l.objs.SmcrNegative.Update(destKey(dst), until, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("bpf: add negative %s: %w", dst, err)
	}
	return nil
}

// RemoveNegative takes dst out of the negative cache.
func (l *Loader) RemoveNegative(dst netip.AddrPort) error {
	if err := l.hold(); err != nil {
		return err
	}
	defer l.inUse.RUnlock()
	err := l.objs.SmcrNegative.Delete(destKey(dst))
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("bpf: remove negative %s: %w", dst, err)
	}
	return nil
}

// Negatives returns the live entries of the negative cache and how long each has
// left. The map is pinned, so it holds what an earlier smcrd put there.
func (l *Loader) Negatives() (map[netip.AddrPort]time.Duration, error) {
	if err := l.hold(); err != nil {
		return nil, err
	}
	defer l.inUse.RUnlock()
	out, err := live(l.objs.SmcrNegative, keyDest, func(until uint64) uint64 { return until })
	if err != nil {
		return nil, fmt.Errorf("bpf: list negative cache: %w", err)
	}
	return out, nil
}

// live returns the entries of an expiring map whose deadline (until) is still
// ahead, by key, with the time each has left.
func live[K, V any, O comparable](m *ebpf.Map, key func(K) O, until func(V) uint64) (map[O]time.Duration, error) {
	out := map[O]time.Duration{}
	now := monotonic()
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		if u := until(v); u > now {
			out[key(k)] = time.Duration(u - now)
		}
	}
	return out, it.Err()
}

// ShownSource is the local address getsockname shows an application whose
// connection to dst was redirected: the listed interface's the route leaves
// through (smcr_prefix4/6). ok is false where the programs show loopback's.
func (l *Loader) ShownSource(dst netip.Addr) (src netip.Addr, ok bool) {
	if l.hold() != nil {
		return netip.Addr{}, false
	}
	defer l.inUse.RUnlock()
	dst = dst.Unmap()
	var v smcrPrefixVal
	var err error
	if dst.Is4() {
		err = l.objs.SmcrPrefix4.Lookup(smcrLpm4Key{Prefixlen: 32, Addr: addrWords(dst)[0]}, &v)
	} else {
		err = l.objs.SmcrPrefix6.Lookup(smcrLpm6Key{Prefixlen: 128, Addr: addrWords(dst)}, &v)
	}
	if err != nil || v.Allow == 0 || v.Src == [4]uint32{} {
		return netip.Addr{}, false
	}
	family := uint32(unix.AF_INET6)
	if dst.Is4() {
		family = unix.AF_INET
	}
	return wordsAddr(family, v.Src), true
}

// AddUnreachable records that smcrd could not connect to dst (refused,
// unreachable, timed out): connect4/6 leave connections to it direct, so that
// the application sees the kernel's answer itself, not a connection to smcrd
// that smcrd resets. Each of them that fails too keeps dst there for another
// ttl; the first that connects takes it out (sockops).
func (l *Loader) AddUnreachable(dst netip.AddrPort, ttl time.Duration) error {
	if err := l.hold(); err != nil {
		return err
	}
	defer l.inUse.RUnlock()
	ttl = max(ttl, 0)
	v := smcrUnreach{Until: monotonic() + uint64(ttl), Ttl: uint64(ttl)}
	if err := l.objs.SmcrUnreach.Update(destKey(dst), v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("bpf: add unreachable %s: %w", dst, err)
	}
	return nil
}

// RemoveUnreachable takes dst out of the unreachable destinations.
func (l *Loader) RemoveUnreachable(dst netip.AddrPort) error {
	if err := l.hold(); err != nil {
		return err
	}
	defer l.inUse.RUnlock()
	err := l.objs.SmcrUnreach.Delete(destKey(dst))
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("bpf: remove unreachable %s: %w", dst, err)
	}
	return nil
}

// Unreachables returns the live entries of AddUnreachable and how long each has
// left.
func (l *Loader) Unreachables() (map[netip.AddrPort]time.Duration, error) {
	if err := l.hold(); err != nil {
		return nil, err
	}
	defer l.inUse.RUnlock()
	out, err := live(l.objs.SmcrUnreach, keyDest, func(v smcrUnreach) uint64 { return v.Until })
	if err != nil {
		return nil, fmt.Errorf("bpf: list unreachable destinations: %w", err)
	}
	return out, nil
}

// destKey is dst as smcr_unreach and smcr_negative key it: IPv4-mapped
// addresses as IPv4.
func destKey(dst netip.AddrPort) smcrAddrPort {
	a := dst.Addr().Unmap()
	k := smcrAddrPort{Family: unix.AF_INET6, Addr: addrWords(a), Port: netPort(dst.Port())}
	if a.Is4() {
		k.Family = unix.AF_INET
	}
	return k
}

// keyDest is destKey's inverse.
func keyDest(k smcrAddrPort) netip.AddrPort {
	return netip.AddrPortFrom(wordsAddr(k.Family, k.Addr), hostPort(k.Port))
}

// SetPrefixes replaces the destination rules: with rules, connect4/6 redirect only
// destinations whose longest matching rule allows it; with none, every destination
// on a listed port is redirected. SetInterfaces calls it with InterfacePrefixes.
func (l *Loader) SetPrefixes(rules []PrefixRule) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("bpf: loader closed: %w", net.ErrClosed)
	}
	return l.setPrefixes(rules, len(rules) > 0)
}

func (l *Loader) setPrefixes(rules []PrefixRule, check bool) error {
	keep4 := map[smcrLpm4Key]bool{}
	keep6 := map[smcrLpm6Key]bool{}
	// Insert the new rules before deleting old ones, so no lookup meets a gap.
	for _, r := range rules {
		p := r.Prefix.Masked()
		v := smcrPrefixVal{}
		if r.Allow {
			v.Allow = 1
		}
		if r.Src.IsValid() && r.Src.Unmap().Is4() == p.Addr().Is4() {
			v.Src = addrWords(r.Src.Unmap())
		}
		var err error
		m, name, n := l.objs.SmcrPrefix4, "smcr_prefix4", len(keep4)
		if p.Addr().Is4() {
			k := smcrLpm4Key{Prefixlen: uint32(p.Bits()), Addr: addrWords(p.Addr())[0]}
			keep4[k] = true
			err = m.Update(k, v, ebpf.UpdateAny)
		} else {
			m, name, n = l.objs.SmcrPrefix6, "smcr_prefix6", len(keep6)
			k := smcrLpm6Key{Prefixlen: uint32(p.Bits()), Addr: addrWords(p.Addr())}
			keep6[k] = true
			err = m.Update(k, v, ebpf.UpdateAny)
		}
		if errors.Is(err, unix.ENOSPC) {
			return fmt.Errorf("bpf: set prefix %s: %s full: it holds %d rules, old and new together while they are replaced (%d new so far): %w",
				p, name, m.MaxEntries(), n, err)
		}
		if err != nil {
			return fmt.Errorf("bpf: set prefix %s: %w", p, err)
		}
	}
	var k4 smcrLpm4Key
	var stale4 []smcrLpm4Key
	for it := l.objs.SmcrPrefix4.Iterate(); it.Next(&k4, new(smcrPrefixVal)); {
		if !keep4[k4] {
			stale4 = append(stale4, k4)
		}
	}
	for _, k := range stale4 {
		l.objs.SmcrPrefix4.Delete(k)
	}
	var k6 smcrLpm6Key
	var stale6 []smcrLpm6Key
	for it := l.objs.SmcrPrefix6.Iterate(); it.Next(&k6, new(smcrPrefixVal)); {
		if !keep6[k6] {
			stale6 = append(stale6, k6)
		}
	}
	for _, k := range stale6 {
		l.objs.SmcrPrefix6.Delete(k)
	}
	return l.updateConfig(func(c *smcrConfig) {
		c.Flags &^= cfgCheckPrefix
		if check {
			c.Flags |= cfgCheckPrefix
		}
	})
}

// InterfacePrefixes derives destination rules from the calling thread's routing
// tables: every main-table route allows its prefix when it leaves through one of
// names, and the host's own (local-table) addresses are never redirected. A cgroup
// connect hook cannot do a route lookup itself (bpf_fib_lookup is for tc and XDP),
// so the longest-prefix match over these rules stands in for it; policy routing
// and multipath routes are not modelled (such destinations are not redirected).
func InterfacePrefixes(names []string) ([]PrefixRule, error) {
	listed := map[int]bool{}
	src := map[int][2]netip.Addr{} // per link: first global IPv4, IPv6 address
	for _, n := range names {
		lk, err := netlink.LinkByName(n)
		if err != nil {
			return nil, fmt.Errorf("bpf: interface %s: %w", n, err)
		}
		idx := lk.Attrs().Index
		listed[idx] = true
		addrs, err := retryDump(func() ([]netlink.Addr, error) { return netlink.AddrList(lk, netlink.FAMILY_ALL) })
		if err != nil {
			return nil, fmt.Errorf("bpf: addresses of %s: %w", n, err)
		}
		var s [2]netip.Addr
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok || !ip.IsGlobalUnicast() {
				continue
			}
			ip = ip.Unmap()
			if i := b2i(ip.Is6()); !s[i].IsValid() {
				s[i] = ip
			}
		}
		src[idx] = s
	}
	best := map[netip.Prefix]struct {
		rule PrefixRule
		prio int
	}{}
	for _, table := range []int{unix.RT_TABLE_MAIN, unix.RT_TABLE_LOCAL} {
		routes, err := retryDump(func() ([]netlink.Route, error) {
			return netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
		})
		if err != nil {
			return nil, fmt.Errorf("bpf: routes: %w", err)
		}
		for _, r := range routes {
			var p netip.Prefix
			if r.Dst == nil {
				p = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
				if r.Family == unix.AF_INET6 {
					p = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
				}
			} else {
				ip, ok := netip.AddrFromSlice(r.Dst.IP)
				if !ok {
					continue
				}
				ones, _ := r.Dst.Mask.Size()
				p = netip.PrefixFrom(ip.Unmap(), ones).Masked()
			}
			rule := PrefixRule{Prefix: p}
			prio := r.Priority
			if table == unix.RT_TABLE_LOCAL {
				// Own addresses and loopback: never redirected, and they win.
				if r.Type != unix.RTN_LOCAL {
					continue
				}
				prio = -1
			} else if listed[r.LinkIndex] && len(r.MultiPath) == 0 {
				rule.Allow = true
				rule.Src = src[r.LinkIndex][b2i(p.Addr().Is6())]
				if s, ok := netip.AddrFromSlice(r.Src); ok && s.IsValid() {
					rule.Src = s.Unmap()
				}
			}
			if old, ok := best[p]; ok && old.prio <= prio {
				continue
			}
			best[p] = struct {
				rule PrefixRule
				prio int
			}{rule, prio}
		}
	}
	rules := make([]PrefixRule, 0, len(best))
	for _, b := range best {
		rules = append(rules, b.rule)
	}
	return rules, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// addrWords lays an address out as the programs read it: the bytes in network
// order, as __u32 words in host order (IPv4 in the first word).
func addrWords(a netip.Addr) [4]uint32 {
	var w [4]uint32
	if a.Is4() {
		b := a.As4()
		w[0] = binary.NativeEndian.Uint32(b[:])
		return w
	}
	b := a.As16()
	for i := range w {
		w[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return w
}

func wordsAddr(family uint32, w [4]uint32) netip.Addr {
	var b [16]byte
	for i := range w {
		binary.NativeEndian.PutUint32(b[4*i:], w[i])
	}
	if family == unix.AF_INET {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16(b)
}

// netPort is a port in network byte order, as a host-order uint16 holds it.
func netPort(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

func hostPort(p uint16) uint16 { return netPort(p) }

// Monotonic is the clock of the programs' time stamps (SetSockopt.At,
// Original.Connected): the time since the host booted, without its suspends.
func Monotonic() time.Duration { return time.Duration(monotonic()) }

// monotonic is CLOCK_MONOTONIC as the programs read it (bpf_ktime_get_ns): the
// host's. Inside a time namespace (a container restored by CRIU, say) this
// process's clock runs at an offset from it, and deadlines written unadjusted
// would be off by that much: liveness for days, or never.
func monotonic() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail for this clock
	return uint64(ts.Nano() - monotonicOffset())
}

// monotonicOffset is this process's time namespace's CLOCK_MONOTONIC offset,
// in nanoseconds: 0 outside one, or where the kernel has none.
var monotonicOffset = sync.OnceValue(func() int64 {
	b, err := os.ReadFile("/proc/self/timens_offsets")
	if err != nil {
		return 0
	}
	return parseMonotonicOffset(string(b))
})

// parseMonotonicOffset reads the monotonic line of timens_offsets
// ("monotonic <seconds> <nanoseconds>"); 0 when there is none.
func parseMonotonicOffset(s string) int64 {
	for line := range strings.Lines(s) {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "monotonic" {
			continue
		}
		sec, err1 := strconv.ParseInt(f[1], 10, 64)
		nsec, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			return 0
		}
		return sec*1e9 + nsec
	}
	return 0
}
