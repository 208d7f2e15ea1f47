// The responder side of a QP: executes the peer's requests in PSN order, checking
// remote access as an RNIC does (rkey in this QP's PD, bounds, permission) before a
// byte lands, so a peer reaches only what was registered for it (RFC 7609 §4.3).

package soft

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// errStopped ends a responder whose QP left RTS under it.
var errStopped = errors.New("soft: qp stopped")

// respond executes requests from the peer's stream c until it ends or fails.
// srcQPN and psn are what its hello named.
func (q *qp) respond(c net.Conn, srcQPN, psn uint32) {
	defer c.Close()
	select {
	case <-q.connected:
	case <-q.done:
		return
	}
	q.mu.Lock()
	delete(q.pendingIn, c)
	if srcQPN != q.remote.QPN || psn != q.remote.PSN || q.in != nil && q.in != c {
		// A stream from some QP we are not connected to (or a second one from
		// ours): refuse it, keep ours.
		q.log.Warn("soft: inbound stream from the wrong qp", "from", srcQPN, "psn", psn, "want", q.remote.QPN)
		q.mu.Unlock()
		return
	}
	q.in = c
	expected := q.remote.PSN
	q.mu.Unlock()

	br, bw := bufio.NewReaderSize(c, bufSize), bufio.NewWriterSize(c, 4096)
	bounce := make([]byte, bufSize) // WRITE payloads on their way to memory (place)
	hb := make([]byte, headerLen)
	var h header
	rnrPending := false
	for {
		if br.Buffered() == 0 && bw.Buffered() > 0 {
			if bw.Flush() != nil {
				return // the peer's requester side is gone; our ackLoop reports it
			}
		}
		if _, err := io.ReadFull(br, hb); err != nil {
			return
		}
		if err := parseHeader(hb, &h); err != nil || !isRequest(h.typ) {
			q.fail(verbs.WCWRFlushErr, verbs.WCWRFlushErr, fmt.Errorf("soft: bad request (type %d): %v", h.typ, err), false)
			return
		}
		if h.psn != expected {
			if rnrPending {
				// Go-back-N after an RNR NAK: drop until the refused PSN comes again.
				if _, err := br.Discard(int(h.length)); err != nil {
					return
				}
				continue
			}
			q.fail(verbs.WCWRFlushErr, verbs.WCWRFlushErr, fmt.Errorf("soft: request psn %#x, expected %#x", h.psn, expected), false)
			return
		}
		rnrPending = false
		syndrome, err := q.execute(br, &h, bounce)
		if err != nil {
			if !errors.Is(err, errStopped) {
				q.fail(verbs.WCWRFlushErr, verbs.WCWRFlushErr, fmt.Errorf("soft: inbound stream: %w", err), false)
			}
			return
		}
		if syndrome == 0 || syndrome == nakRNR {
			resp := header{typ: frameAck, psn: h.psn}
			if syndrome == nakRNR {
				resp.typ, resp.syndrome = frameNak, nakRNR
				rnrPending = true
			} else {
				expected = (expected + 1) & psnMask
			}
			resp.put(hb)
			if _, err := bw.Write(hb); err != nil {
				return
			}
			continue
		}
		// Access and length errors put this QP in ERROR as an RNIC's responder
		// does: first, so its completions carry this cause and not the peer's
		// reaction; then the NAK goes out, and the stream is drained so the NAK is
		// read before the connection closes.
		recvSt := verbs.WCWRFlushErr
		if syndrome == nakInvReq {
			recvSt = verbs.WCLocLenErr
		}
		q.fail(verbs.WCWRFlushErr, recvSt, fmt.Errorf("soft: refused request psn %#x (nak %d)", h.psn, syndrome), true)
		(&header{typ: frameNak, syndrome: syndrome, psn: h.psn}).put(hb)
		if _, err := bw.Write(hb); err != nil || bw.Flush() != nil {
			return
		}
		for {
			if _, err := br.Discard(bufSize); err != nil {
				return
			}
		}
	}
}

