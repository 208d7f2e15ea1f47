// Command verbsbench measures a verbs provider between two processes (or two
// network namespaces, or hosts): RDMA WRITE throughput, SEND ping-pong latency and,
// over the same path, plain TCP, beside local memcpy (the figures of verbstest.Bench).
//
//	verbsbench -provider soft -role server -addr 198.18.0.2:7000
//	verbsbench -provider soft -role client -addr 198.18.0.2:7000
//
// The client connects to the server's control address over TCP, the two exchange
// QP attributes and region keys as JSON lines, then run, in this order: WRITEs of
// each size, SEND ping-pong, TCP throughput and TCP ping-pong over the control
// connection. The soft device of each end listens on the IP of its control socket.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/smcr-io/smcr/internal/nstest"
	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/soft"
	"github.com/smcr-io/smcr/smcr/verbs/verbstest"
)

// hello is what each end sends first on the control connection.
type hello struct {
	QP    verbs.QPAttr
	Addr  uint64
	RKey  uint32
	Pings int
	Total int64 // bytes of the TCP throughput run
}

const regionSize = 1 << 20

func main() {
	provider := flag.String("provider", "soft", "verbs provider (soft)")
	role := flag.String("role", "", "server or client")
	addr := flag.String("addr", "127.0.0.1:7471", "server control address (host:port)")
	n := flag.Int("n", 2000, "WRITEs of each size, and ping-pong round trips")
	flag.Parse()
	if err := run(*provider, *role, *addr, *n); err != nil {
		fmt.Fprintln(os.Stderr, "verbsbench:", err)
		os.Exit(1)
	}
}

func run(provider, role, addr string, n int) error {
	if _, err := verbs.ParseKind(provider); err != nil {
		return err
	}
	if provider != "soft" {
		return fmt.Errorf("provider %s: %w in verbsbench yet", provider, verbs.ErrUnsupported)
	}
	switch role {
	case "server":
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		defer ln.Close()
		fmt.Println("listening on", ln.Addr())
		for {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			if err := serve(c); err != nil {
				fmt.Fprintln(os.Stderr, "verbsbench: client:", err)
			}
		}
	case "client":
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		return client(c, n)
	}
	return fmt.Errorf("-role must be server or client, not %q", role)
}

// end is one side's verbs objects.
type end struct {
	dev      verbs.Device
	qp       verbs.QP
	scq, rcq verbs.CQ
	mr       verbs.MR
}

// setup opens a soft device on the control socket's local IP and exchanges hellos.
func setup(c net.Conn, br *bufio.Reader, mine hello) (*end, hello, error) {
	local, err := netip.ParseAddrPort(c.LocalAddr().String())
	if err != nil {
		return nil, hello{}, err
	}
	dev, err := soft.Open(soft.Config{ListenAddr: netip.AddrPortFrom(local.Addr(), 0).String()})
	if err != nil {
		return nil, hello{}, err
	}
	e := &end{dev: dev}
	pd, err := dev.AllocPD()
	if err == nil {
		e.scq, err = dev.CreateCQ(256)
	}
	if err == nil {
		e.rcq, err = dev.CreateCQ(256)
	}
	if err == nil {
		e.mr, err = pd.AllocMR(regionSize, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	}
	if err == nil {
		e.qp, err = pd.CreateQP(verbs.QPConfig{SendCQ: e.scq, RecvCQ: e.rcq, RNRRetry: 7})
	}
	if err != nil {
		dev.Close()
		return nil, hello{}, err
	}
	mine.QP, mine.Addr, mine.RKey = e.qp.Attr(), e.mr.Addr(), e.mr.RKey()
	var peer hello
	if err := json.NewEncoder(c).Encode(mine); err != nil {
		dev.Close()
		return nil, hello{}, err
	}
	line, err := br.ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &peer)
	}
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = e.qp.Connect(ctx, peer.QP)
		cancel()
	}
	if err != nil {
		dev.Close()
		return nil, hello{}, fmt.Errorf("connect: %w", err)
	}
	return e, peer, nil
}

func serve(c net.Conn) error {
	defer c.Close()
	br := bufio.NewReader(c)
	e, peer, err := setup(c, br, hello{})
	if err != nil {
		return err
	}
	defer e.dev.Close()
	if err := verbstest.Echo(context.Background(), e.qp, e.scq, e.rcq, e.mr, verbstest.PingPongSize, peer.Pings); err != nil {
		return err
	}
	// TCP baseline on the control connection: a sink, then an echo.
	if _, err := io.CopyN(io.Discard, br, peer.Total); err != nil {
		return err
	}
	if _, err := c.Write([]byte{1}); err != nil {
		return err
	}
	buf := make([]byte, verbstest.PingPongSize)
	for range peer.Pings {
		if _, err := io.ReadFull(br, buf); err != nil {
			return err
		}
		if _, err := c.Write(buf); err != nil {
			return err
		}
	}
	return nil
}

func client(c net.Conn, n int) error {
	br := bufio.NewReader(c)
	total := int64(n) * (64 << 10)
	e, peer, err := setup(c, br, hello{Pings: n, Total: total})
	if err != nil {
		return err
	}
	defer e.dev.Close()
	fmt.Printf("%-28s %12s %12s %12s\n", "benchmark", "MB/s", "p50-ns", "p99-ns")
	for _, size := range verbstest.WriteSizes {
		src, dst := make([]byte, size), make([]byte, size)
		start := time.Now()
		for range n {
			copy(dst, src)
		}
		fmt.Printf("%-28s %12.0f\n", fmt.Sprintf("memcpy/%d", size), mbps(size, n, time.Since(start)))
		start = time.Now()
		if err := verbstest.WriteThroughput(e.qp, e.scq, e.mr, peer.Addr, peer.RKey, size, n); err != nil {
			return err
		}
		fmt.Printf("%-28s %12.0f\n", fmt.Sprintf("write/%d", size), mbps(size, n, time.Since(start)))
	}
	rtts, err := verbstest.PingPong(e.qp, e.scq, e.rcq, e.mr, verbstest.PingPongSize, n)
	if err != nil {
		return err
	}
	printLatency("send-pingpong/64", rtts)

	buf := make([]byte, 64<<10)
	start := time.Now()
	for sent := int64(0); sent < total; sent += int64(len(buf)) {
		if _, err := c.Write(buf); err != nil {
			return err
		}
	}
	if _, err := io.ReadFull(br, buf[:1]); err != nil {
		return errors.New("tcp baseline: no acknowledgement")
	}
	fmt.Printf("%-28s %12.0f\n", "tcp/65536", mbps(64<<10, n, time.Since(start)))
	rtts, err = nstest.PingPong(struct {
		io.Reader
		io.Writer
	}{br, c}, verbstest.PingPongSize, n)
	if err != nil {
		return err
	}
	printLatency("tcp-pingpong/64", rtts)
	return nil
}

func mbps(size, n int, d time.Duration) float64 {
	return float64(size) * float64(n) / d.Seconds() / 1e6
}

func printLatency(name string, rtts []time.Duration) {
	fmt.Printf("%-28s %12s %12d %12d\n", name, "", nstest.Percentile(rtts, 50).Nanoseconds(), nstest.Percentile(rtts, 99).Nanoseconds())
}
