// The control API's data: what smcrd reports and accepts, as JSON-tagged structs.
// Not part of RFC 7609; the counters follow Linux smc-tools (smcss, smcr stats,
// smcr linkgroup, smcr device) so operators find what they know.

package control

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/smcr-io/smcr/config"
)

// Status is smcrd's overall state (GET /v1/status).
type Status struct {
	Version       string   `json:"version"`        // smcrd's version
	State         string   `json:"state"`          // StateStarting, StateServing or StateDraining
	PID           int      `json:"pid"`            // smcrd's process id
	UptimeSeconds float64  `json:"uptime_seconds"` // since smcrd started
	Enabled       bool     `json:"enabled"`        // redirecting matching connections now
	Providers     []string `json:"providers"`      // RDMA providers in use, in order of preference
	ConfigFile    string   `json:"config_file"`    // "" when running on the embedded default
	Connections   int      `json:"connections"`    // SMC-R connections open now
	LinkGroups    int      `json:"link_groups"`    // link groups alive now
}

// smcrd's states, as Status reports them. The control socket answers from
// StateServing on; the metrics endpoint, up earlier, may also see StateStarting.
const (
	StateStarting = "starting" // setting up: connections go direct
	StateServing  = "serving"  // redirecting and steering matching connections (when enabled)
	StateDraining = "draining" // shutting down: new connections go direct, open ones finish
)

// Attribute is one configuration attribute with its current value, default and
// description, as `smcrctl show config` prints it (like AIX lsattr -E).
type Attribute = config.Attribute

// SetConfigRequest changes attributes (POST /v1/config). Every assignment is
// validated before any is applied. Persist also writes the configuration file, like
// AIX chdev -P; without it the change lasts until smcrd restarts.
type SetConfigRequest struct {
	Assignments []string `json:"assignments"` // attribute=value
	Persist     bool     `json:"persist"`
}

// SetConfigResult says what a SetConfigRequest changed.
type SetConfigResult struct {
	Changed   []Attribute `json:"changed"`   // the attributes whose value changed, with the new value
	Persisted bool        `json:"persisted"` // the file was written
	File      string      `json:"file"`      // the file written, when Persisted
	// Notes are sentences for the operator about changed attributes that do not
	// take effect at once, e.g. "providers: applies when smcrd restarts (...)".
	Notes []string `json:"notes,omitempty"`
}

// EnableRequest turns redirection on or off (POST /v1/enable, /v1/disable).
type EnableRequest struct {
	Persist bool `json:"persist"`
}

// Stats is the connection summary and traffic counters (GET /v1/stats), after
// `smcr stats` of smc-tools.
type Stats struct {
	SinceResetSeconds float64 `json:"since_reset_seconds"` // counters cover this long

	Connections ConnCounts      `json:"connections"`
	Fallbacks   []FallbackCount `json:"fallbacks"` // by decline reason and side, sorted by count
	RX          Direction       `json:"rx"`
	TX          Direction       `json:"tx"`

	MemoryInUse    int64  `json:"memory_in_use_bytes"` // RMBs and send buffers connections hold now
	MemoryPooled   int64  `json:"memory_pooled_bytes"` // buffers kept for reuse by the link groups (within max_memory too)
	MemoryPeak     int64  `json:"memory_peak_bytes"`
	ProtocolErrors uint64 `json:"protocol_errors"` // peer protocol violations (bad cursor, unknown token …)
	Aborts         uint64 `json:"aborts"`          // connections ended by abnormal close

	Links LinkEvents `json:"links"`

	Direct DirectCounts `json:"direct"`

	// Programs are the eBPF programs' counters (bpf.StatNames): connections
	// redirected to smcrd or left direct and why (skip_*), SYNs marked and
	// steered, SMC options sent and echoed.
	Programs map[string]uint64 `json:"programs,omitempty"`
}

