// The application's socket options on smcrd's connection. An application's own
// connection through smcrd ends on loopback (a redirected client's on smcrd's
// redirect listener, a server's at smcrd's connection to it), so the options it
// sets for the network (a DSCP class, a priority, keepalive and its timings, a
// user timeout) would shape only that leg. smcrd's connection on the wire, the
// TCP connection of CLC and of a fallback, takes them, as Linux's SMC passes an
// SMC socket's options on to its CLC socket: a client's set before its connect
// come with the original destination and are set before smcrd's own connect,
// so that its SYN carries them too; the others (a client's set after its
// connect, a server's inherited from its listener or set later) come through
// the programs' ring (bpf.SockoptReader), in order, and are set as they come.

package daemon

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/bpf"
)

// withOptions has dl's connections carry opts, and no keepalive of Go's own: the
// application's connection has keepalive only where it asked for it.
func withOptions(dl *net.Dialer, opts []bpf.Sockopt, log *slog.Logger) {
	dl.KeepAlive = -1
	if len(opts) == 0 {
		return
	}
	control := dl.Control
	dl.Control = func(network, address string, c syscall.RawConn) error {
		if control != nil {
			if err := control(network, address, c); err != nil {
				return err
			}
		}
		var errs []error
		if err := c.Control(func(fd uintptr) {
			for _, o := range opts {
				errs = append(errs, setSockopt(int(fd), network, o))
			}
		}); err != nil {
			return err
		}
		if err := errors.Join(errs...); err != nil {
			// The kernel took them from the application; smcrd's connection
			// goes on with its defaults rather than not at all.
			log.Warn("application's socket options not carried", "dst", address, "err", err)
		}
		return nil
	}
}

// setSockopt sets o on the socket fd of network "tcp4" or "tcp6". A traffic
// class for the other family is not the connection's (a dual-stack
// application's IPV6_TCLASS on its IPv4 connection): left alone.
func setSockopt(fd int, network string, o bpf.Sockopt) error {
	switch {
	case o.Level == unix.IPPROTO_IP && o.Name == unix.IP_TOS && network != "tcp4",
		o.Level == unix.IPPROTO_IPV6 && o.Name == unix.IPV6_TCLASS && network != "tcp6":
		return nil
	}
	if err := unix.SetsockoptInt(fd, o.Level, o.Name, o.Value); err != nil {
		return &net.OpError{Op: "setsockopt " + o.String(), Net: network, Err: err}
	}
	return nil
}

// wireOptions carries to smcrd's connection on the wire the options an
// application sets on its own: held until that connection is attached, then set
// as they come.
type wireOptions struct {
	mu      sync.Mutex
	conn    syscall.RawConn // smcrd's connection on the wire, once attached
	network string          // its traffic's: "tcp4" (IPv4-mapped too) or "tcp6"
	held    []stampedOpt
	start   time.Duration // the application's connection's start (since); older options are not its
}

// stampedOpt is an option with the time the application set it (bpf.SetSockopt.At).
type stampedOpt struct {
	at time.Duration
	bpf.Sockopt
}

// sockConn names one of smcrd's sockets: its local and remote address, unmapped.
type sockConn struct{ local, remote netip.AddrPort }

func sockConnOf(c net.Conn) sockConn {
	return sockConn{unmapAP(c.LocalAddr().(*net.TCPAddr).AddrPort()), unmapAP(c.RemoteAddr().(*net.TCPAddr).AddrPort())}
}

// unclaimedAge is how long options for a socket smcrd does not follow are kept:
// the server side's inherited ones may be read while smcrd's connect to the
// application completes, before it can follow the connection. Those of a
// connection that ended before its options were read go with them.
const unclaimedAge = 2 * time.Second

type unclaimedOpt struct {
	seen time.Time // for the pruning
	stampedOpt
}

// follow starts carrying the options of the application's connection that
// smcrd's socket c belongs to (the redirected connection it accepted, or its
// connection to the application), those that came already included; call it
// before reading the original destination, whose entry holds those set
// earlier. The returned function stops it.
func (d *Daemon) follow(c net.Conn) (*wireOptions, func()) {
	k := sockConnOf(c)
	var held []stampedOpt
	d.optMu.Lock()
	for _, u := range d.unclaimed[k] {
		held = append(held, u.stampedOpt)
	}
	delete(d.unclaimed, k)
	// Held before w is published: claim may add to it at once.
	w := &wireOptions{held: slices.Clone(held)}
	d.wire[k] = w
	d.optMu.Unlock()
	if len(held) > 0 {
		d.log.Debug("application's socket options carried", "local", k.local, "remote", k.remote, "options", held)
	}
	return w, func() {
		d.optMu.Lock()
		if d.wire[k] == w {
			delete(d.wire, k)
		}
		d.optMu.Unlock()
	}
}

