// Tests of the control API end to end: a real server on a Unix socket, the typed
// client, the fake backend, access control and the not-running errors.

package control_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/smcr-io/smcr/config"
	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/control/controltest"
	"github.com/smcr-io/smcr/internal/leakcheck"
)

func setup(t *testing.T) (*controltest.Fake, *control.Client, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "smcrd.conf")
	f := controltest.NewFake(file)
	path := controltest.Serve(t, f, "")
	c := control.NewClient(path)
	t.Cleanup(c.Close)
	return f, c, file
}

func TestReadCalls(t *testing.T) {
	f, c, _ := setup(t)
	ctx := context.Background()
	check := func(name string, got, want any, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %+v\nwant %+v", name, got, want)
		}
	}
	st, err := c.Status(ctx)
	check("Status", st, f.St, err)
	s, err := c.Stats(ctx)
	check("Stats", s, f.S, err)
	lgs, err := c.LinkGroups(ctx)
	check("LinkGroups", lgs, f.LGs, err)
	cs, err := c.Conns(ctx)
	check("Conns", cs, f.Cs, err)
	ps, err := c.Peers(ctx)
	check("Peers", ps, f.Ps, err)
	ds, err := c.Devices(ctx)
	check("Devices", ds, f.Ds, err)
	attrs, err := c.Config(ctx)
	check("Config", attrs, config.Default().Attributes(), err)

	links, err := c.Links(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 3 {
		t.Fatalf("Links: %d links, want 3 (1 + 2 in the fake's groups)", len(links))
	}
	if l := links[2]; l.LinkGroup != 2 || l.Num != 2 || l.Role != "server" || l.Peer != f.LGs[1].Peer || l.PeerQPN != 0x32 {
		t.Errorf("third link %+v does not carry group 2's identity", l)
	}
}

func TestEmptyListsAreArrays(t *testing.T) {
	f, c, _ := setup(t)
	f.Cs, f.LGs = nil, nil
	for _, p := range []string{"/v1/conns", "/v1/links", "/v1/linkgroups"} {
		b := rawGet(t, c.Socket(), p, 200)
		if strings.TrimSpace(b) != "[]" {
			t.Errorf("%s with nothing to list = %q, want []", p, b)
		}
	}
}

func rawGet(t *testing.T, socket, path string, wantCode int) string {
	t.Helper()
	hc := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return net.Dial("unix", socket)
	}}}
	resp, err := hc.Get("http://smcrd" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != wantCode {
		t.Errorf("GET %s: %d %s, want %d", path, resp.StatusCode, b, wantCode)
	}
	return string(b)
}

func TestSetConfig(t *testing.T) {
	f, c, file := setup(t)
	ctx := context.Background()
	res, err := c.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"port_range_list=5201,6379", "max_memory=512"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Changed) != 2 || res.Changed[0].Value != "5201,6379" || res.Changed[1].Value != "512" || res.Persisted {
		t.Errorf("result %+v: want two changes, not persisted", res)
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a runtime-only change wrote %s (stat: %v)", file, err)
	}

	// All or nothing: one bad value refuses the whole request, with the reason.
	_, err = c.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"max_memory=64", "port_range_list=20-1"}})
	if !errors.Is(err, control.ErrInvalid) {
		t.Fatalf("bad range: err = %v, want ErrInvalid", err)
	}
	if want := `port_range_list: bad range "20-1": start 20 is above end 1`; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	attrs, _ := c.Config(ctx)
	if v := attrValue(attrs, "max_memory"); v != "512" {
		t.Errorf("max_memory = %s after a refused request, want 512 (nothing half-applied)", v)
	}

	res, err = c.SetConfig(ctx, control.SetConfigRequest{Assignments: []string{"rmb_size=64K"}, Persist: true})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Persisted || res.File != file {
		t.Errorf("persist result %+v", res)
	}
	saved, err := config.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	if saved.RMBSize != 64<<10 || saved.MaxMemory != 512<<20 {
		t.Errorf("saved file has rmb_size %d, max_memory %d", saved.RMBSize, saved.MaxMemory)
	}
	if !f.Persisted() {
		t.Error("fake did not see persist")
	}

	if _, err := c.SetConfig(ctx, control.SetConfigRequest{}); !errors.Is(err, control.ErrInvalid) {
		t.Errorf("empty request: err = %v, want ErrInvalid", err)
	}
}

func attrValue(attrs []control.Attribute, name string) string {
	for _, a := range attrs {
		if a.Name == name {
			return a.Value
		}
	}
	return "?"
}

func TestEnableDisable(t *testing.T) {
	_, c, _ := setup(t)
	ctx := context.Background()
	if err := c.Disable(ctx, false); err != nil {
		t.Fatal(err)
	}
	if st, _ := c.Status(ctx); st.Enabled {
		t.Error("still enabled after Disable")
	}
	if err := c.Enable(ctx, false); err != nil {
		t.Fatal(err)
	}
	if st, _ := c.Status(ctx); !st.Enabled {
		t.Error("not enabled after Enable")
	}
}

