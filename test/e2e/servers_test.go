// End-to-end: servers users accelerate, unmodified from their Debian packages:
// nginx (sendfile, keep-alive, parallel downloads, uploads) fetched by curl, and
// redis (pipelined small requests, a large value) driven by redis-benchmark and
// redis-cli.

package e2e

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestServers runs once per provider that can run here.
func TestServers(t *testing.T) {
	for _, prog := range []string{"nginx", "curl", "redis-server", "redis-cli", "redis-benchmark"} {
		if _, err := exec.LookPath(prog); err != nil {
			t.Fatalf("%s is not installed: run scripts/deps.sh", prog)
		}
	}
	for _, p := range providers() {
		t.Run(p, func(t *testing.T) {
			a, b := hosts(t)
			a.start(append(a.providerConf(p), ports)...)
			b.start(append(b.providerConf(p), ports)...)
			testNginx(t, a, b)
			testRedis(t, b, a)
			for _, h := range []*host{a, b} {
				if st := h.stats(); st.Connections.Fallback != 0 || st.Connections.SMCR == 0 {
					t.Errorf("%s: %d SMC-R connections, %d fallbacks (%+v)", h.name,
						st.Connections.SMCR, st.Connections.Fallback, st.Fallbacks)
				}
			}
		})
	}
}

const nginxConf = `user root;
worker_processes 2;
pid {dir}/nginx.pid;
events { worker_connections 512; }
http {
	log_format peer '$remote_addr $request_method $uri $status';
	access_log {dir}/access.log peer;
	sendfile on;
	tcp_nopush on;
	keepalive_requests 1000;
	client_body_temp_path {dir}/body;
	proxy_temp_path {dir}/proxy;
	fastcgi_temp_path {dir}/fastcgi;
	uwsgi_temp_path {dir}/uwsgi;
	scgi_temp_path {dir}/scgi;
	server {
		listen 5204;
		listen [::]:5204;
		root {dir}/www;
		location /up/ {
			dav_methods PUT;
			client_max_body_size 64m;
		}
	}
}
`

