// The client: runs every measurement -runs times, interleaved, and prints medians
// with min and max, then the ratios issue 3 sets goals for (WRITE against memcpy
// and TCP, ping-pong against TCP).

package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/smcr-io/smcr/internal/nstest"
	"github.com/smcr-io/smcr/smcr/verbs/verbstest"
)

// figure is one line of the report: a name, a unit and a sample per run.
type figure struct {
	name, unit string
	samples    []float64
}

// report keeps figures in the order they were first measured.
type report struct {
	figs []*figure
}

func (r *report) add(name, unit string, v float64) {
	for _, f := range r.figs {
		if f.name == name {
			f.samples = append(f.samples, v)
			return
		}
	}
	r.figs = append(r.figs, &figure{name: name, unit: unit, samples: []float64{v}})
}

func (r *report) median(name string) (float64, bool) {
	for _, f := range r.figs {
		if f.name == name {
			return median(f.samples), true
		}
	}
	return 0, false
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// session is the client's end and control connection.
type session struct {
	e  *end
	c  net.Conn
	br *bufio.Reader
	o  options
}

func client(c net.Conn, o options, out io.Writer) error {
	region := max(slices.Max(o.sizes), 4096)
	local, err := localAddr(c)
	if err != nil {
		return err
	}
	e, err := newEnd(o, local, region)
	if err != nil {
		return err
	}
	defer e.Close()
	s := &session{e: e, c: c, br: bufio.NewReader(c), o: o}
	if err := writeLine(c, e.hello(o.provider, region)); err != nil {
		return err
	}
	var peer hello
	if err := readLine(s.br, &peer); err != nil {
		return fmt.Errorf("read server hello: %w", err)
	}
	if peer.Err != "" {
		return fmt.Errorf("server: %s", peer.Err)
	}
	if err := e.connect(peer.QP); err != nil {
		return err
	}
	// Warm up: the first WRITE to a region may set up a mapping (shm) and touches
	// its pages; the ping-pong commands warm up with one unmeasured round trip each.
	for _, size := range o.sizes {
		if err := verbstest.WriteThroughput(e.qp, e.scq, e.mr, peer.Addr, peer.RKey, size, 1); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	var r report
	for range o.runs {
		if err := s.runOnce(&r, peer); err != nil {
			return err
		}
	}
	return r.print(out, o)
}

// runOnce takes every figure once.
func (s *session) runOnce(r *report, peer hello) error {
	for _, size := range s.o.sizes {
		count := int(max(1, s.o.bytes/int64(size)))
		total := int64(count) * int64(size)
		if s.o.baseline {
			r.add("memcpy/"+sizeName(size), "MB/s", mbps(total, memcpy(size, count)))
		}
		start := time.Now()
		if err := verbstest.WriteThroughput(s.e.qp, s.e.scq, s.e.mr, peer.Addr, peer.RKey, size, count); err != nil {
			return err
		}
		r.add("write/"+sizeName(size), "MB/s", mbps(total, time.Since(start)))
		if s.o.baseline {
			d, err := s.tcpThroughput(size, count)
			if err != nil {
				return err
			}
			r.add("tcp/"+sizeName(size), "MB/s", mbps(total, d))
		}
	}
	msg := verbstest.PingPongSize
	for _, busy := range []bool{true, false} {
		rtts, err := s.pingPong(busy)
		if err != nil {
			return err
		}
		mode := "wait"
		if busy {
			mode = "busy"
		}
		addLatency(r, fmt.Sprintf("send-pingpong/%dB/%s", msg, mode), rtts)
	}
	if s.o.baseline {
		rtts, err := s.tcpPingPong()
		if err != nil {
			return err
		}
		addLatency(r, fmt.Sprintf("tcp-pingpong/%dB", msg), rtts)
	}
	return nil
}

// ask sends a command; the caller then does its part and calls done.
func (s *session) ask(cmd command) error {
	if err := writeLine(s.c, cmd); err != nil {
		return fmt.Errorf("%s: send command: %w", cmd.Op, err)
	}
	return nil
}

// done waits for the server's reply to the last command.
func (s *session) done(op string) error {
	var r reply
	if err := readLine(s.br, &r); err != nil {
		return fmt.Errorf("%s: read reply: %w", op, err)
	}
	if r.Err != "" {
		return fmt.Errorf("%s: server: %s", op, r.Err)
	}
	return nil
}

func (s *session) pingPong(busy bool) ([]time.Duration, error) {
	n := s.o.pings
	if err := s.ask(command{Op: opEcho, N: n + 1, Busy: busy}); err != nil {
		return nil, err
	}
	pp := verbstest.PingPong
	if busy {
		pp = verbstest.BusyPingPong
	}
	e, size := s.e, verbstest.PingPongSize
	if _, err := pp(e.qp, e.scq, e.rcq, e.mr, size, 1); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	rtts, err := pp(e.qp, e.scq, e.rcq, e.mr, size, n)
	if err != nil {
		return nil, err
	}
	return rtts, s.done(opEcho)
}

// tcpThroughput sends count writes of size bytes on the control connection and
// returns the time until the server has read them all.
func (s *session) tcpThroughput(size, count int) (time.Duration, error) {
	total := int64(size) * int64(count)
	if err := s.ask(command{Op: opSink, Total: total}); err != nil {
		return 0, err
	}
	buf := make([]byte, size)
	start := time.Now()
	for range count {
		if _, err := s.c.Write(buf); err != nil {
			return 0, fmt.Errorf("tcp: %w", err)
		}
	}
	if err := s.done(opSink); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func (s *session) tcpPingPong() ([]time.Duration, error) {
	n, size := s.o.pings, verbstest.PingPongSize
	if err := s.ask(command{Op: opTCPEcho, N: n + 1, Size: size}); err != nil {
		return nil, err
	}
	rw := struct {
		io.Reader
		io.Writer
	}{s.br, s.c}
	if _, err := nstest.PingPong(rw, size, 1); err != nil {
		return nil, fmt.Errorf("tcp warm-up: %w", err)
	}
	rtts, err := nstest.PingPong(rw, size, n)
	if err != nil {
		return nil, err
	}
	return rtts, s.done(opTCPEcho)
}

// memcpy copies size bytes count times between two heap buffers, as
// verbstest.Bench's memcpy baseline does.
func memcpy(size, count int) time.Duration {
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault the pages in before timing
	start := time.Now()
	for range count {
		copy(dst, src)
	}
	return time.Since(start)
}

func addLatency(r *report, name string, rtts []time.Duration) {
	r.add(name+"/p50", "µs", float64(nstest.Percentile(rtts, 50).Nanoseconds())/1e3)
	r.add(name+"/p99", "µs", float64(nstest.Percentile(rtts, 99).Nanoseconds())/1e3)
}

func mbps(bytes int64, d time.Duration) float64 {
	return float64(bytes) / max(d.Seconds(), 1e-9) / 1e6
}

func sizeName(n int) string {
	switch {
	case n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// print writes the table of medians, then the ratios of medians.
func (r *report) print(out io.Writer, o options) error {
	fmt.Fprintf(out, "# verbsbench: provider %s, %d runs: median, min and max; %s per throughput figure, %d round trips per ping-pong\n",
		o.provider, o.runs, sizeName(int(o.bytes)), o.pings)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "benchmark\tmedian\tmin\tmax\tunit\t")
	for _, f := range r.figs {
		format := "%.1f"
		if f.unit == "µs" {
			format = "%.2f"
		}
		fmt.Fprintf(tw, "%s\t"+format+"\t"+format+"\t"+format+"\t%s\t\n",
			f.name, median(f.samples), slices.Min(f.samples), slices.Max(f.samples), f.unit)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !o.baseline {
		return nil
	}
	fmt.Fprintln(out, "# ratios of medians")
	ratio := func(name string, against ...string) {
		v, ok := r.median(name)
		if !ok {
			return
		}
		var parts []string
		for _, a := range against {
			if w, ok := r.median(a); ok && w > 0 && v > 0 {
				parts = append(parts, describeRatio(v, w, a, r.unit(name) == "µs"))
			}
		}
		if len(parts) > 0 {
			fmt.Fprintf(out, "%s: %s\n", name, strings.Join(parts, ", "))
		}
	}
	for _, size := range o.sizes {
		n := sizeName(size)
		ratio("write/"+n, "memcpy/"+n, "tcp/"+n)
	}
	msg := verbstest.PingPongSize
	for _, mode := range []string{"busy", "wait"} {
		for _, p := range []string{"p50", "p99"} {
			ratio(fmt.Sprintf("send-pingpong/%dB/%s/%s", msg, mode, p), fmt.Sprintf("tcp-pingpong/%dB/%s", msg, p))
		}
	}
	return nil
}

func (r *report) unit(name string) string {
	for _, f := range r.figs {
		if f.name == name {
			return f.unit
		}
	}
	return ""
}

// describeRatio says how v compares with w: "1.12x memcpy/64KiB" for throughput,
// and for latencies "1/20.7 of tcp-pingpong/64B/p50" when v is the smaller.
func describeRatio(v, w float64, against string, latency bool) string {
	if latency && v < w {
		return fmt.Sprintf("1/%.1f of %s", w/v, against)
	}
	return fmt.Sprintf("%.2fx %s", v/w, against)
}
