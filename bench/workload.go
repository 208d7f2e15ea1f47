// Workloads: what a benchmark client asks of its server over any net.Conn, and
// the timing of each. Shared by every scenario so only the transport differs
// (RFC 7609 §4: the data path an SMC-R connection replaces TCP's with).

package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/smcr-io/smcr/internal/drain"
	"github.com/smcr-io/smcr/internal/nstest"
)

// Each connection starts with a 9-byte request header:
//
//	 0      1                               9
//	+------+-------------------------------+
//	|  op  |  argument (64 bits, big-endian)|
//	+------+-------------------------------+
//
//	op 'T' sink:  the server reads argument bytes, then answers one byte
//	   'E' echo:  the server echoes every byte until EOF (argument unused)
//	   'S' setup: the server answers one byte, then waits for EOF
const (
	opSink   = 'T'
	opEcho   = 'E'
	opSetup  = 'S'
	hdrLen   = 9
	argOff   = 1
	copyBuf  = 256 << 10
	warmupRT = 50 // round trips run before the timed ones
)

var errBadOp = errors.New("bench: unknown request")

// serve answers one benchmark connection; it closes c.
func serve(c net.Conn) error {
	defer c.Close()
	var hdr [hdrLen]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return fmt.Errorf("bench: read request: %w", err)
	}
	arg := binary.BigEndian.Uint64(hdr[argOff:])
	switch hdr[0] {
	case opSink:
		if _, err := drain.N(c, int64(arg), make([]byte, copyBuf)); err != nil {
			return fmt.Errorf("bench: sink: %w", err)
		}
		_, err := c.Write(hdr[:1])
		return err
	case opEcho:
		buf := make([]byte, copyBuf)
		_, err := io.CopyBuffer(c, c, buf)
		return err
	case opSetup:
		if _, err := c.Write(hdr[:1]); err != nil {
			return err
		}
		_, err := io.Copy(io.Discard, c)
		return err
	}
	return fmt.Errorf("%w %q", errBadOp, hdr[0])
}

func request(c net.Conn, op byte, arg uint64) error {
	var hdr [hdrLen]byte
	hdr[0] = op
	binary.BigEndian.PutUint64(hdr[argOff:], arg)
	_, err := c.Write(hdr[:])
	return err
}

// dialer opens one connection of the scenario's transport.
type dialer func(ctx context.Context) (net.Conn, error)

// throughput writes total bytes in writes of size bytes over one connection and
// returns the elapsed time until the server has read them all.
func throughput(ctx context.Context, dial dialer, size int, total int64) (time.Duration, error) {
	c, err := dial(ctx)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if err := request(c, opSink, uint64(total)); err != nil {
		return 0, fmt.Errorf("bench: sink request: %w", err)
	}
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i)
	}
	start := time.Now()
	for sent := int64(0); sent < total; {
		n := min(int64(size), total-sent)
		if _, err := c.Write(buf[:n]); err != nil {
			return 0, fmt.Errorf("bench: send: %w", err)
		}
		sent += n
	}
	if _, err := io.ReadFull(c, buf[:1]); err != nil {
		return 0, fmt.Errorf("bench: wait for the sink: %w", err)
	}
	return time.Since(start), nil
}

// latency runs n request/response round trips of msg bytes after a warm-up.
func latency(ctx context.Context, dial dialer, msg, n int) ([]time.Duration, error) {
	c, err := dial(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if err := request(c, opEcho, 0); err != nil {
		return nil, fmt.Errorf("bench: echo request: %w", err)
	}
	if _, err := nstest.PingPong(c, msg, warmupRT); err != nil {
		return nil, err
	}
	return nstest.PingPong(c, msg, n)
}

// setup dials n connections one after another and returns each one's time from
// dial to the server's one-byte answer. fresh, when not nil, is called before each
// dial (outside the timing) to get a dialer with no state shared with the
// previous ones: for SMC-R, a new engine, so every connection is a first contact.
func setup(ctx context.Context, dial dialer, fresh func() (dialer, func(), error), n int) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	var one [1]byte
	for range n {
		d, done := dial, func() {}
		if fresh != nil {
			var err error
			if d, done, err = fresh(); err != nil {
				return out, err
			}
		}
		start := time.Now()
		c, err := d(ctx)
		if err == nil {
			if err = request(c, opSetup, 0); err == nil {
				_, err = io.ReadFull(c, one[:])
			}
		}
		elapsed := time.Since(start)
		if c != nil {
			c.Close()
		}
		done()
		if err != nil {
			return out, fmt.Errorf("bench: setup: %w", err)
		}
		out = append(out, elapsed)
	}
	return out, nil
}

// scaleResult is what one scale step measured.
type scaleResult struct {
	Opened   int           // connections that were set up
	Failed   int           // dials that failed
	SetupIn  time.Duration // wall time to open all of them
	SendIn   time.Duration // wall time for all of them to send their share
	Bytes    int64         // bytes sent in all
	FirstErr string        `json:",omitempty"`
}

// scale opens n connections (at most par dials at once), then has every one of
// them send per bytes at the same time, timed until every server has read its
// share (on the transparent path a write returns once the local smcrd has the
// bytes, so the writes alone would time nothing but a socket buffer), and closes
// them. sent runs after every server has read its share and before the
// connections close, to sample memory with every buffer touched (shm and soft
// map a buffer's pages only when they are first written).
func scale(ctx context.Context, dial dialer, n, par int, per int64, sent func()) scaleResult {
	var r scaleResult
	conns := make([]net.Conn, n)
	errs := make([]error, n)
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			c, err := dial(ctx)
			if err == nil {
				err = request(c, opSink, uint64(per))
				if err != nil {
					c.Close()
				}
			}
			conns[i], errs[i] = c, err
		}()
	}
	wg.Wait()
	r.SetupIn = time.Since(start)
	for i, err := range errs {
		if err != nil {
			r.Failed++
			if r.FirstErr == "" {
				r.FirstErr = err.Error()
			}
			conns[i] = nil
		}
	}
	r.Opened = n - r.Failed
	buf := make([]byte, min(per, 64<<10))
	var mu sync.Mutex
	start = time.Now()
	for _, c := range conns {
		if c == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var sent int64
			var err error
			for sent < per && err == nil {
				var k int
				k, err = c.Write(buf[:min(int64(len(buf)), per-sent)])
				sent += int64(k)
			}
			if err == nil {
				_, err = io.ReadFull(c, make([]byte, 1)) // the server has it all
			}
			mu.Lock()
			if err == nil {
				r.Bytes += sent
			} else if r.FirstErr == "" {
				r.FirstErr = err.Error()
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	r.SendIn = time.Since(start)
	if sent != nil {
		sent()
	}
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
	return r
}
