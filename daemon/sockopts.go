// The application's socket options on smcrd's connection. A redirected
// application's own connection ends on smcrd's loopback listener, so the options
// it sets for the network (a DSCP class, a priority, keepalive and its timings, a
// user timeout) would shape only that loopback leg. smcrd's connection to the
// destination is the one on the wire, the TCP connection of CLC and of a
// fallback, so it takes them, as Linux's SMC passes an SMC socket's options on to
// its CLC socket: those set before the application's connect with the original
// destination, set before smcrd's own connect so that its SYN carries them too;
// those set after through the setsockopt program's ring (bpf.SockoptReader), in
// order, as they come.

package daemon

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"

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

// wireOptions carries to smcrd's connection the options its application sets
// after its connect: held until that connection is there, then set as they come.
type wireOptions struct {
	mu      sync.Mutex
	conn    syscall.RawConn // smcrd's connection, once dialled
	network string          // conn's: "tcp4" or "tcp6"
	held    []bpf.Sockopt
}

// follow starts carrying the options the application at app sets from now on;
// call it before reading its original destination, whose entry holds those set
// earlier. The returned function stops it.
func (d *Daemon) follow(app netip.AddrPort) (*wireOptions, func()) {
	w := &wireOptions{}
	app = unmapAP(app)
	d.optMu.Lock()
	d.wire[app] = w
	d.optMu.Unlock()
	return w, func() {
		d.optMu.Lock()
		if d.wire[app] == w {
			delete(d.wire, app)
		}
		d.optMu.Unlock()
	}
}

// dialled sets the options held so far on c, and has later ones set as they come.
func (w *wireOptions) dialled(c *net.TCPConn, log *slog.Logger) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	network := "tcp6"
	if c.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Is4() {
		network = "tcp4"
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.conn, w.network = rc, network
	for _, o := range w.held {
		w.set(o, log)
	}
	w.held = nil
}

// add sets o on smcrd's connection, or holds it until there is one.
func (w *wireOptions) add(o bpf.Sockopt, log *slog.Logger) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn == nil {
		w.held = append(w.held, o)
		return
	}
	w.set(o, log)
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

// followSockopts starts passing the options applications set after their
// connect to their connections' wireOptions, until the reader is closed; done is
// closed then. Without a reader (nil: the ring could not be read), options set
// after a connect stay on the loopback leg.
func (d *Daemon) followSockopts() (r *bpf.SockoptReader, done chan struct{}) {
	r, err := d.loader.Sockopts()
	if err != nil {
		d.log.Warn("socket options applications set after connecting stay on their loopback leg", "err", err)
		return nil, nil
	}
	done = make(chan struct{})
	go func() {
		defer close(done)
		d.carrySockopts(r)
	}()
	return r, done
}

// carrySockopts reads the options applications set after their connect until r
// is closed, and passes each to its connection's wireOptions.
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
		d.optMu.Lock()
		w := d.wire[s.App]
		d.optMu.Unlock()
		if w != nil {
			d.log.Debug("application's socket option carried", "app", s.App, "option", s.Sockopt)
			w.add(s.Sockopt, d.log)
		}
	}
}
