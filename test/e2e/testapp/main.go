// Command testapp is the static Go program the end-to-end tests run unmodified
// through smcrd's transparent path (RFC 7609 SMC-R underneath, plain TCP to it):
// a server that sinks or echoes, and a client that checks content hashes and
// measures throughput and request/response latency.
//
// Protocol on each connection: the client's first byte picks the mode.
//
//	'S' sink: the server reads to EOF, answers "<bytes> <sha256> <peer>\n", closes
//	'E' echo: the server writes back everything it reads, half-closes at EOF
//	'D' discard: the server reads to EOF and answers "<bytes>\n", closes: iperf3's
//	    shape, for throughput (sink's hashing would bound it at the hash's speed)
//	'U' urgent: the client sends data with urgent bytes (MSG_OOB) between; the
//	    server answers "mark <offset>\n" for each urgent byte where it finds it,
//	    and at EOF "<bytes> <sha256>\n" (urgent.go)
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/smcr-io/smcr/internal/drain"
)

func main() {
	listen := flag.String("listen", "", "serve on this address")
	connect := flag.String("connect", "", "connect to this address")
	mode := flag.String("mode", "sink", "client mode: sink, echo, discard, recv, pingpong or urgent")
	size := flag.Int64("bytes", 1<<20, "bytes per connection (sink, echo); message size (pingpong)")
	conns := flag.Int("conns", 1, "concurrent connections")
	rounds := flag.Int("n", 1000, "pingpong round trips")
	flag.DurationVar(&pingFor, "for", 0, "pingpong for this long, however many round trips that takes, rather than -n")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after this long")
	relayTo := flag.String("relay", "", "with -listen: carry each connection to this address, as smcrd's relay does (a baseline)")
	flag.BoolVar(&useSMC, "smc", false, "use Linux's AF_SMC sockets (the kernel's SMC) instead of TCP ones")
	flag.BoolVar(&useMPTCP, "mptcp", false, "connect with MPTCP sockets (IPPROTO_MPTCP) instead of TCP ones")
	flag.IntVar(&tos, "tos", 0, "set IP_TOS (IPV6_TCLASS for IPv6) on the client's sockets before they connect, or on the listener")
	flag.IntVar(&priority, "priority", 0, "set SO_PRIORITY on the client's sockets before they connect, or on the listener")
	flag.Parse()
	if *listen != "" && *relayTo != "" {
		serve(*listen, func(c net.Conn) { relay(c, *relayTo) })
		return
	}
	if *listen != "" {
		serve(*listen, handle)
		return
	}
	time.AfterFunc(*timeout, func() { fmt.Fprintln(os.Stderr, "testapp: timeout"); os.Exit(3) })
	res := client(*connect, *mode, *size, *conns, *rounds)
	json.NewEncoder(os.Stdout).Encode(res)
	if res.Errors > 0 {
		os.Exit(1)
	}
}

// useSMC: -smc, connections are Linux AF_SMC sockets (smc.go); useMPTCP:
// -mptcp, the client's are MPTCP sockets.
var useSMC, useMPTCP bool

// pingFor: -for, a pingpong's length in time: a test that watches the connection
// while it runs needs it there long enough, on a fast host as in a slow VM.
var pingFor time.Duration

// tos, priority: -tos, -priority, socket options set before connect or listen,
// as programs that mark their traffic do.
var tos, priority int

func dial(addr string) (net.Conn, error) {
	if useSMC {
		return dialSMC(addr)
	}
	d := net.Dialer{Control: mark}
	d.SetMultipathTCP(useMPTCP)
	return d.Dial("tcp", addr)
}

// mark sets -tos and -priority on a socket before it connects or listens (its
// accepted sockets inherit the class).
func mark(network, _ string, c syscall.RawConn) error {
	var errs []error
	err := c.Control(func(fd uintptr) {
		if tos != 0 && network == "tcp6" {
			errs = append(errs, syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IPV6, syscall.IPV6_TCLASS, tos))
		} else if tos != 0 {
			errs = append(errs, syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_TOS, tos))
		}
		if priority != 0 {
			errs = append(errs, syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_PRIORITY, priority))
		}
	})
	return errors.Join(append(errs, err)...)
}