func TestResetStats(t *testing.T) {
	f, c, _ := setup(t)
	ctx := context.Background()
	before, err := c.ResetStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before, controltest.FixedStats()) {
		t.Errorf("ResetStats returned %+v, want the counters before the reset", before)
	}
	if f.Resets != 1 {
		t.Errorf("backend saw %d resets, want 1", f.Resets)
	}
	after, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Connections.Handled != 0 || after.TX.Bytes != 0 || len(after.Fallbacks) != 0 || after.RX.RequestSizes[0].Count != 0 {
		t.Errorf("counters after reset: %+v", after)
	}
}

func TestForgetPeers(t *testing.T) {
	f, c, _ := setup(t)
	ctx := context.Background()
	all := len(f.Ps)
	if all < 2 {
		t.Fatalf("the fake holds %d peers, want at least 2", all)
	}
	if _, err := c.ForgetPeers(ctx, "198.18.0.9", "not-an-address"); !errors.Is(err, control.ErrInvalid) {
		t.Errorf("a malformed address: %v, want ErrInvalid", err)
	}
	if _, err := c.ForgetPeers(ctx, "fe80::1%eth0"); !errors.Is(err, control.ErrInvalid) || !strings.Contains(err.Error(), "zones are not supported") {
		t.Errorf("a zoned address: %v, want ErrInvalid saying zones are not supported", err)
	}
	if _, err := c.ForgetPeers(ctx, "198.18.0.9:0"); !errors.Is(err, control.ErrInvalid) {
		t.Errorf("port 0: %v, want ErrInvalid", err)
	}
	if len(f.Ps) != all {
		t.Error("a refused request forgot peers")
	}
	one := netip.AddrPortFrom(netip.MustParseAddr(f.Ps[0].Addr), f.Ps[0].Port)
	if n, err := c.ForgetPeers(ctx, netip.AddrPortFrom(one.Addr(), one.Port()+1).String()); err != nil || n != 0 || len(f.Ps) != all {
		t.Errorf("forgetting another port of %s: %d, %v, %d left; want none forgotten", one.Addr(), n, err, len(f.Ps))
	}
	if n, err := c.ForgetPeers(ctx, one.String()); err != nil || n != 1 || len(f.Ps) != all-1 {
		t.Errorf("forgetting %s: %d, %v, %d left; want 1 and %d left", one, n, err, len(f.Ps), all-1)
	}
	if n, err := c.ForgetPeers(ctx); err != nil || n != all-1 || len(f.Ps) != 0 {
		t.Errorf("forgetting all: %d, %v, %d left; want %d and none left", n, err, len(f.Ps), all-1)
	}
}

