// Command verbsbench measures a verbs provider between two processes (or two
// network namespaces, or hosts): RDMA WRITE throughput and SEND ping-pong latency
// (the standard benchmarks of verbstest.Bench, issue 3; RFC 7609 §4.3 fills RMBs
// with RDMA WRITEs and §2.1 assumes RC queue pairs), beside memcpy in the client and
// plain TCP between the same two processes over the same path.
//
//	ip netns exec B verbsbench -role server -provider shm -addr 198.18.0.2:7471
//	ip netns exec A verbsbench -role client -provider shm -addr 198.18.0.2:7471 -baseline
//
// The client connects to the server's control address over TCP; the two exchange
// hellos (QP attributes with the device's Endpoint, region address and rkey) as JSON
// lines and connect their QPs. The client then drives every measurement with a
// command line on the control connection, which the server answers when its part is
// done; the TCP baselines run on that same connection. Runs are interleaved (every
// figure once per run), so a noisy moment of the machine hits all of them alike.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// options are the command line.
type options struct {
	provider   string
	role       string
	addr       string
	shmDir     string
	rdmaDevice string
	sizes      []int
	bytes      int64
	pings      int
	runs       int
	baseline   bool
	once       bool
}

const usageText = `Usage: verbsbench -role server|client [flags]

verbsbench measures a verbs provider (soft, shm, or rdma when built with -tags ibv)
between two processes: RDMA WRITE throughput for each -sizes, and SEND ping-pong
round trips of 64 bytes, once with both ends busy-polling their completion queues
(busy) and once waiting through CQ.Wait (wait: spin briefly, then sleep). With
-baseline it also measures memcpy of the same sizes in the client and TCP between
the two processes over the control connection's path. Each figure is the median
of -runs runs, with their min and max; ratios of medians follow the table.

Start the server first, then the client with the same -provider. Example: shm
between two network namespaces joined by a veth pair (they share /tmp, where the
shm rendezvous sockets live):

  ip netns add vb-a && ip netns add vb-b
  ip link add vb-a netns vb-a type veth peer name vb-b netns vb-b
  ip -n vb-a addr add 198.18.0.1/24 dev vb-a && ip -n vb-a link set vb-a up
  ip -n vb-b addr add 198.18.0.2/24 dev vb-b && ip -n vb-b link set vb-b up
  ip netns exec vb-b verbsbench -role server -provider shm -addr 198.18.0.2:7471 &
  ip netns exec vb-a verbsbench -role client -provider shm -addr 198.18.0.2:7471 -baseline
  kill %1; ip netns del vb-a; ip netns del vb-b

For soft, each end's device listens on the IP address of its control socket; for
rdma, each end opens the RDMA device of that address (or -rdma-device).

Flags:
`

func main() {
	var o options
	fs := flag.NewFlagSet("verbsbench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageText)
		fs.PrintDefaults()
	}
	if err := o.parse(fs, os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if err := run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "verbsbench:", err)
		os.Exit(1)
	}
}

// parse fills o from args; errors have been printed with the usage.
func (o *options) parse(fs *flag.FlagSet, args []string) error {
	fs.StringVar(&o.provider, "provider", "soft", "verbs provider: soft, shm or rdma (rdma needs a build with -tags ibv)")
	fs.StringVar(&o.role, "role", "", "server or client")
	fs.StringVar(&o.addr, "addr", "127.0.0.1:7471", "the server's control address (host:port): the server listens on it, the client connects to it")
	fs.StringVar(&o.shmDir, "shm-dir", "", "shm: rendezvous directory, the same for both ends (default $TMPDIR/smcr-shm)")
	fs.StringVar(&o.rdmaDevice, "rdma-device", "", "rdma: device name (default: the device of the control socket's IP address)")
	sizes := fs.String("sizes", "64KiB,1MiB", "client: WRITE (and memcpy, TCP) sizes, comma-separated, in bytes or with a KiB/MiB suffix")
	bytes := fs.String("bytes", "256MiB", "client: bytes moved per throughput figure (the count of WRITEs is this divided by the size)")
	fs.IntVar(&o.pings, "pings", 2000, "client: round trips per ping-pong figure")
	fs.IntVar(&o.runs, "runs", 5, "client: runs; every figure is the median of the runs")
	fs.BoolVar(&o.baseline, "baseline", false, "client: also measure memcpy and TCP over the same path")
	fs.BoolVar(&o.once, "once", false, "server: exit after serving one client")
	if err := fs.Parse(args); err != nil {
		return err
	}
	fail := func(format string, args ...any) error {
		err := fmt.Errorf(format, args...)
		fmt.Fprintln(fs.Output(), "verbsbench:", err)
		fs.Usage()
		return err
	}
	if fs.NArg() > 0 {
		return fail("unexpected argument %q", fs.Arg(0))
	}
	if o.role != "server" && o.role != "client" {
		return fail("-role must be server or client, not %q", o.role)
	}
	if _, err := verbs.ParseKind(o.provider); err != nil {
		return fail("%v", err)
	}
	o.sizes = nil
	for _, s := range strings.Split(*sizes, ",") {
		n, err := parseSize(s)
		if err != nil || n < 1 || n > 1<<30 {
			return fail("-sizes: bad size %q", s)
		}
		o.sizes = append(o.sizes, int(n))
	}
	n, err := parseSize(*bytes)
	if err != nil || n < 1 {
		return fail("-bytes: bad size %q", *bytes)
	}
	o.bytes = n
	if o.pings < 1 || o.runs < 1 {
		return fail("-pings and -runs must be at least 1")
	}
	return nil
}

// parseSize reads "4096", "64KiB", "64K", "1MiB", "1M" or "1GiB".
func parseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"K", 1 << 10}, {"MiB", 1 << 20}, {"M", 1 << 20}, {"GiB", 1 << 30}, {"G", 1 << 30}} {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = rest, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, err
	}
	if n < 0 || n > (1<<40)/mult {
		return 0, fmt.Errorf("size %s out of range", s)
	}
	return n * mult, nil
}

func run(o options, out io.Writer) error {
	if o.provider == verbs.KindRDMA.String() && !ibvBuilt {
		return fmt.Errorf("provider rdma: this verbsbench was built without the ibv build tag; "+
			"rebuild it with `go build -tags ibv ./cmd/verbsbench` (needs rdma-core's libibverbs-dev): %w", verbs.ErrUnsupported)
	}
	if o.role == "server" {
		ln, err := net.Listen("tcp", o.addr)
		if err != nil {
			return err
		}
		defer ln.Close()
		fmt.Fprintln(out, "listening on", ln.Addr())
		for {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			err = serve(c, o)
			if o.once {
				return err
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "verbsbench: client:", err)
			}
		}
	}
	c, err := net.Dial("tcp", o.addr)
	if err != nil {
		return err
	}
	defer c.Close()
	return client(c, o, out)
}
