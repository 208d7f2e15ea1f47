// Package smcr is a user-space SMC-R endpoint (RFC 7609): an Engine (NewEngine)
// whose Dial and Listen return a net.Conn and a net.Listener. Their bytes move over
// RDMA once a CLC handshake on the TCP connection has agreed on it, and over that
// same TCP connection otherwise.
// They keep those interfaces' contracts as a TCP connection does, whichever way
// the bytes go (contract_test.go runs x/net's net.Conn conformance suite and
// net/http over them): a deadline's error wraps os.ErrDeadlineExceeded, also
// once a connection continued over TCP after its last link failed; a Dial whose
// context ends during CLC fails with the context's error; Dial and Listen take
// tcp, tcp4 and tcp6 only.
//
// The files follow the sublayers of the Linux implementation, so a reader of the
// RFC finds each concept by name:
//
//	engine.go     Engine: devices, memory budget, link groups, the connection table
//	config.go     Config: the knobs of an Engine and their defaults
//	clock.go      the engine's clock (Config.Clock), and what stays real time
//	lockrank.go   the lock order over Conn, link, linkGroup and Engine, checked under -tags lockrank
//	prefix.go     the subnet a Proposal names, cached per namespace     ← smc_clc_prfx_set
//	clc.go        CLC handshake as client and server (§3.5, §3.7)       ← smc_clc
//	setup.go      a setup's buffers in max_memory, activation, undoing  ← smc_conn_create, smc_buf_create
//	ext.go        the SMCX provider-choice extension (docs/protocol.md)
//	fallback.go   the one place a connection becomes plain TCP          ← smc_switch_to_fallback
//	linkgroup.go  link groups, their reuse and idle expiry (§3.3, §3.4) ← smc_core
//	link.go       a link: its QP and buffers, created, failed, freed    ← smcr_link_init, smcr_link_clear
//	wr.go         work requests and completions: slots, credits, poller ← smc_wr
//	llc.go        LLC messages: CONFIRM_LINK, RKEYs, TEST_LINK (§3.8)   ← smc_llc
//	multilink.go  the second link: ADD_LINK, load balancing, failover   ← smc_llc_*_add_link, smc_switch_conns
//	resync.go     continuation over TCP once the last link fails        (docs/protocol.md)
//	bufpool.go    RMBs and send buffers reused by a group's connections ← smc_buf_get_slot
//	cdc.go        CDC messages and their validation (§3.9)              ← smc_cdc
//	tx.go, rx.go  data over the RMBEs, cursors, the 10% rule (§4)       ← smc_tx, smc_rx
//	cursors.go    cursor-driven Conns: the application fills and empties the buffers itself
//	urgent.go     urgent data (MSG_OOB): a mark in the stream (§4.2)    ← smc_cdc_handle_urg_data_arrival
//	close.go      sending done, closed, abort (§4.4)                    ← smc_close
//	conn.go       the net.Conn, its fields by concern, its Linux state
//	stats.go      counters for smcrctl                                  ← smc_stats
//
// Outbound flow: the functions one byte of a Conn.Write passes on its way into the
// peer's RMB.
//
//  1. Conn.Write (conn.go) hands the bytes to smcWrite (tx.go).
//  2. smcWrite waits for room in the peer's RMBE (Conn.tx, an rmb.Producer: Free),
//     finds where the bytes go (rmb.AppendSpans), and copies them into the
//     send buffer at the same offsets: it mirrors the peer's RMBE.
//  3. sendChunk (tx.go) counts them in the producer cursor and builds the CDC that announces
//     them (nextCDCLocked, cdc.go).
//  4. link.postData (wr.go) takes a send slot and work-request credits (acquire),
//     encodes the CDC into the slot (fillCDC) and posts one chain: an RDMA WRITE
//     per span (writeWR), then the CDC's SEND (slotWR). RC runs the chain in order,
//     so the peer holds the bytes before it takes the CDC.
//  5. The completions come back to link.complete (wr.go) on the link's poller:
//     a WRITE's gives its credit back and is counted done (Conn.writeDone,
//     close.go); the CDC's gives its slot back and records that the peer holds
//     the bytes it announced (Conn.cdcDone, multilink.go), which a move to
//     another link needs.
//  6. The peer's CDC that moves its consumer cursor (inbound flow, step 3) moves
//     tx's peer consumer cursor, and the room in the peer's RMBE comes back to a waiting Write
//     (txWake).
//
// Inbound flow: the functions one byte passes from the peer's RDMA WRITE to a
// Conn.Read.
//
//  1. The peer's adapter writes the bytes into our RMB: no completion here. The
//     CDC behind them arrives in one of the link's receive slots (postRecv, wr.go).
//  2. The link's poller (link.poll, wr.go), or a reader driving the link itself
//     (Conn.drive, rx.go), polls the completion queue: link.handle, then
//     link.complete, which hands a CDC to link.onCDC and an LLC message to
//     earlyLLC or the link's worker (llc.go).
//  3. link.onCDC finds the connection by alert token; Conn.onCDC (cdc.go) checks
//     the cursors against the rings (applyCursors: Conn.rx, an rmb.Consumer, and
//     Conn.tx), takes them and wakes the reader (rxWake).
//  4. Conn.Read (conn.go) calls smcRead (rx.go), which copies the readable bytes
//     from the RMB (rx.Spans), stopping before an urgent byte (urgent.go), and
//     consumes them (rx.Consume).
//  5. Once a tenth of the RMBE is free again (rx.UpdateDue), smcRead sends the consumer cursor
//     back to the peer: sendCursors, sendCDCKind (cdc.go), link.sendConnCDC
//     (wr.go). The peer's Write may fill that room again.
//
// Each link's completions are handled by one goroutine at a time: the link's
// poller, or a Read waiting for bytes on that link, which polls the completion
// queue itself for up to Config.ReadSpin while the poller steps aside (rx.go,
// Conn.drive). The CDC a reader waits for is then handled on its own goroutine,
// with no hand-off; everything else (LLC, writers' space, other connections) is
// handled the same way by whoever holds the turn.
//
// Cursors are kept internally as absolute byte counts (uint64) and are converted to
// the wire's (wrap, count) pair only at the CDC boundary; the conversion back checks
// every peer value against what the ring can hold.
package smcr
