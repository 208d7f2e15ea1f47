// Tests of the soft provider: the conformance suite over loopback and across two
// network namespaces, a misbehaving peer, the frame codec and its fuzz target.

package soft

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/smcr-io/smcr/internal/nstest"
	"github.com/smcr-io/smcr/smcr/verbs"
	"github.com/smcr-io/smcr/smcr/verbs/verbstest"
)

func open(t testing.TB, cfg Config) verbs.Device {
	t.Helper()
	d, err := Open(cfg)
	if err != nil {
		t.Fatalf("open soft device: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

var loopback = verbstest.Env{
	Open: func(t testing.TB) (a, b verbs.Device) {
		return open(t, Config{}), open(t, Config{})
	},
}

func TestConformance(t *testing.T) { verbstest.Run(t, loopback) }

// nsEnv runs each device inside its own namespace of p, listening on its veth
// address and dialling from there.
func nsEnv(p *nstest.Pair) verbstest.Env {
	openIn := func(t testing.TB, ns *nstest.NS) verbs.Device {
		var d verbs.Device
		err := ns.Do(func() error {
			var err error
			d, err = Open(Config{
				ListenAddr: netip.AddrPortFrom(ns.Addr4(), 0).String(),
				Netdev:     ns.Links[0].Name,
				Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
					var c net.Conn
					err := ns.Do(func() error {
						var d net.Dialer
						var err error
						c, err = d.DialContext(ctx, network, addr)
						return err
					})
					return c, err
				},
			})
			return err
		})
		if err != nil {
			t.Fatalf("open soft device in %s: %v", ns.Name, err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	return verbstest.Env{
		Open:            func(t testing.TB) (a, b verbs.Device) { return openIn(t, p.A), openIn(t, p.B) },
		SkipPeerProcess: "the peer-process test runs in TestConformance over loopback",
	}
}

func TestConformanceNetns(t *testing.T) {
	if verbstest.InPeer() {
		t.Skip("not the peer's test")
	}
	verbstest.Run(t, nsEnv(nstest.NewPair(t)))
}

func TestPortAttr(t *testing.T) {
	if verbstest.InPeer() {
		t.Skip("not the peer's test")
	}
	p := nstest.NewPair(t)
	env := nsEnv(p)
	a, _ := env.Open(t)
	port := a.Port()
	want := netip.AddrFrom16(port.GID)
	if want != netip.AddrFrom16(p.A.Addr4().As16()) || !want.Is4In6() {
		t.Fatalf("GID %v, want the IPv4-mapped form of %v", want, p.A.Addr4())
	}
	ifi := p.A.Links[0].Name
	if port.Netdev != ifi || port.MAC == ([6]byte{}) {
		t.Fatalf("netdev %q MAC %x, want %s's MAC", port.Netdev, port.MAC, ifi)
	}
	if ep := string(a.Endpoint()); ep != netip.AddrPortFrom(p.A.Addr4(), 0).Addr().String()+ep[len(p.A.Addr4().String()):] {
		t.Fatalf("endpoint %q does not carry %v", ep, p.A.Addr4())
	}
	if a.Kind() != verbs.KindSoft {
		t.Fatalf("kind %v", a.Kind())
	}
}

// TestPortUp: the port follows its interface, in the namespace the device was
// opened in (the test's own thread is elsewhere): down when either end of the
// veth pair is set down (no carrier), up again with it, down once closed. Each
// change is announced (verbs.PortNotifier): the test waits on those alone.
func TestPortUp(t *testing.T) {
	if verbstest.InPeer() {
		t.Skip("not the peer's test")
	}
	p := nstest.NewPair(t)
	a, _ := nsEnv(p).Open(t)
	ps, ok := a.(verbs.PortStater)
	if !ok {
		t.Fatal("soft device does not say whether its port is up")
	}
	pn, ok := a.(verbs.PortNotifier)
	if !ok {
		t.Fatal("soft device does not announce port changes")
	}
	// setLink sets ns's end down or up and returns once the changes
	// announced bring PortUp to want.
	setLink := func(ns *nstest.NS, state string, want bool) {
		t.Helper()
		changed := pn.PortChanged()
		if out, err := ns.Command("ip", "link", "set", ns.Links[0].Name, state).CombinedOutput(); err != nil {
			t.Fatalf("ip link set %s: %v %s", state, err, out)
		}
		for {
			select {
			case <-changed:
			case <-time.After(5 * time.Second):
				t.Fatalf("%s %s: no change announced in 5 s; PortUp() = %v, want %v", ns.Links[0].Name, state, ps.PortUp(), want)
			}
			changed = pn.PortChanged()
			if ps.PortUp() == want {
				return
			}
		}
	}
	for i := 0; !ps.PortUp(); i++ { // the veth pair's carrier may lag its creation
		if i == 100 {
			t.Fatal("port still down 2 s after open")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, ns := range []*nstest.NS{p.A, p.B} { // our end, then the peer's: no carrier
		setLink(ns, "down", false)
		setLink(ns, "up", true)
	}
	a.Close()
	if ps.PortUp() {
		t.Error("closed device says its port is up")
	}
}

// connectedQP returns a device with a connected QP whose peer is a raw TCP
// connection the test drives, and the region the peer is entitled to write.
func connectedQP(t *testing.T, cfg Config, size int) (q verbs.QP, rcq, scq verbs.CQ, peer net.Conn, m verbs.MR, other verbs.MR) {
	d := open(t, cfg)
	pd, _ := d.AllocPD()
	scq, _ = d.CreateCQ(16)
	rcq, _ = d.CreateCQ(16)
	m, _ = pd.AllocMR(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	// A region of another PD on the same device: never reachable through q.
	pd2, _ := d.AllocPD()
	other, _ = pd2.AllocMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	q, err := pd.CreateQP(verbs.QPConfig{SendCQ: scq, RecvCQ: rcq, RNRRetry: 7})
	if err != nil {
		t.Fatal(err)
	}
	// The fake peer: a listener for q's requests, and a stream to q.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		t.Cleanup(func() { c.Close() })
		var b [headerLen]byte
		if _, err := readFull(c, b[:]); err != nil {
			return
		}
		var h header
		parseHeader(b[:], &h)
		(&header{typ: frameHelloOK, psn: h.psn}).put(b[:])
		c.Write(b[:])
	}()
	const peerQPN, peerPSN = 0x123, 0x777
	peer, err = net.Dial("tcp", string(d.Endpoint()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	var b [headerLen]byte
	(&header{typ: frameHello, psn: peerPSN, addr: peerQPN<<32 | uint64(q.Attr().QPN), rkey: helloMagic, imm: helloVersion}).put(b[:])
	peer.Write(b[:])
	if _, err := readFull(peer, b[:]); err != nil {
		t.Fatalf("hello reply: %v", err)
	}
	err = q.Connect(context.Background(), verbs.QPAttr{QPN: peerQPN, PSN: peerPSN, MTU: verbs.MTU1024, Endpoint: []byte(ln.Addr().String())})
	if err != nil {
		t.Fatal(err)
	}
	return q, rcq, scq, peer, m, other
}

func frame(h header, payload []byte) []byte {
	h.length = uint32(len(payload))
	b := make([]byte, headerLen, headerLen+len(payload))
	h.put(b)
	return append(b, payload...)
}

func readResp(t *testing.T, c net.Conn) (header, error) {
	t.Helper()
	var b [headerLen]byte
	var h header
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := readFull(c, b[:]); err != nil {
		return h, err
	}
	return h, parseHeader(b[:], &h)
}

func TestBadPeer(t *testing.T) {
	if verbstest.InPeer() {
		t.Skip("not the peer's test")
	}
	cases := []struct {
		name  string
		frame func(m, other verbs.MR) []byte
		nak   uint8 // 0: the stream is simply dropped
	}{
		{"garbage", func(m, other verbs.MR) []byte { return bytes.Repeat([]byte{0xff}, 64) }, 0},
		{"unknown type", func(m, other verbs.MR) []byte { return frame(header{typ: 9, psn: 0x777}, nil) }, 0},
		{"wrong psn", func(m, other verbs.MR) []byte {
			return frame(header{typ: frameWrite, psn: 0x778, addr: m.Addr(), rkey: m.RKey()}, []byte("x"))
		}, 0},
		{"other pd's rkey", func(m, other verbs.MR) []byte {
			return frame(header{typ: frameWrite, psn: 0x777, addr: other.Addr(), rkey: other.RKey()}, []byte("evil"))
		}, nakRemAccess},
		{"address wraps", func(m, other verbs.MR) []byte {
			return frame(header{typ: frameWrite, psn: 0x777, addr: ^uint64(0) - 1, rkey: m.RKey()}, []byte("evil"))
		}, nakRemAccess},
		{"one past the end", func(m, other verbs.MR) []byte {
			return frame(header{typ: frameWrite, psn: 0x777, addr: m.Addr() + 4093, rkey: m.RKey()}, []byte("evil"))
		}, nakRemAccess},
		{"ack on a request stream", func(m, other verbs.MR) []byte { return frame(header{typ: frameAck, psn: 0x777}, nil) }, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q, rcq, _, peer, m, other := connectedQP(t, Config{RNRTimer: time.Millisecond}, 4096)
			if err := q.PostRecv(&verbs.RecvWR{ID: 5, SG: []verbs.SGE{{MR: m, Length: 64}}}); err != nil {
				t.Fatal(err)
			}
			peer.Write(tc.frame(m, other))
			h, err := readResp(t, peer)
			if tc.nak != 0 {
				if err != nil || h.typ != frameNak || h.syndrome != tc.nak {
					t.Fatalf("response %+v, %v: want NAK %d", h, err, tc.nak)
				}
				peer.Close() // the requester gives up on a NAK
			} else if err == nil {
				t.Fatalf("garbage answered with %+v", h)
			}
			var wc [1]verbs.WorkCompletion
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for n := 0; n == 0; {
				if n, _ = rcq.Poll(wc[:]); n == 0 {
					if err := rcq.Wait(ctx); err != nil {
						t.Fatalf("no flush after bad input: %v", err)
					}
				}
			}
			if wc[0].ID != 5 || wc[0].Status != verbs.WCWRFlushErr {
				t.Fatalf("completion %+v, want the RECV flushed", wc[0])
			}
			if q.State() != verbs.QPError {
				t.Fatalf("state %v, want ERROR", q.State())
			}
			if untouchedZero(m.Bytes()) >= 0 || untouchedZero(other.Bytes()) >= 0 {
				t.Fatalf("bad input changed memory")
			}
		})
	}
}

func untouchedZero(b []byte) int {
	for i, x := range b {
		if x != 0 {
			return i
		}
	}
	return -1
}

// A peer that garbles one QP's stream leaves the device's other QPs working.
func TestBadPeerIsolated(t *testing.T) {
	if verbstest.InPeer() {
		t.Skip("not the peer's test")
	}
	a, b := open(t, Config{}), open(t, Config{})
	// A stream naming no QP, and a garbage hello: both refused, nothing else hurt.
	for _, junk := range [][]byte{
		frame(header{typ: frameHello, addr: 1<<32 | 0xfffffe, rkey: helloMagic, imm: helloVersion}, nil),
		bytes.Repeat([]byte("GET / HTTP/1.1\r\n"), 4),
	} {
		c, err := net.Dial("tcp", string(b.Endpoint()))
		if err != nil {
			t.Fatal(err)
		}
		c.Write(junk)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 64)); err == nil {
			t.Fatalf("refused stream answered %d bytes", n)
		}
		c.Close()
	}
	pa, _ := a.AllocPD()
	pb, _ := b.AllocPD()
	cq, _ := a.CreateCQ(8)
	cqb, _ := b.CreateCQ(8)
	mb, _ := pb.AllocMR(64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	ma, _ := pa.AllocMR(64, verbs.AccessLocalWrite)
	qa, _ := pa.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
	qb, _ := pb.CreateQP(verbs.QPConfig{SendCQ: cqb, RecvCQ: cqb})
	ctx := context.Background()
	errc := make(chan error, 1)
	go func() { errc <- qb.Connect(ctx, qa.Attr()) }()
	if err := qa.Connect(ctx, qb.Attr()); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	copy(ma.Bytes(), "fine")
	if err := qa.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Signaled: true, SG: []verbs.SGE{{MR: ma, Length: 4}},
		RemoteAddr: mb.Addr(), RKey: mb.RKey()}); err != nil {
		t.Fatal(err)
	}
	var wc [1]verbs.WorkCompletion
	for n := 0; n == 0; {
		n, _ = cq.Poll(wc[:])
		if n == 0 {
			cq.Wait(ctx)
		}
	}
	if wc[0].Status != verbs.WCSuccess || string(mb.Bytes()[:4]) != "fine" {
		t.Fatalf("write after garbage: %+v, region %q", wc[0], mb.Bytes()[:4])
	}
}

// TestGarbageLogLimited: a flood of garbage at the device's listener, which
// anyone may connect to, logs a few lines, not one per stream.
func TestGarbageLogLimited(t *testing.T) {
	if verbstest.InPeer() {
		t.Skip("not the peer's test")
	}
	var log bytes.Buffer
	var mu sync.Mutex
	d := open(t, Config{Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &log}, nil))})
	const n = 50
	for range n {
		c, err := net.Dial("tcp", string(d.Endpoint()))
		if err != nil {
			t.Fatal(err)
		}
		c.Write(bytes.Repeat([]byte("GET / HTTP/1.1\r\n"), 4))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		c.Read(make([]byte, 64)) // until the device closes it
		c.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Count(log.String(), "refused stream"); got == 0 || got > 5 {
		t.Errorf("%d log lines for %d garbage streams, want 1 to 5:\n%s", got, n, log.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Golden frames: the header layout of the package doc, byte for byte.
var golden = []struct {
	name string
	h    header
	hex  string
}{
	{"write", header{typ: frameWrite, psn: 0xabcdef, addr: 0x7f0000001000, rkey: 0x11223344, length: 5},
		"01000000" + "00abcdef" + "00007f0000001000" + "11223344" + "00000000" + "00000005"},
	{"write imm", header{typ: frameWriteImm, psn: 1, addr: 2, rkey: 3, imm: 0xdeadbeef, length: 0},
		"02000000" + "00000001" + "0000000000000002" + "00000003" + "deadbeef" + "00000000"},
	{"send", header{typ: frameSend, psn: 0xffffff, length: 64},
		"03000000" + "00ffffff" + "0000000000000000" + "00000000" + "00000000" + "00000040"},
	{"ack", header{typ: frameAck, psn: 7}, "10000000" + "00000007" + "0000000000000000" + "00000000" + "00000000" + "00000000"},
	{"nak rnr", header{typ: frameNak, syndrome: nakRNR, psn: 7},
		"11010000" + "00000007" + "0000000000000000" + "00000000" + "00000000" + "00000000"},
	{"hello", header{typ: frameHello, psn: 0x777, addr: 0x123<<32 | 0x456, rkey: helloMagic, imm: helloVersion},
		"20000000" + "00000777" + "0000012300000456" + "534f4654" + "00000001" + "00000000"},
	{"hello ok", header{typ: frameHelloOK, psn: 0x777},
		"21000000" + "00000777" + "0000000000000000" + "00000000" + "00000000" + "00000000"},
}

func TestHeaderGolden(t *testing.T) {
	for _, g := range golden {
		b := make([]byte, headerLen)
		g.h.put(b)
		if got := hex.EncodeToString(b); got != g.hex {
			t.Errorf("%s: encoded %s, want %s", g.name, got, g.hex)
		}
		var h header
		raw, _ := hex.DecodeString(g.hex)
		if err := parseHeader(raw, &h); err != nil || h != g.h {
			t.Errorf("%s: parsed %+v, %v; want %+v", g.name, h, err, g.h)
		}
	}
}

func TestHeaderRejects(t *testing.T) {
	bad := map[string]header{
		"psn over 24 bits":  {typ: frameAck, psn: 1 << 24},
		"unknown type":      {typ: 4},
		"syndrome on ack":   {typ: frameAck, syndrome: 1},
		"nak syndrome 0":    {typ: frameNak},
		"nak syndrome 9":    {typ: frameNak, syndrome: 9},
		"payload on ack":    {typ: frameAck, length: 1},
		"imm on write":      {typ: frameWrite, imm: 1},
		"rkey on send":      {typ: frameSend, rkey: 1},
		"hello bad magic":   {typ: frameHello, addr: 1<<32 | 1, rkey: 1, imm: helloVersion},
		"hello version 2":   {typ: frameHello, addr: 1<<32 | 1, rkey: helloMagic, imm: 2},
		"hello zero qpn":    {typ: frameHello, addr: 1, rkey: helloMagic, imm: helloVersion},
		"length over bound": {typ: frameSend, length: maxMessage + 1},
	}
	for name, h := range bad {
		b := make([]byte, headerLen)
		h.put(b)
		var got header
		if err := parseHeader(b, &got); !errors.Is(err, errFrame) {
			t.Errorf("%s: parse gave %v, want errFrame", name, err)
		}
	}
	if err := parseHeader(make([]byte, headerLen-1), new(header)); !errors.Is(err, errFrame) {
		t.Errorf("short header: %v", err)
	}
	b := make([]byte, headerLen)
	(&header{typ: frameAck}).put(b)
	b[offReserved] = 1
	if err := parseHeader(b, new(header)); !errors.Is(err, errFrame) {
		t.Errorf("reserved byte set: %v", err)
	}
}

// FuzzParseHeader: a header either fails to parse or re-encodes to the same bytes.
func FuzzParseHeader(f *testing.F) {
	for _, g := range golden {
		raw, _ := hex.DecodeString(g.hex)
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h header
		if parseHeader(b, &h) != nil {
			return
		}
		out := make([]byte, headerLen)
		h.put(out)
		if !bytes.Equal(out, b[:headerLen]) {
			t.Fatalf("re-encoded %x, parsed from %x", out, b[:headerLen])
		}
	})
}

// BenchmarkLoopback: both devices in this process, over loopback TCP.
func BenchmarkLoopback(b *testing.B) { verbstest.Bench(b, loopback) }

// BenchmarkNetns: each device listening inside its own namespace, across a veth pair.
func BenchmarkNetns(b *testing.B) { verbstest.Bench(b, nsEnv(nstest.NewPair(b))) }

// The hot path allocates nothing: posting a WRITE and a SEND, executing them,
// acknowledging them and polling their completions.
func TestNoAllocPerMessage(t *testing.T) {
	if verbstest.InPeer() {
		t.Skip("not the peer's test")
	}
	p := newQPPair(t)
	qa, qb, ma, mb, cqa, cqb := p.qa, p.qb, p.ma, p.mb, p.cqa, p.cqb
	ctx := context.Background()
	write := &verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, SG: []verbs.SGE{{MR: ma, Length: 32 << 10}}, RemoteAddr: mb.Addr(), RKey: mb.RKey()}
	send := &verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Signaled: true, SG: []verbs.SGE{{MR: ma, Length: 64}}}
	recv := &verbs.RecvWR{ID: 3, SG: []verbs.SGE{{MR: mb, Offset: 60000, Length: 64}}}
	wc := make([]verbs.WorkCompletion, 4)
	wait := func(cq verbs.CQ) {
		for {
			n, err := cq.Poll(wc)
			if err != nil || (n == 1 && wc[0].Status != verbs.WCSuccess) {
				t.Fatalf("poll: %v %+v", err, wc[0])
			}
			if n == 1 {
				return
			}
			cq.Wait(ctx)
		}
	}
	round := func() {
		if qb.PostRecv(recv) != nil || qa.PostSend(write) != nil || qa.PostSend(send) != nil {
			t.Fatal("post failed")
		}
		wait(cqa)
		wait(cqb)
	}
	for range 100 {
		round() // warm up buffers, rings and timers
	}
	// The count covers the whole process, and the device's port watcher
	// allocates for every link event netlink reports in its namespace (other
	// tests' veth pairs): the best of a few tries is the hot path's.
	allocs := testing.AllocsPerRun(200, round)
	for try := 1; try < 5 && allocs >= 1; try++ {
		allocs = min(allocs, testing.AllocsPerRun(200, round))
	}
	if allocs >= 1 {
		t.Fatalf("%.1f allocations per WRITE+SEND round trip, want 0", allocs)
	}
}

// qpPair is a QP on each of two devices, connected; mb, on b's side, takes
// remote writes.
type qpPair struct {
	qa, qb   verbs.QP
	ma, mb   verbs.MR
	cqa, cqb verbs.CQ
}

func newQPPair(t *testing.T) *qpPair {
	t.Helper()
	a, b := open(t, Config{}), open(t, Config{})
	pa, _ := a.AllocPD()
	pb, _ := b.AllocPD()
	p := &qpPair{}
	p.cqa, _ = a.CreateCQ(64)
	p.cqb, _ = b.CreateCQ(64)
	p.ma, _ = pa.AllocMR(64<<10, verbs.AccessLocalWrite)
	p.mb, _ = pb.AllocMR(64<<10, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	p.qa, _ = pa.CreateQP(verbs.QPConfig{SendCQ: p.cqa, RecvCQ: p.cqa})
	p.qb, _ = pb.CreateQP(verbs.QPConfig{SendCQ: p.cqb, RecvCQ: p.cqb})
	ctx := context.Background()
	errc := make(chan error, 1)
	go func() { errc <- p.qb.Connect(ctx, p.qa.Attr()) }()
	if err := p.qa.Connect(ctx, p.qb.Attr()); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return p
}

// TestNoWriteAfterClose: a WRITE whose payload has arrived when its target QP
// closes lands nothing, as an RNIC's responder executes nothing once its QP has
// left RTS: the engine closes a link's QP so that no WRITE late over it lands on
// bytes the peer rewrote over another link (Conn.fenceMovedFrom).
func TestNoWriteAfterClose(t *testing.T) {
	if verbstest.InPeer() {
		t.Skip("not the peer's test")
	}
	p := newQPPair(t)
	closed := closeAtFirstPiece(t, p.qb)
	fill(p.ma.Bytes(), 0xab)
	if err := p.qa.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Signaled: true, SG: []verbs.SGE{{MR: p.ma, Length: 32 << 10}}, RemoteAddr: p.mb.Addr(), RKey: p.mb.RKey()}); err != nil {
		t.Fatal(err)
	}
	<-closed
	staysClear(t, p.mb.Bytes(), 0xab, "after the target QP closed")
}

// closeAtFirstPiece closes q when its responder has read the first piece of a
// payload, before it copies it (testHookPlace); the channel closes then.
func closeAtFirstPiece(t *testing.T, q verbs.QP) <-chan struct{} {
	closed := make(chan struct{})
	var once sync.Once
	hook := func(x *qp) {
		if x == q.(*qp) {
			once.Do(func() { q.Close(); close(closed) })
		}
	}
	testHookPlace.Store(&hook)
	t.Cleanup(func() { testHookPlace.Store(nil) })
	return closed
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// staysClear checks for 50 ms that no byte v lands in b.
func staysClear(t *testing.T, b []byte, v byte, when string) {
	t.Helper()
	for range 50 {
		if i := bytes.IndexByte(b, v); i >= 0 {
			t.Fatalf("byte %d written %s", i, when)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestNoSendAfterClose: a SEND whose payload is arriving when its target QP
// closes lands nothing in the receive buffer, which the close handed back with
// a flush completion (the user may repost or reuse it from then on).
func TestNoSendAfterClose(t *testing.T) {
	if verbstest.InPeer() {
		t.Skip("not the peer's test")
	}
	p := newQPPair(t)
	closed := closeAtFirstPiece(t, p.qb)
	if err := p.qb.PostRecv(&verbs.RecvWR{ID: 9, SG: []verbs.SGE{{MR: p.mb, Length: 1024}}}); err != nil {
		t.Fatal(err)
	}
	fill(p.ma.Bytes(), 0xab)
	if err := p.qa.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Signaled: true, SG: []verbs.SGE{{MR: p.ma, Length: 1024}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the SEND's payload never reached the responder's copy")
	}
	wc := make([]verbs.WorkCompletion, 4)
	flushed := false
	for deadline := time.Now().Add(5 * time.Second); !flushed && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		n, _ := p.cqb.Poll(wc)
		for _, c := range wc[:n] {
			if c.ID == 9 && c.Opcode == verbs.WCRecv {
				if c.Status == verbs.WCSuccess {
					t.Fatal("the receive completed although its QP closed first")
				}
				flushed = true
			}
		}
	}
	if !flushed {
		t.Fatal("no flush completion for the receive")
	}
	staysClear(t, p.mb.Bytes()[:1024], 0xab, "into a flushed receive")
}

// writeWatch counts the Writes in progress on a QP's request stream, and holds
// one that failed for a moment, as a send slow to return would be.
type writeWatch struct {
	net.Conn
	writing *atomic.Int32
}

func (w writeWatch) Write(p []byte) (int, error) {
	w.writing.Add(1)
	defer w.writing.Add(-1)
	n, err := w.Conn.Write(p)
	if err != nil {
		time.Sleep(50 * time.Millisecond)
	}
	return n, err
}

// TestNoReadAfterFlush: a send request's memory is not read once its
// completion is out, flushed or not: the user may reuse it from then on, as
// after an adapter's completion. The peer reads nothing, so the requester is
// stuck writing the WRITE's payload when the QP is closed.
func TestNoReadAfterFlush(t *testing.T) {
	var writing atomic.Int32
	var d net.Dialer
	cfg := Config{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeWatch{c, &writing}, nil
	}}
	const size = 64 << 20 // beyond what the sockets buffer
	q, _, scq, _, m, _ := connectedQP(t, cfg, size)
	if err := q.PostSend(&verbs.SendWR{ID: 7, Opcode: verbs.OpWrite, Signaled: true, SG: []verbs.SGE{{MR: m, Length: size}}, RemoteAddr: 0, RKey: 1}); err != nil {
		t.Fatal(err)
	}
	// Wait until the write blocks: the stream's buffers are full.
	deadline := time.Now().Add(10 * time.Second)
	for quiet := 0; quiet < 20; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the request stream never blocked")
		}
		if writing.Load() == 0 {
			quiet = 0
			continue
		}
		quiet++
	}
	q.Close()
	wc := make([]verbs.WorkCompletion, 1)
	for deadline = time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if n, _ := scq.Poll(wc); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no completion after close")
		}
	}
	if n := writing.Load(); wc[0].ID != 7 || wc[0].Status == verbs.WCSuccess || n != 0 {
		t.Fatalf("completion %+v with %d writes of its payload in progress", wc[0], n)
	}
}