// since drops the options held that are older than the application's
// connection, which began at start (on bpf.Monotonic's clock), and those that
// come later: they were set on an earlier connection of the same 4-tuple, and
// smcrd read them late. Call it before attach.
func (w *wireOptions) since(start time.Duration, log *slog.Logger) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.start = start
	w.held = slices.DeleteFunc(w.held, func(o stampedOpt) bool { return w.stale(o, log) })
}

func (w *wireOptions) stale(o stampedOpt, log *slog.Logger) bool {
	if o.at >= w.start {
		return false
	}
	log.Debug("socket option of an earlier connection not carried", "option", o.Sockopt, "age", w.start-o.at)
	return true
}

// attach sets the options held so far on c, smcrd's connection on the wire, and
// has later ones set as they come.
func (w *wireOptions) attach(c *net.TCPConn, log *slog.Logger) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	network := "tcp6"
	if c.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap().Is4() {
		network = "tcp4"
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.conn, w.network = rc, network
	for _, o := range w.held {
		w.set(o.Sockopt, log)
	}
	w.held = nil
}

// add sets o on smcrd's connection, or holds it until there is one.
func (w *wireOptions) add(o stampedOpt, log *slog.Logger) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stale(o, log) {
		return
	}
	if w.conn == nil {
		w.held = append(w.held, o)
		return
	}
	w.set(o.Sockopt, log)
}

func (w *wireOptions) set(o bpf.Sockopt, log *slog.Logger) {
	var err error
	if cerr := w.conn.Control(func(fd uintptr) { err = setSockopt(int(fd), w.network, o) }); cerr != nil {
		return // closed: nothing to carry it any more
	}
	if err != nil {
		log.Warn("application's socket option not carried", "err", err)
	}
}

// claim passes s to the wireOptions following its socket, or keeps it for one
// that follows it soon.
func (d *Daemon) claim(s bpf.SetSockopt) {
	k := sockConn{unmapAP(s.Local), unmapAP(s.Remote)}
	now := time.Now()
	d.optMu.Lock()
	w := d.wire[k]
	if w == nil {
		if now.Sub(d.prunedAt) > time.Second { // at most once a second: short connections leave many
			for k, l := range d.unclaimed {
				if now.Sub(l[len(l)-1].seen) > unclaimedAge {
					delete(d.unclaimed, k)
				}
			}
			d.prunedAt = now
		}
		d.unclaimed[k] = append(d.unclaimed[k], unclaimedOpt{now, stampedOpt{s.At, s.Sockopt}})
	}
	d.optMu.Unlock()
	if w != nil {
		d.log.Debug("application's socket option carried", "local", s.Local, "remote", s.Remote, "option", s.Sockopt)
		w.add(stampedOpt{s.At, s.Sockopt}, d.log)
	}
}

// followSockopts starts passing the options applications set (bpf.SetSockopt)
// to their connections' wireOptions, until the reader is closed; done is closed
// then. Without a reader (nil: the ring could not be read), those stay on the
// loopback leg.
func (d *Daemon) followSockopts() (r *bpf.SockoptReader, done chan struct{}) {
	r, err := d.loader.Sockopts()
	if err != nil {
		d.log.Warn("socket options applications set after connecting, or on connections accepted from smcrd, stay on their loopback leg", "err", err)
		return nil, nil
	}
	done = make(chan struct{})
	go func() {
		defer close(done)
		d.carrySockopts(r)
	}()
	return r, done
}

// carrySockopts reads the options applications set until r is closed, and
// passes each to its connection's wireOptions.
func (d *Daemon) carrySockopts(r *bpf.SockoptReader) {
	for {
		s, err := r.Read()
		if errors.Is(err, os.ErrClosed) {
			return
		}
		if err != nil {
			d.log.Warn("socket options", "err", err)
			continue
		}
		d.claim(s)
	}
}
