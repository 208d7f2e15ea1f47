// Sockets: how smcrd marks its own sockets, registers its listeners and reads what
// the programs recorded about a connection (the SMC-R option exchange of RFC 7609
// 3.3, original destinations of redirected connections).

package bpf

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Socket tag flags, as in c/maps.h.
const (
	skOwn      = 1
	skOption   = 2
	skShowPeer = 4
	skSynOpt   = 64
)

// Tag describes one of smcrd's sockets to the programs. Every tagged socket is
// smcrd's own, so connect4/6 never redirect it.
type Tag struct {
	// SMCOption: on a connecting socket, send the SMC-R option on the SYN; on a
	// listener (the steering listener), echo it on SYN-ACKs to SYNs that had it.
	SMCOption bool
	// ShowPeer: on smcrd's connection to the local application (server host),
	// the application's getpeername and accept show this address instead of
	// smcrd's: the real client's.
	ShowPeer netip.AddrPort
}

// TagSocket tags the socket fd; call it before connect or listen, since the
// programs read the tag there.
func (l *Loader) TagSocket(fd int, t Tag) error {
	if err := l.hold(); err != nil {
		return err
	}
	defer l.inUse.RUnlock()
	st := smcrSkState{Flags: skOwn}
	if t.SMCOption {
		st.Flags |= skOption
	}
	if t.ShowPeer.IsValid() {
		a := t.ShowPeer.Addr().Unmap()
		st.Flags |= skShowPeer
		st.Family = unix.AF_INET6
		if a.Is4() {
			st.Family = unix.AF_INET
		}
		st.Addr = addrWords(a)
		st.Port = netPort(t.ShowPeer.Port())
	}
	if err := l.objs.SmcrSk.Update(int32(fd), &st, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("bpf: tag socket: %w", err)
	}
	return nil
}

// Control returns a function for net.Dialer.Control or net.ListenConfig.Control
// that tags the new socket before it connects or listens.
func (l *Loader) Control(t Tag) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var terr error
		if err := c.Control(func(fd uintptr) { terr = l.TagSocket(int(fd), t) }); err != nil {
			return err
		}
		return terr
	}
}

// RegisterSteering puts smcrd's steering listener in the SOCKMAP sk_lookup assigns
// from: the IPv4 slot for an IPv4 listener, the IPv6 slot for an IPv6 one (which
// also takes IPv4 when no IPv4 listener is registered and it is dual-stack:
// bound to the wildcard address; the kernel refuses to assign an IPv4 SYN to
// one bound to ::1, whatever IPV6_V6ONLY says). The
// listener must not be MPTCP (net.ListenConfig.SetMultipathTCP(false)). Closing
// the listener removes it.
func (l *Loader) RegisterSteering(ln syscall.Conn) error {
	if err := l.hold(); err != nil {
		return err
	}
	defer l.inUse.RUnlock()
	rc, err := ln.SyscallConn()
	if err != nil {
		return fmt.Errorf("bpf: register steering listener: %w", err)
	}
	var uerr error
	err = rc.Control(func(fd uintptr) {
		var sa unix.Sockaddr
		if sa, uerr = unix.Getsockname(int(fd)); uerr != nil {
			return
		}
		key := uint32(0)
		if _, ok := sa.(*unix.SockaddrInet6); ok {
			key = 1
		}
		uerr = l.objs.SmcrSteer.Update(key, uint64(fd), ebpf.UpdateAny)
	})
	if err = errors.Join(err, uerr); err != nil {
		return fmt.Errorf("bpf: register steering listener: %w", err)
	}
	return nil
}

// OriginalDst answers what the application connected to, for a connection smcrd
// accepted on its redirect listener, through getsockopt SO_ORIGINAL_DST (or
// IP6T_SO_ORIGINAL_DST), which the cgroup/getsockopt program answers (and
// netfilter's REDIRECT would too).
func OriginalDst(c syscall.Conn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("bpf: original destination: %w", err)
	}
	var ap netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) { ap, serr = originalDst(int(fd)) })
	if err = errors.Join(err, serr); err != nil {
		return netip.AddrPort{}, fmt.Errorf("bpf: original destination: %w", err)
	}
	return ap, nil
}

func originalDst(fd int) (netip.AddrPort, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return netip.AddrPort{}, err
	}
	level, size := unix.SOL_IP, unix.SizeofSockaddrInet4
	if _, ok := sa.(*unix.SockaddrInet6); ok {
		level, size = unix.SOL_IPV6, unix.SizeofSockaddrInet6
	}
	var buf [unix.SizeofSockaddrInet6]byte
	n := uint32(size)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), unix.SO_ORIGINAL_DST,
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		return netip.AddrPort{}, e
	}
	port := uint16(buf[2])<<8 | uint16(buf[3])
	switch family := *(*uint16)(unsafe.Pointer(&buf[0])); {
	case family == unix.AF_INET && n >= unix.SizeofSockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(buf[4:8])), port), nil
	case family == unix.AF_INET6 && n >= unix.SizeofSockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(buf[8:24])), port), nil
	default:
		return netip.AddrPort{}, fmt.Errorf("unexpected address family %d, length %d", family, n)
	}
}

