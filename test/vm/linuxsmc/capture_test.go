//go:build linuxsmc && ibv

// The wire of smcr against Linux as a protocol analyzer reads it: one first
// contact captured on lo and decoded by tshark's SMC dissector in the guest
// (issue #36, proof step 3). Only its TCP part: rxe hands RoCE v2 packets for a
// local address straight back to itself (rxe_loopback), so LLC and CDC never
// reach lo; their codecs' goldens go through tshark in llc's tests instead.

package linuxsmc

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/smcr"
)

const capturePort = 5003

// capture runs tcpdump on lo with filter, full frames, until stop, which
// returns the pcap's path.
func capture(t *testing.T, filter string) (stop func() string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "lo.pcap")
	cmd := exec.Command("tcpdump", "-i", loopback, "-s", "0", "-U", "--immediate-mode", "-w", path, filter)
	errs, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("tcpdump: %v", err)
	}
	listening := make(chan struct{})
	go func() {
		s := bufio.NewScanner(errs)
		for s.Scan() {
			if strings.Contains(s.Text(), "listening on") {
				close(listening)
				break
			}
		}
		for s.Scan() {
		}
	}()
	select {
	case <-listening:
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatal("tcpdump did not start listening")
	}
	return func() string {
		time.Sleep(200 * time.Millisecond) // the last frames
		cmd.Process.Signal(syscall.SIGINT)
		cmd.Wait()
		return path
	}
}

// tsharkLines runs tshark on pcap and returns one line per frame: the fields,
// tab-separated.
func tsharkLines(t *testing.T, pcap string, fields ...string) [][]string {
	t.Helper()
	args := []string{"-r", pcap, "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=,", "-E", "separator=/t"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	cmd := exec.Command("tshark", args...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, stderr.String())
	}
	var lines [][]string
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		lines = append(lines, strings.Split(l, "\t"))
	}
	return lines
}

// TestLinuxCaptureDecodes: Linux's client makes a first contact with the smcr
// engine's server and moves some data, captured on lo; tshark decodes the CLC
// messages as SMC-R version 2 (Proposal, Accept, Confirm) and every frame with
// no field malformed.
func TestLinuxCaptureDecodes(t *testing.T) {
	setupKernel(t)
	l := loadBPF(t, capturePort)
	e := newEngine(t, "server", -1, testUEID)
	ln := listenSMCR(t, l, capturePort)
	stop := capture(t, fmt.Sprintf("tcp port %d or udp port 4791", capturePort))
	served := serveOnce(e, ln, 0, 64<<10, func(c *smcr.Conn) error {
		if c.Mode() != smcr.ModeSMCR {
			return fmt.Errorf("mode %v, decline %v", c.Mode(), c.Decline())
		}
		return nil
	})
	fd := smcSocket(t)
	if err := unix.Connect(fd, &unix.SockaddrInet4{Port: capturePort, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("connect: %v", err)
	}
	f := os.NewFile(uintptr(fd), "smc-client")
	err := talk(f, 0, 256<<10, 64<<10, func() error { return unix.Shutdown(fd, unix.SHUT_WR) })
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("server: %v", err)
	}
	pcap := stop()

	lines := tsharkLines(t, pcap, "frame.number", "_ws.col.Protocol", "smc.clc_msg", "_ws.malformed", "_ws.col.Info")
	var clc []string
	for _, v := range lines {
		if len(v) < 5 {
			t.Fatalf("tshark line %q", v)
		}
		if v[3] != "" {
			t.Errorf("tshark: frame %s malformed: %s %s", v[0], v[1], v[4])
		}
		if v[2] != "" {
			clc = append(clc, v[2])
			if v[1] != "SMCv2" {
				t.Errorf("tshark: frame %s, CLC type %s, decoded as %s, want SMCv2", v[0], v[2], v[1])
			}
			t.Logf("tshark: frame %s %s %s", v[0], v[1], v[4])
		}
	}
	if strings.Join(clc, ",") != "1,2,3" {
		t.Fatalf("tshark decoded CLC messages %v, want Proposal, Accept and Confirm (1,2,3)", clc)
	}
	t.Logf("tshark: %d frames of a first contact, CLC version 2 decoded, none malformed", len(lines))
}
