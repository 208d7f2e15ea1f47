// The peer-process test: the far end of an RC connection runs in a child process
// that is killed with SIGKILL, as a crashed smcrd would be (RFC 7609 §4.5 link
// failure: outstanding work must fail, never hang).

package verbstest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// peerHello is what each end tells the other, one JSON object per line.
type peerHello struct {
	QP verbs.QPAttr
	MR remoteMR
}

// runPattern is a -test.run pattern that selects exactly the test named name.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

func testPeerDies(t *testing.T, env Env) {
	if env.SkipPeerProcess != "" {
		t.Skip(env.SkipPeerProcess)
	}
	da, _ := openDevices(t, env)
	a := newSide(t, da, 4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite, 7, 16)

	// Re-execute this test binary, selecting the test that called Run.
	parent := t.Name()[:strings.LastIndex(t.Name(), "/")]
	command := env.PeerCommand
	if command == nil {
		command = exec.Command
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatalf("find test binary: %v", err)
	}
	cmd := command(self, "-test.run="+runPattern(parent), "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), peerEnvVar+"=1")
	toChildR, toChildW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	fromChildR, fromChildW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.ExtraFiles = []*os.File{fromChildW, toChildR} // fd 3: to parent, fd 4: from parent
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start peer process: %v", err)
	}
	fromChildW.Close()
	toChildR.Close()
	killed := false
	t.Cleanup(func() {
		toChildW.Close()
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
		fromChildR.Close()
		if t.Failed() {
			t.Logf("peer process output:\n%s", stderr.String())
		}
	})

	in := bufio.NewReader(fromChildR)
	var child peerHello
	if err := readLine(in, &child, env.timeout()); err != nil {
		t.Fatalf("peer hello: %v", err)
	}
	a.remote = child.MR
	for i := range 4 {
		postRecv(t, a.qp, uint64(100+i), a.mr, i*64, 64)
	}
	if err := json.NewEncoder(toChildW).Encode(peerHello{QP: a.qp.Attr(), MR: describe(a.mr)}); err != nil {
		t.Fatalf("send hello to peer: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), env.timeout())
	defer cancel()
	if err := a.qp.Connect(ctx, child.QP); err != nil {
		t.Fatalf("connect to peer process: %v", err)
	}
	// The peer sends one message once it is connected: the pair works both ways.
	wc := waitWC(t, env, a.rcq, 1)[0]
	wantWC(t, wc, 100, verbs.WCSuccess, verbs.WCRecv)
	if got := string(a.mr.Bytes()[:wc.ByteLen]); got != "alive" {
		t.Fatalf("peer said %q", got)
	}
	copy(a.mr.Bytes()[1000:], "written before the kill")
	postSend(t, a.qp, &verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Signaled: true,
		SG: []verbs.SGE{{MR: a.mr, Offset: 1000, Length: 23}}, RemoteAddr: a.remote.Addr, RKey: a.remote.RKey})
	wantWC(t, waitWC(t, env, a.scq, 1)[0], 1, verbs.WCSuccess, verbs.WCWrite)

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill peer: %v", err)
	}
	cmd.Wait()
	killed = true

	// A request to the dead peer fails (retry exceeded, or flushed if the provider
	// noticed the death first), and the posted receives are flushed.
	err = a.qp.PostSend(&verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Signaled: true,
		SG: []verbs.SGE{{MR: a.mr, Length: 8}}})
	switch {
	case err == nil:
		wc := waitWC(t, env, a.scq, 1)[0]
		if wc.ID != 2 || wc.Status == verbs.WCSuccess {
			t.Fatalf("send to a dead peer completed %+v, want an error", wc)
		}
	case !isState(err):
		t.Fatalf("post send to a dead peer: %v", err)
	}
	for i, wc := range waitWC(t, env, a.rcq, 3) {
		wantWC(t, wc, uint64(101+i), verbs.WCWRFlushErr, 0)
	}
	if st := a.qp.State(); st != verbs.QPError {
		t.Fatalf("QP in state %v after its peer died, want ERROR", st)
	}
}

func isState(err error) bool { return errors.Is(err, verbs.ErrQPState) }

// runPeer is the child's side: open a device, connect, say "alive", wait for SIGKILL.
func runPeer(t *testing.T, env Env) {
	out, in := os.NewFile(3, "to-parent"), os.NewFile(4, "from-parent")
	if out == nil || in == nil {
		t.Fatal("verbstest: peer process started without its pipes")
	}
	var dev verbs.Device
	if env.OpenPeer != nil {
		dev = env.OpenPeer(t)
	} else {
		a, b := env.Open(t)
		a.Close()
		dev = b
	}
	defer dev.Close()
	s := newSide(t, dev, 4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite, 7, 16)
	for i := range 4 {
		postRecv(t, s.qp, uint64(i), s.mr, 2048+i*64, 64)
	}
	if err := json.NewEncoder(out).Encode(peerHello{QP: s.qp.Attr(), MR: describe(s.mr)}); err != nil {
		t.Fatalf("peer: hello: %v", err)
	}
	br := bufio.NewReader(in)
	var parent peerHello
	if err := readLine(br, &parent, env.timeout()); err != nil {
		t.Fatalf("peer: parent hello: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), env.timeout())
	defer cancel()
	if err := s.qp.Connect(ctx, parent.QP); err != nil {
		t.Fatalf("peer: connect: %v", err)
	}
	copy(s.mr.Bytes(), "alive")
	postSend(t, s.qp, &verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Signaled: true, SG: []verbs.SGE{{MR: s.mr, Length: 5}}})
	wantWC(t, waitWC(t, env, s.scq, 1)[0], 1, verbs.WCSuccess, verbs.WCSend)
	// Block until killed; if the parent goes away first, its pipe closes.
	br.ReadString('\n')
}

// readLine decodes one JSON line from r, or fails after timeout.
func readLine(r *bufio.Reader, v any, timeout time.Duration) error {
	type result struct {
		line string
		err  error
	}
	c := make(chan result, 1)
	go func() {
		line, err := r.ReadString('\n')
		c <- result{line, err}
	}()
	select {
	case res := <-c:
		if res.err != nil {
			return res.err
		}
		return json.Unmarshal([]byte(res.line), v)
	case <-time.After(timeout):
		return fmt.Errorf("no line within %v", timeout)
	}
}
