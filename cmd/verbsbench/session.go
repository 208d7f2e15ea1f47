// The control session: opening each end's device, the hello exchange that carries
// what CLC would (QP attributes with the device Endpoint, RMB address and rkey,
// RFC 7609 §3.1), and the server's side of every measurement.

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/ibv"
	"github.com/smcr-io/smcr/smcr/verbs/shm"
	"github.com/smcr-io/smcr/smcr/verbs/soft"
	"github.com/smcr-io/smcr/smcr/verbs/verbstest"
)

// hello is what each end sends first on the control connection.
type hello struct {
	Provider string
	QP       verbs.QPAttr
	Addr     uint64 // the region's address for SendWR.RemoteAddr
	RKey     uint32
	Region   int    // client: the region size both ends allocate
	Err      string // server: why it will not go on
}

// command is one measurement the client asks the server to take part in; the
// server answers each with a reply line once its part is done.
type command struct {
	Op    string // opEcho, opSink, opTCPEcho
	N     int    // echo, tcp-echo: messages
	Size  int    // tcp-echo: message size
	Busy  bool   // echo: busy-poll instead of CQ.Wait
	Total int64  // sink: bytes to read
}

type reply struct {
	Err string
}

const (
	opEcho    = "echo"     // verbstest.Echo or BusyEcho of N pings
	opSink    = "sink"     // read Total raw bytes from the control connection
	opTCPEcho = "tcp-echo" // echo N raw messages of Size bytes
)

// connectTimeout bounds QP connection (the peer end connects at the same time).
const connectTimeout = 10 * time.Second

// end is one side's verbs objects.
type end struct {
	dev      verbs.Device
	qp       verbs.QP
	scq, rcq verbs.CQ
	mr       verbs.MR
}

func (e *end) Close() error { return e.dev.Close() }

// localAddr is the IP address of the control socket's end in this process: soft
// and rdma devices use the same path as the control connection.
func localAddr(c net.Conn) (netip.Addr, error) {
	ap, err := netip.ParseAddrPort(c.LocalAddr().String())
	if err != nil {
		return netip.Addr{}, fmt.Errorf("control socket address: %w", err)
	}
	return ap.Addr().Unmap(), nil
}

// openDevice opens the provider's device; local is the control socket's address.
func openDevice(o options, local netip.Addr) (verbs.Device, error) {
	switch o.provider {
	case verbs.KindSoft.String():
		return soft.Open(soft.Config{ListenAddr: netip.AddrPortFrom(local, 0).String()})
	case verbs.KindSHM.String():
		return shm.Open(shm.Config{Dir: o.shmDir})
	case verbs.KindRDMA.String():
		cfg := ibv.Config{Device: o.rdmaDevice, Interface: local.String()}
		if cfg.Device != "" {
			cfg.GIDIndex = -1 // the port's best RoCE v2 GID
		}
		return ibv.Open(cfg)
	}
	return nil, fmt.Errorf("provider %q: %w", o.provider, verbs.ErrUnsupported)
}

// newEnd opens the device and creates a QP and a region of size bytes.
func newEnd(o options, local netip.Addr, size int) (*end, error) {
	dev, err := openDevice(o, local)
	if err != nil {
		return nil, fmt.Errorf("open %s device: %w", o.provider, err)
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
		e.mr, err = pd.AllocMR(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	}
	if err == nil {
		e.qp, err = pd.CreateQP(verbs.QPConfig{SendCQ: e.scq, RecvCQ: e.rcq, RNRRetry: 7})
	}
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("%s device: %w", o.provider, err)
	}
	// Fill the region: WRITEs then copy real bytes from pages that exist, not from
	// the zero page a never-written mapping may read as (memcpy fills its source too).
	for i, b := 0, e.mr.Bytes(); i < len(b); i++ {
		b[i] = byte(i*7 + 1)
	}
	return e, nil
}

func (e *end) hello(provider string, region int) hello {
	return hello{Provider: provider, QP: e.qp.Attr(), Addr: e.mr.Addr(), RKey: e.mr.RKey(), Region: region}
}

func (e *end) connect(peer verbs.QPAttr) error {
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	if err := e.qp.Connect(ctx, peer); err != nil {
		return fmt.Errorf("connect qp: %w", err)
	}
	return nil
}

// readLine decodes one JSON line from br into v.
func readLine(br *bufio.Reader, v any) error {
	line, err := br.ReadBytes('\n')
	if err != nil {
		if errors.Is(err, io.EOF) {
			return io.ErrUnexpectedEOF
		}
		return err
	}
	return json.Unmarshal(line, v)
}

func writeLine(w io.Writer, v any) error { return json.NewEncoder(w).Encode(v) }

// serve runs one client's session: hello, then commands until the client hangs up.
func serve(c net.Conn, o options) error {
	defer c.Close()
	br := bufio.NewReader(c)
	var peer hello
	if err := readLine(br, &peer); err != nil {
		return fmt.Errorf("read hello: %w", err)
	}
	refuse := func(err error) error {
		writeLine(c, hello{Err: err.Error()})
		return err
	}
	if peer.Provider != o.provider {
		return refuse(fmt.Errorf("server runs provider %s, client asked for %s", o.provider, peer.Provider))
	}
	if peer.Region < 2*verbstest.PingPongSize || peer.Region > 1<<30 {
		return refuse(fmt.Errorf("region size %d out of range", peer.Region))
	}
	local, err := localAddr(c)
	if err != nil {
		return refuse(err)
	}
	e, err := newEnd(o, local, peer.Region)
	if err != nil {
		return refuse(err)
	}
	defer e.Close()
	if err := writeLine(c, e.hello(o.provider, peer.Region)); err != nil {
		return err
	}
	if err := e.connect(peer.QP); err != nil {
		return err
	}
	for {
		var cmd command
		if err := readLine(br, &cmd); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return nil // the client is done
			}
			return fmt.Errorf("read command: %w", err)
		}
		err := e.do(cmd, c, br)
		var r reply
		if err != nil {
			r.Err = err.Error()
		}
		if werr := writeLine(c, r); werr != nil {
			return werr
		}
		if err != nil {
			return err
		}
	}
}

// do is the server's part of one command.
func (e *end) do(cmd command, c net.Conn, br *bufio.Reader) error {
	switch cmd.Op {
	case opEcho:
		echo := verbstest.Echo
		if cmd.Busy {
			echo = verbstest.BusyEcho
		}
		return echo(context.Background(), e.qp, e.scq, e.rcq, e.mr, verbstest.PingPongSize, cmd.N)
	case opSink:
		if _, err := io.CopyN(io.Discard, br, cmd.Total); err != nil {
			return fmt.Errorf("tcp sink: %w", err)
		}
		return nil
	case opTCPEcho:
		if cmd.Size < 1 || cmd.Size > 1<<20 {
			return fmt.Errorf("tcp echo: size %d out of range", cmd.Size)
		}
		buf := make([]byte, cmd.Size)
		for range cmd.N {
			if _, err := io.ReadFull(br, buf); err != nil {
				return fmt.Errorf("tcp echo: %w", err)
			}
			if _, err := c.Write(buf); err != nil {
				return fmt.Errorf("tcp echo: %w", err)
			}
		}
		return nil
	}
	return fmt.Errorf("unknown command %q", cmd.Op)
}