// flakyListener fails its first Accept with EMFILE, as under descriptor
// pressure, then accepts as usual.
type flakyListener struct {
	net.Listener
	failed atomic.Bool
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if !l.failed.Swap(true) {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	}
	return l.Listener.Accept()
}

// TestQPNsUnpredictable: verbstest.QPNsSpread.
func TestQPNsUnpredictable(t *testing.T) { verbstest.QPNsSpread(t, open(t, Config{})) }

// TestAcceptErrorPasses: a failed accept (out of file descriptors) does not
// end the device's listening for good: peers connect once it passes.
func TestAcceptErrorPasses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	qa, qb := testQP(t, open(t, Config{Listener: &flakyListener{Listener: ln}})), testQP(t, open(t, Config{}))
	if c, err := net.Dial("tcp", ln.Addr().String()); err == nil { // meets the failure
		c.Close()
	}
	if err := connectBoth(qa, qb); err != nil {
		t.Fatalf("connect to the device after an accept error: %v", err)
	}
}

// pdAndCQ allocates a PD and a CQ on d.
func pdAndCQ(t *testing.T, d verbs.Device) (verbs.PD, verbs.CQ) {
	t.Helper()
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := d.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	return pd, cq
}

// testQP makes a QP on d, with a CQ of its own.
func testQP(t *testing.T, d verbs.Device) verbs.QP {
	t.Helper()
	pd, cq := pdAndCQ(t, d)
	q, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// connectBoth connects qa and qb to each other, both at once.
func connectBoth(qa, qb verbs.QP) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- qa.Connect(ctx, qb.Attr()) }()
	return errors.Join(qb.Connect(ctx, qa.Attr()), <-errc)
}

