// Test helpers: a cgroup v2 per test holding the test process, loaders inside test
// namespaces, listeners and dialers, and an AF_PACKET capture of TCP handshakes.

package bpf

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/smcr-io/smcr/internal/nstest"
	"golang.org/x/sys/unix"
)

func randHex() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// testCgroup moves the test process into a fresh cgroup v2 for the test's
// duration, so the programs attached there see only this test's sockets.
func testCgroup(t testing.TB) string {
	t.Helper()
	nstest.Require(t)
	mnt := nstest.Cgroup2(t)
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	orig := ""
	for line := range strings.SplitSeq(string(self), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			orig = p
		}
	}
	dir := filepath.Join(mnt, "smcr-bpftest-"+randHex())
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0); err != nil {
		os.Remove(dir)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(filepath.Join(mnt, orig, "cgroup.procs"), pid, 0); err != nil {
			t.Errorf("leave test cgroup: %v", err)
		}
		os.Remove(dir)
	})
	return dir
}

// loadIn loads the programs inside ns, with a pin directory of the test's own;
// the test's cleanup removes everything.
func loadIn(t testing.TB, ns *nstest.NS, opts Options) *Loader {
	t.Helper()
	if opts.PinDir == "" {
		opts.PinDir = "/sys/fs/bpf/smcr-test-" + randHex()
	}
	var l *Loader
	err := ns.Do(func() error {
		var err error
		l, err = Load(opts)
		return err
	})
	if err != nil {
		skipIfUnsupported(t, err)
		t.Fatalf("load in %s: %v", ns.Name, err)
	}
	t.Cleanup(func() {
		if err := l.Remove(); err != nil {
			t.Errorf("remove: %v", err)
		}
	})
	return l
}

// skipIfUnsupported skips the test when err says the kernel lacks a BPF
// feature and it does: cilium/ebpf's own finding (ErrNotSupported), or an
// errno that a missing feature gives and a probe of every program and map
// type smcr uses confirms. The same errno from a kernel that has them all is a
// bug of ours, and the caller fails on it.
func skipIfUnsupported(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, ebpf.ErrNotSupported) {
		t.Skipf("kernel lacks a BPF feature smcr needs: %v", err)
	}
	if errors.Is(err, syscall.Errno(524) /* ENOTSUPP */) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		if lacks := kernelLacks(); lacks != "" {
			t.Skipf("kernel lacks %s, which smcr needs: %v", lacks, err)
		}
	}
}

// kernelLacks names the first program or map type of smcr's programs the
// kernel does not have, or returns "". The program types imply the attach
// points smcr uses (getpeername hooks came before sk_lookup, in 5.8 and 5.9).
func kernelLacks() string {
	for _, pt := range []ebpf.ProgramType{ebpf.SockOps, ebpf.CGroupSockAddr, ebpf.CGroupSockopt, ebpf.SchedCLS, ebpf.SkLookup} {
		if err := features.HaveProgramType(pt); errors.Is(err, ebpf.ErrNotSupported) {
			return "program type " + pt.String()
		}
	}
	for _, mt := range []ebpf.MapType{ebpf.Array, ebpf.PerCPUArray, ebpf.LPMTrie, ebpf.LRUHash, ebpf.SkStorage, ebpf.SockMap} {
		if err := features.HaveMapType(mt); errors.Is(err, ebpf.ErrNotSupported) {
			return "map type " + mt.String()
		}
	}
	return ""
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// listen opens a listener in ns, tagged by l when tag is non-nil; MPTCP off.
func listen(t testing.TB, ns *nstest.NS, addr string, l *Loader, tag *Tag) net.Listener {
	t.Helper()
	var ln net.Listener
	err := ns.Do(func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		if tag != nil {
			lc.Control = l.Control(*tag)
		}
		var err error
		ln, err = lc.Listen(context.Background(), "tcp", addr)
		return err
	})
	must(t, err)
	t.Cleanup(func() { ln.Close() })
	return ln
}

