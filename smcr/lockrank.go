// The lock order of the engine, and the mutex types that carry it: every mutex of
// Conn, link, linkGroup and Engine has its rank, and a goroutine takes them in
// rising rank only. Built with the tag lockrank, the mutexes check that order as
// they are taken (lockrank_on.go) and the package's tests fail on a breach
// (make test-lockrank); without it they are plain sync mutexes.
// No RFC part: a property of this implementation.

package smcr

import "sync"

// lockRank is a mutex's place in the lock order: a goroutine holding a mutex of
// rank r takes only mutexes of a higher rank, so two mutexes of one rank (two
// Conns' mu) are never held at once. Mutexes not listed (a deadline's, a
// ticker's, the prefix cache's, the stats') take no other lock while held.
// Where two mutexes are never held together their order here is a choice; the
// package's tests under the tag hold every pair that is nested in this order.
//
// From outermost to innermost:
//
//	Engine.setMu       the settings' setters
//	Engine.lgCreate    a server's search for a link group, or its creation
//	Conn.txMu          one Write at a time
//	Conn.rxMu          one Read at a time
//	Conn.cdcMu         our CDCs in sequence order; a Write's chunk is counted,
//	                   announced and posted under it
//	linkGroup.addMu    one ADD_LINK exchange at a time
//	linkGroup.flow     rkeys announced on every link (write: a new link's)
//	link.pollMu        handling the link's completions (poller or a driving Read)
//	link.creditMu      takers of several work-request credits
//	link.useMu         the send slots mapped while a sender encodes (read)
//	link.postMu        one post of a chain of work requests
//	Engine.mu          the engine's link groups and connection table
//	linkGroup.mu       the group's links, connections, peer rkeys, pool
//	Conn.mu            the connection's cursors and flags
//	link.pmu           LLC requests waiting for their responses
//	link.pdMu          the protection domain's and slot's holds
type lockRank uint8

const (
	rankNone lockRank = iota
	rankEngineSet
	rankEngineLGCreate
	rankConnTx
	rankConnRx
	rankConnCDC
	rankGroupAdd
	rankGroupFlow
	rankLinkPoll
	rankLinkCredit
	rankLinkUse
	rankLinkPost
	rankEngine
	rankGroup
	rankConn
	rankLinkPending
	rankLinkPD
)

var rankNames = [...]string{
	rankNone:           "none",
	rankEngineSet:      "Engine.setMu",
	rankEngineLGCreate: "Engine.lgCreate",
	rankConnTx:         "Conn.txMu",
	rankConnRx:         "Conn.rxMu",
	rankConnCDC:        "Conn.cdcMu",
	rankGroupAdd:       "linkGroup.addMu",
	rankGroupFlow:      "linkGroup.flow",
	rankLinkPoll:       "link.pollMu",
	rankLinkCredit:     "link.creditMu",
	rankLinkUse:        "link.useMu",
	rankLinkPost:       "link.postMu",
	rankConn:           "Conn.mu",
	rankGroup:          "linkGroup.mu",
	rankEngine:         "Engine.mu",
	rankLinkPending:    "link.pmu",
	rankLinkPD:         "link.pdMu",
}

func (r lockRank) String() string { return rankNames[r] }

// A ranker names a rank by its type, so that a mutex's rank costs no memory and
// no instruction in a build without the tag.
type ranker interface{ rank() lockRank }

type (
	engineSetRank   struct{}
	lgCreateRank    struct{}
	connTxRank      struct{}
	connRxRank      struct{}
	connCDCRank     struct{}
	groupAddRank    struct{}
	groupFlowRank   struct{}
	linkPollRank    struct{}
	linkCreditRank  struct{}
	linkUseRank     struct{}
	linkPostRank    struct{}
	connRank        struct{}
	groupRank       struct{}
	engineRank      struct{}
	linkPendingRank struct{}
	linkPDRank      struct{}
)

func (engineSetRank) rank() lockRank   { return rankEngineSet }
func (lgCreateRank) rank() lockRank    { return rankEngineLGCreate }
func (connTxRank) rank() lockRank      { return rankConnTx }
func (connRxRank) rank() lockRank      { return rankConnRx }
func (connCDCRank) rank() lockRank     { return rankConnCDC }
func (groupAddRank) rank() lockRank    { return rankGroupAdd }
func (groupFlowRank) rank() lockRank   { return rankGroupFlow }
func (linkPollRank) rank() lockRank    { return rankLinkPoll }
func (linkCreditRank) rank() lockRank  { return rankLinkCredit }
func (linkUseRank) rank() lockRank     { return rankLinkUse }
func (linkPostRank) rank() lockRank    { return rankLinkPost }
func (connRank) rank() lockRank        { return rankConn }
func (groupRank) rank() lockRank       { return rankGroup }
func (engineRank) rank() lockRank      { return rankEngine }
func (linkPendingRank) rank() lockRank { return rankLinkPending }
func (linkPDRank) rank() lockRank      { return rankLinkPD }

// lockBefore checks, with the tag, that R's mutex m may be taken now; it
// returns the goroutine's ID for lockAfter.
func lockBefore[R ranker](m any) uint64 {
	if !lockrankOn {
		return 0
	}
	var r R
	return lockOrder(r.rank(), m)
}

// lockAfter records, with the tag, that goroutine g holds R's mutex m.
func lockAfter[R ranker](g uint64, m any) {
	if lockrankOn {
		var r R
		lockHeld(g, r.rank(), m)
	}
}

// lockGone records, with the tag, that m is let go.
func lockGone(m any) {
	if lockrankOn {
		lockFreed(m)
	}
}

// mutex is a sync.Mutex of rank R.
type mutex[R ranker] struct{ m sync.Mutex }

func (m *mutex[R]) Lock() {
	g := lockBefore[R](m)
	m.m.Lock()
	lockAfter[R](g, m)
}

// TryLock takes m if it is free; no wait, so no order to keep.
func (m *mutex[R]) TryLock() bool {
	ok := m.m.TryLock()
	if ok {
		lockAfter[R](goid(), m)
	}
	return ok
}

func (m *mutex[R]) Unlock() {
	lockGone(m)
	m.m.Unlock()
}

// rwMutex is a sync.RWMutex of rank R; a read hold keeps the order as a write
// hold does.
type rwMutex[R ranker] struct{ m sync.RWMutex }

func (m *rwMutex[R]) Lock() {
	g := lockBefore[R](m)
	m.m.Lock()
	lockAfter[R](g, m)
}

func (m *rwMutex[R]) Unlock() {
	lockGone(m)
	m.m.Unlock()
}

func (m *rwMutex[R]) RLock() {
	g := lockBefore[R](m)
	m.m.RLock()
	lockAfter[R](g, m)
}

func (m *rwMutex[R]) RUnlock() {
	lockGone(m)
	m.m.RUnlock()
}
