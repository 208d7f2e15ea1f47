// Golden-output tests of smcrctl against a real smcrd, built from this tree and run
// in a fresh network namespace with its own cgroup, so the verbs are checked
// against the daemon's real Backend and not only the fake.

package cli_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/smcr-io/smcr/cmd/smcrctl/cli"
	"github.com/smcr-io/smcr/cmd/smcrctl/cli/clitest"
	"github.com/smcr-io/smcr/config"
	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/internal/nstest"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startSmcrd builds smcrd and runs it in a new namespace with the given
// configuration file contents; it returns the socket and the configuration file.
func startSmcrd(t *testing.T, conf string) (sock, file string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs smcrd; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, cgroups and BPF")
	}
	nstest.Require(t)
	mnt := nstest.Cgroup2(t)
	// A directory of fixed path length (/tmp, not $TMPDIR), so that normalizing its
	// random part keeps the columns of tables that print it (show config) aligned.
	var id [4]byte
	rand.Read(id[:])
	name := "smcr-cli-" + hex.EncodeToString(id[:])
	dir := filepath.Join("/tmp", name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "smcrd")
	if out, err := exec.Command("go", "build", "-o", bin, "../../../cmd/smcrd").CombinedOutput(); err != nil {
		t.Fatalf("build smcrd: %v\n%s", err, out)
	}
	cg := filepath.Join(mnt, name)
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	cgFD, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	pin := filepath.Join("/sys/fs/bpf", name)
	ns := nstest.NewPair(t).A

	sock = filepath.Join(dir, "smcrd.sock")
	file = filepath.Join(dir, "smcrd.conf")
	conf = "cgroup = " + name + "\ncontrol_socket = " + sock + "\nmetrics_address =\n" + conf
	if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// nsenter joins only the network namespace, so /sys/fs/bpf and the cgroup mount
	// stay as they are; the process starts inside its cgroup.
	cmd := exec.Command("nsenter", "--net=/run/netns/"+ns.Name, bin, "-config", file, "-pin-dir", pin,
		"-shm-dir", filepath.Join(dir, "shm"), "-liveness-ttl", "1s", "-drain-timeout", "1s")
	// smcrd runs as a systemd Type=notify service (configs/smcrd.service): check that
	// it says READY=1 on $NOTIFY_SOCKET, as systemd would receive it.
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "notify"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+filepath.Join(dir, "notify"))
	log := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cgFD.Fd()), Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("smcrd did not stop on SIGTERM")
		}
		if t.Failed() {
			t.Logf("smcrd log:\n%s", log)
		}
		cgFD.Close()
		os.RemoveAll(pin)
		os.Remove(cg)
	})
	c := control.NewClient(sock)
	defer c.Close()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Status(ctx)
		cancel()
		if err == nil {
			notify.SetReadDeadline(time.Now().Add(10 * time.Second))
			buf := make([]byte, 1024)
			n, err := notify.Read(buf)
			if err != nil || !strings.Contains(string(buf[:n]), "READY=1") {
				t.Fatalf("smcrd's sd_notify: %q, %v; want READY=1", buf[:n], err)
			}
			return sock, file
		}
		select {
		case <-done:
			t.Fatalf("smcrd exited: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("smcrd not answering: %v\n%s", err, log)
		}
	}
}

// normalizeReal hides what a real smcrd varies from run to run.
var realVarying = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`smcr-cli-[0-9a-f]{8}`), "smcr-cli-XXXXXXXX"},
	{regexp.MustCompile(`(?m)^(pid:\s+)\d+`), "${1}PID"},
	{regexp.MustCompile(`(?m)^(uptime:\s+)\S+`), "${1}UPTIME"},
	{regexp.MustCompile(`(?m)^(smcrd:?\s+)\S+`), "${1}VERSION"},
	{regexp.MustCompile(`Counters for the last \S+`), "Counters for the last DURATION"},
}

func normalizeReal(s string) string {
	for _, v := range realVarying {
		s = v.re.ReplaceAllString(s, v.repl)
	}
	return s
}

func TestGoldenRealSmcrd(t *testing.T) {
	sock, file := startSmcrd(t, "port_range_list = 5201\nproviders = shm,soft\n")
	h := clitest.Harness{Dir: "testdata/smcrd", Socket: sock, SocketName: normalizeReal(sock), Normalize: normalizeReal}
	for _, c := range []clitest.Case{
		{Name: "status", Args: []string{"status"}},
		{Name: "show_config", Args: []string{"show", "config"}},
		{Name: "linkgroups", Args: []string{"linkgroups"}},
		{Name: "links", Args: []string{"links"}},
		{Name: "conns", Args: []string{"conns", "-d"}},
		{Name: "peers", Args: []string{"peers"}},
		{Name: "stats", Args: []string{"stats", "-d"}},
		{Name: "set_bad", Args: []string{"set", "port_range_list=20-1", "max_memory=64"}, Exit: cli.ExitError},
		{Name: "set_persist", Args: []string{"set", "port_range_list=5201,6379", "max_memory=64", "-P"}},
		{Name: "set_restart", Args: []string{"set", "providers=soft", "rmb_size=128K", "clc_timeout=3s"}},
		{Name: "set_ueid_list", Args: []string{"set", "ueid_list=SMCR-V2PROBE.UEID,PLANT-7"}},
		{Name: "show_config_ueid_list", Args: []string{"show", "config", "ueid_list"}},
		{Name: "set_ueid_list_bad", Args: []string{"set", "ueid_list=plant-7"}, Exit: cli.ExitError},
		{Name: "disable", Args: []string{"disable"}},
		{Name: "status_disabled", Args: []string{"status"}},
		{Name: "enable", Args: []string{"enable"}},
		{Name: "stats_reset", Args: []string{"stats", "-r"}},
		{Name: "version", Args: []string{"version"}},
	} {
		h.Run(t, c)
	}

	// set -P really wrote the file smcrd runs from; the refused set changed nothing.
	saved, err := config.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	if got := saved.PortRanges.String(); got != "5201,6379" || saved.MaxMemory != 64<<20 {
		t.Errorf("saved port_range_list %s, max_memory %d", got, saved.MaxMemory)
	}
	// devices vary with the host (MACs, GIDs): check the shape, not the text.
	r := h.Exec("devices", "--json")
	var ds []control.Device
	if err := json.Unmarshal([]byte(r.Stdout), &ds); err != nil || r.Exit != 0 {
		t.Fatalf("devices --json: exit %d, %v\n%s%s", r.Exit, err, r.Stdout, r.Stderr)
	}
	for _, d := range ds {
		if d.Name == "" || d.Provider == "" {
			t.Errorf("device without name or provider: %+v", d)
		}
	}
	if r := h.Exec("devices"); r.Exit != 0 || !strings.HasPrefix(r.Stdout, "DEVICE") {
		t.Errorf("devices: exit %d\n%s%s", r.Exit, r.Stdout, r.Stderr)
	}
}
