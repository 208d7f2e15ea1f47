package nstest

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ownEnv marks a test binary BenchMain re-executed in a network namespace of its
// own, by its pid.
const ownEnv = "SMCR_NSTEST_OWN_NETNS"

// own is the process's namespace when BenchMain made it a fresh one: host A of
// one pair at a time.
var own struct {
	sync.Mutex
	ok    bool // the process runs in a namespace of its own
	inUse bool // a pair's A is that namespace now
}

// BenchMain runs m, for a TestMain. When benchmarks are asked for (as root), it
// first re-executes the binary in a fresh network namespace of its own, and
// NewPair then makes host A the process's namespace: a client in A dials from any
// goroutine, as an application in its namespace does, not through Do, whose
// goroutine is locked to a thread in A. A locked goroutine that waits hands its
// thread off and back, two futex wake-ups between threads: on these VMs they made
// a TCP connect through Do take ~100 µs against ~40 µs from a plain goroutine,
// and they weigh more on a handshake that waits more than once (docs/benchmarks-log.md).
// A run of tests alone is left as it is; tests that run beside benchmarks run
// in the new namespace too (its loopback up).
func BenchMain(m *testing.M) int {
	flag.Parse()
	// The mark names the process it was made for (exec keeps the pid): a child
	// that inherits it runs in its parent's namespace, not one of its own.
	if os.Getenv(ownEnv) == strconv.Itoa(os.Getpid()) {
		if err := loopbackUp(); err != nil {
			fmt.Fprintf(os.Stderr, "nstest: own namespace without loopback, pairs get a new one for A: %v\n", err)
		} else {
			own.ok = true
		}
		return m.Run()
	}
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" || os.Geteuid() != 0 {
		return m.Run()
	}
	if err := reexecIsolated(); err != nil {
		fmt.Fprintf(os.Stderr, "nstest: benchmarks dial from namespaces through Do: %v\n", err)
	}
	return m.Run()
}

// reexecIsolated replaces the process with itself started in a new network
// namespace; it returns only on failure. The new process's threads all descend
// from the one that called exec, in the new namespace.
func reexecIsolated() error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: a thread left in the new namespace by a failed exec
		// ends with this goroutine instead of running others.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, ownEnv+"=") })
		err := syscall.Exec(exe, os.Args, append(env, ownEnv+"="+strconv.Itoa(os.Getpid())))
		errc <- fmt.Errorf("exec %s: %w", exe, err)
	}()
	return <-errc
}

func loopbackUp() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(lo)
}

// newA is host A of a new pair: the process's own namespace when BenchMain made
// one and no other pair holds it, else a new namespace.
func newA(name string) (*NS, error) {
	own.Lock()
	defer own.Unlock()
	if !own.ok || own.inUse {
		return newNS(name)
	}
	h, err := netns.Get() // any thread not locked by Do is in the process's namespace
	if err != nil {
		return nil, fmt.Errorf("own netns: %w", err)
	}
	own.inUse = true
	return &NS{Name: "self", handle: h, own: true}, nil
}

// releaseOwn deletes the veth ends a pair left in the process's namespace (their
// peers go with them) and frees it for the next pair. Synchronously: a
// namespace's own removal frees its devices later, and the next pair reuses
// the addresses.
func (n *NS) releaseOwn() {
	for _, l := range n.Links {
		if link, err := netlink.LinkByName(l.Name); err == nil {
			netlink.LinkDel(link)
		}
	}
	n.handle.Close()
	own.Lock()
	own.inUse = false
	own.Unlock()
}
