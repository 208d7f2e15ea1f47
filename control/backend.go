// Backend: what smcrd implements for the control server, and the errors it returns.
// Not part of RFC 7609 (see the package doc).

package control

import (
	"context"
	"errors"
	"net/netip"
)

// APIVersion is the version in the paths this package serves and calls (/v1/...).
const APIVersion = "v1"

// Backend is the daemon side of the API. Every method returns a snapshot the
// server may encode at leisure: the daemon must not hand out slices it keeps
// changing. Methods are called concurrently.
type Backend interface {
	Status(ctx context.Context) (Status, error)
	Config(ctx context.Context) ([]Attribute, error)
	// SetConfig applies all assignments or none; a refused value is an error that
	// matches ErrInvalid (a *config.Error does).
	SetConfig(ctx context.Context, req SetConfigRequest) (SetConfigResult, error)
	SetEnabled(ctx context.Context, enabled, persist bool) error
	Stats(ctx context.Context) (Stats, error)
	// ResetStats zeroes the counters and returns their values just before, taken
	// atomically with the reset so that nothing counted in between is lost.
	ResetStats(ctx context.Context) (Stats, error)
	LinkGroups(ctx context.Context) ([]LinkGroup, error)
	Conns(ctx context.Context) ([]Conn, error)
	Peers(ctx context.Context) ([]Peer, error)
	// ForgetPeers takes peers out of the peer cache, every one when peers is
	// empty, so that the next connections to them try SMC-R again; it returns
	// how many entries went. A peer with port 0 stands for every port of its
	// address (ParsePeer).
	ForgetPeers(ctx context.Context, peers []netip.AddrPort) (int, error)
	Devices(ctx context.Context) ([]Device, error)
	// Listeners are the TCP listeners of smcrd's network namespace but its
	// own, and whether smcrd steers their connections.
	Listeners(ctx context.Context) ([]Listener, error)
	// History is the last connections that ended, newest first.
	History(ctx context.Context) ([]ClosedConn, error)
	// Probe says whether a connection to dst would be tried over SMC-R now.
	Probe(ctx context.Context, dst netip.AddrPort) (Probe, error)
}

var (
	// ErrInvalid marks a request the backend refuses as malformed (HTTP 400).
	ErrInvalid = errors.New("invalid request")
	// ErrNotRunning is what every Client call returns, wrapped, when no smcrd
	// listens on the socket.
	ErrNotRunning = errors.New("smcrd is not running")
	// ErrPermission is returned when the caller may not use the control socket.
	ErrPermission = errors.New("permission denied")
)

// NotRunningError says which socket was tried; it matches ErrNotRunning.
type NotRunningError struct {
	Socket string
	Stale  bool // a socket file exists but nothing accepts on it
}

func (e *NotRunningError) Error() string {
	if e.Stale {
		return "smcrd is not running: nothing listens on the control socket " + e.Socket
	}
	return "smcrd is not running: no control socket at " + e.Socket
}

// Is makes errors.Is(err, ErrNotRunning) hold.
func (e *NotRunningError) Is(target error) bool { return target == ErrNotRunning }

// APIError is a non-2xx answer from smcrd.
type APIError struct {
	StatusCode int
	Message    string
}

func (e *APIError) Error() string { return e.Message }

// Is maps status codes to the sentinels callers branch on.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrInvalid:
		return e.StatusCode == 400
	case ErrPermission:
		return e.StatusCode == 403
	}
	return false
}