// testNginx serves files from nginx on server and fetches and uploads them with
// curl from client.
func testNginx(t *testing.T, client, server *host) {
	dir := t.TempDir()
	www := filepath.Join(dir, "www")
	if err := os.MkdirAll(filepath.Join(www, "up"), 0o755); err != nil {
		t.Fatal(err)
	}
	big, small := randomBytes(16<<20), randomBytes(1500)
	writeFile(t, filepath.Join(www, "big"), big)
	writeFile(t, filepath.Join(www, "small"), small)
	conf := filepath.Join(dir, "nginx.conf")
	writeFile(t, conf, []byte(strings.ReplaceAll(nginxConf, "{dir}", dir)))
	server.background("nginx", "-c", conf, "-e", filepath.Join(dir, "error.log"), "-g", "daemon off;")
	server.waitListening(5204)
	url4 := fmt.Sprintf("http://%s:5204", server.ns.Addr4())
	url6 := fmt.Sprintf("http://[%s]:5204", server.ns.Addr6())

	// Four parallel downloads of the big file on four connections, over IPv4
	// and IPv6 (nginx sends it with sendfile).
	got := t.TempDir()
	args := []string{"-sS", "--fail", "-g", "--parallel", "--parallel-immediate", "--parallel-max", "4"}
	for i, u := range []string{url4, url4, url6, url6} {
		args = append(args, "-o", filepath.Join(got, fmt.Sprint(i)), u+"/big")
	}
	runOK(t, client.command("curl", args...))
	for i := range 4 {
		if b, err := os.ReadFile(filepath.Join(got, fmt.Sprint(i))); err != nil || !bytes.Equal(b, big) {
			t.Fatalf("download %d: %d bytes (%v), differ from the %d served", i, len(b), err, len(big))
		}
	}
	// Forty small requests on one keep-alive connection.
	args = []string{"-sS", "--fail"}
	for range 40 {
		args = append(args, url4+"/small")
	}
	if out := runOK(t, client.command("curl", args...)); !bytes.Equal(out, bytes.Repeat(small, 40)) {
		t.Fatalf("keep-alive: got %d bytes, want 40 × %d", len(out), len(small))
	}
	// An upload: the bytes go the other way.
	up := randomBytes(8 << 20)
	upFile := filepath.Join(got, "up")
	writeFile(t, upFile, up)
	runOK(t, client.command("curl", "-sS", "--fail", "-T", upFile, url4+"/up/data"))
	if b, err := os.ReadFile(filepath.Join(www, "up", "data")); err != nil || !bytes.Equal(b, up) {
		t.Fatalf("upload: nginx stored %d bytes (%v), want the %d sent", len(b), err, len(up))
	}

	// nginx logged every request with the client's real address, and every
	// connection went SMC-R.
	log, err := os.ReadFile(filepath.Join(dir, "access.log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(log)), "\n")
	if len(lines) != 4+40+1 {
		t.Errorf("nginx logged %d requests, want 45:\n%s", len(lines), log)
	}
	for _, l := range lines {
		peer, _, _ := strings.Cut(l, " ")
		if a, err := netip.ParseAddr(peer); err != nil || (a != client.ns.Addr4() && a != client.ns.Addr6()) {
			t.Errorf("nginx saw a request from %q, want the client %s or %s", peer, client.ns.Addr4(), client.ns.Addr6())
		}
	}
	st := client.stats()
	if st.Connections.SMCR < 6 || st.Connections.Fallback != 0 {
		t.Errorf("curl's connections: %d SMC-R, %d fallbacks; want 6 SMC-R", st.Connections.SMCR, st.Connections.Fallback)
	}
	if min := uint64(4 * len(big)); st.RX.Bytes < min {
		t.Errorf("the client received %d bytes over SMC-R, want at least %d", st.RX.Bytes, min)
	}
}

// testRedis runs redis-server on server and drives it from client.
func testRedis(t *testing.T, client, server *host) {
	dir := t.TempDir()
	server.background("redis-server", "--port", "5205", "--bind", "0.0.0.0", "::",
		"--protected-mode", "no", "--save", "", "--appendonly", "no", "--dir", dir)
	server.waitListening(5205)
	addr := server.ns.Addr4().String()
	cli := func(args ...string) *exec.Cmd {
		return client.command("redis-cli", append([]string{"-h", addr, "-p", "5205"}, args...)...)
	}
	before := client.stats().Connections.SMCR

	// Many small pipelined requests on 20 connections at once.
	out := runOK(t, client.command("redis-benchmark", "-h", addr, "-p", "5205", "-q", "--csv",
		"-n", "20000", "-c", "20", "-P", "16", "-d", "256", "-t", "set,get,incr,lpush,lrange_100"))
	for _, test := range []string{"SET", "GET", "INCR", "LPUSH", "LRANGE_100"} {
		if !bytes.Contains(out, []byte(`"`+test)) {
			t.Errorf("redis-benchmark reported no %s:\n%s", test, out)
		}
	}
	// A 4 MiB value there and back, every byte intact.
	value := randomBytes(4 << 20)
	set := cli("-x", "SET", "big")
	set.Stdin = bytes.NewReader(value)
	if out := runOK(t, set); strings.TrimSpace(string(out)) != "OK" {
		t.Fatalf("SET: %q", out)
	}
	if out := runOK(t, cli("--raw", "GET", "big")); !bytes.Equal(out, append(value, '\n')) {
		t.Fatalf("GET returned %d bytes, differing from the %d set", len(out), len(value))
	}
	// redis sees the client's real address.
	if out := runOK(t, cli("CLIENT", "LIST")); !bytes.Contains(out, []byte("addr="+client.ns.Addr4().String()+":")) {
		t.Errorf("CLIENT LIST does not show the client %s:\n%s", client.ns.Addr4(), out)
	}
	if n := client.stats().Connections.SMCR - before; n < 23 {
		t.Errorf("redis's clients made %d SMC-R connections, want at least 23", n)
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func writeFile(t testing.TB, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(name, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// runOK runs cmd and returns its standard output, failing the test with its
// standard error if it fails.
func runOK(t *testing.T, cmd *exec.Cmd) []byte {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, stderr.Bytes())
	}
	return out
}
