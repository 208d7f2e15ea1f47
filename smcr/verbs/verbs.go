// Package verbs is the RDMA provider interface the SMC-R engine is written against.
// It is shaped after libibverbs (RFC 7609 §2.1 assumes RC queue pairs), reduced to
// what SMC-R uses: memory regions with rkeys, completion queues, RC queue pairs,
// RDMA WRITE (with and without immediate), SEND and RECV.
//
// Three providers implement it and all pass the conformance suite in verbstest:
//
//	soft  RC semantics emulated over TCP between hosts without RDMA
//	shm   peers on one host: regions in shared memory (memfd), doorbells by eventfd
//	ibv   real RDMA through libibverbs (cgo, build tag "ibv")
//
// The object model:
//
//	Device ── AllocPD ──▶ PD ── AllocMR ──▶ MR   (local bytes, lkey, rkey, addr)
//	   │                   └── CreateQP ──▶ QP   (RC; Connect, PostSend, PostRecv)
//	   └── CreateCQ ─────────────────────▶ CQ   (Poll, Wait)
//
// A QP is connected from the attributes CLC and LLC carry (QPN, PSN, GID, MAC, MTU)
// plus the peer device's Endpoint: a provider-specific rendezvous address that
// travels in smcr's CLC extension (empty for real RDMA, where the GID is enough).
package verbs

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Kind names a provider. The values travel in smcr's CLC extension: never renumber.
type Kind uint8

const (
	KindRDMA Kind = 1 // libibverbs hardware or soft-RoCE
	KindSHM  Kind = 2 // same-host shared memory
	KindSoft Kind = 3 // software emulation over TCP
)

