// Peer processes: the benchmark's client and server ends, run as this binary
// re-executed inside a network namespace, over plain TCP or package smcr
// (RFC 7609 §3: each end an SMC-R endpoint with its own device and link groups).

package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/smcr"
	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/shm"
	"github.com/smcr-io/smcr/smcr/verbs/soft"
)

// scaleDialers is how many connections a scale run sets up at once.
const scaleDialers = 32

// peerEnv carries a peer's spec (JSON) to the re-executed binary.
const peerEnv = "SMCRBENCH_PEER"

// Transports a peer can use.
const (
	transportTCP  = "tcp"
	transportSHM  = "shm"
	transportSoft = "soft"
)

// peerSpec tells a child process what to be.
type peerSpec struct {
	Role      string // "server" or "client"
	Transport string
	Addr      string // server: listen address; client: the server's address
	LocalIP   string // the IP of this end's namespace (soft devices listen there)
	ShmDir    string // shm rendezvous directory, seen by both ends
	Jobs      []job  // client only
	PeerPIDs  []int  // client only: processes whose CPU and memory count with ours
	// Smcrd, client only: the control socket of the smcrd that carries this
	// client's connections (the transparent path, where the client dials plain
	// TCP), whose counters before and after each job say how its connections went.
	Smcrd string `json:",omitempty"`
	// ProfileDir, when set, is where the peers write their profiles (profile.go).
	ProfileDir string `json:",omitempty"`
	// RMBSize is the engine's RMB in bytes (0: its default).
	RMBSize int `json:",omitempty"`
}

// job is one measurement a client makes.
type job struct {
	Kind  string // "warmup", "throughput", "latency", "setup", "setup-first", "scale"
	Size  int    // write or message size; scale: connections
	Total int64  // throughput: bytes; scale: bytes per connection
	Count int    // latency: round trips; setup: connections
}

// jobResult is what a client reports for one job.
type jobResult struct {
	Job       job
	Err       string          `json:",omitempty"`
	Elapsed   time.Duration   `json:",omitempty"` // throughput
	Bytes     int64           `json:",omitempty"`
	Samples   []time.Duration `json:",omitempty"` // latency round trips, setup times
	CPUSelf   float64         // seconds of this process during the job
	CPUPeers  float64         // seconds of PeerPIDs during the job
	Scale     *scaleResult    `json:",omitempty"`
	RSSBefore int64           `json:",omitempty"` // bytes, this process + peers, before the connections
	RSSAfter  int64           `json:",omitempty"` // and with them open, after all have sent
	SMC       int             // connections of this job that ran SMC-R
	Fallback  int             // and that fell back to TCP
	Declines  map[string]int  `json:",omitempty"` // fallback reasons
}

// IsPeer reports whether this process is a benchmark peer; RunPeer must then be
// called instead of the program's normal work.
func IsPeer() bool { return os.Getenv(peerEnv) != "" }

