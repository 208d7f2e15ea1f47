// How the tests wait: for a condition (waitFor, eventually), a channel
// (within), or a goroutine's state (goBlocked, goroutinesIn), rather than for
// a fixed time that is too short on a busy machine and too long elsewhere.

package smcr

import (
	"bytes"
	"net"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/internal/leakcheck"
)

// waitLimit bounds a wait in a test for what comes at once when all is well,
// far beyond the pauses of a busy machine under the race detector.
const waitLimit = 30 * time.Second

// waitFor reports whether cond came true within d, asking every millisecond:
// the tests' one poll, for states (counters, a socket's queue, goroutines)
// that signal nothing when they change.
func waitFor(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// eventually waits up to 5 s for cond, or fails the test.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !waitFor(5*time.Second, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// within receives from ch, or fails the test after waitLimit: a test that
// waits for ever hangs the whole suite until its timeout, unnamed.
func within[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// awaitInput waits, in poll(2), until conn has input or an error pending (what
// pendingInput asks without waiting), or fails the test after waitLimit.
func awaitInput(t *testing.T, conn net.Conn) {
	t.Helper()
	rc, err := conn.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	rc.Control(func(fd uintptr) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
		for n, err = unix.Poll(pfd, int(waitLimit/time.Millisecond)); err == unix.EINTR; {
			n, err = unix.Poll(pfd, int(waitLimit/time.Millisecond))
		}
	})
	if err != nil || n == 0 {
		t.Fatalf("no input within %v: %v", waitLimit, err)
	}
}

// goBlocked runs f in a goroutine of its own and returns once f has returned
// or its goroutine is blocked (on a channel, a select, a mutex), with a channel
// closed when f returns. It reports a goroutine still running after waitLimit
// with t.Error, so that it may be called from any goroutine.
func goBlocked(t testing.TB, f func()) (done <-chan struct{}) {
	ended := make(chan struct{})
	id := make(chan uint64, 1)
	go func() {
		defer close(ended)
		id <- goroutineID()
		f()
	}()
	g := <-id
	if !waitFor(waitLimit, func() bool { return isClosed(ended) || goroutineBlocked(g, "") }) {
		t.Errorf("goroutine %d neither returned nor blocked", g)
	}
	return ended
}

// goroutineBlocked reports whether goroutine id waits (in state, or in any
// state but running, runnable or a system call when state is empty).
func goroutineBlocked(id uint64, state string) bool {
	for _, g := range goroutineStacks() {
		if g.id != id {
			continue
		}
		if state != "" {
			return g.state == state
		}
		switch g.state {
		case "running", "runnable", "syscall", "preempted":
			return false
		}
		return true
	}
	return false
}

// goroutinesIn counts the goroutines whose stack holds frame (a function's
// qualified name, e.g. "smcr.(*Conn).watchTCP(").
func goroutinesIn(frame string) int {
	n := 0
	for _, g := range goroutineStacks() {
		if bytes.Contains(g.stack, []byte(frame)) {
			n++
		}
	}
	return n
}

// goroutineWaitingIn reports whether a goroutine whose stack holds frame waits
// in state (as goroutineStack.state).
func goroutineWaitingIn(frame, state string) bool {
	for _, g := range goroutineStacks() {
		if g.state == state && bytes.Contains(g.stack, []byte(frame)) {
			return true
		}
	}
	return false
}

type goroutineStack struct {
	id    uint64
	state string // as the header writes it, without its duration: "select", "sync.Mutex.Lock"
	stack []byte
}

// goroutineStacks parses runtime.Stack's dump of every goroutine.
func goroutineStacks() []goroutineStack {
	var gs []goroutineStack
	for _, block := range bytes.Split(leakcheck.Stacks(), []byte("\n\n")) {
		header, stack, _ := bytes.Cut(block, []byte("\n"))
		// goroutine 18 [select, 2 minutes]:
		rest, ok := bytes.CutPrefix(header, []byte("goroutine "))
		if !ok {
			continue
		}
		num, state, _ := bytes.Cut(rest, []byte(" ["))
		id, err := strconv.ParseUint(string(num), 10, 64)
		if err != nil {
			continue
		}
		state, _, _ = bytes.Cut(state, []byte("]"))
		state, _, _ = bytes.Cut(state, []byte(","))
		gs = append(gs, goroutineStack{id: id, state: string(state), stack: stack})
	}
	return gs
}

// goroutineID is the calling goroutine's ID.
func goroutineID() uint64 {
	var buf [64]byte
	header := buf[:runtime.Stack(buf[:], false)]
	header = bytes.TrimPrefix(header, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(header[:bytes.IndexByte(header, ' ')]), 10, 64)
	return id
}