func (k Kind) String() string {
	switch k {
	case KindRDMA:
		return "rdma"
	case KindSHM:
		return "shm"
	case KindSoft:
		return "soft"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// ParseKind is the inverse of Kind.String, for configuration files.
func ParseKind(s string) (Kind, error) {
	for _, k := range []Kind{KindRDMA, KindSHM, KindSoft} {
		if k.String() == s {
			return k, nil
		}
	}
	return 0, fmt.Errorf("verbs: unknown provider %q (want rdma, shm or soft)", s)
}

// MTU is an InfiniBand path MTU code, as carried in CLC (1..5 = 256..4096 bytes).
type MTU uint8

const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes, or 0 for an invalid code.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// Valid reports whether m is one of the five defined codes.
func (m MTU) Valid() bool { return m.Bytes() != 0 }

// Access is a set of memory-region permissions, as ibv_access_flags.
type Access uint8

const (
	AccessLocalWrite  Access = 1 << 0
	AccessRemoteWrite Access = 1 << 1
	AccessRemoteRead  Access = 1 << 2
)

// Opcode is the operation of a send work request.
type Opcode uint8

const (
	OpWrite    Opcode = iota + 1 // RDMA WRITE
	OpWriteImm                   // RDMA WRITE WITH IMMEDIATE: consumes a RECV at the peer
	OpSend                       // SEND: consumes a RECV at the peer
)

// WCOpcode is the operation a completion reports.
type WCOpcode uint8

const (
	WCSend        WCOpcode = iota + 1 // a SEND completed at the requester
	WCWrite                           // an RDMA WRITE (with or without imm) completed at the requester
	WCRecv                            // a RECV consumed by a SEND
	WCRecvRDMAImm                     // a RECV consumed by a WRITE WITH IMMEDIATE
)

// WCStatus mirrors enum ibv_wc_status for the cases SMC-R distinguishes.
type WCStatus uint8

const (
	WCSuccess        WCStatus = iota
	WCLocLenErr               // local length error (receive buffer too small)
	WCLocProtErr              // local protection error (bad lkey / SGE outside its MR)
	WCWRFlushErr              // flushed: the QP entered the error state
	WCRemAccessErr            // remote access error: bad rkey, bounds or permission
	WCRemOpErr                // remote operation error
	WCRemInvReqErr            // remote invalid request
	WCRetryExcErr             // transport retry counter exceeded (peer gone)
	WCRNRRetryExcErr          // receiver-not-ready retry counter exceeded
	WCGeneralErr              // anything else
)

var wcStatusNames = [...]string{
	WCSuccess:        "success",
	WCLocLenErr:      "local length error",
	WCLocProtErr:     "local protection error",
	WCWRFlushErr:     "work request flushed",
	WCRemAccessErr:   "remote access error",
	WCRemOpErr:       "remote operation error",
	WCRemInvReqErr:   "remote invalid request",
	WCRetryExcErr:    "transport retry exceeded",
	WCRNRRetryExcErr: "receiver not ready retry exceeded",
	WCGeneralErr:     "general error",
}

func (s WCStatus) String() string {
	if int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return fmt.Sprintf("wc status %d", uint8(s))
}

// WorkCompletion is one entry polled from a CQ. A failed one (Status other than
// WCSuccess) has its ID, Status and QPN only, as in verbs: an adapter reports no
// operation or length for it (Opcode 0), so its work request is known by its ID.
type WorkCompletion struct {
	ID      uint64 // the work request's ID
	Status  WCStatus
	Opcode  WCOpcode
	ByteLen uint32 // bytes received (RECV) or written (WRITE_IMM at the responder)
	Imm     uint32 // immediate data, valid when HasImm
	HasImm  bool
	QPN     uint32 // local QP number
}

// SGE is one scatter/gather element: a byte range of a local memory region.
type SGE struct {
	MR     MR
	Offset int
	Length int
}

// SendWR is a send-queue work request. The caller may reuse it after PostSend returns.
type SendWR struct {
	ID         uint64
	Opcode     Opcode
	SG         []SGE
	RemoteAddr uint64 // WRITE: the peer MR's Addr() plus an offset
	RKey       uint32 // WRITE: the peer MR's RKey()
	Imm        uint32 // WRITE_IMM
	Signaled   bool   // generate a completion on success (errors always complete)
	// Inline asks the provider to copy the payload into the request as it is
	// posted (IBV_SEND_INLINE) when it fits the queue pair's inline space
	// (QPConfig.MaxInline): the adapter then need not read it from memory,
	// which saves small messages latency. It is a hint: larger payloads, and
	// providers that copy at post anyway, go as usual, so the caller keeps the
	// buffer until the completion either way.
	Inline bool
	// Next chains another request behind this one: PostSend posts the whole
	// chain, at most MaxChain requests, in order and in one call (one doorbell
	// on an adapter, one system call on rxe), as ibv_post_send does.
	Next *SendWR
}

// MaxChain bounds the requests of one chain (SendWR.Next).
const MaxChain = 8

// chainLen counts the requests chained from wr, stopping past MaxChain (a
// longer chain, or a loop, is refused whole).
func chainLen(wr *SendWR) int {
	n := 0
	for ; wr != nil && n <= MaxChain; wr = wr.Next {
		n++
	}
	return n
}

// CheckChain refuses a nil request and a chain longer than MaxChain: PostSend
// posts nothing of either.
func CheckChain(wr *SendWR) error {
	switch n := chainLen(wr); {
	case n == 0:
		return fmt.Errorf("%w: no work request", ErrInvalid)
	case n > MaxChain:
		return fmt.Errorf("%w: chain of more than %d requests", ErrInvalid, MaxChain)
	}
	return nil
}

// PostError is PostSend's error when a chain failed part way, as ibv_post_send's
// bad_wr: the first Posted requests went (and complete as usual), the failing
// one and those after it did not.
type PostError struct {
	Posted int
	Err    error
}

func (e *PostError) Error() string {
	return fmt.Sprintf("%v (the chain's first %d posted)", e.Err, e.Posted)
}

func (e *PostError) Unwrap() error { return e.Err }

// Posted returns how many requests of a chain went before PostSend failed with
// err: PostError's count, else none.
func Posted(err error) int {
	var pe *PostError
	if errors.As(err, &pe) {
		return pe.Posted
	}
	return 0
}

// PostChain gives PostSend's chain semantics to a provider that posts one
// request at a time (post).
func PostChain(wr *SendWR, post func(*SendWR) error) error {
	if err := CheckChain(wr); err != nil {
		return err
	}
	for i := 0; wr != nil; i, wr = i+1, wr.Next {
		if err := post(wr); err != nil {
			if i == 0 {
				return err
			}
			return &PostError{Posted: i, Err: err}
		}
	}
	return nil
}

// RecvWR is a receive-queue work request.
type RecvWR struct {
	ID uint64
	SG []SGE
}

// QPState mirrors enum ibv_qp_state.
type QPState uint8

const (
	QPReset QPState = iota
	QPInit
	QPRTR
	QPRTS
	QPError
)

func (s QPState) String() string {
	switch s {
	case QPReset:
		return "RESET"
	case QPInit:
		return "INIT"
	case QPRTR:
		return "RTR"
	case QPRTS:
		return "RTS"
	case QPError:
		return "ERROR"
	}
	return fmt.Sprintf("qp state %d", uint8(s))
}

// QPAttr are the addressing attributes of one end of an RC connection: what CLC
// Accept/Confirm and LLC ADD_LINK carry, plus the provider's rendezvous Endpoint.
type QPAttr struct {
	QPN      uint32 // 24 bits
	PSN      uint32 // 24 bits, initial packet sequence number
	GID      [16]byte
	MAC      [6]byte
	MTU      MTU
	Endpoint []byte // provider-specific rendezvous of the device; see Device.Endpoint
}

// QPConfig sizes a new RC queue pair.
type QPConfig struct {
	SendCQ, RecvCQ CQ
	MaxSendWR      int // outstanding send work requests (default 64)
	MaxRecvWR      int // outstanding receive work requests (default 64)
	RNRRetry       int // receiver-not-ready retries before WCRNRRetryExcErr; 7 = forever, as ibverbs
	// MaxInline is the inline space to ask for, in bytes (SendWR.Inline). A
	// device may grant more, or none where it has none.
	MaxInline int
}

// PortAttr describes the device's active port.
type PortAttr struct {
	// Num is the port's number on its device, which tells apart the ports
	// of a dual-port adapter opened as two devices of one name (0 on
	// devices without ports: taken as 1).
	Num     int
	GID     [16]byte
	MAC     [6]byte
	MTU     MTU    // active path MTU
	Netdev  string // the network interface the port maps to, if any
	LinkUp  bool
	GIDType string // "RoCE v2", "RoCE v1", "IB", or the provider's name
}

// Device is an opened RDMA device (one port).
type Device interface {
	Kind() Kind
	Name() string
	Port() PortAttr
	// Endpoint is the rendezvous a peer needs besides QPAttr to reach this device:
	// for soft the TCP address, for shm the host identity and socket path,
	// nil for real RDMA.
	Endpoint() []byte
	AllocPD() (PD, error)
	CreateCQ(depth int) (CQ, error)
	Close() error
}

// PD is a protection domain: MRs and QPs of one PD may be used together only.
type PD interface {
	// AllocMR allocates size bytes that the provider can access remotely (outside
	// the Go heap where the provider needs it) and registers them with access.
	AllocMR(size int, access Access) (MR, error)
	CreateQP(cfg QPConfig) (QP, error)
	Close() error
}

// Registrar is an optional interface of a PD: it registers memory that an MR of
// another device of the same provider already holds, so that one buffer is
// reachable through QPs of both devices (SMC-R's second link uses an RMB on both).
// The result shares the bytes of mr (Bytes aliases them) and has its own lkey, rkey
// and addr on this PD's device. mr must stay open while the result is in use;
// closing either one leaves the other usable. An MR of another provider, or one
// the provider cannot share, gives an error wrapping ErrInvalid.
type Registrar interface {
	RegisterMR(mr MR, access Access) (MR, error)
}

// Mappable is an optional interface of an MR whose bytes live in a file that
// another process can map (shm's sealed memfds): smcrd hands a direct
// connection's buffers to the program's library this way.
type Mappable interface {
	// DupFile returns a new close-on-exec descriptor of the file, which the
	// caller closes, and the offset of the MR's first byte in it. The file
	// cannot be resized, and outlives the MR's Close for whoever holds it.
	DupFile() (fd int, off int64, err error)
}

// PortStater is implemented by devices whose port can go down and come back
// (real RDMA): PortUp asks the device now, where Port's LinkUp may be what it
// was at Open. Devices without it are taken to be up while open.
type PortStater interface {
	PortUp() bool
}

// PortNotifier is implemented by PortStaters that hear of port changes as they
// happen (real RDMA: libibverbs' async events), so that a watcher need not wait
// for its next look at PortUp. PortChanged returns a channel that is closed at
// the next change after the call; each change closes the channel every caller
// holds, so any number of watchers may wait. Changes may be coalesced, and a
// close may come without a change: the watcher asks PortUp.
type PortNotifier interface {
	PortChanged() <-chan struct{}
}

// GIDHolder is implemented by devices whose addresses can go while links use
// them (real RDMA: a port's GID table follows its interface's addresses, and a
// queue pair keeps the GID it was made with). HasGID reports whether gid is
// still one of the port's: a link whose GID went reaches its peer no more.
// Changes come through PortNotifier.
type GIDHolder interface {
	HasGID(gid [16]byte) bool
}

// PortChanges is what a PortNotifier hands out: Next is PortChanged, and Notify
// closes the channel of every waiter. The zero value is ready.
type PortChanges struct {
	mu   sync.Mutex
	next chan struct{}
}

// Next returns the channel the next Notify closes.
func (c *PortChanges) Next() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.next == nil {
		c.next = make(chan struct{})
	}
	return c.next
}

// Notify wakes every waiter on Next's channel.
func (c *PortChanges) Notify() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.next != nil {
		close(c.next)
		c.next = nil
	}
}