// DirectCounts count the sockets programs brought to smcrd with the direct
// mode's library (docs/direct.md), by outcome.
type DirectCounts struct {
	SMCR    uint64 `json:"smcr"`    // carried through shared memory over SMC-R
	TCP     uint64 `json:"tcp"`     // handed back as plain TCP after CLC or without it
	Failed  uint64 `json:"failed"`  // connects that failed (the program got the error)
	Refused uint64 `json:"refused"` // not taken: not a TCP socket, no option on the SYN, disabled
	Bypass  uint64 `json:"bypass"`  // of SMCR, same host: the libraries write into each other's rings
	// Released: of SMCR, handed back to the program's socket mid-stream (sent
	// to another process, an exec without the library), its bytes going on
	// over TCP.
	Released uint64 `json:"released"`
}

// LinkEvents count what happened to the links of the link groups: second links
// added and deleted, and where the connections of a failed link went.
type LinkEvents struct {
	Added          uint64 `json:"added"`           // second links added (ADD_LINK)
	Deleted        uint64 `json:"deleted"`         // links the peer deleted (DELETE_LINK)
	ConnsMoved     uint64 `json:"conns_moved"`     // connections moved to the surviving link (failover)
	ConnsContinued uint64 `json:"conns_continued"` // connections that went on over TCP when their link group failed
}

// ConnCounts summarise how connections went.
type ConnCounts struct {
	Handled         uint64 `json:"handled"`          // connections that ran (or tried) the CLC handshake
	SMCR            uint64 `json:"smcr"`             // that went SMC-R
	Fallback        uint64 `json:"fallback"`         // that became plain TCP (sum of Fallbacks)
	HandshakeErrors uint64 `json:"handshake_errors"` // CLC failures: timeouts (fallbacks too), TCP connections lost during CLC, setups smcrd could not start
	FirstContact    uint64 `json:"first_contact"`    // SMC-R connections that created a link group
	Reused          uint64 `json:"reused"`           // SMC-R connections that reused a link group
	Active          int64  `json:"active"`           // SMC-R connections open now
	// Handled, SMCR and Fallback by role, as smc-tools' smcr stats splits
	// them: connections this host's applications made (client) or took.
	Client RoleCounts `json:"client"`
	Server RoleCounts `json:"server"`
	// SMCR by the SMC-R version the handshake agreed, as smcr stats splits
	// it: version 2 with standard peers (Linux's AF_SMC) whose User EID
	// matches one of ueid_list; version 1 otherwise, and between smcrds.
	V1 uint64 `json:"smcr_v1"`
	V2 uint64 `json:"smcr_v2"`
}

// RoleCounts are one role's connections: handled, that went SMC-R, that became
// plain TCP.
type RoleCounts struct {
	Handled  uint64 `json:"handled"`
	SMCR     uint64 `json:"smcr"`
	Fallback uint64 `json:"fallback"`
}

// Side names which end decided a fallback.
const (
	SideLocal = "local" // this host declined (or gave up)
	SidePeer  = "peer"  // the peer sent a Decline
)

// FallbackCount is the number of fallbacks for one decline code from one side.
type FallbackCount struct {
	Code   uint32 `json:"code"`   // CLC decline code (docs/protocol.md, section 2), 0 for "no CLC at all"
	Reason string `json:"reason"` // its meaning, as smcrd names it
	Side   string `json:"side"`   // SideLocal or SidePeer
	Count  uint64 `json:"count"`
}

// Direction is one direction's traffic over SMC-R.
type Direction struct {
	Bytes          uint64 `json:"bytes"`            // payload moved over RDMA
	Requests       uint64 `json:"requests"`         // send/receive calls that moved it
	FallbackBytes  uint64 `json:"fallback_bytes"`   // payload over TCP after a fallback
	BufferFull     uint64 `json:"buffer_full"`      // a writer found the ring full (TX: peer's RMBE; RX: ours)
	BufferTooSmall uint64 `json:"buffer_too_small"` // a request larger than the whole buffer
	Downgrades     uint64 `json:"downgrades"`       // a buffer smaller than configured was used (memory short)
	Reuses         uint64 `json:"reuses"`           // a buffer taken from the free pool instead of allocated

	BufferSizes  Histogram `json:"buffer_sizes"`  // buffers used, by size
	RequestSizes Histogram `json:"request_sizes"` // requests, by payload size
}

