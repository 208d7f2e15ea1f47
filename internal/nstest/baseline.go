// Baselines: plain TCP over the veth pair, measured in the same run as the figure it
// is compared with (these VMs are noisy; only ratios within one run mean anything).

package nstest

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/smcr-io/smcr/internal/drain"
)

// TCPThroughput sends total bytes in writes of size bytes from A to B over TCP and
// returns bytes per second, timed until B has received the last byte.
func (p *Pair) TCPThroughput(size int, total int64) (float64, error) {
	ln, err := p.B.Listen("tcp", netip.AddrPortFrom(p.B.Addr4(), 0).String())
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		if _, err := drain.N(c, total, make([]byte, 256<<10)); err != nil {
			done <- fmt.Errorf("nstest: receive: %w", err)
			return
		}
		_, err = c.Write([]byte{1})
		done <- err
	}()
	c, err := p.A.Dial("tcp", ln.Addr().String())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	buf := make([]byte, size)
	start := time.Now()
	for sent := int64(0); sent < total; {
		n := int64(size)
		if total-sent < n {
			n = total - sent
		}
		if _, err := c.Write(buf[:n]); err != nil {
			return 0, fmt.Errorf("nstest: send: %w", err)
		}
		sent += n
	}
	if _, err := io.ReadFull(c, buf[:1]); err != nil {
		return 0, fmt.Errorf("nstest: wait for receiver: %w", err)
	}
	elapsed := time.Since(start)
	if err := <-done; err != nil {
		return 0, err
	}
	return float64(total) / elapsed.Seconds(), nil
}

// TCPPingPong bounces a msg-byte message n times between A and B over one TCP
// connection and returns each round trip's duration.
func (p *Pair) TCPPingPong(msg, n int) ([]time.Duration, error) {
	ln, err := p.B.Listen("tcp", netip.AddrPortFrom(p.B.Addr4(), 0).String())
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c) // echo until the client closes
	}()
	c, err := p.A.Dial("tcp", ln.Addr().String())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	return PingPong(c, msg, n)
}

// PingPong writes a msg-byte message to an echoing peer and reads it back, n times,
// and returns each round trip's duration. Any stream transport can be measured.
func PingPong(c io.ReadWriter, msg, n int) ([]time.Duration, error) {
	out, in := make([]byte, msg), make([]byte, msg)
	rtts := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		out[0] = byte(i)
		start := time.Now()
		if _, err := c.Write(out); err != nil {
			return rtts, fmt.Errorf("nstest: ping: %w", err)
		}
		if _, err := io.ReadFull(c, in); err != nil {
			return rtts, fmt.Errorf("nstest: pong: %w", err)
		}
		rtts = append(rtts, time.Since(start))
		if in[0] != out[0] {
			return rtts, fmt.Errorf("nstest: pong %d carried %d", i, in[0])
		}
	}
	return rtts, nil
}

// Median returns the median of v (the upper one of an even count), 0 for none;
// v is left as it is.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// Percentile returns the p-th percentile (0..100) of d, nearest rank; d is sorted in place.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := int(p/100*float64(len(d))+0.5) - 1
	return d[max(0, min(i, len(d)-1))]
}

// TCPPair returns both ends of a TCP connection over loopback in the caller's
// namespace, closed at cleanup.
func TCPPair(t testing.TB) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}
