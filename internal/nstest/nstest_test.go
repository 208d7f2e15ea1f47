package nstest

import (
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/smcr-io/smcr/internal/cgroupfs"
)

func TestPairCarriesTraffic(t *testing.T) {
	p := NewPair(t)
	for _, addr := range []netip.Addr{p.B.Addr4(), p.B.Addr6()} {
		ln, err := p.B.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan string, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				got <- err.Error()
				return
			}
			defer c.Close()
			b, _ := io.ReadAll(c)
			got <- c.RemoteAddr().String() + " " + string(b)
		}()
		c, err := p.A.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("hello"))
		c.Close()
		want := netip.AddrPortFrom(p.A.Addr4(), 0).Addr().String()
		if addr.Is6() {
			want = "[" + p.A.Addr6().String() + "]"
		}
		if s := <-got; !strings.HasPrefix(s, want) || !strings.HasSuffix(s, " hello") {
			t.Errorf("B saw %q, want a connection from %s carrying hello", s, want)
		}
		ln.Close()
	}
}

func TestNamespacesAreIsolated(t *testing.T) {
	p := NewPair(t)
	// Each namespace holds its own end of the veth pair and not the other.
	out, err := p.A.Command("ip", "-brief", "addr").CombinedOutput()
	if err != nil {
		t.Fatalf("ip addr in A: %v %s", err, out)
	}
	if !strings.Contains(string(out), p.A.Addr4().String()) || strings.Contains(string(out), p.B.Addr4().String()) {
		t.Errorf("namespace A addresses:\n%s", out)
	}
}

func TestAddLink(t *testing.T) {
	p := NewPair(t)
	a, b := p.AddLink()
	if a.Addr4.Addr().String() != "198.19.0.1" || b.Addr4.Addr().String() != "198.19.0.2" {
		t.Fatalf("second link addresses %v %v", a.Addr4, b.Addr4)
	}
	ln, err := p.B.Listen("tcp", netip.AddrPortFrom(b.Addr4.Addr(), 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := p.A.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial over second link: %v", err)
	}
	c.Close()
}

func TestBaselines(t *testing.T) {
	p := NewPair(t)
	bps, err := p.TCPThroughput(64<<10, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	if bps <= 0 {
		t.Fatalf("throughput %v", bps)
	}
	rtts, err := p.TCPPingPong(64, 200)
	if err != nil {
		t.Fatal(err)
	}
	if len(rtts) != 200 || Percentile(rtts, 50) <= 0 || Percentile(rtts, 50) > time.Second {
		t.Fatalf("ping-pong: %d samples, p50 %v", len(rtts), Percentile(rtts, 50))
	}
	t.Logf("TCP over veth: %.0f MB/s, 64 B p50 %v p99 %v", bps/1e6, Percentile(rtts, 50), Percentile(rtts, 99))
}

func TestPercentile(t *testing.T) {
	d := []time.Duration{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 5}, {90, 9}, {99, 10}, {100, 10}, {0, 1}} {
		if got := Percentile(d, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if Percentile(nil, 50) != 0 {
		t.Error("empty percentile")
	}
}

func TestOpenPairWithoutTB(t *testing.T) {
	Require(t)
	p, err := OpenPair()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := p.B.Listen("tcp", netip.AddrPortFrom(p.B.Addr4(), 0).String())
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := p.A.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Errorf("dial across the pair: %v", err)
	} else {
		c.Close()
	}
	ln.Close()
	p.Close()
	if _, err := os.Stat("/run/netns/" + p.A.Name); !os.IsNotExist(err) {
		t.Errorf("namespace %s still there after Close (stat: %v)", p.A.Name, err)
	}
}

func TestMain(m *testing.M) { os.Exit(BenchMain(m)) }

// TestBenchMainIsolates runs this binary's BenchmarkOwnNamespace the way go test
// -bench does: BenchMain re-executes it in a namespace of its own, whose pair's
// host A is the process's namespace, reached without Do.
func TestBenchMainIsolates(t *testing.T) {
	Require(t)
	parent, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^BenchmarkOwnNamespace$", "-test.benchtime=1x")
	cmd.Env = append(os.Environ(), "NSTEST_PARENT_NS="+parent)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "own namespace: A is the process's, dialled without Do") {
		t.Fatalf("%v\n%s", err, out)
	}
}

// BenchmarkOwnNamespace is TestBenchMainIsolates' probe: it fails unless the
// process runs in a namespace other than its starter's and a pair's A is that
// namespace.
func BenchmarkOwnNamespace(b *testing.B) {
	parent := os.Getenv("NSTEST_PARENT_NS")
	if parent == "" {
		b.Skip("run by TestBenchMainIsolates")
	}
	if self, err := os.Readlink("/proc/self/ns/net"); err != nil || self == parent || !own.ok {
		b.Fatalf("process namespace %s (%v), its starter's %s", self, err, parent)
	}
	p := NewPair(b)
	q := NewPair(b) // A is taken: q gets namespaces of its own
	if !p.A.own || q.A.own {
		b.Fatalf("own: p.A %v, q.A %v", p.A.own, q.A.own)
	}
	ln, err := p.B.Listen("tcp", netip.AddrPortFrom(p.B.Addr4(), 0).String())
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	for range b.N {
		c, err := net.Dial("tcp", ln.Addr().String()) // from this goroutine, in A
		if err != nil {
			b.Fatal(err)
		}
		if got := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr(); got != p.A.Addr4() {
			b.Fatalf("dialled from %v, want %v", got, p.A.Addr4())
		}
		c.Close()
	}
	b.Log("own namespace: A is the process's, dialled without Do")
}

// TestCgroup2MountsIt: with no cgroup2 mount (a mount namespace of its own,
// every cgroup2 mount detached), Cgroup2 mounts one, and it is the real
// hierarchy: it lists the test process's cgroup.
func TestCgroup2MountsIt(t *testing.T) {
	Require(t)
	if os.Getenv("NSTEST_CGROUP2_CHILD") == "1" {
		if mnt, err := cgroupfs.Mount(); err == nil {
			t.Fatalf("cgroup2 still mounted at %s", mnt)
		}
		mnt := Cgroup2(t)
		if _, err := os.Stat(filepath.Join(mnt, "cgroup.procs")); err != nil {
			t.Fatalf("Cgroup2 gave %s: %v", mnt, err)
		}
		if got, _ := cgroupfs.Mount(); got != mnt {
			t.Fatalf("/proc/mounts does not list %s", mnt)
		}
		return
	}
	Cgroup2(t) // mounted here if nothing is: the child detaches every mount there is
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	script := `for m in $(awk '$3 == "cgroup2" {print $2}' /proc/mounts); do umount -l "$m"; done; exec "$0" -test.run '^TestCgroup2MountsIt$' -test.v`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script, exe)
	cmd.Env = append(os.Environ(), "NSTEST_CGROUP2_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestCgroup2MountsIt") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