// Histogram counts values in buckets with increasing upper bounds; the last bucket
// has UpTo 0 and counts everything above the previous bound.
type Histogram []Bucket

// Bucket is one bar of a Histogram.
type Bucket struct {
	UpTo  uint64 `json:"up_to"` // inclusive upper bound in bytes; 0: no bound
	Count uint64 `json:"count"`
}

// Label names the bucket as smc-tools does: "8K", "512K", ">512K".
func (h Histogram) Label(i int) string {
	if b := h[i]; b.UpTo != 0 {
		return FormatSize(b.UpTo)
	}
	if i == 0 {
		return "any"
	}
	return ">" + FormatSize(h[i-1].UpTo)
}

// SizeBuckets are the bounds smc-tools uses for its size histograms.
var SizeBuckets = []uint64{8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10}

// NewHistogram returns empty buckets for the given bounds plus the unbounded one.
func NewHistogram(bounds []uint64) Histogram {
	h := make(Histogram, 0, len(bounds)+1)
	for _, b := range bounds {
		h = append(h, Bucket{UpTo: b})
	}
	return append(h, Bucket{})
}

// Observe counts v in its bucket.
func (h Histogram) Observe(v uint64) {
	for i := range h {
		if h[i].UpTo == 0 || v <= h[i].UpTo {
			h[i].Count++
			return
		}
	}
}

// FormatSize writes a byte count in K/M/G when it divides evenly.
func FormatSize(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dG", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return fmt.Sprint(n)
}

// LinkGroup is the set of links to one peer that its connections share
// (GET /v1/linkgroups), after `smcr linkgroup`.
type LinkGroup struct {
	ID       uint32 `json:"id"`
	Role     string `json:"role"`      // "client" or "server"
	Peer     string `json:"peer"`      // the peer's SMC peer ID, hex
	PeerAddr string `json:"peer_addr"` // the peer's IP address of first contact
	Provider string `json:"provider"`  // rdma, shm or soft
	State    string `json:"state"`     // "active", "inactive", "deleting"
	Conns    int    `json:"conns"`     // connections on it now
	Links    []Link `json:"links"`
	// MostLinks is the most links it has had at once: fewer active links
	// than that is a path lost.
	MostLinks int `json:"most_links"`
	// TX and RX count every link it has had, failed ones included: they
	// only grow, where the sum over Links drops when a link goes.
	TX LinkTraffic `json:"tx"`
	RX LinkTraffic `json:"rx"`
}

// Link is one RC queue pair of a link group (GET /v1/links), after
// `smcr linkgroup link-show`.
type Link struct {
	LinkGroup uint32 `json:"link_group"` // the group's ID
	Num       uint8  `json:"num"`        // link number within the group
	Role      string `json:"role"`       // the group's role, repeated for the flat view
	Peer      string `json:"peer"`       // the group's peer ID, repeated for the flat view
	State     string `json:"state"`      // "active", "activating", "inactive"…
	Interface string `json:"interface"`  // network interface it runs over
	Device    string `json:"device"`     // RDMA device (rxe0, mlx5_0) or shm/soft endpoint
	Port      int    `json:"port"`       // device port
	LocalGID  string `json:"local_gid"`
	PeerGID   string `json:"peer_gid"`
	LocalQPN  uint32 `json:"local_qpn"` // shown with QPN
	PeerQPN   uint32 `json:"peer_qpn"`
	Conns     int    `json:"conns"` // connections using it

	TX LinkTraffic `json:"tx"`
	RX LinkTraffic `json:"rx"`

	Errors uint64 `json:"errors"` // work completions in error, remote access errors
	// ErrorsByKind splits Errors: a work completion's status ("remote access
	// error", "transport retry exceeded", ...) or "protocol error" (a
	// malformed message from the peer); only the kinds seen.
	ErrorsByKind map[string]uint64 `json:"errors_by_kind,omitempty"`
	RTTMicros    float64           `json:"rtt_us"`                // last TEST_LINK round trip; 0 before the first
	TestLinkAgo  float64           `json:"test_link_ago_seconds"` // since the last TEST_LINK answer
}