// dial connects from ns, tagged by l when tag is non-nil.
func dial(t testing.TB, ns *nstest.NS, addr string, l *Loader, tag *Tag) net.Conn {
	t.Helper()
	var c net.Conn
	err := ns.Do(func() error {
		d := net.Dialer{Timeout: 3 * time.Second}
		d.SetMultipathTCP(false)
		if tag != nil {
			d.Control = l.Control(*tag)
		}
		var err error
		c, err = d.Dial("tcp", addr)
		return err
	})
	must(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// acceptWithin returns the next connection ln accepts within d, or nil.
func acceptWithin(t testing.TB, ln net.Listener, d time.Duration) net.Conn {
	t.Helper()
	tl := ln.(*net.TCPListener)
	tl.SetDeadline(time.Now().Add(d))
	defer tl.SetDeadline(time.Time{})
	c, err := tl.Accept()
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil
		}
		t.Fatalf("accept: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// whoAccepts dials addr from ns and reports which of the listeners took it.
func whoAccepts(t testing.TB, ns *nstest.NS, addr string, lns ...net.Listener) (int, net.Conn, net.Conn) {
	t.Helper()
	c := dial(t, ns, addr, nil, nil)
	for i, ln := range lns {
		if a := acceptWithin(t, ln, 300*time.Millisecond); a != nil {
			return i, c, a
		}
	}
	return -1, c, nil
}

func addrPort(a net.Addr) netip.AddrPort {
	ap := a.(*net.TCPAddr).AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// segment is one captured TCP handshake segment.
type segment struct {
	src, dst netip.AddrPort
	syn, ack bool
	smc      bool // carries kind 254, length 6, ExID E2D4C3D9
	smcx     bool // carries kind 254, length 6, ExID "SMCX" (smcrd's SYN-ACK)
}

func (s segment) String() string {
	return fmt.Sprintf("%s->%s syn=%v ack=%v smc=%v smcx=%v", s.src, s.dst, s.syn, s.ack, s.smc, s.smcx)
}

// capture records SYN and SYN-ACK segments on ifname inside ns until stop.
func capture(t testing.TB, ns *nstest.NS, ifname string) (stop func() []segment) {
	t.Helper()
	var fd int
	err := ns.Do(func() error {
		iface, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		proto := int(htons(unix.ETH_P_ALL))
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return err
		}
		tv := unix.Timeval{Usec: 100000}
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: iface.Index})
	})
	must(t, err)
	var (
		mu   sync.Mutex
		segs []segment
		done = make(chan struct{})
		quit = make(chan struct{})
	)
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			select {
			case <-quit:
				return
			default:
			}
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				continue
			}
			if s, ok := parseSegment(buf[:n]); ok {
				mu.Lock()
				segs = append(segs, s)
				mu.Unlock()
			}
		}
	}()
	var once sync.Once
	stop = func() []segment {
		once.Do(func() {
			close(quit)
			<-done
			unix.Close(fd)
		})
		mu.Lock()
		defer mu.Unlock()
		return segs
	}
	t.Cleanup(func() { stop() })
	return stop
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// parseSegment decodes an Ethernet frame holding a TCP SYN or SYN-ACK.
func parseSegment(f []byte) (segment, bool) {
	var s segment
	if len(f) < 14 {
		return s, false
	}
	et, p := binary.BigEndian.Uint16(f[12:]), f[14:]
	var src, dst netip.Addr
	switch {
	case et == unix.ETH_P_IP && len(p) >= 20 && p[9] == syscall.IPPROTO_TCP:
		src, dst = netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20]))
		p = p[int(p[0]&15)*4:]
	case et == unix.ETH_P_IPV6 && len(p) >= 40 && p[6] == syscall.IPPROTO_TCP:
		src, dst = netip.AddrFrom16([16]byte(p[8:24])), netip.AddrFrom16([16]byte(p[24:40]))
		p = p[40:]
	default:
		return s, false
	}
	if len(p) < 20 || p[13]&0x02 == 0 {
		return s, false
	}
	s.src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(p[0:]))
	s.dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(p[2:]))
	s.syn, s.ack = true, p[13]&0x10 != 0
	hl := int(p[12]>>4) * 4
	if hl < 20 || hl > len(p) {
		return s, false
	}
	s.smc = hasExpOption(p[20:hl], "\xe2\xd4\xc3\xd9")
	s.smcx = hasExpOption(p[20:hl], "SMCX")
	return s, true
}

// hasSMCOption is the reference walk of TCP options the tc program must agree with.
func hasSMCOption(opts []byte) bool { return hasExpOption(opts, "\xe2\xd4\xc3\xd9") }

// hasExpOption reports an experimental option (kind 254, length 6) with ExID exid,
// found as the kernel's bpf_load_hdr_opt finds it, which sockops asks: an
// experimental option too short for a 4-byte ExID ends the search, and the first
// with exid decides by its length.
func hasExpOption(opts []byte, exid string) bool {
	for i := 0; i < len(opts); {
		switch opts[i] {
		case 0:
			return false
		case 1:
			i++
			continue
		}
		if i+2 > len(opts) {
			return false
		}
		l := int(opts[i+1])
		if l < 2 || i+l > len(opts) {
			return false
		}
		if opts[i] == 254 && l < 6 {
			return false
		}
		if opts[i] == 254 && string(opts[i+2:i+6]) == exid {
			return l == 6
		}
		i += l
	}
	return false
}