// serve accepts connections on addr and runs handler on each.
func serve(addr string, handler func(net.Conn)) {
	listen := func(addr string) (net.Listener, error) {
		lc := net.ListenConfig{Control: mark}
		return lc.Listen(context.Background(), "tcp", addr)
	}
	if useSMC {
		listen = listenSMC
	}
	ln, err := listen(addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testapp:", err)
		os.Exit(2)
	}
	fmt.Println("listening", ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, "testapp: accept:", err)
			os.Exit(2)
		}
		go handler(c)
	}
}

func handle(c net.Conn) {
	defer c.Close()
	var m [1]byte
	if _, err := io.ReadFull(c, m[:]); err != nil {
		return
	}
	switch m[0] {
	case 'S':
		h := sha256.New()
		n, err := io.Copy(h, c)
		if err != nil {
			return
		}
		fmt.Fprintf(c, "%d %x %s\n", n, h.Sum(nil), c.RemoteAddr())
	case 'E':
		io.Copy(c, c)
		c.(*net.TCPConn).CloseWrite()
	case 'D':
		n, err := drain.All(c, make([]byte, 256<<10))
		if err != nil {
			return
		}
		fmt.Fprintf(c, "%d\n", n)
	case 'U':
		serveUrgent(c.(*net.TCPConn))
	}
}

// relay is a user-space TCP relay shaped like smcrd's (daemon/relay.go): two
// goroutines per connection copying through 256 KiB buffers, half-close carried.
// Two of them in a chain are the floor for any relay in user space: the
// benchmarks measure one beside smcrd, so what SMC-R itself adds shows.
func relay(c net.Conn, to string) {
	d, err := net.Dial("tcp", to)
	if err != nil {
		c.Close()
		return
	}
	half := func(dst, src *net.TCPConn) {
		io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, make([]byte, 256<<10))
		dst.CloseWrite()
	}
	done := make(chan struct{})
	go func() { half(d.(*net.TCPConn), c.(*net.TCPConn)); close(done) }()
	half(c.(*net.TCPConn), d.(*net.TCPConn))
	<-done
	c.Close()
	d.Close()
}

// Result is what the client prints, as JSON.
type Result struct {
	OK, Errors int
	Bytes      int64
	Seconds    float64
	MBps       float64
	Peers      []string // the address each sink connection's server saw
	Local      []string // each connection's local address as getsockname shows it
	Remote     []string // and its peer's as getpeername does
	P50us      float64
	P99us      float64
	Err        string `json:",omitempty"`
}

func client(addr, mode string, size int64, conns, rounds int) Result {
	var res Result
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			peer, local, remote, lat, err := one(addr, mode, size, rounds, uint64(i))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.Errors++
				res.Err = err.Error()
				return
			}
			res.OK++
			res.Bytes += size
			res.Local = append(res.Local, local)
			res.Remote = append(res.Remote, remote)
			if peer != "" {
				res.Peers = append(res.Peers, peer)
			}
			if len(lat) > 0 {
				slices.Sort(lat)
				res.P50us = float64(percentile(lat, 50).Nanoseconds()) / 1e3
				res.P99us = float64(percentile(lat, 99).Nanoseconds()) / 1e3
			}
		}()
	}
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()
	res.MBps = float64(res.Bytes) / res.Seconds / 1e6
	return res
}

// percentile is the p-th percentile of sorted, non-empty d by nearest rank, as
// nstest.Percentile reckons it for the benchmarks (which this static program
// does not link).
func percentile(d []time.Duration, p float64) time.Duration {
	i := int(p/100*float64(len(d))+0.5) - 1
	return d[max(0, min(i, len(d)-1))]
}

// payload is a deterministic pseudo-random stream per connection.
func payload(seed uint64) io.Reader {
	return &prng{r: rand.New(rand.NewPCG(seed, 42))}
}

// prng yields each 64-bit word's bytes in order, however the reads split
// them: a read shorter than a word keeps the word's rest for the next one.
type prng struct {
	r    *rand.Rand
	word [8]byte
	rest []byte // the unread tail of word
}

func (p *prng) Read(b []byte) (int, error) {
	n := 0
	for n < len(b) {
		if len(p.rest) == 0 {
			v := p.r.Uint64()
			for j := range 8 {
				p.word[j] = byte(v >> (8 * j))
			}
			p.rest = p.word[:]
		}
		k := copy(b[n:], p.rest)
		p.rest = p.rest[k:]
		n += k
	}
	return n, nil
}

