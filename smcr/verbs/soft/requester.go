// The requester side of a QP: transmits send work requests in order and retires
// them as ACKs arrive, retrying after receiver-not-ready NAKs (RFC 7609 §2.1 relies
// on RC's reliable, in-order delivery; the retry rules are ibverbs').

package soft

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"time"

	"github.com/smcr-io/smcr/smcr/verbs"
)

func randPSN() uint32 { return rand.Uint32N(psnMask + 1) }

// psnOf returns the PSN of the send work request with index i.
func (q *qp) psnOf(i uint64) uint32 { return (q.psn + uint32(i)) & psnMask }

func frameType(op verbs.Opcode) uint8 {
	switch op {
	case verbs.OpWrite:
		return frameWrite
	case verbs.OpWriteImm:
		return frameWriteImm
	}
	return frameSend
}

// sendLoop writes send work requests to the outbound stream, from sqNext on.
// It flushes whenever it runs out of work, so a burst becomes few syscalls.
func (q *qp) sendLoop(c net.Conn) {
	bw := bufio.NewWriterSize(c, bufSize)
	hb := make([]byte, headerLen)
	var sg []verbs.SGE // the request's SGEs, copied out of its slot
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	n := uint64(len(q.sq))
	for {
		q.mu.Lock()
		for {
			if q.state != verbs.QPRTS {
				q.mu.Unlock()
				return
			}
			if q.sqNext < q.sqTail {
				wait := time.Until(q.rnrUntil)
				if wait <= 0 {
					break
				}
				q.mu.Unlock()
				if bw.Flush() == nil {
					timer.Reset(wait)
					select {
					case <-timer.C:
					case <-q.done:
					}
				}
				q.mu.Lock()
				continue
			}
			q.mu.Unlock()
			if err := bw.Flush(); err != nil {
				q.fail(verbs.WCRetryExcErr, verbs.WCWRFlushErr, fmt.Errorf("soft: send: %w", err), false)
				return
			}
			select {
			case <-q.kick:
			case <-q.done:
			}
			q.mu.Lock()
		}
		idx := q.sqNext
		q.sqNext++
		s := q.sq[idx%n]
		sg = append(sg[:0], s.sg...)
		more := q.sqNext < q.sqTail
		q.mu.Unlock()

		// The SGEs are copied: a peer may ACK a request before it has all of
		// it (a hostile one; a true one cannot), and PostSend reuses a slot
		// from its completion on. The regions they name stay valid memory
		// (Go's), and a request's bytes go only to the peer that asked for
		// them early; a failing QP waits for txMu before it flushes.
		h := header{typ: frameType(s.op), psn: q.psnOf(idx), length: s.length}
		if s.op != verbs.OpSend {
			h.addr, h.rkey = s.addr, s.rkey
		}
		if s.op == verbs.OpWriteImm {
			h.imm = s.imm
		}
		h.put(hb)
		q.txMu.Lock()
		if q.txOff {
			q.txMu.Unlock()
			return // failed meanwhile: the request completed flushed
		}
		_, err := bw.Write(hb)
		for _, sge := range sg {
			if err != nil {
				break
			}
			_, err = bw.Write(sge.MR.(*mr).buf[sge.Offset : sge.Offset+sge.Length])
		}
		q.txMu.Unlock()
		if err == nil && !more {
			err = bw.Flush()
		}
		if err != nil {
			q.fail(verbs.WCRetryExcErr, verbs.WCWRFlushErr, fmt.Errorf("soft: send: %w", err), false)
			return
		}
	}
}

// ackLoop reads ACKs and NAKs from the outbound stream and completes the oldest
// outstanding work request with each. The stream ending means the peer is gone.
func (q *qp) ackLoop(c net.Conn) {
	br := bufio.NewReaderSize(c, 4096)
	hb := make([]byte, headerLen)
	var h header
	n := uint64(len(q.sq))
	for {
		if _, err := io.ReadFull(br, hb); err != nil {
			q.fail(verbs.WCRetryExcErr, verbs.WCWRFlushErr, fmt.Errorf("soft: peer gone: %w", err), false)
			return
		}
		if err := parseHeader(hb, &h); err != nil || (h.typ != frameAck && h.typ != frameNak) {
			q.fail(verbs.WCGeneralErr, verbs.WCWRFlushErr, fmt.Errorf("soft: bad response (type %d): %v", h.typ, err), false)
			return
		}
		q.mu.Lock()
		if q.state != verbs.QPRTS {
			q.mu.Unlock()
			return
		}
		if q.sqHead >= q.sqNext || h.psn != q.psnOf(q.sqHead) {
			q.failLocked(verbs.WCGeneralErr, verbs.WCWRFlushErr,
				fmt.Errorf("soft: response for psn %#x, expected %#x", h.psn, q.psnOf(q.sqHead)), false)
			q.mu.Unlock()
			return
		}
		s := &q.sq[q.sqHead%n]
		if h.typ == frameAck {
			if s.signaled {
				q.scq.push(verbs.WorkCompletion{ID: s.id, Status: verbs.WCSuccess, Opcode: wcOpcode(s.op), QPN: q.qpn})
			}
			q.sqHead++
			q.mu.Unlock()
			continue
		}
		switch h.syndrome {
		case nakRNR:
			s.rnr++
			if q.rnrRetry < 7 && s.rnr > q.rnrRetry {
				q.failLocked(verbs.WCRNRRetryExcErr, verbs.WCWRFlushErr, fmt.Errorf("soft: receiver not ready %d times", s.rnr), false)
				break
			}
			// Go back to the refused request; the responder drops what followed it.
			q.sqNext = q.sqHead
			q.rnrUntil = time.Now().Add(q.dev.cfg.RNRTimer)
			select {
			case q.kick <- struct{}{}:
			default:
			}
		case nakRemAccess:
			q.failLocked(verbs.WCRemAccessErr, verbs.WCWRFlushErr, fmt.Errorf("soft: remote access error"), false)
		case nakInvReq:
			q.failLocked(verbs.WCRemInvReqErr, verbs.WCWRFlushErr, fmt.Errorf("soft: remote invalid request"), false)
		default:
			q.failLocked(verbs.WCRemOpErr, verbs.WCWRFlushErr, fmt.Errorf("soft: remote operation error"), false)
		}
		q.mu.Unlock()
	}
}