// ErrUnknown: the maps hold nothing about that connection.
var ErrUnknown = errors.New("bpf: connection unknown")

// Sockopt is one option of an application's socket that shapes its connection
// on the wire (IP_TOS or IPV6_TCLASS, SO_PRIORITY, keepalive and its timings,
// TCP_USER_TIMEOUT): smcrd sets it on its own connection on the wire.
type Sockopt struct {
	Level, Name, Value int
}

func (o Sockopt) String() string {
	name, ok := sockoptNames[[2]int{o.Level, o.Name}]
	if !ok {
		name = fmt.Sprintf("%d/%d", o.Level, o.Name)
	}
	return fmt.Sprintf("%s=%d", name, o.Value)
}

var sockoptNames = map[[2]int]string{
	{unix.IPPROTO_IP, unix.IP_TOS}:            "IP_TOS",
	{unix.IPPROTO_IPV6, unix.IPV6_TCLASS}:     "IPV6_TCLASS",
	{unix.SOL_SOCKET, unix.SO_PRIORITY}:       "SO_PRIORITY",
	{unix.SOL_SOCKET, unix.SO_KEEPALIVE}:      "SO_KEEPALIVE",
	{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE}:     "TCP_KEEPIDLE",
	{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL}:    "TCP_KEEPINTVL",
	{unix.IPPROTO_TCP, unix.TCP_KEEPCNT}:      "TCP_KEEPCNT",
	{unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT}: "TCP_USER_TIMEOUT",
}

// app_opts.have, as in c/maps.h.
const (
	optTOS = 1 << iota
	optPriority
	optKeepAlive
	optUserTimeout
)

// sockopts lists what o holds for a connection to an IPv4 (v6 false) or IPv6
// destination: what differs from a new socket's defaults.
func sockopts(o smcrAppOpts, v6 bool) []Sockopt {
	var l []Sockopt
	if o.Have&optTOS != 0 {
		if v6 {
			l = append(l, Sockopt{unix.IPPROTO_IPV6, unix.IPV6_TCLASS, int(o.Tos)})
		} else {
			l = append(l, Sockopt{unix.IPPROTO_IP, unix.IP_TOS, int(o.Tos)})
		}
	}
	if o.Have&optPriority != 0 {
		l = append(l, Sockopt{unix.SOL_SOCKET, unix.SO_PRIORITY, int(o.Priority)})
	}
	if o.Have&optKeepAlive != 0 {
		l = append(l, Sockopt{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
			Sockopt{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, int(o.Keepidle)},
			Sockopt{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, int(o.Keepintvl)},
			Sockopt{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, int(o.Keepcnt)})
	}
	if o.Have&optUserTimeout != 0 {
		l = append(l, Sockopt{unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(o.UserTimeout)})
	}
	return l
}

// Original is what connect4/6 and sockops recorded of a redirected connection.
type Original struct {
	Dst netip.AddrPort // what the application connected to
	// Options: those of the application's socket at its connect, and any it
	// set after while the entry was there (see Sockopts for the others).
	Options []Sockopt
	// Connected is when the application's connect began, on Monotonic's
	// clock: its options in the ring (SetSockopt) are no older.
	Connected time.Duration
}

// OriginalOf looks the redirected connection up in the map the getsockopt program
// reads, by the accepted connection's local and remote address.
func (l *Loader) OriginalOf(local, remote netip.AddrPort) (Original, error) {
	if err := l.hold(); err != nil {
		return Original{}, err
	}
	defer l.inUse.RUnlock()
	var o smcrOrig
	if err := l.objs.SmcrOrigdst.Lookup(tuple(local, remote), &o); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return Original{}, ErrUnknown
		}
		return Original{}, fmt.Errorf("bpf: original destination: %w", err)
	}
	return Original{
		Dst:       netip.AddrPortFrom(wordsAddr(o.Dst.Family, o.Dst.Addr), hostPort(o.Dst.Port)),
		Options:   sockopts(o.Opts, o.Dst.Family == unix.AF_INET6),
		Connected: time.Duration(o.At),
	}, nil
}

// ForgetOriginalDst deletes the original destination of the accepted connection
// local↔remote. smcrd calls it once it has read the destination: the entry
// outlives the application's socket, so nothing else removes it before the LRU
// evicts it.
func (l *Loader) ForgetOriginalDst(local, remote netip.AddrPort) error {
	if err := l.hold(); err != nil {
		return err
	}
	defer l.inUse.RUnlock()
	err := l.objs.SmcrOrigdst.Delete(tuple(local, remote))
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("bpf: forget original destination: %w", err)
	}
	return nil
}