func one(addr, mode string, size int64, rounds int, seed uint64) (peer, local, remote string, lat []time.Duration, err error) {
	c, err := dial(addr)
	if err != nil {
		return "", "", "", nil, err
	}
	defer c.Close()
	local, remote = c.LocalAddr().String(), c.RemoteAddr().String()
	tc := c.(*net.TCPConn)
	switch mode {
	case "sink":
		h := sha256.New()
		if _, err := c.Write([]byte{'S'}); err != nil {
			return "", local, remote, nil, err
		}
		buf := make([]byte, 256<<10)
		if _, err := io.CopyBuffer(io.MultiWriter(c, h), io.LimitReader(payload(seed), size), buf); err != nil {
			return "", local, remote, nil, fmt.Errorf("send: %w", err)
		}
		tc.CloseWrite()
		var n int64
		var sum, p string
		if _, err := fmt.Fscan(bufio.NewReader(c), &n, &sum, &p); err != nil {
			return "", local, remote, nil, fmt.Errorf("read answer: %w", err)
		}
		if want := hex.EncodeToString(h.Sum(nil)); n != size || sum != want {
			return p, local, remote, nil, fmt.Errorf("server got %d bytes %s, sent %d %s", n, sum, size, want)
		}
		return p, local, remote, nil, nil
	case "echo":
		if _, err := c.Write([]byte{'E'}); err != nil {
			return "", local, remote, nil, err
		}
		sent := sha256.New()
		errc := make(chan error, 1)
		go func() {
			_, err := io.Copy(io.MultiWriter(c, sent), io.LimitReader(payload(seed), size))
			tc.CloseWrite()
			errc <- err
		}()
		got := sha256.New()
		n, rerr := io.Copy(got, c)
		if err := <-errc; err != nil {
			return "", local, remote, nil, fmt.Errorf("send: %w", err)
		}
		if rerr != nil {
			return "", local, remote, nil, fmt.Errorf("receive: %w", rerr)
		}
		if n != size || !slices.Equal(got.Sum(nil), sent.Sum(nil)) {
			return "", local, remote, nil, fmt.Errorf("echo returned %d bytes of %d, or other content", n, size)
		}
		return "", local, remote, nil, nil
	case "recv":
		// Nothing sent: what the server writes, read to the end of the
		// stream, as netcat takes it for the end of the data.
		if n, err := io.Copy(io.Discard, c); err != nil {
			return "", local, remote, nil, fmt.Errorf("receive after %d bytes: %w", n, err)
		}
		return "", local, remote, nil, nil
	case "discard":
		if _, err := c.Write([]byte{'D'}); err != nil {
			return "", local, remote, nil, err
		}
		buf := make([]byte, 256<<10)
		io.ReadFull(payload(seed), buf)
		for left := size; left > 0; {
			n, err := c.Write(buf[:min(left, int64(len(buf)))])
			if err != nil {
				return "", local, remote, nil, fmt.Errorf("send: %w", err)
			}
			left -= int64(n)
		}
		tc.CloseWrite()
		var n int64
		if _, err := fmt.Fscan(bufio.NewReader(c), &n); err != nil {
			return "", local, remote, nil, fmt.Errorf("read answer: %w", err)
		}
		if n != size {
			return "", local, remote, nil, fmt.Errorf("server got %d bytes, sent %d", n, size)
		}
		return "", local, remote, nil, nil
	case "urgent":
		err := sendUrgent(tc, size, seed)
		return "", local, remote, nil, err
	case "pingpong":
		if _, err := c.Write([]byte{'E'}); err != nil {
			return "", local, remote, nil, err
		}
		msg := make([]byte, size)
		back := make([]byte, size)
		lat = make([]time.Duration, 0, rounds)
		end := time.Now().Add(pingFor)
		more := func(i int) bool {
			if pingFor > 0 {
				return time.Now().Before(end)
			}
			return i < rounds
		}
		for i := 0; more(i); i++ {
			t := time.Now()
			if _, err := c.Write(msg); err != nil {
				return "", local, remote, nil, err
			}
			if _, err := io.ReadFull(c, back); err != nil {
				return "", local, remote, nil, err
			}
			lat = append(lat, time.Since(t))
		}
		return "", local, remote, lat, nil
	}
	return "", "", "", nil, fmt.Errorf("unknown mode %q", mode)
}
