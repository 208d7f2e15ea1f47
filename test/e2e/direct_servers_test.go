// The direct mode with more servers from Debian packages, all started with
// libsmcr-preload.so on both hosts: memcached (libevent, worker threads that
// take the accepted sockets from the listener's thread), haproxy in front of
// nginx (haproxy splices), and sshd with scp (sshd forks per connection and
// passes the socket between its processes). Bytes are checked by hash, and
// every connection is verified as the direct mode's SMC-R in both smcrds'
// counters and, while one is open, in their tables and in the library's own
// view (the shared areas it maps in the program).

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/smcr-io/smcr/control"
)

// holdOpen starts a Python client with the library on h that connects to the
// other host's port, sends hello, reads a reply, and keeps the connection
// open until the returned function closes its stdin: while it holds, both
// smcrds' tables must list it.
func holdOpen(t *testing.T, h *host, port int, hello string) (client *proc, release func()) {
	t.Helper()
	cmd := h.direct(h.command("python3", "-c", `
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.sendall(sys.argv[3].encode())
if not s.recv(1 << 16):
    sys.exit("no reply")
print("up", flush=True)
sys.stdin.read()
s.close()`, h.other.ns.Addr4().String(), strconv.Itoa(port), hello))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := h.startCmd(cmd)
	if !waitFor(10*time.Second, func() bool { return strings.Contains(p.out(), "up") }) {
		t.Fatalf("held connection to port %d did not come up: %s %s", port, p.out(), p.errOut())
	}
	return p, func() {
		stdin.Close()
		if !p.wait(10 * time.Second) {
			t.Errorf("held connection to port %d: its client did not end", port)
		}
	}
}

// wantLibraryMapped checks the library's own view of the program: it holds
// at least n connections' shared areas (smcrd's "smcr-direct" memfds) mapped,
// which it does only for the connections it carries over SMC-R.
func wantLibraryMapped(t *testing.T, p *proc, n int) {
	t.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", p.cmd.Process.Pid))
	if err != nil {
		t.Fatalf("%s's mappings: %v", p.cmd.Args[0], err)
	}
	areas := map[string]bool{} // by inode: an area may be mapped in parts
	for _, l := range strings.Split(string(maps), "\n") {
		if f := strings.Fields(l); len(f) >= 6 && strings.HasPrefix(f[5], "/memfd:smcr-direct") {
			areas[f[4]] = true
		}
	}
	if len(areas) < n {
		t.Errorf("%s maps %d shared areas of the direct mode, want at least %d: the library does not carry its connections", strings.Join(p.cmd.Args, " "), len(areas), n)
	}
}

// wantDirectBoth waits until both smcrds counted the same number of the
// direct mode's SMC-R connections, at least least, and checks that those are
// all they carried: each connection between two libraries is counted once on
// each side.
func wantDirectBoth(t *testing.T, a, b *host, least uint64) {
	t.Helper()
	var sa, sb control.Stats
	waitFor(5*time.Second, func() bool {
		sa, sb = a.stats(), b.stats()
		return sa.Direct.SMCR == sb.Direct.SMCR && sa.Direct.SMCR >= least
	})
	if sa.Direct.SMCR != sb.Direct.SMCR || sa.Direct.SMCR < least {
		t.Errorf("direct SMC-R connections: %s %+v, %s %+v; want the same on both, at least %d", a.name, sa.Direct, b.name, sb.Direct, least)
	}
	wantDirect(t, a, sa.Direct.SMCR)
	wantDirect(t, b, sb.Direct.SMCR)
}

// TestDirectProgramsMemcached: memcached (libevent, four worker threads) and
// Python clients on eight connections at once, storing values from 1 byte to
// 512 KiB and reading them back with multi-gets, every byte checked.
func TestDirectProgramsMemcached(t *testing.T) {
	needPrograms(t, "memcached")
	requirePython(t)
	eachProvider(t, testDirectMemcached)
}