// MR is a registered memory region.
type MR interface {
	Bytes() []byte // the local mapping; valid until Close
	LKey() uint32
	RKey() uint32
	Addr() uint64 // the address a peer puts in SendWR.RemoteAddr for offset 0
	Access() Access
	Close() error // deregister and free
}

// CQ is a completion queue.
type CQ interface {
	// Poll moves up to len(wc) completions into wc and returns how many; it never blocks.
	Poll(wc []WorkCompletion) (int, error)
	// Wait returns when a completion may be ready to poll, after spinning briefly and
	// then sleeping; it returns ctx.Err() when ctx ends and ErrClosed after Close.
	// Spurious wake-ups are allowed: callers poll in a loop.
	Wait(ctx context.Context) error
	Close() error
}

// QP is a reliable-connected queue pair.
type QP interface {
	Attr() QPAttr // local attributes to send to the peer
	// Connect moves the QP through INIT, RTR and RTS towards the remote end.
	Connect(ctx context.Context, remote QPAttr) error
	// PostSend posts wr and the requests chained behind it (SendWR.Next). When
	// one fails, those before it were posted: see PostError.
	PostSend(wr *SendWR) error
	PostRecv(wr *RecvWR) error
	State() QPState
	// Close destroys the QP; outstanding work requests complete with WCWRFlushErr.
	Close() error
}

var (
	// ErrClosed is returned by operations on a closed object.
	ErrClosed = errors.New("verbs: closed")
	// ErrQPState is returned when a work request is posted in a state that forbids it.
	ErrQPState = errors.New("verbs: queue pair in wrong state")
	// ErrQueueFull is returned when more work requests are posted than the QP holds.
	ErrQueueFull = errors.New("verbs: work queue full")
	// ErrInvalid is returned for malformed work requests (bad SGE, opcode, sizes).
	ErrInvalid = errors.New("verbs: invalid argument")
	// ErrUnsupported is returned when a provider is not built into this binary or
	// cannot run on this machine.
	ErrUnsupported = errors.New("verbs: provider not supported here")
)

// CheckSGE validates an SGE against its MR: providers call it before touching memory.
func CheckSGE(s SGE) error {
	if s.MR == nil || s.Offset < 0 || s.Length < 0 || s.Offset > len(s.MR.Bytes())-s.Length {
		return fmt.Errorf("%w: sge offset %d length %d outside its region", ErrInvalid, s.Offset, s.Length)
	}
	return nil
}

// SGLen returns the total length of a scatter/gather list.
func SGLen(sg []SGE) int {
	n := 0
	for _, s := range sg {
		n += s.Length
	}
	return n
}
