// Stats: engine and connection counters that smcrctl shows.
// RFC 7609 has no counters; these follow the Linux smc_stats split (handshakes,
// fallbacks by reason and side, bytes, buffer use).

package smcr

import (
	"maps"
	"sync"
	"sync/atomic"
)

// Side says which end of a connection decided a fallback.
type Side uint8

const (
	SideLocal Side = iota + 1 // this endpoint declined (or gave up)
	SidePeer                  // the peer sent a Decline
)

func (s Side) String() string {
	switch s {
	case SideLocal:
		return "local"
	case SidePeer:
		return "peer"
	}
	return "unknown"
}

// FallbackKey indexes Stats.Fallback.
type FallbackKey struct {
	Code DeclineCode
	Side Side
}

// Stats is a snapshot of an Engine's counters.
type Stats struct {
	Handled  uint64                 // connections that ran (or tried) CLC
	SMC      uint64                 // connections that went SMC-R
	SMCV2    uint64                 // of SMC, those of SMC-R version 2 (with a standard peer)
	Fallback map[FallbackKey]uint64 // connections that became plain TCP, by reason and side
	// HandshakeErrors counts handshakes that ended in an error instead:
	// the TCP connection lost during CLC, or the context ended (Linux's
	// clnt_hshake_err_cnt and srv_hshake_err_cnt together).
	HandshakeErrors uint64
	// Server is Handled, SMC and the fallbacks of the connections the engine
	// served; the clients' are the rest (smc-tools' smcr stats splits them so).
	Server       RoleStats
	FirstContact uint64 // link groups created
	LinkConfirms uint64 // CONFIRM_LINK exchanges completed
	Reused       uint64 // SMC-R connections that reused a link group
	Active       int64  // SMC-R connections open now
	TxBytes      uint64 // bytes sent over RDMA
	RxBytes      uint64 // bytes received over RDMA
	FallbackTx   uint64 // bytes sent over TCP after a fallback
	FallbackRx   uint64 // bytes received over TCP after a fallback
	CDCSent      uint64
	CDCReceived  uint64
	CDCStale     uint64 // CDCs dropped for a sequence number older than one taken
	LLCSent      uint64
	LLCReceived  uint64
	WriteBlocked uint64 // times a writer found the peer's RMBE full
	RxFull       uint64 // CDCs that filled our RMBE: the peer had to wait for the reader
	RxTooSmall   uint64 // reads asking for more than the whole RMBE
	TxTooSmall   uint64 // writes of more than the peer's whole RMBE (the send buffer)
	RxReuses     uint64 // RMBs taken from the link group's pool instead of allocated
	TxReuses     uint64 // send buffers taken from the pool instead of allocated
	// RxDowngrades counts RMBs smaller than configured, for lack of memory.
	// Send buffers mirror the peer's RMBE and are never downgraded.
	RxDowngrades uint64
	ProtoErrors  uint64 // peer protocol violations (bad cursor, unknown token, …)
	Aborts       uint64 // connections ended by abnormal close
	Continued    uint64 // connections that went on over TCP after their link group failed
	AddLinks     uint64 // second links added (ADD_LINK exchanges completed)
	DeleteLinks  uint64 // single links the peer deleted (DELETE_LINK received)
	MovedConns   uint64 // connections moved to the surviving link after theirs failed
	MemoryInUse  int64  // bytes of RMBs and send buffers connections hold now
	MemoryPooled int64  // bytes of buffers kept for reuse (they count against MaxMemory too)
	MemoryPeak   int64  // most bytes held at once since start or the last reset
	LinkGroups   int    // link groups alive now

	RxBufSizes SizeHistogram // our RMBEs, one per connection that went SMC-R
	TxBufSizes SizeHistogram // our send buffers (the peer's RMBE size), one per such connection
	RxReqSizes SizeHistogram // Reads that returned SMC-R payload, by bytes returned
	TxReqSizes SizeHistogram // Writes on SMC-R connections, by bytes written
}

// RoleStats are the counts of one role's connections.
type RoleStats struct{ Handled, SMC, Fallback uint64 }

// SizeBounds are the inclusive upper bounds in bytes of the size histograms'
// buckets, those of smc-tools' `smcr stats`; one more bucket counts larger sizes.
var SizeBounds = [...]uint64{8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10}

// SizeHistogram counts sizes by bucket: [i] counts sizes up to SizeBounds[i] (and
// above the bound before), the last one sizes above every bound.
type SizeHistogram [len(SizeBounds) + 1]uint64

// sizeHist is a SizeHistogram that counts concurrently.
type sizeHist [len(SizeBounds) + 1]atomic.Uint64

