// The direct mode end to end with real programs from Debian packages, all
// started with libsmcr-preload.so as smcrctl run starts them: iperf3, socat
// (a server that forks per connection), nginx (workers, edge-triggered epoll,
// sendfile) with curl, redis-server with redis-benchmark and redis-cli. Bytes
// are checked by hash and every connection is verified as the direct mode's
// SMC-R in both smcrds' counters and tables. Then mixed pairs (the library on
// one side only, a peer without smcrd) and faults (smcrd or a program killed
// mid-transfer).

package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/smcr-io/smcr/control"
)

// needPrograms skips the test when one of the programs is not installed
// (scripts/deps.sh installs them all).
func needPrograms(t *testing.T, progs ...string) {
	t.Helper()
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s is not installed: run scripts/deps.sh", p)
		}
	}
}

// directHosts makes the pair of hosts with smcrd on both, with provider p.
func directHosts(t *testing.T, p string) (*host, *host) {
	t.Helper()
	a, b := hosts(t)
	startWith(a, p)
	startWith(b, p)
	return a, b
}

// startWith starts smcrd on h with provider p, and fails the test if the
// provider did not open (the shm provider's rendezvous socket is under the
// test's temporary directory, named after the test, and its path must fit a
// Unix socket address: short test names).
func startWith(h *host, p string) {
	h.t.Helper()
	h.start(append(h.providerConf(p), ports)...)
	if log := h.logText(); strings.Contains(log, "no provider opened a device") {
		h.t.Fatalf("smcrd on %s has no %s device:\n%s", h.name, p, log)
	}
}

// eachProvider runs f once per provider that can run here (shm and soft:
// the library writes into the peer's RMB itself with shm, smcrd posts the
// writes from the library's send buffer with the others).
func eachProvider(t *testing.T, f func(t *testing.T, p string)) {
	for _, p := range providers() {
		t.Run(p, func(t *testing.T) { f(t, p) })
	}
}

// proc is a program running in a host, its output kept.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *syncWriter
	done           chan struct{}
	err            error
}

// startProc starts a program in h, with the library when lib is set; it and
// every process it started (its process group) are killed at cleanup.
func (h *host) startProc(lib bool, name string, args ...string) *proc {
	h.t.Helper()
	cmd := h.command(name, args...)
	if lib {
		h.direct(cmd)
	}
	return h.startCmd(cmd)
}

func (h *host) startCmd(cmd *exec.Cmd) *proc {
	h.t.Helper()
	p := &proc{cmd: cmd, stdout: &syncWriter{w: &bytes.Buffer{}}, stderr: &syncWriter{w: &bytes.Buffer{}}, done: make(chan struct{})}
	if cmd.Stdout == nil {
		cmd.Stdout = p.stdout
	}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	h.t.Cleanup(p.kill)
	return p
}