// Seen is what sockops saw of the SMC-R option on a connection smcrd opened.
type Seen uint32

// Seen flags, as in c/maps.h.
const (
	SeenSentSYNOption Seen = 1  // our SYN carried the option
	SeenPeerEchoed    Seen = 2  // the peer's SYN-ACK carried it back
	SeenNoSpace       Seen = 16 // no TCP option space was left for it
	SeenEstablished   Seen = 32 // the handshake completed
	SeenPeerSMCX      Seen = 64 // the SYN-ACK carried smcr's SMCX option too: the server is smcrd
)

// PeerSupportsSMC reports whether the option went both ways: worth a CLC
// Proposal. The option is only a hint; CLC decides.
func (s Seen) PeerSupportsSMC() bool {
	return s&(SeenSentSYNOption|SeenPeerEchoed) == SeenSentSYNOption|SeenPeerEchoed
}

// Seen returns what sockops recorded for a connection smcrd opened,
// local↔remote (as net.Conn's LocalAddr and RemoteAddr give them), or
// ErrUnknown. Connections steered to smcrd are not recorded: the packets
// tell what their handshake carried.
func (l *Loader) Seen(local, remote netip.AddrPort) (Seen, error) {
	if err := l.hold(); err != nil {
		return 0, err
	}
	defer l.inUse.RUnlock()
	var v uint32
	if err := l.objs.SmcrSeen.Lookup(tuple(local, remote), &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return 0, ErrUnknown
		}
		return 0, fmt.Errorf("bpf: seen: %w", err)
	}
	return Seen(v), nil
}

func tuple(local, remote netip.AddrPort) smcrTuple {
	la, ra := local.Addr().Unmap(), remote.Addr().Unmap()
	t := smcrTuple{Family: unix.AF_INET6, Laddr: addrWords(la), Raddr: addrWords(ra), Lport: local.Port(), Rport: remote.Port()}
	if la.Is4() {
		t.Family = unix.AF_INET
	}
	return t
}

// StatNames names the programs' counters, in the order of enum stat in c/maps.h.
var StatNames = []string{
	"redirected", "skip_dead", "skip_negative", "skip_prefix",
	"syn_opt_sent", "synack_opt_sent", "opt_no_space", "peer_echoed",
	"syn_marked", "steered", "steer_no_listener", "steer_failed",
	"orig_dst_answered", "skip_unreachable", "sockopt_lost", "direct",
}

// Stats returns the programs' counters, summed over CPUs, by StatNames.
func (l *Loader) Stats() (map[string]uint64, error) {
	if err := l.hold(); err != nil {
		return nil, err
	}
	defer l.inUse.RUnlock()
	out := make(map[string]uint64, len(StatNames))
	for i, name := range StatNames {
		var per []uint64
		if err := l.objs.SmcrStats.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("bpf: stats: %w", err)
		}
		var sum uint64
		for _, v := range per {
			sum += v
		}
		out[name] = sum
	}
	return out, nil
}

// AddDirectPort says a program with the direct mode's library listens on port:
// sk_lookup leaves the SYNs that carry the option to it rather than steering
// them to smcrd, and its SYN-ACKs echo the option. Each call is undone by one
// RemoveDirectPort.
func (l *Loader) AddDirectPort(port uint16) error { return l.countDirectPort(port, 1) }

// RemoveDirectPort undoes one AddDirectPort.
func (l *Loader) RemoveDirectPort(port uint16) error { return l.countDirectPort(port, -1) }

// countDirectPort adds delta to port's count of listeners, deleting it at 0.
func (l *Loader) countDirectPort(port uint16, delta int) error {
	if err := l.hold(); err != nil {
		return err
	}
	defer l.inUse.RUnlock()
	l.directMu.Lock()
	defer l.directMu.Unlock()
	var n uint32
	err := l.objs.SmcrDirectPorts.Lookup(port, &n)
	switch {
	case err != nil && !errors.Is(err, ebpf.ErrKeyNotExist):
	case int(n)+delta <= 0:
		err = l.objs.SmcrDirectPorts.Delete(port)
	default:
		err = l.objs.SmcrDirectPorts.Update(port, uint32(int(n)+delta), ebpf.UpdateAny)
	}
	if err != nil {
		return fmt.Errorf("bpf: direct port %d: %w", port, err)
	}
	return nil
}

// SYNHadOption reports whether the SYN of fd, a socket a program accepted from
// a listener of the direct mode, carried the SMC-R option.
func (l *Loader) SYNHadOption(fd int) (bool, error) {
	if err := l.hold(); err != nil {
		return false, err
	}
	defer l.inUse.RUnlock()
	var st smcrSkState
	err := l.objs.SmcrSk.Lookup(int32(fd), &st)
	switch {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("bpf: socket tag: %w", err)
	}
	return st.Flags&skSynOpt != 0, nil
}