func (h *sizeHist) observe(n uint64) {
	i := 0
	for i < len(SizeBounds) && n > SizeBounds[i] {
		i++
	}
	h[i].Add(1)
}

// take returns the counts, zeroing them when reset is set: each count goes
// either into what take returns or into what follows, never nowhere.
func (h *sizeHist) take(reset bool) SizeHistogram {
	var out SizeHistogram
	for i := range h {
		out[i] = load(&h[i], reset)
	}
	return out
}

func load(c *atomic.Uint64, reset bool) uint64 {
	if reset {
		return c.Swap(0)
	}
	return c.Load()
}

type stats struct {
	handled, smc, smcV2, firstContact, reused    atomic.Uint64
	linkConfirms                                 atomic.Uint64
	handshakeErrors                              atomic.Uint64
	srvHandled, srvSMC, srvFallback              atomic.Uint64
	active                                       atomic.Int64
	txBytes, rxBytes, fbTx, fbRx                 atomic.Uint64
	cdcSent, cdcRecv, cdcStale, llcSent, llcRecv atomic.Uint64
	writeBlocked, protoErrors, aborts, continued atomic.Uint64
	addLinks, deleteLinks, movedConns            atomic.Uint64
	rxFull, rxTooSmall, txTooSmall               atomic.Uint64
	rxReuses, txReuses, rxDowngrades             atomic.Uint64
	rxBuf, txBuf, rxReq, txReq                   sizeHist
	mu                                           sync.Mutex
	fallback                                     map[FallbackKey]uint64
}

// countFallback counts one fallback by its code and side. A code no one named
// is counted under its class (its first byte): a peer picks the codes of its
// Declines, and each would be an entry here and a series in smcrd's metrics.
func (s *stats) countFallback(code DeclineCode, side Side) {
	if !code.Known() {
		code = DeclineCode(code.Class()) << 24
	}
	s.mu.Lock()
	if s.fallback == nil {
		s.fallback = make(map[FallbackKey]uint64)
	}
	s.fallback[FallbackKey{code, side}]++
	s.mu.Unlock()
}

// take returns the counters, zeroing them when reset is set (not the active
// gauge), so that nothing counted meanwhile is lost.
func (s *stats) take(reset bool) Stats {
	s.mu.Lock()
	fb := s.fallback
	if reset {
		s.fallback = nil
	} else {
		fb = maps.Clone(fb)
	}
	s.mu.Unlock()
	if fb == nil {
		fb = map[FallbackKey]uint64{}
	}
	get := func(c *atomic.Uint64) uint64 { return load(c, reset) }
	return Stats{
		Handled:         get(&s.handled),
		HandshakeErrors: get(&s.handshakeErrors),
		Server:          RoleStats{Handled: get(&s.srvHandled), SMC: get(&s.srvSMC), Fallback: get(&s.srvFallback)},
		SMC:             get(&s.smc),
		SMCV2:           get(&s.smcV2),
		Fallback:        fb,
		FirstContact:    get(&s.firstContact),
		LinkConfirms:    get(&s.linkConfirms),
		Reused:          get(&s.reused),
		Active:          s.active.Load(),
		TxBytes:         get(&s.txBytes),
		RxBytes:         get(&s.rxBytes),
		FallbackTx:      get(&s.fbTx),
		FallbackRx:      get(&s.fbRx),
		CDCSent:         get(&s.cdcSent),
		CDCReceived:     get(&s.cdcRecv),
		CDCStale:        get(&s.cdcStale),
		LLCSent:         get(&s.llcSent),
		LLCReceived:     get(&s.llcRecv),
		WriteBlocked:    get(&s.writeBlocked),
		ProtoErrors:     get(&s.protoErrors),
		Aborts:          get(&s.aborts),
		Continued:       get(&s.continued),
		AddLinks:        get(&s.addLinks),
		DeleteLinks:     get(&s.deleteLinks),
		MovedConns:      get(&s.movedConns),
		RxFull:          get(&s.rxFull),
		RxTooSmall:      get(&s.rxTooSmall),
		TxTooSmall:      get(&s.txTooSmall),
		RxReuses:        get(&s.rxReuses),
		TxReuses:        get(&s.txReuses),
		RxDowngrades:    get(&s.rxDowngrades),
		RxBufSizes:      s.rxBuf.take(reset),
		TxBufSizes:      s.txBuf.take(reset),
		RxReqSizes:      s.rxReq.take(reset),
		TxReqSizes:      s.txReq.take(reset),
	}
}

// ConnStats are one connection's counters.
type ConnStats struct {
	TxBytes, RxBytes uint64
	CDCSent, CDCRecv uint64
	WriteBlocked     uint64
	ConsumerUpdates  uint64 // CDCs sent only to report freed RMBE space
}