// kill ends the program and its process group at once.
func (p *proc) kill() {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// wait waits up to d for the program to end; false if it still runs.
func (p *proc) wait(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

func (p *proc) out() string    { return text(p.stdout) }
func (p *proc) errOut() string { return text(p.stderr) }

func text(w *syncWriter) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.String()
}

// run runs cmd in h to its end, failing the test if it fails or runs past
// limit (a hang: its process group is killed, and both smcrds' tables logged).
func (h *host) run(cmd *exec.Cmd, limit time.Duration) string {
	h.t.Helper()
	p := h.startCmd(cmd)
	if !p.wait(limit) {
		h.t.Logf("%s%s", h.snapshotter()(), h.other.snapshotter()())
		p.kill()
		h.t.Fatalf("%s ran past %v (hung):\n%s\n%s", strings.Join(cmd.Args, " "), limit, p.out(), p.errOut())
	}
	if p.err != nil {
		h.t.Fatalf("%s: %v\n%s\n%s", strings.Join(cmd.Args, " "), p.err, p.out(), p.errOut())
	}
	return p.out()
}

// waitFor polls cond for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// wantDirect checks that smcrd on h carried exactly n connections of the
// direct mode over SMC-R, none as plain TCP or failed, and none through the
// relay. Counters settle after the programs end: it waits a little.
func wantDirect(t *testing.T, h *host, n uint64) {
	t.Helper()
	var st control.Stats
	ok := waitFor(5*time.Second, func() bool {
		st = h.stats()
		return st.Direct.SMCR == n
	})
	if !ok || st.Direct.TCP != 0 || st.Direct.Failed != 0 {
		t.Errorf("smcrd %s: direct %+v, want %d SMC-R and nothing else", h.name, st.Direct, n)
	}
	if r := st.Programs["redirected"] + st.Programs["steered"]; r != 0 {
		t.Errorf("smcrd %s: %d connections through the relay, want none", h.name, r)
	}
}

// wantDirectConns waits until smcrd on h lists n connections, all SMC-R on the
// direct path.
func wantDirectConns(t *testing.T, h *host, n int) {
	t.Helper()
	var cs []control.Conn
	ok := waitFor(10*time.Second, func() bool {
		cs = h.conns()
		if len(cs) != n {
			return false
		}
		for _, c := range cs {
			if c.Mode != control.ModeSMCR || c.Path != control.PathDirect {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Errorf("smcrd %s lists %+v, want %d SMC-R connections on the direct path", h.name, cs, n)
	}
}

// wantIdle waits until smcrd on h carries no SMC-R connection: the programs'
// connections all ended (a connection that a fork shared ends when its last
// process closes it).
func wantIdle(t *testing.T, h *host) {
	t.Helper()
	var st control.Stats
	if !waitFor(10*time.Second, func() bool { st = h.stats(); return st.Connections.Active == 0 }) {
		t.Errorf("smcrd %s still carries %d connections after the programs closed them:\n%s", h.name, st.Connections.Active, h.snapshotter()())
	}
}

// wireBytes is what h's link to the other host carried so far, both ways:
// the direct mode's bytes over shm never cross it, only the TCP handshakes,
// CLC and the closes do.
func wireBytes(t *testing.T, h *host) uint64 {
	t.Helper()
	var sum uint64
	for _, dir := range []string{"rx", "tx"} {
		out, err := h.ns.Command("cat", "/sys/class/net/"+h.ns.Links[0].Name+"/statistics/"+dir+"_bytes").Output()
		n, perr := strconv.ParseUint(strings.TrimSpace(string(out)), 10, 64)
		if err != nil || perr != nil {
			t.Fatalf("%s's link statistics: %v %v", h.name, err, perr)
		}
		sum += n
	}
	return sum
}

// offWire returns, with the shm provider, the check that the programs' bytes
// moved from now on stayed off h's link: it carried less than a tenth of
// them. Other providers carry them over the link.
func offWire(t *testing.T, h *host, p string) func(moved uint64) {
	t.Helper()
	if p != "shm" {
		return func(uint64) {}
	}
	before := wireBytes(t, h)
	return func(moved uint64) {
		t.Helper()
		if n := wireBytes(t, h) - before; n > moved/10 {
			t.Errorf("%s's link carried %d bytes while the programs moved %d: not through shared memory", h.name, n, moved)
		}
	}
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestDirectProgramsIperf3: iperf3 with the library on both sides, a 2 s test
// each way; the bytes the receiver counted are those the sender sent, and its
// two connections (control and data) are the direct mode's SMC-R on both
// hosts while it runs.
func TestDirectProgramsIperf3(t *testing.T) {
	needPrograms(t, "iperf3")
	eachProvider(t, testDirectIperf3)
}

func testDirectIperf3(t *testing.T, p string) {
	a, b := directHosts(t, p)
	var conns uint64
	for _, reverse := range []bool{false, true} {
		srv := b.startProc(true, "iperf3", "-s", "-p", "5201", "-1", "-J")
		b.waitListening(5201)
		args := []string{"-c", b.ns.Addr4().String(), "-p", "5201", "-t", "2", "-J"}
		if reverse {
			args = append(args, "-R")
		}
		wire := offWire(t, a, p)
		cli := a.startProc(true, "iperf3", args...)
		// While it runs: control and data connection, SMC-R, direct, on both.
		wantDirectConns(t, a, 2)
		wantDirectConns(t, b, 2)
		if !cli.wait(20 * time.Second) {
			t.Fatalf("iperf3 client hung:\n%s", a.snapshotter()())
		}
		if cli.err != nil {
			t.Fatalf("iperf3 client (reverse %v): %v\n%s\n%s", reverse, cli.err, cli.out(), cli.errOut())
		}
		if !srv.wait(10 * time.Second) {
			t.Fatalf("iperf3 server did not end after its one test:\n%s", srv.out())
		}
		type sum struct {
			Bytes int64 `json:"bytes"`
		}
		var c, s struct {
			End struct {
				Sent     sum `json:"sum_sent"`
				Received sum `json:"sum_received"`
			} `json:"end"`
			Error string `json:"error"`
		}
		if err := json.Unmarshal([]byte(cli.out()), &c); err != nil || c.Error != "" {
			t.Fatalf("iperf3 client output (%v): %s", err, cli.out())
		}
		if err := json.Unmarshal([]byte(srv.out()), &s); err != nil || s.Error != "" {
			t.Fatalf("iperf3 server output (%v): %s", err, srv.out())
		}
		// The receiver's and the sender's own counts. iperf3 stops counting
		// at the end of the test, with bytes still in flight (plain TCP too):
		// the receiver's count may be short of the sender's by those.
		sent, recv := c.End.Sent.Bytes, s.End.Received.Bytes
		agree := c.End.Received.Bytes == recv // the client's copy of the server's count
		if reverse {
			sent, recv = s.End.Sent.Bytes, c.End.Received.Bytes
			agree = c.End.Sent.Bytes == sent
		}
		t.Logf("reverse %v: sent %d, received %d bytes in 2 s (%.0f Mbit/s)", reverse, sent, recv, float64(recv)*8/2e6)
		if recv <= 0 || recv > sent || sent-recv > 16<<20 {
			t.Errorf("reverse %v: the sender sent %d bytes, the receiver received %d", reverse, sent, recv)
		}
		if !agree {
			t.Errorf("reverse %v: the client reports sent %d received %d, the server sent %d received %d", reverse,
				c.End.Sent.Bytes, c.End.Received.Bytes, s.End.Sent.Bytes, s.End.Received.Bytes)
		}
		wire(uint64(recv))
		conns += 2
	}
	for _, h := range []*host{a, b} {
		wantDirect(t, h, conns)
		wantIdle(t, h)
	}
}

// TestDirectProgramsSocat: socat echoes through a pipe, forking a child per
// connection (the child carries the connection the parent accepted and
// closed). A socat client sends a file and writes the echo to another, and
// Python asyncio clients send on three connections at once; every byte comes
// back, and the connections end once the children have closed them.
func TestDirectProgramsSocat(t *testing.T) {
	needPrograms(t, "socat")
	requirePython(t)
	eachProvider(t, testDirectSocat)
}

func testDirectSocat(t *testing.T, p string) {
	a, b := directHosts(t, p)
	b.startProc(true, "socat", "TCP-LISTEN:5201,reuseaddr,fork", "PIPE")
	b.waitListening(5201)

	dir := t.TempDir()
	data := randomBytes(8<<20 + 12345)
	in, outName := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	writeFile(t, in, data)
	fin, err := os.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	defer fin.Close()
	fout, err := os.Create(outName)
	if err != nil {
		t.Fatal(err)
	}
	defer fout.Close()
	cmd := a.direct(a.command("socat", "-t", "30", "-", fmt.Sprintf("TCP:%s:5201", b.ns.Addr4())))
	cmd.Stdin, cmd.Stdout = fin, fout
	wire := offWire(t, a, p)
	a.run(cmd, 30*time.Second)
	wire(2 * uint64(len(data)))
	if got, err := os.ReadFile(outName); err != nil || sha(got) != sha(data) {
		t.Fatalf("socat client: %d bytes came back (%v), want the %d sent (sha256 %s, got %s)", len(got), err, len(data), sha(data), sha(got))
	}

	out := a.run(a.direct(a.command("python3", "testdata/hash_client.py", b.ns.Addr4().String(), "5201", strconv.Itoa(4<<20), "3")), 30*time.Second)
	var r hashResult
	if err := json.Unmarshal([]byte(out), &r); err != nil || !r.OK || len(r.Ports) != 3 {
		t.Fatalf("python client: %s (%v)", out, err)
	}
	for _, h := range []*host{a, b} {
		wantDirect(t, h, 4)
		wantIdle(t, h)
	}
}

// startNginx starts nginx on h, with the library when lib is set, listening
// on port, serving files from the directory www under the directory it
// returns (PUT allowed under www/up/), its log in error.log there.
func startNginx(t testing.TB, h *host, lib bool, port int, files map[string][]byte) (dir string) {
	t.Helper()
	dir = t.TempDir()
	www := filepath.Join(dir, "www")
	if err := os.MkdirAll(filepath.Join(www, "up"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		writeFile(t, filepath.Join(www, name), data)
	}
	conf := filepath.Join(dir, "nginx.conf")
	writeFile(t, conf, []byte(strings.NewReplacer("{dir}", dir, "{port}", strconv.Itoa(port)).Replace(directNginxConf)))
	h.startProc(lib, "nginx", "-c", conf, "-e", filepath.Join(dir, "error.log"))
	h.waitListening(port)
	return dir
}

// The nginx configuration of the direct mode's tests: two workers, sendfile.
const directNginxConf = `user root;
worker_processes 2;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events { worker_connections 512; }
http {
	access_log off;
	sendfile on;
	keepalive_requests 1000;
	client_body_temp_path {dir}/body;
	proxy_temp_path {dir}/proxy;
	fastcgi_temp_path {dir}/fastcgi;
	uwsgi_temp_path {dir}/uwsgi;
	scgi_temp_path {dir}/scgi;
	server {
		listen {port};
		root {dir}/www;
		location /up/ {
			dav_methods PUT;
			client_max_body_size 64m;
		}
	}
}
`

// TestDirectProgramsNginx: nginx (two workers, edge-triggered epoll,
// sendfile) and curl, both with the library: several files over one
// keep-alive connection, three parallel downloads on three connections,
// forty small responses on one connection, and an upload, every one checked
// by hash.
func TestDirectProgramsNginx(t *testing.T) {
	needPrograms(t, "nginx", "curl")
	eachProvider(t, testDirectNginx)
}

func testDirectNginx(t *testing.T, p string) {
	a, b := directHosts(t, p)
	files := map[string][]byte{
		"big":   randomBytes(6 << 20),
		"odd":   randomBytes(3<<20 + 4093),
		"small": randomBytes(1500),
	}
	dir := startNginx(t, b, true, 5201, files)
	www := filepath.Join(dir, "www")
	url := fmt.Sprintf("http://%s:5201/", b.ns.Addr4())

	got := t.TempDir()
	check := func(what string, names []string) {
		t.Helper()
		for i, name := range names {
			b, err := os.ReadFile(filepath.Join(got, fmt.Sprint(i)))
			if err != nil || sha(b) != sha(files[name]) {
				t.Errorf("%s: download %d of %s: %d bytes (%v), want the %d served", what, i, name, len(b), err, len(files[name]))
			}
		}
	}
	// One curl, one keep-alive connection, several files.
	names := []string{"big", "small", "odd", "big", "small", "odd"}
	args := []string{"-sS", "--fail"}
	for i, name := range names {
		args = append(args, "-o", filepath.Join(got, fmt.Sprint(i)), url+name)
	}
	wire := offWire(t, a, p)
	a.run(a.direct(a.command("curl", args...)), 30*time.Second)
	check("keep-alive", names)
	wire(2 * uint64(len(files["big"])+len(files["odd"])))
	wantDirect(t, a, 1)
	wantDirect(t, b, 1)

	// Three parallel downloads, three connections.
	names = []string{"big", "odd", "big"}
	args = []string{"-sS", "--fail", "--parallel", "--parallel-immediate", "--parallel-max", "3"}
	for i, name := range names {
		args = append(args, "-o", filepath.Join(got, fmt.Sprint(i)), url+name)
	}
	wire = offWire(t, a, p)
	a.run(a.direct(a.command("curl", args...)), 30*time.Second)
	check("parallel", names)
	wire(uint64(2*len(files["big"]) + len(files["odd"])))
	wantDirect(t, a, 4)
	wantDirect(t, b, 4)

	// Forty small responses on one keep-alive connection, then an upload
	// (the bytes the other way: curl writes, nginx reads and stores them).
	args = []string{"-sS", "--fail"}
	for range 40 {
		args = append(args, url+"small")
	}
	if out := a.run(a.direct(a.command("curl", args...)), 30*time.Second); sha([]byte(out)) != sha(bytes.Repeat(files["small"], 40)) {
		t.Errorf("keep-alive small: got %d bytes, want 40 × %d", len(out), len(files["small"]))
	}
	up := randomBytes(5<<20 + 77)
	upFile := filepath.Join(got, "up")
	writeFile(t, upFile, up)
	wire = offWire(t, a, p)
	a.run(a.direct(a.command("curl", "-sS", "--fail", "-T", upFile, url+"up/data")), 30*time.Second)
	wire(uint64(len(up)))
	if b, err := os.ReadFile(filepath.Join(www, "up", "data")); err != nil || sha(b) != sha(up) {
		t.Errorf("upload: nginx stored %d bytes (%v), want the %d sent", len(b), err, len(up))
	}
	wantDirect(t, a, 6)
	wantDirect(t, b, 6)
	wantIdle(t, a)

	if log, err := os.ReadFile(filepath.Join(dir, "error.log")); err == nil {
		for _, bad := range []string{"[alert]", "[crit]", "[emerg]", "[error]"} {
			if bytes.Contains(log, []byte(bad)) {
				t.Errorf("nginx logged %s:\n%s", bad, log)
				break
			}
		}
	}
}

// TestDirectProgramsRedis: redis-server and its clients with the library:
// redis-benchmark with and without pipelining, and a 1 MiB value through
// redis-cli, every byte intact.
func TestDirectProgramsRedis(t *testing.T) {
	needPrograms(t, "redis-server", "redis-benchmark", "redis-cli")
	eachProvider(t, testDirectRedis)
}

func testDirectRedis(t *testing.T, p string) {
	a, b := directHosts(t, p)
	b.startProc(true, "redis-server", "--port", "5201", "--bind", "0.0.0.0", "--protected-mode", "no",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir())
	b.waitListening(5201)
	addr := b.ns.Addr4().String()

	for _, pipeline := range []string{"1", "16"} {
		out := a.run(a.direct(a.command("redis-benchmark", "-h", addr, "-p", "5201", "-t", "set,get", "-n", "20000", "-q", "-P", pipeline)), 60*time.Second)
		for _, test := range []string{"SET: ", "GET: "} {
			if !strings.Contains(out, test) || !strings.Contains(out, "requests per second") {
				t.Errorf("redis-benchmark -P %s reported no %s:\n%s", pipeline, test, out)
			}
		}
		t.Logf("redis-benchmark -P %s: %s", pipeline, lastLines(out))
	}
	value := randomBytes(1 << 20)
	wire := offWire(t, a, p)
	set := a.direct(a.command("redis-cli", "-h", addr, "-p", "5201", "-x", "SET", "big"))
	set.Stdin = bytes.NewReader(value)
	if out := a.run(set, 20*time.Second); strings.TrimSpace(out) != "OK" {
		t.Fatalf("SET: %q", out)
	}
	out := a.run(a.direct(a.command("redis-cli", "-h", addr, "-p", "5201", "--raw", "GET", "big")), 20*time.Second)
	if want := append(value, '\n'); sha([]byte(out)) != sha(want) {
		t.Fatalf("GET returned %d bytes, differing from the %d set", len(out), len(value))
	}
	wire(2 << 20)
	// redis sees the client's own address: the socket stays the program's.
	if out := a.run(a.direct(a.command("redis-cli", "-h", addr, "-p", "5201", "CLIENT", "LIST")), 20*time.Second); !strings.Contains(out, "addr="+a.ns.Addr4().String()+":") {
		t.Errorf("CLIENT LIST does not show the client %s:\n%s", a.ns.Addr4(), out)
	}

	// Every connection of every client went the direct mode's SMC-R, and
	// about as many on both sides: a client that closes its socket while its
	// smcrd still hands it the memory is counted by the server's smcrd alone
	// (redis-benchmark closes a few at its start and end), so the two may
	// differ by those. (With too few requests for its 50 clients, the others
	// may finish them all before the last ones are decided; 20000 leave every
	// client some.)
	var sa, sb control.Stats
	waitFor(5*time.Second, func() bool { sa, sb = a.stats(), b.stats(); return sa.Direct.SMCR == sb.Direct.SMCR })
	if sa.Direct.SMCR < 2*50+2 || sb.Direct.SMCR < sa.Direct.SMCR || sb.Direct.SMCR > sa.Direct.SMCR+4 {
		t.Errorf("direct SMC-R connections: client %+v, server %+v; want at least 102, the server's at most 4 more", sa.Direct, sb.Direct)
	}
	wantDirect(t, a, sa.Direct.SMCR)
	wantDirect(t, b, sb.Direct.SMCR)
	wantIdle(t, a)
}

// lastLines is the end of redis-benchmark's output, its progress lines
// (carriage returns) left out.
func lastLines(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if i := strings.LastIndexByte(l, '\r'); i >= 0 {
			l = l[i+1:]
		}
		if l = strings.TrimSpace(l); l != "" {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "; ")
}

// TestDirectProgramsMixed: the library on one side only, and a peer
// without smcrd. The bytes always arrive; the counters say which path.
// (Subtests have short names: the shm provider's rendezvous socket lives in
// the test's temporary directory, named after the test, and a Unix socket's
// path has at most 107 bytes.)
func TestDirectProgramsMixed(t *testing.T) {
	requirePython(t)
	const conns, size = 2, 2 << 20
	echo := func(t *testing.T, from *host, lib bool, port int, env ...string) {
		t.Helper()
		cmd := from.command("python3", "testdata/hash_client.py", from.other.ns.Addr4().String(), strconv.Itoa(port), strconv.Itoa(size), strconv.Itoa(conns))
		if lib {
			from.direct(cmd)
			cmd.Env = append(cmd.Env, env...)
		}
		out := from.run(cmd, 30*time.Second)
		var r hashResult
		if err := json.Unmarshal([]byte(out), &r); err != nil || !r.OK || len(r.Ports) != conns {
			t.Fatalf("client: %s (%v)", out, err)
		}
	}
	relayed := func(st control.Stats) uint64 { return st.Programs["redirected"] + st.Programs["steered"] }

	t.Run("lib-relay", func(t *testing.T) {
		a, b := directHosts(t, "shm")
		b.startProc(false, "python3", "testdata/echo_server.py", "5202")
		b.waitListening(5202)
		echo(t, a, true, 5202)
		wantDirect(t, a, conns)
		sb := b.stats()
		if sb.Direct.SMCR != 0 || sb.Connections.SMCR != conns || relayed(sb) < conns {
			t.Errorf("server's smcrd: direct %+v, %d SMC-R connections, %d relayed; want %d SMC-R through the relay",
				sb.Direct, sb.Connections.SMCR, relayed(sb), conns)
		}
	})
	t.Run("relay-lib", func(t *testing.T) {
		a, b := directHosts(t, "shm")
		b.startProc(true, "python3", "testdata/echo_server.py", "5201")
		b.waitListening(5201)
		echo(t, a, false, 5201)
		wantDirect(t, b, conns)
		sa := a.stats()
		if sa.Direct.SMCR != 0 || sa.Connections.SMCR != conns || relayed(sa) < conns {
			t.Errorf("client's smcrd: direct %+v, %d SMC-R connections, %d relayed; want %d SMC-R through the relay",
				sa.Direct, sa.Connections.SMCR, relayed(sa), conns)
		}
	})
	t.Run("optout", func(t *testing.T) {
		// SMCR_DIRECT=0 turns the library off for one program: that
		// client goes through the relay instead.
		a, b := directHosts(t, "shm")
		b.startProc(true, "python3", "testdata/echo_server.py", "5201")
		b.waitListening(5201)
		echo(t, a, true, 5201, "SMCR_DIRECT=0")
		wantDirect(t, b, conns)
		sa := a.stats()
		if sa.Direct != (control.DirectCounts{}) || sa.Connections.SMCR != conns || sa.Programs["redirected"] < conns {
			t.Errorf("client's smcrd: direct %+v, %d SMC-R connections, %d redirected; want %d SMC-R through the relay",
				sa.Direct, sa.Connections.SMCR, sa.Programs["redirected"], conns)
		}
	})
	t.Run("unlisted", func(t *testing.T) {
		// A port outside port_range_list: the library passes the
		// connections through without asking smcrd (the policy page).
		a, b := directHosts(t, "shm")
		b.startProc(true, "python3", "testdata/echo_server.py", "6001")
		b.waitListening(6001)
		echo(t, a, true, 6001)
		for _, h := range []*host{a, b} {
			if st := h.stats(); st.Direct != (control.DirectCounts{}) || st.Connections.Handled != 0 {
				t.Errorf("smcrd %s: direct %+v, %d connections handled; want none: the port is not listed", h.name, st.Direct, st.Connections.Handled)
			}
		}
	})
	t.Run("lib-nosmcrd", func(t *testing.T) {
		a, b := hosts(t)
		startWith(a, "shm")
		b.startProc(false, "python3", "testdata/echo_server.py", "5201")
		b.waitListening(5201)
		echo(t, a, true, 5201)
		sa := a.stats()
		// Taken, CLC not started (no option echoed), handed back as TCP.
		if sa.Direct != (control.DirectCounts{TCP: conns}) || sa.Connections.SMCR != 0 {
			t.Errorf("client's smcrd: direct %+v, %d SMC-R connections; want %d handed back as plain TCP", sa.Direct, sa.Connections.SMCR, conns)
		}
	})
	t.Run("nosmcrd-lib", func(t *testing.T) {
		a, b := hosts(t)
		startWith(b, "shm")
		b.startProc(true, "python3", "testdata/echo_server.py", "5201")
		b.waitListening(5201)
		echo(t, a, true, 5201)
		sb := b.stats()
		// The client's SYNs had no option: the accepted sockets are refused,
		// at no cost to the program.
		if sb.Direct != (control.DirectCounts{Refused: conns}) || sb.Connections.SMCR != 0 {
			t.Errorf("server's smcrd: direct %+v, %d SMC-R connections; want %d refused (plain TCP)", sb.Direct, sb.Connections.SMCR, conns)
		}
	})
}

// streamHash is the sha256 of the first n bytes of direct_sender.py's stream:
// 1 MiB blocks, each starting with its index.
func streamHash(n int64) string {
	base := make([]byte, 1<<20)
	for i := range base {
		base[i] = byte(i*31 + i>>9)
	}
	h := sha256.New()
	for k := int64(0); n > 0; k++ {
		binary.BigEndian.PutUint64(base, uint64(k))
		m := min(n, int64(len(base)))
		h.Write(base[:m])
		n -= m
	}
	return hex.EncodeToString(h.Sum(nil))
}

// readerResult is direct_reader.py's output.
type readerResult struct {
	Bytes   int64
	SHA256  string
	EOF     bool
	Err     string
	Seconds float64
}

// TestDirectProgramsKillSmcrd and TestDirectProgramsKillProgram: smcrd or a
// program killed with SIGKILL while a stream moves (Python, the library on
// both sides), the reader the client or (rev-) the server. The reader never
// hangs, every byte it got is the stream's, and it never takes a short
// stream for a whole one: unless its peer program died, it gets every byte or
// an error. smcrd's death on every provider (the shm provider's connections
// bypass smcrd's pumps, the others' go through them); the programs' deaths
// with shm.
func TestDirectProgramsKillSmcrd(t *testing.T) {
	requirePython(t)
	eachProvider(t, func(t *testing.T, p string) { testDirectFaults(t, p, true) })
}

func TestDirectProgramsKillProgram(t *testing.T) {
	requirePython(t)
	testDirectFaults(t, "shm", false)
}

func testDirectFaults(t *testing.T, p string, smcrd bool) {
	const size = 512 << 20 // read at 64 MB/s: about 8 s
	const rate = 64e6
	setup := func(t *testing.T) (a, b *host, sender, reader *proc) {
		a, b = directHosts(t, p)
		sender = b.startProc(true, "python3", "testdata/direct_sender.py", "5201", strconv.Itoa(size))
		b.waitListening(5201)
		reader = a.startProc(true, "python3", "testdata/direct_reader.py", b.ns.Addr4().String(), "5201", fmt.Sprint(rate))
		wantDirectConns(t, a, 1)
		wantDirectConns(t, b, 1)
		time.Sleep(time.Second) // mid-transfer
		return
	}
	// setupRev: the other way round, the reader is the server (its socket
	// accepted) and the sender its client.
	setupRev := func(t *testing.T) (a, b *host, sender, reader *proc) {
		a, b = directHosts(t, p)
		reader = b.startProc(true, "python3", "testdata/direct_reader.py", "-", "5201", fmt.Sprint(rate))
		b.waitListening(5201)
		sender = a.startProc(true, "python3", "testdata/direct_sender.py", "5201", strconv.Itoa(size), b.ns.Addr4().String())
		wantDirectConns(t, a, 1)
		wantDirectConns(t, b, 1)
		time.Sleep(time.Second)
		return
	}
	// result waits for the reader's verdict and checks its bytes.
	result := func(t *testing.T, reader *proc) readerResult {
		t.Helper()
		if !reader.wait(20 * time.Second) {
			reader.kill()
			t.Fatalf("the reader hung:\n%s", reader.errOut())
		}
		var r readerResult
		if err := json.Unmarshal([]byte(reader.out()), &r); err != nil {
			t.Fatalf("reader: %v: %s %s", err, reader.out(), reader.errOut())
		}
		t.Logf("reader: %d of %d bytes in %.1f s, eof %v, error %q", r.Bytes, size, r.Seconds, r.EOF, r.Err)
		if r.SHA256 != streamHash(r.Bytes) {
			t.Errorf("the reader's %d bytes are not the stream's first %d", r.Bytes, r.Bytes)
		}
		return r
	}
	whole := func(t *testing.T, r readerResult) {
		t.Helper()
		if r.Err == "" && (!r.EOF || r.Bytes != size) {
			t.Errorf("the reader saw a clean end of the stream after %d of %d bytes: a short stream taken for a whole one", r.Bytes, size)
		}
	}

	if !smcrd {
		testProgramDeath(t, setup, setupRev, result)
		return
	}
	for _, side := range []string{"client", "server"} {
		t.Run("kill-smcrd-"+side, func(t *testing.T) {
			a, b, sender, reader := setup(t)
			victim, survivor := a, b
			if side == "server" {
				victim, survivor = b, a
			}
			victim.kill()
			whole(t, result(t, reader))
			senderEnds(t, sender)
			wantIdle(t, survivor)

			// New connections, the library still on both sides, are
			// plain TCP once the dead smcrd's liveness (1 s) lapsed,
			// every byte intact.
			time.Sleep(1500 * time.Millisecond)
			before := survivor.stats().Direct
			reader = a.startProc(true, "python3", "testdata/direct_reader.py", b.ns.Addr4().String(), "5201", "0")
			if r := result(t, reader); r.Err != "" || !r.EOF || r.Bytes != size {
				t.Errorf("a new connection with smcrd on the %s dead: %+v, want the whole stream", side, r)
			}
			after := survivor.stats().Direct
			if after.SMCR != before.SMCR || after.TCP+after.Refused != before.TCP+before.Refused+1 {
				t.Errorf("smcrd on %s counted the new connection as %+v (before: %+v), want plain TCP", survivor.name, after, before)
			}
		})
	}
	for _, side := range []string{"client", "server"} {
		t.Run("rev-kill-smcrd-"+side, func(t *testing.T) {
			a, b, sender, reader := setupRev(t)
			victim, survivor := a, b
			if side == "server" {
				victim, survivor = b, a
			}
			victim.kill()
			whole(t, result(t, reader))
			senderEnds(t, sender)
			wantIdle(t, survivor)
		})
	}
}

// senderEnds: the sender program does not hang either once its reader ended.
func senderEnds(t *testing.T, sender *proc) {
	t.Helper()
	if !waitFor(20*time.Second, func() bool { return strings.Contains(sender.out(), "\n") }) {
		t.Errorf("the sender still sends 20 s after its reader ended:\n%s", sender.errOut())
		return
	}
	t.Logf("sender: %s", strings.TrimSpace(sender.out()))
}

// testProgramDeath kills the sender or the reader program mid-transfer.
func testProgramDeath(t *testing.T, setup, setupRev func(*testing.T) (a, b *host, sender, reader *proc), result func(*testing.T, *proc) readerResult) {
	const size = 512 << 20
	t.Run("rev-kill-sender", func(t *testing.T) {
		a, b, sender, reader := setupRev(t)
		sender.kill()
		if r := result(t, reader); r.Bytes == size && r.EOF {
			t.Errorf("the reader got the whole stream from a sender killed mid-way")
		}
		wantIdle(t, a)
		wantIdle(t, b)
	})
	t.Run("kill-server", func(t *testing.T) {
		a, b, sender, reader := setup(t)
		sender.kill()
		r := result(t, reader)
		if r.Bytes == size && r.EOF {
			t.Errorf("the reader got the whole stream from a sender killed mid-way")
		}
		wantIdle(t, a)
		wantIdle(t, b)
	})
	t.Run("kill-client", func(t *testing.T) {
		a, b, sender, reader := setup(t)
		reader.kill()
		senderEnds(t, sender)
		if strings.Contains(sender.out(), `"err": ""`) {
			t.Errorf("the sender saw no error from a reader killed mid-way: %s", sender.out())
		}
		wantIdle(t, a)
		wantIdle(t, b)
	})
}

// TestDirectProgramsExec: socat's EXEC with nofork hands the accepted socket
// itself to cat across exec (stdin and stdout), as inetd and sshd do, before
// CLC has decided: cat's library adopts the connection still pending
// (preload/c/exec.c) and echoes what the client sends, every byte.
func TestDirectProgramsExec(t *testing.T) {
	needPrograms(t, "socat", "cat")
	requirePython(t)
	a, b := directHosts(t, "shm")
	b.startProc(true, "socat", "TCP-LISTEN:5201,reuseaddr,fork", "EXEC:cat,nofork")
	b.waitListening(5201)
	out := a.run(a.direct(a.command("python3", "testdata/hash_client.py", b.ns.Addr4().String(), "5201", strconv.Itoa(1<<20), "2")), 20*time.Second)
	var r hashResult
	if err := json.Unmarshal([]byte(out), &r); err != nil || !r.OK || len(r.Ports) != 2 {
		t.Fatalf("python client: %s (%v)", out, err)
	}
	for _, h := range []*host{a, b} {
		wantIdle(t, h)
	}
}

// TestDirectProgramsExecDecided: an inetd-style server (Python, the library)
// reads a line from each connection, so the connection is SMC-R by then, and
// execs cat on the socket: cat's library adopts it with its shared area and
// echoes the rest, every byte.
func TestDirectProgramsExecDecided(t *testing.T) {
	r := execEcho(t)
	if !r.OK {
		t.Fatalf("client: %+v", r)
	}
}

// execEcho runs direct_exec_server.py (it execs cmd, cat by default) and its
// client, and returns the client's verdict; a client that hangs fails the test.
func execEcho(t *testing.T, cmd ...string) echoResult {
	t.Helper()
	requirePython(t)
	a, b := directHosts(t, "shm")
	return execEchoOn(t, a, b, cmd...)
}

// echoResult is the verdict of direct_exec_client.py and direct_passfd_client.py.
type echoResult struct {
	OK    bool
	Bytes int
	Err   string
}

// execEchoOn is execEcho between hosts a and b, their smcrds started.
func execEchoOn(t *testing.T, a, b *host, cmd ...string) (r echoResult) {
	t.Helper()
	b.startProc(true, "python3", append([]string{"testdata/direct_exec_server.py", "5201"}, cmd...)...)
	b.waitListening(5201)
	cli := a.startProc(true, "python3", "testdata/direct_exec_client.py", b.ns.Addr4().String(), "5201", strconv.Itoa(1<<20))
	if !cli.wait(20 * time.Second) {
		t.Logf("%s%s", a.snapshotter()(), b.snapshotter()())
		t.Fatalf("the client hung: its echo never came back")
	}
	if err := json.Unmarshal([]byte(cli.out()), &r); err != nil {
		t.Fatalf("client: %s (%v) %s", cli.out(), err, cli.errOut())
	}
	return r
}

// engineHosts starts smcrd with the shm provider on a pair of hosts, the
// same-host bypass off (-direct-same-host=false): the libraries' bytes go
// through smcrd and the engine, whose buffers are their rings, as between
// hosts.
func engineHosts(t *testing.T) (*host, *host) {
	t.Helper()
	a, b := hosts(t)
	for _, h := range []*host{a, b} {
		h.smcrdFlags = []string{"-direct-same-host=false"}
		startWith(h, "shm")
	}
	return a, b
}

// wantReleased checks that b's smcrd released n connections to the program's
// socket and that both engines continued them over TCP, no connection left.
func wantReleased(t *testing.T, a, b *host, n uint64) {
	t.Helper()
	if st := b.stats(); st.Direct.SMCR != n || st.Direct.Bypass != 0 || st.Direct.Released != n {
		t.Errorf("smcrd %s: direct %+v, want %d SMC-R, all released", b.name, st.Direct, n)
	}
	for _, h := range []*host{a, b} {
		if st := h.stats(); st.Links.ConnsContinued != n {
			t.Errorf("smcrd %s: %d connections continued over TCP, want %d", h.name, st.Links.ConnsContinued, n)
		}
		wantIdle(t, h)
	}
}

// TestDirectReleasePassFd: a server with the library reads and echoes a MiB,
// then sends its socket with SCM_RIGHTS to a process it starts, while the
// client's next MiB is on its way: the library releases the connection to the
// socket first (SMCR_LIB_RELEASE), so that the receiver reads every byte the
// client sent after the first MiB, those the server's library held unread
// included, and its echo reaches the client over TCP. The libraries on both
// hosts go through the engine, which continues the connection over TCP.
func TestDirectReleasePassFd(t *testing.T) {
	a, b := engineHosts(t)
	releasePassFd(t, a, b)
	wantReleased(t, a, b, 1)
}

// TestDirectReleasePassFdBypass is TestDirectReleasePassFd over the same-host
// bypass, where each library writes into the other's ring: the server's
// smcrd asks the client's, which stops the client library's writes into the
// server's ring and resends from the client's socket what the server's
// library held unread; the client's library reads the rest of its own ring
// (the first MiB's echo) before the socket.
func TestDirectReleasePassFdBypass(t *testing.T) {
	a, b := directHosts(t, "shm")
	releasePassFd(t, a, b)
	wantReleasedBypass(t, a, b, 1)
}

// releasePassFd runs direct_passfd_server.py on b and its client on a.
func releasePassFd(t *testing.T, a, b *host) {
	t.Helper()
	requirePython(t)
	b.startProc(true, "python3", "testdata/direct_passfd_server.py", "5201", strconv.Itoa(1<<20))
	b.waitListening(5201)
	cli := a.startProc(true, "python3", "testdata/direct_passfd_client.py", b.ns.Addr4().String(), "5201", strconv.Itoa(1<<20))
	if !cli.wait(30 * time.Second) {
		t.Logf("%s%s", a.snapshotter()(), b.snapshotter()())
		t.Fatalf("the client hung")
	}
	var r echoResult
	if err := json.Unmarshal([]byte(cli.out()), &r); err != nil || !r.OK {
		t.Fatalf("client: %s (%v) %s; smcrd %s: %+v, smcrd %s: %+v", cli.out(), err, cli.errOut(), a.name, a.stats().Direct, b.name, b.stats().Direct)
	}
}

// TestDirectReleaseExec: the inetd-style server execs cat through env -i, so
// cat runs without the library: its library releases the connection to the
// socket before the exec, and cat echoes the rest of the stream over plain
// TCP, every byte.
func TestDirectReleaseExec(t *testing.T) {
	needPrograms(t, "env", "cat")
	requirePython(t)
	a, b := engineHosts(t)
	if r := execEchoOn(t, a, b, "env", "-i", "cat"); !r.OK {
		t.Fatalf("client: %+v", r)
	}
	wantReleased(t, a, b, 1)
}

// TestDirectReleaseExecBypass is TestDirectReleaseExec over the same-host
// bypass (the libraries write into each other's rings): released all the
// same, every byte, never a reset.
func TestDirectReleaseExecBypass(t *testing.T) {
	needPrograms(t, "env", "cat")
	requirePython(t)
	a, b := directHosts(t, "shm")
	if r := execEchoOn(t, a, b, "env", "-i", "cat"); !r.OK {
		t.Fatalf("client: %+v", r)
	}
	wantReleasedBypass(t, a, b, 1)
}

// TestDirectSpawn: the inetd-style server reads a line from each connection
// (SMC-R by then) and starts cat on the socket with posix_spawn, which makes its
// child with glibc's own clone and execve: the library works out in the parent
// that the child gets the socket at its stdin and stdout (the spawn's file
// actions), and cat's library adopts the connection, with no release.
func TestDirectSpawn(t *testing.T) {
	needPrograms(t, "cat")
	requirePython(t)
	a, b := directHosts(t, "shm")
	if r := execEchoOn(t, a, b, "--spawn", "cat"); !r.OK {
		t.Fatalf("client: %+v", r)
	}
	if st := b.stats(); st.Direct.SMCR != 1 || st.Direct.Released != 0 {
		t.Errorf("smcrd %s: direct %+v, want 1 SMC-R, none released", b.name, st.Direct)
	}
	for _, h := range []*host{a, b} {
		wantIdle(t, h)
	}
}

// TestDirectReleaseSpawn: as TestDirectSpawn, but cat is spawned with an empty
// environment, without the library: the server's library releases the
// connection to the socket before the spawn, and cat echoes the rest of the
// stream over plain TCP, every byte.
func TestDirectReleaseSpawn(t *testing.T) {
	needPrograms(t, "cat")
	requirePython(t)
	a, b := engineHosts(t)
	if r := execEchoOn(t, a, b, "--spawn-noenv", "cat"); !r.OK {
		t.Fatalf("client: %+v", r)
	}
	wantReleased(t, a, b, 1)
}

// wantReleasedBypass checks that b's smcrd released n same-host bypass
// connections, none continued over TCP by the engines (the resend is smcrd's),
// no connection left.
func wantReleasedBypass(t *testing.T, a, b *host, n uint64) {
	t.Helper()
	if st := b.stats(); st.Direct.SMCR != n || st.Direct.Bypass != n || st.Direct.Released != n {
		t.Errorf("smcrd %s: direct %+v, want %d SMC-R, all bypass and released", b.name, st.Direct, n)
	}
	for _, h := range []*host{a, b} {
		if st := h.stats(); st.Links.ConnsContinued != 0 {
			t.Errorf("smcrd %s: %d connections continued over TCP, want none", h.name, st.Links.ConnsContinued)
		}
		wantIdle(t, h)
	}
}