func TestErrors(t *testing.T) {
	f, c, _ := setup(t)
	ctx := context.Background()
	f.Err = errors.New("engine: link group table locked")
	_, err := c.Stats(ctx)
	var ae *control.APIError
	if !errors.As(err, &ae) || ae.StatusCode != 500 || ae.Message != f.Err.Error() {
		t.Errorf("backend failure: err = %#v, want a 500 APIError with the message", err)
	}
	f.Err = nil

	b := rawGet(t, c.Socket(), "/v2/stats", 404)
	if !strings.Contains(b, "API v1") {
		t.Errorf("unknown path answer %q does not name the API version", b)
	}
	rawGet(t, c.Socket(), "/v1/stats/reset", 404) // a reset must be a POST
	if f.Resets != 0 {
		t.Error("a GET reset the counters")
	}

	hc := http.Client{Transport: &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
		return net.Dial("unix", c.Socket())
	}}}
	resp, err := hc.Post("http://smcrd/v1/config", "application/json", strings.NewReader(`{"assignments":["enabled=no"],"persistent":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("unknown field: status %d, want 400", resp.StatusCode)
	}
	if st, _ := c.Status(ctx); !st.Enabled {
		t.Error("a refused request changed the configuration")
	}
}

func TestNotRunning(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "smcrd.sock")
	_, err := control.NewClient(path).Status(context.Background())
	if !errors.Is(err, control.ErrNotRunning) {
		t.Fatalf("err = %v, want ErrNotRunning", err)
	}
	if want := "smcrd is not running: no control socket at " + path; err.Error() != want {
		t.Errorf("err = %q, want %q", err, want)
	}

	// A socket file left by a crashed smcrd: nothing accepts.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	_, err = control.NewClient(path).Status(context.Background())
	var nr *control.NotRunningError
	if !errors.As(err, &nr) || !nr.Stale {
		t.Fatalf("stale socket: err = %v, want a stale NotRunningError", err)
	}

	// A new server replaces the stale socket ...
	path2 := controltestServeAt(t, path)
	if _, err := control.NewClient(path2).Status(context.Background()); err != nil {
		t.Fatalf("after replacing the stale socket: %v", err)
	}
	// ... but refuses to take over a live one, or a file that is not a socket.
	if _, err := control.NewServer(path, "", "", controltest.NewFake(""), nil); err == nil || !strings.Contains(err.Error(), "another smcrd") {
		t.Errorf("second server on a live socket: err = %v", err)
	}
	plain := filepath.Join(dir, "plain")
	os.WriteFile(plain, nil, 0o644)
	if _, err := control.NewServer(plain, "", "", controltest.NewFake(""), nil); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("server on a regular file: err = %v", err)
	}
}

func controltestServeAt(t *testing.T, path string) string {
	t.Helper()
	srv, err := control.NewServer(path, "", "", controltest.NewFake(""), nil)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	t.Cleanup(func() { srv.Close(context.Background()) })
	return path
}

func TestSocketMode(t *testing.T) {
	for _, tc := range []struct {
		group, monitor string
		mode           os.FileMode
		gid            int
	}{{"", "", 0o600, -1}, {"4321", "", 0o660, 4321}, {"4321", "4322", 0o666, -1}, {"", "4322", 0o666, -1}} {
		path := filepath.Join(t.TempDir(), "s.sock")
		srv, err := control.NewServer(path, tc.group, tc.monitor, controltest.NewFake(""), nil)
		if err != nil {
			if os.Geteuid() != 0 && tc.gid >= 0 {
				t.Skipf("chown to another group needs root: %v", err)
			}
			t.Fatal(err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != tc.mode {
			t.Errorf("group %q: socket mode %v, want %v", tc.group, fi.Mode().Perm(), tc.mode)
		}
		if gid := int(fi.Sys().(*syscall.Stat_t).Gid); tc.gid >= 0 && gid != tc.gid {
			t.Errorf("group %q: socket gid %d, want %d", tc.group, gid, tc.gid)
		}
		srv.Close(context.Background())
	}
}

// TestPeerCredRefused runs a client as an unprivileged uid against a socket whose
// file permissions were (wrongly) opened to everyone: the SO_PEERCRED check must
// still refuse it.
func TestPeerCredRefused(t *testing.T) {
	if os.Getenv("CONTROL_TEST_CLIENT") != "" {
		return // the child's run of this test: see TestMain
	}
	if os.Geteuid() != 0 {
		t.Skip("running a client as another uid needs root (CAP_SETUID)")
	}
	dir, err := os.MkdirTemp("", "smcr-control-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	path := filepath.Join(dir, "smcrd.sock")
	for _, tc := range []struct {
		group, monitor string
		uid, gid       uint32
		allowed        bool
		write          bool // allowed to change too
	}{
		{"", "", 65534, 65534, false, false},
		{"4321", "", 65534, 65534, false, false},
		{"4321", "", 65534, 4321, true, true},
		{"4321", "4322", 65534, 4322, true, false},
		{"", "4322", 65534, 4322, true, false},
		{"", "4322", 65534, 65534, false, false},
	} {
		srv, err := control.NewServer(path, tc.group, tc.monitor, controltest.NewFake(""), nil)
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve()
		os.Chmod(path, 0o666)

		exe := copyExecutable(t, dir)
		cmd := exec.Command(exe, "-test.run=^TestPeerCredRefused$")
		cmd.Env = append(os.Environ(), "CONTROL_TEST_CLIENT="+path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: tc.uid, Gid: tc.gid}}
		out, err := cmd.CombinedOutput()
		srv.Close(context.Background())
		if err != nil {
			t.Fatalf("client as uid %d: %v\n%s", tc.uid, err, out)
		}
		var res struct {
			OK, WriteOK                 bool
			Permission, WritePermission bool
			Msg                         string
		}
		if err := json.Unmarshal(lastLine(out), &res); err != nil {
			t.Fatalf("client output %q: %v", out, err)
		}
		switch {
		case tc.allowed && !res.OK:
			t.Errorf("group %q, uid %d gid %d: refused (%s), want allowed", tc.group, tc.uid, tc.gid, res.Msg)
		case !tc.allowed && (res.OK || !res.Permission):
			t.Errorf("group %q, uid %d gid %d: %+v, want a permission error", tc.group, tc.uid, tc.gid, res)
		case !tc.allowed && !strings.Contains(res.Msg, "uid 65534"):
			t.Errorf("refusal %q does not name the uid", res.Msg)
		case tc.write != res.WriteOK || !tc.write && !res.WritePermission:
			t.Errorf("group %q monitor %q, uid %d gid %d: change allowed %v (permission error %v), want allowed %v",
				tc.group, tc.monitor, tc.uid, tc.gid, res.WriteOK, res.WritePermission, tc.write)
		}
	}
}

func lastLine(b []byte) []byte {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return []byte(lines[len(lines)-1])
}

func copyExecutable(t *testing.T, dir string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "control.test")
	if _, err := os.Stat(dst); err == nil {
		return dst
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestMain(m *testing.M) {
	if path := os.Getenv("CONTROL_TEST_CLIENT"); path != "" {
		c := control.NewClient(path)
		_, err := c.Status(context.Background())
		res := map[string]any{"OK": err == nil, "Permission": errors.Is(err, control.ErrPermission)}
		if err != nil {
			res["Msg"] = err.Error()
		}
		werr := c.Enable(context.Background(), false)
		res["WriteOK"], res["WritePermission"] = werr == nil, errors.Is(werr, control.ErrPermission)
		b, _ := json.Marshal(res)
		os.Stdout.Write(append(b, '\n'))
		os.Exit(0)
	}
	os.Exit(leakcheck.Run(m))
}
