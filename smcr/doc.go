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
//	clc.go        CLC handshake as client and server (§3.5, §3.7)      ← smc_clc
//	ext.go        the SMCX provider-choice extension (docs/protocol.md)
//	fallback.go   the one place a connection becomes plain TCP          ← smc_switch_to_fallback
//	linkgroup.go  link groups, their reuse and idle expiry (§3.3, §3.4) ← smc_core
//	link.go       a link: its QP and buffers, created, failed, freed    ← smcr_link_init, smcr_link_clear
//	wr.go         work requests and completions: slots, credits, poller ← smc_wr
//	llc.go        LLC messages: CONFIRM_LINK, RKEYs, TEST_LINK (§3.8)   ← smc_llc
//	multilink.go  the second link: ADD_LINK, load balancing, failover   ← smc_llc_*_add_link, smc_switch_conns
//	cdc.go        CDC messages and their validation (§3.9)              ← smc_cdc
//	tx.go, rx.go  data over the RMBEs, cursors, the 10% rule (§4)       ← smc_tx, smc_rx
//	close.go      sending done, closed, abort (§4.4)                    ← smc_close
//	conn.go       the net.Conn and its state machine
//	stats.go      counters for smcrctl                                  ← smc_stats
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