// execute performs one request whose header is h and whose payload follows in br.
// It returns 0 to ACK, a NAK syndrome (the payload then discarded), or an error
// when the stream broke or the QP stopped.
func (q *qp) execute(br *bufio.Reader, h *header, bounce []byte) (uint8, error) {
	var recv recvSlot
	var ridx uint64
	if h.typ == frameWrite {
		// A QP that left RTS executes nothing more, WRITEs still buffered from the
		// stream included, as an RNIC's: the engine relies on it when it moves a
		// connection to another link and rewrites the bytes.
		select {
		case <-q.done:
			return 0, errStopped
		default:
		}
	} else {
		q.mu.Lock()
		if q.state != verbs.QPRTS {
			q.mu.Unlock()
			return 0, errStopped
		}
		if q.rqHead == q.rqTail {
			q.mu.Unlock()
			return nakRNR, discard(br, h.length)
		}
		ridx = q.rqHead
		recv = q.rq[ridx%uint64(len(q.rq))]
		q.mu.Unlock()
	}
	switch h.typ {
	case frameWrite, frameWriteImm:
		// A zero-length write names no memory, so its rkey is not checked (as IB).
		if h.length > 0 {
			dst, ok := q.pd.lookup(h.rkey, h.addr, h.length)
			if !ok {
				return nakRemAccess, discard(br, h.length)
			}
			if err := q.place(br, dst, bounce, dmaCopy); err != nil {
				return 0, err
			}
		}
	case frameSend:
		if int(h.length) > recv.length {
			return nakInvReq, discard(br, h.length)
		}
		// Into the receive buffers as a WRITE lands (place): a receive flushed
		// when the QP failed is the user's again, and gets no bytes after.
		left := int(h.length)
		for _, s := range recv.sg {
			if left == 0 {
				break
			}
			k := min(left, s.Length)
			if err := q.place(br, s.MR.(*mr).buf[s.Offset:s.Offset+k], bounce, visibleCopy); err != nil {
				return 0, err
			}
			left -= k
		}
	}
	if h.typ == frameWrite {
		return 0, nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.state != verbs.QPRTS || q.rqHead != ridx {
		return 0, errStopped // flushed meanwhile
	}
	wc := verbs.WorkCompletion{ID: recv.id, Status: verbs.WCSuccess, Opcode: verbs.WCRecv, ByteLen: h.length, QPN: q.qpn}
	if h.typ == frameWriteImm {
		wc.Opcode, wc.Imm, wc.HasImm = verbs.WCRecvRDMAImm, h.imm, true
	}
	q.rcq.push(wc)
	q.rqHead++
	return 0, nil
}

func discard(br *bufio.Reader, n uint32) error {
	_, err := br.Discard(int(n))
	return err
}

// place reads a WRITE's payload from br into dst, registered memory, as an
// adapter's DMA writes it: through bounce, a piece at a time, each piece copied
// under execMu and only while the QP is in RTS. Nothing lands once the QP has
// entered ERROR (failLocked waits for a piece being copied), Close included: the
// engine relies on it when the peer moves a
// connection to another link and rewrites its bytes there, where a WRITE late
// over the failed link would land on them (Conn.fenceMovedFrom). And the copy,
// like an adapter's DMA or shm's memcpy, is not one the race detector sees:
// registered memory is ordered by the verbs protocol (completions, and SMC-R's
// cursors above it), not by Go's memory model, and the same bytes written over
// two links at once during such a move would read as a data race. A SEND's
// payload goes into the receive buffer with a copy the detector sees (cp): a
// receive buffer belongs to one receive at a time, which the detector checks.
func (q *qp) place(br *bufio.Reader, dst, bounce []byte, cp func(dst, src []byte)) error {
	for len(dst) > 0 {
		k := min(len(dst), len(bounce))
		if _, err := io.ReadFull(br, bounce[:k]); err != nil {
			return err
		}
		if h := testHookPlace.Load(); h != nil {
			(*h)(q)
		}
		q.execMu.RLock()
		if q.execOff {
			q.execMu.RUnlock()
			return errStopped
		}
		cp(dst, bounce[:k])
		q.execMu.RUnlock()
		dst = dst[k:]
	}
	return nil
}

func visibleCopy(dst, src []byte) { copy(dst, src) }

// testHookPlace runs in place when a piece of a WRITE has been read, before it
// is copied.
var testHookPlace atomic.Pointer[func(*qp)]