// LinkTraffic is one direction of a link.
type LinkTraffic struct {
	Bytes        uint64 `json:"bytes"`
	WorkRequests uint64 `json:"work_requests"` // tx: posted (WRITEs, SENDs); rx: messages received (SENDs)
}

// Connection modes.
const (
	ModeSMCR = "SMCR"
	ModeTCP  = "TCP"
)

// Conn is one connection smcrd handles (GET /v1/conns), after smcss.
type Conn struct {
	ID     uint32 `json:"id"`     // local alert token (SMC-R, ≥ 2^31); a sequence number for TCP (below)
	Local  string `json:"local"`  // address:port as the application sees it
	Remote string `json:"remote"` // address:port
	Role   string `json:"role"`   // "client" or "server"
	State  string `json:"state"`  // kernel smc_state names: ACTIVE, APPCLOSEWAIT1, …
	Mode   string `json:"mode"`   // ModeSMCR or ModeTCP
	// Path is how the program's bytes reach the connection: PathDirect
	// (the library in the program) or PathRelay (through smcrd's relay).
	Path string `json:"path"`
	// For ModeTCP: which side declined and why; empty for SMC-R.
	DeclineSide   string `json:"decline_side,omitempty"`
	DeclineCode   uint32 `json:"decline_code,omitempty"`
	DeclineReason string `json:"decline_reason,omitempty"`

	LinkGroup   uint32 `json:"link_group,omitempty"`
	PeerToken   uint32 `json:"peer_token,omitempty"`    // the peer's alert token, which our CDCs carry
	SndBufSize  int    `json:"sndbuf_size,omitempty"`   // our send buffer
	RMBSize     int    `json:"rmb_size,omitempty"`      // our receive buffer (RMBE)
	PeerRMBSize int    `json:"peer_rmb_size,omitempty"` // the peer's RMBE we write into

	TxBytes uint64 `json:"tx_bytes"`
	RxBytes uint64 `json:"rx_bytes"`

	// Cursors (RFC 7609 §4.4.2), shown by `conns -d`.
	TxProd Cursor `json:"tx_prod"` // how far we wrote into the peer's RMBE
	TxCons Cursor `json:"tx_cons"` // how far the peer says it consumed
	RxProd Cursor `json:"rx_prod"` // how far the peer wrote into ours
	RxCons Cursor `json:"rx_cons"` // how far we consumed
}

// The paths of Conn.Path.
const (
	PathDirect = "direct"
	PathRelay  = "relay"
)

// ClosedConn is a connection smcrd carried that has ended (GET /v1/history):
// the last ones, newest first, a bounded number of them.
type ClosedConn struct {
	ID     uint64    `json:"id"`
	Local  string    `json:"local"`
	Remote string    `json:"remote"`
	Role   string    `json:"role"`             // "client" or "server"
	Mode   string    `json:"mode"`             // ModeSMCR, ModeTCP, or ModeFailed
	Reason string    `json:"reason,omitempty"` // why TCP: the decline reason
	Ended  time.Time `json:"ended"`
	// Seconds is how long it lasted, from smcrd's accept.
	Seconds float64 `json:"seconds"`
	TxBytes uint64  `json:"tx_bytes"`
	RxBytes uint64  `json:"rx_bytes"`
}

// Probe says whether a connection to Dst, made now by a program in the cgroup
// smcrd serves, would be tried over SMC-R, and why not (GET /v1/probe), like
// smc-tools' smc_chk: each check the programs make, in their order.
type Probe struct {
	Dst    string       `json:"dst"`
	Cgroup string       `json:"cgroup"` // whose programs' connections are redirected ("": all)
	SMCR   bool         `json:"smcr"`   // every check passed
	Checks []ProbeCheck `json:"checks"`
}