// TestStrangerHelloFirst: a stranger's hello naming a QP before its peer's does
// not keep the peer's stream out: the QP holds both until it connects, keeps its
// peer's and closes the stranger's.
func TestStrangerHelloFirst(t *testing.T) {
	qa, qb := testQP(t, open(t, Config{})), testQP(t, open(t, Config{}))
	attr := qa.Attr()
	c, err := net.Dial("tcp", string(attr.Endpoint))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var b [headerLen]byte
	(&header{typ: frameHello, psn: 1, addr: 0x42<<32 | uint64(attr.QPN), rkey: helloMagic, imm: helloVersion}).put(b[:])
	c.Write(b[:])
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := readFull(c, b[:]); err != nil {
		t.Fatalf("the stranger's hello got no answer: %v", err)
	}
	if err := connectBoth(qa, qb); err != nil {
		t.Fatalf("the peers did not connect after a stranger's hello: %v", err)
	}
	if _, err := readFull(c, b[:]); err == nil {
		t.Error("the stranger's stream stayed open")
	}
}

// TestEarlyAckSlotReuse: a peer that ACKs a WRITE after its header only (no
// true peer can) completes it while its payload is still being sent, and the
// slot can then be posted again. The payload still goes out as posted: the
// requester had copied the request's SGEs, where it read the new request's
// (another region's bytes, and a data race on the slot).
func TestEarlyAckSlotReuse(t *testing.T) {
	pd, cq := pdAndCQ(t, open(t, Config{}))
	mustMR := func(size int, fill string) verbs.MR {
		m, err := pd.AllocMR(size, verbs.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		copy(m.Bytes(), fill)
		return m
	}
	big, pub, secret := mustMR(8<<20, ""), mustMR(16, "PUBLICPUBLICPUBL"), mustMR(16, "SECRETSECRETSECR")
	q, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 2})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer := make(chan net.Conn, 1)
	go func() { // a peer that answers the hello, then speaks for itself
		c, err := ln.Accept()
		if err != nil {
			return
		}
		var b [headerLen]byte
		readFull(c, b[:])
		var h header
		parseHeader(b[:], &h)
		(&header{typ: frameHelloOK, psn: h.psn}).put(b[:])
		c.Write(b[:])
		peer <- c
	}()
	if err := q.Connect(context.Background(), verbs.QPAttr{QPN: 0x123, PSN: 0x777, MTU: verbs.MTU1024, Endpoint: []byte(ln.Addr().String())}); err != nil {
		t.Fatal(err)
	}
	c := <-peer
	defer c.Close()
	write := func(id uint64, sg ...verbs.SGE) {
		t.Helper()
		if err := q.PostSend(&verbs.SendWR{ID: id, Opcode: verbs.OpWrite, SG: sg, RemoteAddr: 0x1000, RKey: 5}); err != nil {
			t.Fatal(err)
		}
	}
	write(1, verbs.SGE{MR: big, Length: 8 << 20}, verbs.SGE{MR: pub, Length: 16})
	var b [headerLen]byte
	readFull(c, b[:])
	var h header
	parseHeader(b[:], &h)
	(&header{typ: frameAck, psn: h.psn}).put(b[:])
	c.Write(b[:]) // the ACK, after the header only
	time.Sleep(50 * time.Millisecond)
	write(2, verbs.SGE{MR: pub, Length: 1})
	write(3, verbs.SGE{MR: pub, Length: 1}, verbs.SGE{MR: secret, Length: 16}) // request 1's slot again
	rest := make([]byte, 8<<20+16)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, rest); err != nil {
		t.Fatal(err)
	}
	if tail := rest[8<<20:]; !bytes.Equal(tail, pub.Bytes()) {
		t.Fatalf("request 1's last SGE went out as %q, want its own %q", tail, pub.Bytes())
	}
}

// TestDialsOnlyAddresses: the peer names the endpoint a QP dials (CLC, LLC);
// a name (looked up, perhaps somewhere else), an unspecified or multicast
// address, or port 0 is refused before anything is dialled.
func TestDialsOnlyAddresses(t *testing.T) {
	var dialled []string
	d := open(t, Config{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dialled = append(dialled, addr)
		return nil, errors.New("no dialling here")
	}})
	pd, cq := pdAndCQ(t, d)
	for _, ep := range []string{"metadata.internal:80", "localhost:22", "0.0.0.0:22", "[::]:22", "224.0.0.1:22", "192.0.2.1:0", ""} {
		q, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
		if err != nil {
			t.Fatal(err)
		}
		err = q.Connect(context.Background(), verbs.QPAttr{QPN: q.Attr().QPN + 1, PSN: 1, MTU: verbs.MTU1024, Endpoint: []byte(ep)})
		if !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("endpoint %q: %v, want ErrInvalid", ep, err)
		}
		q.Close()
	}
	if len(dialled) != 0 {
		t.Errorf("dialled %q", dialled)
	}
}
