// The direct mode end to end: unmodified dynamically linked programs started
// with libsmcr-preload.so on both hosts (as smcrctl run starts them), their
// bytes through the rings smcrd shares with them, over SMC-R.

package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/smcr-io/smcr/control"
)

// direct makes cmd run with the direct mode's library and this host's smcrd.
func (h *host) direct(cmd *exec.Cmd) *exec.Cmd {
	if _, err := os.Stat(bins.preload); err != nil {
		// Without it the program would run, unaccelerated, and the test
		// would blame the direct mode.
		h.t.Fatalf("the direct mode's library: %v (SMCR_E2E_BIN must hold libsmcr-preload.so)", err)
	}
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+bins.preload, "SMCR_DIRECT_SOCKET="+filepath.Join(h.dir, "direct.sock"))
	return cmd
}

// directBackground starts a long-running program with the library.
func (h *host) directBackground(name string, args ...string) *exec.Cmd {
	h.t.Helper()
	cmd := h.direct(h.command(name, args...))
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

// hashResult is hash_client.py's output.
type hashResult struct {
	OK    bool
	Ports []int
}

func requirePython(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed (scripts/deps.sh installs it)")
	}
}

// TestDirect: a Python asyncio client (epoll, nonblocking) and a threaded
// Python echo server (blocking calls), both with the library, carry 4 MiB
// each way on each of 4 connections at once, checked by hash; both smcrds
// count them as the direct mode's SMC-R connections, none through the relay.
func TestDirect(t *testing.T) {
	requirePython(t)
	for _, p := range providers() {
		t.Run(p, func(t *testing.T) {
			a, b := hosts(t)
			a.start(a.providerConf(p)...)
			b.start(b.providerConf(p)...)
			b.directBackground("python3", "testdata/echo_server.py", "5201")
			b.waitListening(5201)

			const conns = 4
			out, err := a.direct(a.command("python3", "testdata/hash_client.py", "198.18.0.2", "5201", strconv.Itoa(4<<20), strconv.Itoa(conns))).Output()
			if err != nil {
				var stderr []byte
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = ee.Stderr
				}
				t.Fatalf("client: %v: %s%s", err, out, stderr)
			}
			var r hashResult
			if err := json.Unmarshal(out, &r); err != nil || !r.OK || len(r.Ports) != conns {
				t.Fatalf("client: %s (%v)", out, err)
			}
			for _, h := range []*host{a, b} {
				st := h.stats()
				if st.Direct.SMCR != conns || st.Direct.TCP != 0 {
					t.Errorf("smcrd %s: direct %+v, want %d SMC-R", h.name, st.Direct, conns)
				}
				// Over shm both ends are libraries on one host: they
				// write into each other's rings, smcrd out of the way.
				if want := map[bool]uint64{true: conns}[p == "shm"]; st.Direct.Bypass != want {
					t.Errorf("smcrd %s: %d connections library to library, want %d", h.name, st.Direct.Bypass, want)
				}
				if n := st.Programs["redirected"] + st.Programs["steered"]; n != 0 {
					t.Errorf("smcrd %s: %d connections through the relay", h.name, n)
				}
				if st.Connections.SMCR != conns || st.Connections.V1 != conns || st.Connections.V2 != 0 {
					t.Errorf("smcrd %s: %d SMC-R connections (v1 %d, v2 %d), want %d, all v1", h.name,
						st.Connections.SMCR, st.Connections.V1, st.Connections.V2, conns)
				}
			}
		})
	}
}

// TestDirectConnsTable: while a direct connection is open, both smcrds list
// it as SMC-R on the direct path, with the program's own addresses.
func TestDirectConnsTable(t *testing.T) {
	requirePython(t)
	a, b := hosts(t)
	a.start(a.providerConf("shm")...)
	b.start(b.providerConf("shm")...)
	b.directBackground("python3", "testdata/echo_server.py", "5201")
	b.waitListening(5201)
	// A client that holds its connection open while the tables are read.
	a.directBackground("python3", "-c", `
import socket, time
s = socket.create_connection(("198.18.0.2", 5201))
s.sendall(b"x"); s.recv(1)
time.sleep(60)`)
	up := func(cs []control.Conn) bool { return len(cs) == 1 && cs[0].Mode == control.ModeSMCR }
	for i := 0; i < 100 && !(up(a.conns()) && up(b.conns())); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	for _, h := range []*host{a, b} {
		cs := h.conns()
		if len(cs) != 1 || cs[0].Mode != control.ModeSMCR || cs[0].Path != control.PathDirect {
			t.Fatalf("smcrd %s lists %+v, want one SMC-R connection on the direct path", h.name, cs)
		}
	}
	if got := b.conns()[0]; got.Local != "198.18.0.2:5201" || got.Role != "server" {
		t.Errorf("server side: %+v", got)
	}
}