// ProbeCheck is one check of a Probe.
type ProbeCheck struct {
	Check  string `json:"check"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// ModeFailed is the mode of a connection that ended while smcrd set it up:
// the application saw a reset (destination unreachable, handshake lost).
const ModeFailed = "FAILED"

// Cursor is an RMBE position with its wrap count.
type Cursor struct {
	Wrap  uint16 `json:"wrap"`
	Count uint32 `json:"count"`
}

func (c Cursor) String() string { return fmt.Sprintf("%d:%d", c.Wrap, c.Count) }

// Peer is one entry of the peer capability cache (GET /v1/peers).
type Peer struct {
	Addr             string  `json:"addr"`               // peer IP address
	Port             uint16  `json:"port,omitempty"`     // its port: an entry is for one destination, not the whole host
	Capable          bool    `json:"capable"`            // the last handshake with it went SMC-R
	Reason           string  `json:"reason,omitempty"`   // why not, when not capable
	ExpiresInSeconds float64 `json:"expires_in_seconds"` // until the entry is forgotten and tried again
	Hits             uint64  `json:"hits"`               // connections decided by this entry
}

// Listener is a TCP socket listening in smcrd's network namespace, and
// whether smcrd steers the SMC-R connections to it (GET /v1/listeners), like
// smcss -l.
type Listener struct {
	Addr    string `json:"addr"` // the address it is bound to ("0.0.0.0", "::": every one)
	Port    uint16 `json:"port"`
	Steered bool   `json:"steered"`          // connections to it with the SMC option come to smcrd
	Reason  string `json:"reason,omitempty"` // why not, when not steered
}

// ForgetPeersRequest is POST /v1/peers/forget's body: the peers to take out of
// the peer cache (as ParsePeer reads them), all of them when Addrs is empty.
type ForgetPeersRequest struct {
	Addrs []string `json:"addrs,omitempty"`
}

// ParsePeer reads a peer to forget: an IP address, which stands for every port
// of it (port 0 in the result), or an address and port ("198.18.0.9:6379",
// "[2001:db8::7]:443"). IPv4-mapped addresses come back as IPv4.
func ParsePeer(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	switch {
	case err == nil && ap.Port() == 0:
		return netip.AddrPort{}, fmt.Errorf("%q: port 0 is no destination (an address alone stands for all its ports)", s)
	case err != nil:
		a, aerr := netip.ParseAddr(s)
		if aerr != nil {
			return netip.AddrPort{}, fmt.Errorf("%q is neither an IP address nor an address and port", s)
		}
		ap = netip.AddrPortFrom(a, 0)
	}
	if ap.Addr().Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("%q: zones are not supported: link-local peers are never redirected, so none is cached", s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// PeerNamed reports whether peers, as ForgetPeers takes them, name dst: every
// destination when there are none, every port of an address with port 0.
func PeerNamed(peers []netip.AddrPort, dst netip.AddrPort) bool {
	return len(peers) == 0 || slices.ContainsFunc(peers, func(p netip.AddrPort) bool {
		return p.Addr() == dst.Addr() && (p.Port() == 0 || p.Port() == dst.Port())
	})
}

// ForgetPeersResult is its answer.
type ForgetPeersResult struct {
	Forgotten int `json:"forgotten"` // entries taken out
}

// Device is an RDMA device smcrd can use (GET /v1/devices), after `smcr device`.
type Device struct {
	Name       string `json:"name"`     // rxe0, mlx5_0, shm, soft
	Provider   string `json:"provider"` // rdma, shm or soft
	Port       int    `json:"port"`
	State      string `json:"state"`     // "active", "down"
	Interface  string `json:"interface"` // its network interface
	GID        string `json:"gid"`
	MAC        string `json:"mac"`
	MTU        int    `json:"mtu"` // path MTU in bytes
	LinkGroups int    `json:"link_groups"`
	Links      int    `json:"links"`
}

// Error is the body of every non-2xx answer.
type Error struct {
	Error string `json:"error"`
}

// QPN is a queue pair number as ibv_devinfo and rdma-core's tools print it
// (0x0011ab): the form smcrctl and smcrd's log show.
func QPN(n uint32) string { return fmt.Sprintf("%#06x", n) }
