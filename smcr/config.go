// Config: the knobs of an Engine and their defaults.
// RFC 7609 §3 (resources an SMC-R endpoint manages).

package smcr

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// Config configures an Engine. The zero value of every field but Devices means
// "the default".
type Config struct {
	// Devices are the RDMA devices to offer, one per link (1 or 2). With none, every
	// connection falls back to TCP (declining with "no SMC-R device").
	Devices []verbs.Device
	// MaxMemory bounds the bytes of RMBs and send buffers held at once. A
	// connection that would exceed it takes a smaller RMB (Stats.RxDowngrades),
	// down to 16 KiB; one that would exceed it even so falls back with
	// "insufficient memory". Zero means unlimited.
	MaxMemory int64
	// RMBSize is the receive buffer (RMBE) of each connection, rounded up to a
	// power of two between 16 KiB and 512 KiB. Default 256 KiB, as smcrd's rmb_size.
	RMBSize int
	// SendBufSize is accepted for configuration compatibility; the send buffer
	// mirrors the peer's RMBE, so its size is the peer's choice.
	SendBufSize int
	// CLCTimeout bounds the wait for each CLC message (Linux: 6 s). Default 6 s.
	CLCTimeout time.Duration
	// LLCTimeout bounds the wait for an LLC response (Linux: 2 s). Default 2 s.
	LLCTimeout time.Duration
	// LinkGroupIdle is how long a link group without connections is kept for
	// reuse. Default 10 minutes.
	LinkGroupIdle time.Duration
	// LinkRetry is how long after one of a link group's two links failed the
	// server first tries to add a link again (ADD_LINK); the wait doubles with
	// each failed try, up to a minute. Default 1 s; negative disables it.
	LinkRetry time.Duration
	// TestLinkInterval is how long a link may receive nothing before it is
	// tested with TEST_LINK (Linux: net.smc.smcr_testlink_time, 30 s). Default
	// 30 s; negative disables it.
	TestLinkInterval time.Duration
	// CloseTimeout bounds how long a closed connection waits for the peer's close
	// before it aborts and frees its buffers. Default 30 s.
	CloseTimeout time.Duration
	// ReadSpin is how long, at most, a Read waiting for bytes handles its
	// link's completions itself before it sleeps (Linux's busy_read): the
	// bytes then need no hand-off from the link's poller, which halves a small
	// message's latency. Each connection adapts its spin below this to how
	// soon its bytes come. Default 20 µs; negative disables it and the
	// handshake's poll of the TCP socket for the peer's Accept or Confirm
	// (up to 250 µs, adapted per engine); Engine.SetReadSpin changes it at
	// run time.
	ReadSpin time.Duration
	// UEIDs are SMC-R version 2's User EIDs (at most 8, as smcrd's ueid_list):
	// a server accepts a version-2 Proposal only with one of them in common,
	// and a client offers version 2 only with one (Linux's rule). None: the
	// engine speaks version 1 only. Engine.SetUEIDs changes them at run time.
	UEIDs []string
	// PeerID is this endpoint's 8-byte peer ID; zero means 2 random bytes plus the
	// MAC of the first device.
	PeerID [8]byte
	// Prefixes returns the subnet of the interface that holds the local address,
	// for the CLC same-subnet check. Default: looked up with net.InterfaceAddrs in
	// the calling thread's network namespace, the list kept for up to a second
	// per namespace (the engine finds a connection's by its socket).
	Prefixes    func(local netip.Addr) (netip.Prefix, bool)
	prefixCache *prefixCache // the default Prefixes' cache
	// Clock supplies time; nil means the real one. Tests inject a fake.
	Clock Clock
	// Logger receives the engine's logs; nil discards them.
	Logger *slog.Logger
	// portPoll is the port watch's pace when not zero (tests).
	portPoll time.Duration
	// releasePoll is the longest pause of Close's wait for closed connections'
	// releases when not zero (tests).
	releasePoll time.Duration
}

const (
	minRMB     = 16 << 10
	maxRMB     = 512 << 10
	defaultRMB = 256 << 10
	maxLinks   = 2
	// linkSlots bounds the links a group holds at once, live or gone but still
	// holding registrations (Linux's link index; it has 3): a connection
	// allocated its buffers on the link it started on, and they stay there,
	// in that link's protection domain, until it ends. A link's number on the
	// wire is another thing, cycling through 1–255 (multilink.go).
	linkSlots      = 8
	maxLinkRetry   = time.Minute
	maxConnsPerLGR = 255
)

// ErrConfig is wrapped by NewEngine for an unusable configuration.
var ErrConfig = errors.New("smcr: bad configuration")

func (c *Config) withDefaults() (Config, error) {
	out := *c
	if len(out.Devices) > maxLinks {
		return out, fmt.Errorf("%w: %d devices, at most %d links", ErrConfig, len(out.Devices), maxLinks)
	}
	for i, d := range out.Devices {
		if d == nil {
			return out, fmt.Errorf("%w: device %d is nil", ErrConfig, i)
		}
	}
	if _, err := parseUEIDs(out.UEIDs); err != nil {
		return out, err
	}
	var err error
	if out.RMBSize, err = rmbSize(out.RMBSize); err != nil {
		return out, err
	}
	if out.MaxMemory < 0 {
		return out, fmt.Errorf("%w: negative max memory", ErrConfig)
	}
	out.CLCTimeout = clcTimeout(out.CLCTimeout)
	if out.LLCTimeout <= 0 {
		out.LLCTimeout = 2 * time.Second
	}
	if out.LinkGroupIdle <= 0 {
		out.LinkGroupIdle = 10 * time.Minute
	}
	if out.LinkRetry == 0 {
		out.LinkRetry = time.Second
	}
	out.TestLinkInterval = testLinkInterval(out.TestLinkInterval)
	if out.CloseTimeout <= 0 {
		out.CloseTimeout = 30 * time.Second
	}
	out.ReadSpin = readSpin(out.ReadSpin)
	if out.Clock == nil {
		out.Clock = realClock{}
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	if out.Prefixes == nil {
		out.prefixCache = newPrefixCache(net.InterfaceAddrs, out.Clock.Now)
		out.Prefixes = out.prefixCache.lookup
	}
	return out, nil
}

// rmbSize applies RMBSize's default and rounding: 0 is the default, a size within
// 16 KiB..512 KiB rounds up to a power of two.
func rmbSize(n int) (int, error) {
	if n == 0 {
		n = defaultRMB
	}
	if n < 0 || n > maxRMB {
		return 0, fmt.Errorf("%w: rmb size %d outside 16 KiB..512 KiB", ErrConfig, n)
	}
	return sizeFromCode(sizeCode(n)), nil
}

// clcTimeout applies CLCTimeout's default.
// testLinkInterval is Config.TestLinkInterval with its default (30 s, as
// Linux's net.smc.smcr_testlink_time).
func testLinkInterval(d time.Duration) time.Duration {
	if d == 0 {
		return 30 * time.Second
	}
	return d
}

func clcTimeout(d time.Duration) time.Duration {
	if d <= 0 {
		return 6 * time.Second
	}
	return d
}

// sizeCode returns the RMBE size code for at least n bytes: size = 16 KiB << code.
func sizeCode(n int) uint8 {
	c := uint8(0)
	for sizeFromCode(c) < n && c < 5 {
		c++
	}
	return c
}

func sizeFromCode(c uint8) int { return minRMB << c }

// readSpin applies ReadSpin's default.
func readSpin(d time.Duration) time.Duration {
	if d == 0 {
		return 20 * time.Microsecond
	}
	return d
}