func testDirectMemcached(t *testing.T, p string) {
	a, b := directHosts(t, p)
	server := b.startProc(true, "memcached", "-u", "root", "-p", "5201", "-U", "0", "-l", "0.0.0.0", "-t", "4", "-m", "256", "-I", "1m")
	b.waitListening(5201)

	client, release := holdOpen(t, a, 5201, "version\r\n")
	wantDirectConns(t, a, 1)
	wantDirectConns(t, b, 1)
	wantLibraryMapped(t, client, 1)
	wantLibraryMapped(t, server, 1)
	release()

	const conns, keys = 8, 12
	wire := offWire(t, a, p)
	out := a.run(a.direct(a.command("python3", "testdata/memcached_client.py", b.ns.Addr4().String(), "5201", strconv.Itoa(conns), strconv.Itoa(keys))), 60*time.Second)
	var r struct {
		OK    bool
		Ports []int
		Bytes uint64
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || !r.OK || len(r.Ports) != conns {
		t.Fatalf("memcached client: %s (%v)", out, err)
	}
	wire(2 * r.Bytes)
	for _, h := range []*host{a, b} {
		wantDirect(t, h, conns+1)
		wantIdle(t, h)
	}
}

// The haproxy configuration of TestDirectProgramsHaproxy: HTTP mode, two
// threads, splicing both ways whenever it can.
const directHaproxyConf = `global
	nbthread 2
	maxconn 200
defaults
	mode http
	option splice-request
	option splice-response
	timeout connect 5s
	timeout client 30s
	timeout server 30s
frontend front
	bind :5201
	default_backend nginx
backend nginx
	server one {backend}
`

// TestDirectProgramsHaproxy: curl on one host fetches files through haproxy
// on the other, which proxies to nginx back on the first host; all three with
// the library, so both hops are SMC-R connections of the direct mode, and
// haproxy moves the bodies with splice. Every file and an upload checked by
// hash.
func TestDirectProgramsHaproxy(t *testing.T) {
	needPrograms(t, "haproxy", "nginx", "curl")
	eachProvider(t, testDirectHaproxy)
}

func testDirectHaproxy(t *testing.T, p string) {
	a, b := directHosts(t, p)
	files := map[string][]byte{
		"big":   randomBytes(8<<20 + 4093),
		"small": randomBytes(1500),
	}
	dir := startNginx(t, a, true, 5202, files)
	www := filepath.Join(dir, "www")
	haproxyConf := filepath.Join(dir, "haproxy.cfg")
	writeFile(t, haproxyConf, []byte(strings.ReplaceAll(directHaproxyConf, "{backend}", a.ns.Addr4().String()+":5202")))
	haproxy := b.startProc(true, "haproxy", "-db", "-f", haproxyConf)
	b.waitListening(5201)
	url := fmt.Sprintf("http://%s:5201/", b.ns.Addr4())

	got := t.TempDir()
	names := []string{"big", "small", "big", "small", "big"}
	args := []string{"-sS", "--fail"}
	for i, name := range names {
		args = append(args, "-o", filepath.Join(got, fmt.Sprint(i)), url+name)
	}
	wire := offWire(t, a, p)
	a.run(a.direct(a.command("curl", args...)), 60*time.Second)
	for i, name := range names {
		data, err := os.ReadFile(filepath.Join(got, fmt.Sprint(i)))
		if err != nil || sha(data) != sha(files[name]) {
			t.Errorf("download %d of %s: %d bytes (%v), want the %d served", i, name, len(data), err, len(files[name]))
		}
	}
	up := randomBytes(5<<20 + 77)
	upFile := filepath.Join(got, "up")
	writeFile(t, upFile, up)
	a.run(a.direct(a.command("curl", "-sS", "--fail", "-T", upFile, url+"up/data")), 60*time.Second)
	if data, err := os.ReadFile(filepath.Join(www, "up", "data")); err != nil || sha(data) != sha(up) {
		t.Errorf("upload: nginx stored %d bytes (%v), want the %d sent", len(data), err, len(up))
	}
	// Every byte crossed the link twice (curl to haproxy, haproxy to nginx).
	wire(uint64(2 * (3*len(files["big"]) + len(up))))
	// Two curls, each a connection to haproxy and at least one from haproxy
	// to nginx.
	wantDirectBoth(t, a, b, 4)
	if strings.Contains(haproxy.errOut(), "ALERT") {
		t.Errorf("haproxy alerted:\n%s", haproxy.errOut())
	}
}

// TestDirectProgramsSSH: sshd on a private port with a generated host key and
// an authorized key for root, and scp (its ssh child) copying a file each way
// over SFTP; sshd forks a process per connection and passes the connection
// between its privilege-separated processes.
func TestDirectProgramsSSH(t *testing.T) {
	needPrograms(t, "scp", "ssh", "ssh-keygen")
	if _, err := os.Stat("/usr/sbin/sshd"); err != nil {
		t.Skip("sshd is not installed (openssh-server): run scripts/deps.sh")
	}
	eachProvider(t, testDirectSSH)
}

func testDirectSSH(t *testing.T, p string) {
	a, b := directHosts(t, p)
	dir := t.TempDir()
	hostKey, userKey := filepath.Join(dir, "host_key"), filepath.Join(dir, "user_key")
	for _, k := range []string{hostKey, userKey} {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", k).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v\n%s", err, out)
		}
	}
	pub, err := os.ReadFile(userKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	authorized := filepath.Join(dir, "authorized_keys")
	writeFile(t, authorized, pub)
	// sshd's privilege separation chroots into this directory.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatal(err)
	}
	// sshd execs itself again for each connection after a closefrom: the
	// accepted socket crosses both with its connection (preload/c/exec.c,
	// closerange.c). Its preauth child polls in a sandbox whose RLIMIT_NOFILE
	// is 1.
	sshd := b.startProc(true, "/usr/sbin/sshd", "-D", "-e", "-f", "/dev/null", "-p", "5201", "-h", hostKey,
		"-o", "AuthorizedKeysFile="+authorized, "-o", "StrictModes=no", "-o", "UsePAM=no",
		"-o", "PermitRootLogin=prohibit-password", "-o", "PidFile="+filepath.Join(dir, "sshd.pid"),
		"-o", "Subsystem=sftp internal-sftp")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sshd's log:\n%s", sshd.errOut())
		}
	})
	b.waitListening(5201)

	scp := func(from, to string) {
		t.Helper()
		a.run(a.direct(a.command("scp", "-q", "-F", "/dev/null", "-i", userKey, "-P", "5201",
			"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
			from, to)), 60*time.Second)
	}
	remote := "root@" + b.ns.Addr4().String() + ":"
	down, up := randomBytes(8<<20+333), randomBytes(6<<20+17)
	src, dst := filepath.Join(dir, "down-src"), filepath.Join(dir, "down-dst")
	writeFile(t, src, down)
	wire := offWire(t, a, p)
	scp(remote+src, dst)
	if data, err := os.ReadFile(dst); err != nil || sha(data) != sha(down) {
		t.Errorf("scp from sshd: %d bytes (%v), want the %d there", len(data), err, len(down))
	}
	src, dst = filepath.Join(dir, "up-src"), filepath.Join(dir, "up-dst")
	writeFile(t, src, up)
	scp(src, remote+dst)
	if data, err := os.ReadFile(dst); err != nil || sha(data) != sha(up) {
		t.Errorf("scp to sshd: %d bytes (%v), want the %d sent", len(data), err, len(up))
	}
	wire(uint64(len(down) + len(up)))

	// A session held open: both tables list it as the direct mode's SMC-R.
	hold := a.direct(a.command("ssh", "-F", "/dev/null", "-i", userKey, "-p", "5201",
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
		"root@"+b.ns.Addr4().String(), "echo up; cat"))
	stdin, err := hold.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	session := a.startCmd(hold)
	if !waitFor(20*time.Second, func() bool { return strings.Contains(session.out(), "up") }) {
		t.Fatalf("ssh session did not come up: %s %s", session.out(), session.errOut())
	}
	wantDirectConns(t, a, 1)
	wantDirectConns(t, b, 1)
	wantLibraryMapped(t, session, 1)
	io.WriteString(stdin, "bye\n")
	stdin.Close()
	if !session.wait(20*time.Second) || !strings.Contains(session.out(), "bye") {
		t.Errorf("ssh session: %q %s", session.out(), session.errOut())
	}
	for _, h := range []*host{a, b} {
		wantDirect(t, h, 3)
		wantIdle(t, h)
	}
}
