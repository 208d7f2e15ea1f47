// Socket options of applications' connections through smcrd: the setsockopt
// program passes on those set on a redirected socket after its connect and on a
// socket accepted from smcrd, and sockops those the latter inherited from its
// listener, each through a ring buffer, in order, for smcrd to set on its
// connection on the wire (daemon/sockopts.go). Those a redirected socket had at
// its connect come with the original destination (Original.Options).

package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/ringbuf"
)

// SetSockopt is an option an application set on its socket, for smcrd's
// connection on the wire: on its redirected socket after its connect, or on its
// socket accepted from smcrd (inherited from its listener, or set after).
type SetSockopt struct {
	// Local and Remote name smcrd's socket of the application's connection,
	// as its LocalAddr and RemoteAddr give them (IPv4-mapped addresses as
	// IPv4): its accepted redirected connection on the client side, its
	// connection to the application on the server side.
	Local, Remote netip.AddrPort
	Sockopt
	// At is when the application set it (or, inherited, when its socket was
	// accepted from smcrd), on Monotonic's clock. An earlier connection on
	// the same 4-tuple (loopback's reuse one in TIME_WAIT after a second)
	// may leave records that smcrd reads after the next one began: those
	// are older than that connection's start.
	At time.Duration
}

// sockoptEvent is struct sockopt_event of c/maps.h: bpf2go emits no type only a
// ring buffer carries.
type sockoptEvent struct {
	Conn    smcrTuple
	Level   uint32
	Optname uint32
	Value   int32
	_       uint32
	At      uint64
}

// SockoptPoll is how often a SockoptReader looks at the ring: the programs do not
// wake it for each record (only when the ring is half full), so an option comes
// to smcrd at most this late.
const SockoptPoll = 100 * time.Millisecond

// SockoptReader reads the options applications set (SetSockopt).
type SockoptReader struct {
	r        *ringbuf.Reader
	deadline time.Time
}

// Sockopts opens a reader of the options applications set (SetSockopt). Close
// it before the Loader.
func (l *Loader) Sockopts() (*SockoptReader, error) {
	if err := l.hold(); err != nil {
		return nil, err
	}
	defer l.inUse.RUnlock()
	r, err := ringbuf.NewReader(l.objs.SmcrSockopts)
	if err != nil {
		return nil, fmt.Errorf("bpf: socket options: %w", err)
	}
	return &SockoptReader{r: r}, nil
}

// SetDeadline has Read give up at t with an error that is
// os.ErrDeadlineExceeded; the zero time waits for ever. Not while a Read waits.
func (r *SockoptReader) SetDeadline(t time.Time) { r.deadline = t }

// Read waits for the next option; after Close it returns an error that is
// os.ErrClosed.
func (r *SockoptReader) Read() (SetSockopt, error) {
	var rec ringbuf.Record
	for {
		wait := time.Now().Add(SockoptPoll)
		if !r.deadline.IsZero() && r.deadline.Before(wait) {
			wait = r.deadline
		}
		r.r.SetDeadline(wait)
		err := r.r.ReadInto(&rec)
		if errors.Is(err, os.ErrDeadlineExceeded) && (r.deadline.IsZero() || time.Now().Before(r.deadline)) {
			continue // records wait without waking the reader: look again
		}
		if err != nil {
			return SetSockopt{}, fmt.Errorf("bpf: socket options: %w", err)
		}
		break
	}
	var e sockoptEvent
	if len(rec.RawSample) < int(unsafe.Sizeof(e)) {
		return SetSockopt{}, fmt.Errorf("bpf: socket options: a record of %d bytes", len(rec.RawSample))
	}
	if _, err := binary.Decode(rec.RawSample, binary.NativeEndian, &e); err != nil {
		return SetSockopt{}, fmt.Errorf("bpf: socket options: %w", err)
	}
	return SetSockopt{
		Local:   netip.AddrPortFrom(wordsAddr(e.Conn.Family, e.Conn.Laddr), e.Conn.Lport),
		Remote:  netip.AddrPortFrom(wordsAddr(e.Conn.Family, e.Conn.Raddr), e.Conn.Rport),
		Sockopt: Sockopt{Level: int(e.Level), Name: int(e.Optname), Value: int(e.Value)},
		At:      time.Duration(e.At),
	}, nil
}

// Close ends the reader; a Read waiting returns.
func (r *SockoptReader) Close() error {
	if err := r.r.Close(); err != nil && !errors.Is(err, ringbuf.ErrClosed) {
		return fmt.Errorf("bpf: socket options: %w", err)
	}
	return nil
}