// RunPeer runs this process as the peer its environment describes and exits.
// cmd/smcrbench and the package's TestMain call it first thing.
func RunPeer() {
	var spec peerSpec
	if err := json.Unmarshal([]byte(os.Getenv(peerEnv)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "bench: peer spec:", err)
		os.Exit(2)
	}
	var err error
	switch spec.Role {
	case "server":
		err = runServer(spec)
	case "client":
		err = runClient(spec, os.Stdout)
	default:
		err = fmt.Errorf("bench: unknown role %q", spec.Role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// endpoint is one end's transport: a dialer, a listener, and for SMC-R the engine.
type endpoint struct {
	spec   peerSpec
	engine *smcr.Engine
	dev    verbs.Device
	smcrd  *control.Client // spec.Smcrd's
	mu     sync.Mutex
	tally  tally
}

// tally counts how connections came out.
type tally struct {
	smc, fallback int
	declines      map[string]int
}

func openEndpoint(spec peerSpec) (*endpoint, error) {
	ep := &endpoint{spec: spec}
	if spec.Smcrd != "" {
		ep.smcrd = control.NewClient(spec.Smcrd)
	}
	if spec.Transport == transportTCP {
		return ep, nil
	}
	dev, err := openDevice(spec)
	if err != nil {
		return nil, err
	}
	e, err := smcr.NewEngine(smcr.Config{Devices: []verbs.Device{dev}, TestLinkInterval: -1, RMBSize: spec.RMBSize,
		CloseTimeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("bench: engine: %w", err)
	}
	ep.engine, ep.dev = e, dev
	return ep, nil
}

func openDevice(spec peerSpec) (verbs.Device, error) {
	switch spec.Transport {
	case transportSHM:
		d, err := shm.Open(shm.Config{Dir: spec.ShmDir})
		if err != nil {
			return nil, fmt.Errorf("bench: open shm device: %w", err)
		}
		return d, nil
	case transportSoft:
		d, err := soft.Open(soft.Config{ListenAddr: net.JoinHostPort(spec.LocalIP, "0")})
		if err != nil {
			return nil, fmt.Errorf("bench: open soft device: %w", err)
		}
		return d, nil
	}
	return nil, fmt.Errorf("bench: unknown transport %q", spec.Transport)
}

func (ep *endpoint) close() {
	if ep.smcrd != nil {
		ep.smcrd.Close()
	}
	if ep.engine != nil {
		ep.engine.Close()
		ep.dev.Close()
	}
}

func (ep *endpoint) listen() (net.Listener, error) {
	if ep.engine == nil {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		return lc.Listen(context.Background(), "tcp", ep.spec.Addr)
	}
	return ep.engine.Listen("tcp", ep.spec.Addr)
}

func (ep *endpoint) dial(ctx context.Context) (net.Conn, error) {
	if ep.engine == nil {
		var d net.Dialer
		d.SetMultipathTCP(false)
		return d.DialContext(ctx, "tcp", ep.spec.Addr)
	}
	c, err := ep.engine.Dial(ctx, "tcp", ep.spec.Addr)
	if err != nil {
		return nil, err
	}
	ep.count(c)
	return c, nil
}

func (ep *endpoint) count(c *smcr.Conn) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if c.Mode() == smcr.ModeSMCR {
		ep.tally.smc++
		return
	}
	ep.tally.fallback++
	if ep.tally.declines == nil {
		ep.tally.declines = map[string]int{}
	}
	why := "unknown"
	if d := c.Decline(); d != nil {
		why = d.Error()
	}
	ep.tally.declines[why]++
}

func (ep *endpoint) takeTally() tally {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	t := ep.tally
	ep.tally = tally{}
	return t
}

// runServer listens, prints "ready <addr>" and serves until stdin closes.
func runServer(spec peerSpec) error {
	ep, err := openEndpoint(spec)
	if err != nil {
		return err
	}
	defer ep.close()
	ln, err := ep.listen()
	if err != nil {
		return fmt.Errorf("bench: listen: %w", err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	defer serveProfiles(spec)()
	fmt.Printf("ready %s\n", ln.Addr())
	io.Copy(io.Discard, os.Stdin)
	return ln.Close()
}

// runClient runs spec.Jobs in order and writes one JSON object with the results.
func runClient(spec peerSpec, out io.Writer) error {
	ep, err := openEndpoint(spec)
	if err != nil {
		return err
	}
	defer ep.close()
	ctx := context.Background()
	results := make([]jobResult, 0, len(spec.Jobs))
	prof := newProfiler(spec)
	for _, j := range spec.Jobs {
		end := prof.jobProfile(spec, j)
		results = append(results, ep.run(ctx, j))
		end()
	}
	return json.NewEncoder(out).Encode(results)
}

func (ep *endpoint) run(ctx context.Context, j job) jobResult {
	r := jobResult{Job: j}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var st0 control.Stats
	var stErr error
	if ep.smcrd != nil {
		st0, stErr = ep.smcrd.Stats(ctx)
	}
	self0, peers0 := cpuSelf(), cpuOf(ep.spec.PeerPIDs)
	var err error
	switch j.Kind {
	case "warmup": // a throughput run that no figure counts
		_, err = throughput(ctx, ep.dial, j.Size, j.Total)
	case "throughput":
		r.Elapsed, err = throughput(ctx, ep.dial, j.Size, j.Total)
		r.Bytes = j.Total
	case "latency":
		r.Samples, err = latency(ctx, ep.dial, j.Size, j.Count)
	case "setup":
		r.Samples, err = setup(ctx, ep.dial, nil, j.Count)
	case "setup-first":
		r.Samples, err = setup(ctx, nil, ep.fresh, j.Count)
	case "scale":
		runtimeGC()
		mem := append([]int{os.Getpid()}, ep.spec.PeerPIDs...)
		r.RSSBefore = rssOf(mem)
		sr := scale(ctx, ep.dial, j.Size, scaleDialers, j.Total, func() { r.RSSAfter = rssOf(mem) })
		r.Scale = &sr
	default:
		err = fmt.Errorf("bench: unknown job %q", j.Kind)
	}
	r.CPUSelf, r.CPUPeers = cpuSelf()-self0, cpuOf(ep.spec.PeerPIDs)-peers0
	t := ep.takeTally()
	if ep.smcrd != nil {
		st1, err1 := ep.smcrd.Stats(ctx)
		if e := errors.Join(stErr, err1); e != nil {
			err = errors.Join(err, fmt.Errorf("bench: smcrd stats: %w", e))
		}
		t = smcrdTally(st0, st1)
	}
	if err != nil {
		r.Err = err.Error()
	}
	r.SMC, r.Fallback, r.Declines = t.smc, t.fallback, t.declines
	return r
}

// smcrdTally is how the connections an smcrd carried between two readings of
// its counters came out.
func smcrdTally(before, after control.Stats) tally {
	grew := func(was, is uint64) int {
		if is > was {
			return int(is - was)
		}
		return 0
	}
	t := tally{smc: grew(before.Connections.SMCR, after.Connections.SMCR),
		fallback: grew(before.Connections.Fallback, after.Connections.Fallback)}
	was := map[string]uint64{}
	for _, f := range before.Fallbacks {
		was[f.Reason+" ("+f.Side+")"] += f.Count
	}
	for _, f := range after.Fallbacks {
		k := f.Reason + " (" + f.Side + ")"
		if n := grew(was[k], f.Count); n > 0 {
			if t.declines == nil {
				t.declines = map[string]int{}
			}
			t.declines[k] += n
		}
	}
	return t
}

// fresh returns a dialer on a new engine and device, so its connection is a first
// contact (RFC 7609 §3.3: a new link group, its QPs and CONFIRM_LINK).
func (ep *endpoint) fresh() (dialer, func(), error) {
	if ep.engine == nil {
		return ep.dial, func() {}, nil
	}
	other, err := openEndpoint(ep.spec)
	if err != nil {
		return nil, nil, err
	}
	d := func(ctx context.Context) (net.Conn, error) {
		c, err := other.dial(ctx)
		if sc, ok := c.(*smcr.Conn); ok && err == nil {
			ep.count(sc)
		}
		return c, err
	}
	return d, other.close, nil
}

// readyLine waits for a server's "ready <addr>" line.
func readyLine(r io.Reader) (string, error) {
	sc := bufio.NewScanner(r)
	if !sc.Scan() {
		if err := sc.Err(); err != nil {
			return "", err
		}
		return "", errors.New("bench: server exited before it was ready")
	}
	var addr string
	if _, err := fmt.Sscanf(sc.Text(), "ready %s", &addr); err != nil {
		return "", fmt.Errorf("bench: server said %q", sc.Text())
	}
	return addr, nil
}

func cpuSelf() float64 { return cpuOf([]int{os.Getpid()}) }
