// Connections that reach smcrd's listeners without the programs having sent
// them there: a local program (any user, any cgroup) connecting to the
// steering or the redirect listener's own loopback address.

package e2e

import (
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStrayConnections: a connection straight to the steering listener is
// closed at once. smcrd took it for a steered connection, connected to its
// local address (the steering listener itself) and so on, thousands of times
// a second, until it ran out of file descriptors. Neither listener logs more
// than a few lines for a flood of them, and the real path still works.
func TestStrayConnections(t *testing.T) {
	a, b := hosts(t)
	a.start("providers = shm", ports)
	b.start("providers = shm", ports)
	b.serve(5201)
	m := regexp.MustCompile(`msg=listening redirect4=([0-9.:]+) .*steering="?\[(127\.0\.0\.1:[0-9]+)`).FindStringSubmatch(b.logText())
	if m == nil {
		t.Fatalf("smcrd on B did not log its listeners:\n%s", b.logText())
	}
	redirect, steering := m[1], m[2]
	fds := func() int {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", b.smcrd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := fds()
	const n = 50
	for _, addr := range []string{steering, redirect} {
		for i := range n {
			c, err := b.ns.Dial("tcp", addr)
			if errors.Is(err, syscall.ECONNRESET) {
				continue // reset before connect returned
			}
			if err != nil {
				t.Fatalf("connection %d to %s: %v", i, addr, err)
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
				t.Fatalf("connection %d to %s: read %v, want it closed by smcrd", i, addr, err)
			}
			c.Close()
		}
	}
	time.Sleep(200 * time.Millisecond)
	if after := fds(); after > before+10 {
		t.Errorf("smcrd on B holds %d file descriptors after %d stray connections, %d before", after, 2*n, before)
	}
	log := b.logText()
	for _, what := range []string{"steering listener not steered", "redirect listener not redirected"} {
		if got := strings.Count(log, what); got == 0 || got > 5 {
			t.Errorf("%d log lines %q for %d connections, want 1 to 5", got, what, n)
		}
	}
	if st := b.stats(); st.Connections.Fallback != 0 || st.Connections.HandshakeErrors != 0 {
		t.Errorf("B counts %d fallbacks and %d handshake errors for stray connections, want none", st.Connections.Fallback, st.Connections.HandshakeErrors)
	}
	if r, err := a.client(fmt.Sprintf("%s:5201", b.ns.Addr4()), "-mode", "echo", "-bytes", "1000"); err != nil || r.OK != 1 {
		t.Fatalf("a steered connection after the strays: %+v %v", r, err)
	}
	if st := b.stats(); st.Connections.SMCR != 1 {
		t.Errorf("B: %d SMC-R connections after a steered one, want 1", st.Connections.SMCR)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
