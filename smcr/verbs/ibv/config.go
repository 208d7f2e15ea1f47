// Options of the libibverbs provider, shared by the cgo build and the stub.

package ibv

import (
	"log/slog"
	"time"
)

// Config selects and tunes one device port.
type Config struct {
	// Device is the RDMA device name ("rxe0", "mlx5_0"). When empty, Interface
	// is resolved with Resolve.
	Device string
	// Interface is a network interface name or IP address whose RDMA device is
	// opened (the PNET mapping), used when Device is empty.
	Interface string
	// Port is the device port, 1 when zero.
	Port int
	// GIDIndex is the source GID entry; -1 picks the port's best RoCE v2 GID
	// (IPv4-mapped first), as Resolve does for an interface.
	GIDIndex int
	// Spin is how long CQ.Wait polls before it arms the CQ and sleeps (default
	// 20µs; negative: never spin). Spinning saves the event round trip when
	// completions come quickly.
	Spin time.Duration
	// Logger receives the provider's diagnostics; nil discards them.
	Logger *slog.Logger
}
