package config

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestDefaults(t *testing.T) {
	c := Default()
	if !c.Enabled || c.MaxMemory != 256<<20 || c.RMBSize != 256<<10 || c.CLCTimeout != 6*time.Second ||
		c.PeerCacheTTL != 10*time.Minute || len(c.Interfaces) != 0 || c.ControlSocket != "/run/smcr/smcrd.sock" {
		t.Fatalf("defaults: %+v", c)
	}
	if !c.PortRanges.Contains(5201) || c.PortRanges.Contains(22) {
		t.Errorf("default port_range_list %s", c.PortRanges)
	}
}

func TestParseFile(t *testing.T) {
	c, err := Parse(strings.NewReader(`
# a comment
enabled = no          # trailing comment
port_range_list = 50, 1-20 ,23
ip_addr_list = eth0,192.0.2.7
max_memory = 512
rmb_size = 64K
providers = shm
peer_cache_ttl = 1h
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Enabled || c.PortRanges.String() != "1-20,23,50" || !reflect.DeepEqual(c.Interfaces, []string{"eth0", "192.0.2.7"}) ||
		c.MaxMemory != 512<<20 || c.RMBSize != 64<<10 || !reflect.DeepEqual(c.Providers, []string{"shm"}) ||
		c.PeerCacheTTL != time.Hour || c.SendBufSize != 256<<10 {
		t.Fatalf("parsed %+v", c)
	}
}

// Every error names the line, the attribute and what is wrong.
func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"port_range_list = 20-1", `line 1: port_range_list: bad range "20-1": start 20 is above end 1`},
		{"port_range_list = 70000", `line 1: port_range_list: bad range "70000": port 70000 is out of range 1-65535`},
		{"port_range_list = a-b", `line 1: port_range_list: bad range "a-b": "a" is not a port number`},
		{"port_range_list = 0", `port 0 is out of range 1-65535`},
		{"\n\nip_addr_list = eth0,eth1,eth2", `line 3: ip_addr_list: 3 interfaces given, at most 2 (one per link of a link group)`},
		{"ip_addr_list = eth0,eth0", `ip_addr_list: "eth0" listed twice`},
		{"ip_addr_list = bad/name", `"bad/name" is neither an IP address nor an interface name`},
		{"ip_addr_list = eth=1", `"eth=1": an interface whose name has "#,=" cannot be listed`},
		{"max_memory = lots", `line 1: max_memory: "lots" is not a number of MB`},
		{"max_memory = 0", `max_memory: 0 is out of range 1-1048576`},
		{"rmb_size = 1G", `rmb_size: "1G" is not a size such as 64K or 1M`},
		{"rmb_size = 8K", `rmb_size: 8K is out of range 16K-512K`},
		{"providers = rdma,infiniband", `providers: provider "infiniband" is not one of rdma, shm, soft`},
		{"providers =", `no provider given`},
		{"peer_cache_ttl = soon", `"soon" is not a duration`},
		{"read_spin = 2ms", `read_spin: 2ms is out of range 0s-1ms`},
		{"read_spin = -1us", `read_spin: -1us is out of range 0s-1ms`},
		{"enabled = maybe", `enabled: "maybe" is not yes or no`},
		{"colour = blue", `line 1: colour: unknown attribute`},
		{"just words", `line 1: "just words" is not of the form attribute = value`},
		{"enabled = yes\nenabled = no", `line 2: enabled: set twice (first on line 1)`},
		{"metrics_address = localhost", `"localhost" is not an address:port`},
		{"control_socket = run/x.sock", `"run/x.sock" is not an absolute path`},
		{"control_socket = /" + strings.Repeat("d", 107), `control_socket: "/ddd`},
		{"control_socket = /" + strings.Repeat("d", 107), `is 108 bytes long, longer than a Unix socket's path may be (107)`},
		{"rdma_devices = eth0", `rdma_devices: "eth0" is not of the form interface=device[/port]`},
		{"ueid_list = A,B,C,D,E,F,G,H,I", `line 1: ueid_list: 9 user EIDs given, at most 8`},
		{"ueid_list = PROD.SMC,PROD.SMC", `ueid_list: "PROD.SMC" listed twice`},
		{"ueid_list = prod", `ueid_list: "prod": character 'p' at 1, allowed are A-Z 0-9 . -: invalid user EID`},
		{"ueid_list = -PROD", `ueid_list: "-PROD": starts with '-', must start with a letter or digit`},
		{"ueid_list = PROD_SMC", `character '_' at 5`},
		{"ueid_list = " + strings.Repeat("E", 33), `ueid_list: "` + strings.Repeat("E", 33) + `": 33 characters, at most 32`},
		{"rdma_devices = eth0=mlx5_0/0", `"eth0=mlx5_0/0": port "0" is not a number from 1 to 255`},
		{"rdma_devices = eth0=mlx5_0/x", `port "x" is not a number`},
		{"rdma_devices = eth0=", `"eth0=": "" is not an RDMA device name`},
		{"rdma_devices = =mlx5_0", `"" is not an interface name`},
		{"rdma_devices = eth0=a,eth0=b", `interface eth0 mapped twice`},
		{"rdma_devices = eth0=mlx5_0;rm", `"mlx5_0;rm" is not an RDMA device name`},
	} {
		_, err := Parse(strings.NewReader(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v, want error containing %q", c.in, err, c.want)
		}
	}
}

// TestDurationRangeAsWritten pins that a duration out of range is refused with
// its bounds written as the guide and the file write them (1m, 168h), not as
// Go prints a Duration (1m0s, 168h0m0s).
func TestDurationRangeAsWritten(t *testing.T) {
	for in, want := range map[string]string{
		"clc_timeout = 2m":      `line 1: clc_timeout: 2m is out of range 10ms-1m`,
		"peer_cache_ttl = 200h": `line 1: peer_cache_ttl: 200h is out of range 1s-168h`,
		"test_link_time = 90m":  `line 1: test_link_time: 90m is out of range 100ms-1h (or 0: never)`,
		"test_link_time = 1us":  `line 1: test_link_time: 1us is out of range 100ms-1h (or 0: never)`,
		"read_spin = 2ms":       `line 1: read_spin: 2ms is out of range 0s-1ms`,
	} {
		if _, err := Parse(strings.NewReader(in)); err == nil || err.Error() != want {
			t.Errorf("Parse(%q) = %v, want %s", in, err, want)
		}
	}
}

// TestTestLinkTimeFloor pins that test_link_time takes 0 (never) and values
// from 100ms, and nothing in between: a link tested every microsecond would
// spend its group's time on TEST_LINKs.
func TestTestLinkTimeFloor(t *testing.T) {
	for in, want := range map[string]time.Duration{"0": 0, "0s": 0, "100ms": 100 * time.Millisecond, "1h": time.Hour} {
		c, err := Parse(strings.NewReader("test_link_time = " + in))
		if err != nil || c.TestLinkTime != want {
			t.Errorf("test_link_time = %s: %v, %v; want %v", in, c.TestLinkTime, err, want)
		}
	}
	for _, in := range []string{"1ns", "99ms", "-1s"} {
		if _, err := Parse(strings.NewReader("test_link_time = " + in)); err == nil {
			t.Errorf("test_link_time = %s: accepted", in)
		}
	}
}

// TestMaxMemoryIsMB pins that a max_memory written as a size (512M, as rmb_size
// takes) is refused with the unit it is in and, where whole, the number to write.
func TestMaxMemoryIsMB(t *testing.T) {
	for v, want := range map[string]string{
		"512M":  `set: max_memory: "512M" is not a number of MB (write 512)`,
		"2048k": `set: max_memory: "2048k" is not a number of MB (write 2)`,
		"512K":  `set: max_memory: "512K" is not a number of MB`,
		"lots":  `set: max_memory: "lots" is not a number of MB`,
		"0":     `set: max_memory: 0 is out of range 1-1048576`,
	} {
		if _, err := Default().Set("max_memory=" + v); err == nil || err.Error() != want {
			t.Errorf("set max_memory=%s: %v, want %q", v, err, want)
		}
	}
	if c, err := Default().Set("max_memory=512"); err != nil || c.MaxMemory != 512<<20 {
		t.Errorf("set max_memory=512: %v", err)
	}
}

func TestParseReportsEveryError(t *testing.T) {
	_, err := Parse(strings.NewReader("max_memory = x\nrmb_size = y\n"))
	if err == nil || !strings.Contains(err.Error(), "line 1: max_memory") || !strings.Contains(err.Error(), "line 2: rmb_size") {
		t.Fatalf("want both errors, got %v", err)
	}
}

func TestLoadNamesFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "smcrd.conf")
	os.WriteFile(p, []byte("enabled = yes\nmax_memory = -3\n"), 0o644)
	_, err := Load(p)
	if err == nil || !strings.HasPrefix(err.Error(), p+":2: max_memory: ") {
		t.Fatalf("Load: %v", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.conf")); err == nil {
		t.Fatal("missing file loaded")
	}
}

// TestLoadUnreadable: a line too long, a binary file and control characters
// give an error with the file and line, escaped, once. They gave only
// "bufio.Scanner: token too long", or echoed the bytes to the terminal.
func TestLoadUnreadable(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, text, want string
	}{
		{"long", "enabled = yes\nlog_level = " + strings.Repeat("x", 70<<10) + "\n", ":2: line longer than 64 KiB"},
		{"binary", "\x7fELF\x02\x01\x01\x00\x00 = \x1b[2J\n\x00\x00\n", ":1: not text (a binary file?)"},
		{"control", "enabled = yes\n\x1b[2J\x07 = 1\n", `:2: "\x1b[2J\a": unknown attribute`},
		{"latin1", "\xe9t\xe9 = 1\n", `:1: "\xe9t\xe9": unknown attribute`},
	} {
		p := filepath.Join(dir, c.name+".conf")
		if err := os.WriteFile(p, []byte(c.text), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(p)
		if err == nil || !strings.HasPrefix(err.Error(), p+c.want) || strings.Count(err.Error(), "\n") > 0 {
			t.Errorf("%s: %v, want one error beginning %q", c.name, err, p+c.want)
		}
		if err != nil && strings.ContainsAny(err.Error(), "\x00\x1b\x07") {
			t.Errorf("%s: the error holds control characters: %q", c.name, err)
		}
	}
}

// TestAttrError: an error found in an attribute's value after the file loaded
// names the line that sets it.
func TestAttrError(t *testing.T) {
	p := filepath.Join(t.TempDir(), "smcrd.conf")
	os.WriteFile(p, []byte("enabled = yes\n# c\ncgroup = /x/\n"), 0o644)
	if got, want := AttrError(p, "cgroup", "no such cgroup").Error(), p+":3: cgroup: no such cgroup"; got != want {
		t.Errorf("AttrError = %q, want %q", got, want)
	}
	if got, want := AttrError("", "cgroup", "no such cgroup").Error(), "cgroup: no such cgroup"; got != want {
		t.Errorf("AttrError of the defaults = %q, want %q", got, want)
	}
}

func TestSetIsAllOrNothing(t *testing.T) {
	c := Default()
	n, err := c.Set("port_range_list=5201", "max_memory=64")
	if err != nil {
		t.Fatal(err)
	}
	if n.PortRanges.String() != "5201" || n.MaxMemory != 64<<20 {
		t.Fatalf("set: %+v", n)
	}
	if c.PortRanges.String() != "1024-65535" {
		t.Fatal("Set changed its receiver")
	}
	bad, err := n.Set("port_range_list=80", "max_memory=oops")
	if err == nil || !strings.Contains(err.Error(), `set: max_memory: "oops" is not a number`) {
		t.Fatalf("want error, got %v", err)
	}
	if bad.PortRanges.String() != "5201" {
		t.Fatal("a failed Set applied part of its assignments")
	}
	if _, err := n.Set("novalue"); err == nil {
		t.Fatal("assignment without = accepted")
	}
	// What smcrd would save and not read back as set is refused.
	for _, a := range []string{"ip_addr_list=eth#1", "control_socket=/run/smcr#1.sock", "cgroup=/apps#x"} {
		if _, err := n.Set(a); err == nil || !strings.Contains(err.Error(), "#") {
			t.Errorf("Set(%q) = %v, want an error about '#'", a, err)
		}
	}
}

// TestSetRefusesDuplicates pins that Set, like a file, refuses an attribute named
// twice instead of applying the last value.
func TestSetRefusesDuplicates(t *testing.T) {
	c := Default()
	n, err := c.Set("port_range_list=5201", "max_memory=64", "port_range_list=80")
	want := `set: port_range_list: set twice (first as "5201")`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Set with port_range_list twice = %v, want error containing %q", err, want)
	}
	if n.PortRanges.String() != c.PortRanges.String() || n.MaxMemory != c.MaxMemory {
		t.Errorf("a refused Set applied part of its assignments: %+v", n)
	}
}

// TestCgroupDotDot pins that cgroup refuses .. only as a whole path element, which
// would climb out of the cgroup mount, and takes names that merely contain "..".
func TestCgroupDotDot(t *testing.T) {
	for _, v := range []string{"..", "../x", "a/../b", "/a/..", "a/../"} {
		if _, err := Default().Set("cgroup=" + v); err == nil || !strings.Contains(err.Error(), "must not contain a .. element") {
			t.Errorf("set cgroup=%s: %v, want refused", v, err)
		}
	}
	for v, want := range map[string]string{"app..slice": "app..slice", "/a/b..c/": "a/b..c", "...": "..."} {
		if c, err := Default().Set("cgroup=" + v); err != nil || c.Cgroup != want {
			t.Errorf("set cgroup=%s: cgroup %q, %v; want %q", v, c.Cgroup, err, want)
		}
	}
}

func TestFormatRoundTrip(t *testing.T) {
	c, err := Default().Set("enabled=no", "port_range_list=1-20,23,50", "ip_addr_list=eth1", "providers=soft,shm",
		"peer_cache_ttl=1h30m", "clc_timeout=250ms", "ueid_list=SMCR-V2PROBE.UEID, 0.PLANT-7", "read_spin=0", "rdma_devices=eth1=mlx5_0/2, veth0=rxe0", "metrics_address=", "log_format=json", "cgroup=/smcr/apps/")
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(strings.NewReader(string(c.Format())))
	if err != nil {
		t.Fatalf("parse formatted: %v\n%s", err, c.Format())
	}
	if want := []string{"SMCR-V2PROBE.UEID", "0.PLANT-7"}; !reflect.DeepEqual(c.UserEIDs, want) {
		t.Errorf("ueid_list = %q, want %q", c.UserEIDs, want)
	}
	if want := []RDMADevice{{"eth1", "mlx5_0", 2}, {"veth0", "rxe0", 1}}; !reflect.DeepEqual(c.RDMADevices, want) {
		t.Errorf("rdma_devices = %+v, want %+v", c.RDMADevices, want)
	}
	if !reflect.DeepEqual(back, c) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", back, c)
	}
	p := filepath.Join(t.TempDir(), "x.conf")
	if err := c.Save(p); err != nil {
		t.Fatal(err)
	}
	if loaded, err := Load(p); err != nil || !reflect.DeepEqual(loaded, c) {
		t.Fatalf("save/load: %v", err)
	}
}

// TestSaveThroughSymlink pins that Save replaces the file a symlink points to, not
// the link, and keeps the file's mode and, as root, its owner.
func TestSaveThroughSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "managed", "smcrd.conf")
	link := filepath.Join(dir, "smcrd.conf")
	if err := os.Mkdir(filepath.Dir(target), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, Default().Format(), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	const uid, gid = 4321, 4322
	asRoot := os.Geteuid() == 0
	if asRoot {
		if err := os.Chown(target, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	c, err := Default().Set("max_memory=64")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Save(link); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("Save replaced the symlink: %v %v", fi.Mode(), err)
	}
	if back, err := Load(target); err != nil || back.MaxMemory != 64<<20 {
		t.Fatalf("the link's target was not written: %v", err)
	}
	fi, err := os.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want -rw-r-----", fi.Mode().Perm())
	}
	if st := fi.Sys().(*syscall.Stat_t); asRoot && (st.Uid != uid || st.Gid != gid) {
		t.Errorf("owner %d:%d, want %d:%d", st.Uid, st.Gid, uid, gid)
	}
	if leftover, _ := filepath.Glob(filepath.Join(dir, "*", "*.tmp")); len(leftover) > 0 {
		t.Errorf("left behind %v", leftover)
	}
}

func TestExampleConfigParses(t *testing.T) {
	c, err := Load("../configs/smcrd.conf")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, Default()) {
		t.Errorf("configs/smcrd.conf should spell out the defaults:\n got %+v\nwant %+v", c, Default())
	}
	// Byte for byte, descriptions too: it is what smcrd -print-default-config
	// writes (regenerate it with that).
	b, err := os.ReadFile("../configs/smcrd.conf")
	if err != nil {
		t.Fatal(err)
	}
	if want := Default().Format(); !bytes.Equal(b, want) {
		t.Errorf("configs/smcrd.conf differs from smcrd -print-default-config:\n%s", want)
	}
}

func TestAttributesCoverEveryField(t *testing.T) {
	attrs := Default().Attributes()
	if len(attrs) != reflect.TypeOf(Config{}).NumField() {
		t.Fatalf("%d attributes for %d Config fields", len(attrs), reflect.TypeOf(Config{}).NumField())
	}
	for _, a := range attrs {
		if a.Description == "" || a.Value != a.Default {
			t.Errorf("attribute %+v", a)
		}
	}
}

// TestAtRestartNamesAttributes pins that the restart-only table names only real
// attributes, so a renamed one cannot drop out of smcrctl set's help unseen.
func TestAtRestartNamesAttributes(t *testing.T) {
	for name := range atRestart {
		if _, ok := attrByName(name); !ok {
			t.Errorf("atRestart names %q, which is no attribute", name)
		}
	}
	if got := RestartOnly(); len(got) != len(atRestart) || got[0] != "providers" {
		t.Errorf("RestartOnly() = %v", got)
	}
}

func TestPortRanges(t *testing.T) {
	rs, err := ParsePortRanges("50,1-20,23,19-25,26,65535")
	if err != nil {
		t.Fatal(err)
	}
	if rs.String() != "1-26,50,65535" {
		t.Fatalf("merged to %s", rs)
	}
	for p, want := range map[uint16]bool{1: true, 20: true, 26: true, 27: false, 49: false, 50: true, 51: false, 65535: true, 0: false} {
		if rs.Contains(p) != want {
			t.Errorf("Contains(%d) = %v", p, !want)
		}
	}
	if rs, _ := ParsePortRanges(""); len(rs) != 0 || rs.Contains(80) {
		t.Error("empty list")
	}
}

func TestResolveInterfaces(t *testing.T) {
	host := []Interface{
		{Name: "lo", Up: true, Loop: true, Addrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8")}},
		{Name: "eth0", Up: true, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.7/24")}},
		{Name: "eth1", Up: false, Addrs: []netip.Prefix{netip.MustParsePrefix("198.51.100.1/24")}},
		{Name: "eth2", Up: true, Addrs: []netip.Prefix{netip.MustParsePrefix("2001:db8::1/64")}},
	}
	got, err := ResolveInterfaces(nil, host)
	if err != nil || len(got) != 2 || got[0].Name != "eth0" || got[1].Name != "eth2" {
		t.Fatalf("auto: %v %v", got, err)
	}
	got, err = ResolveInterfaces([]string{"2001:db8::1", "eth1"}, host)
	if err != nil || got[0].Name != "eth2" || got[1].Name != "eth1" {
		t.Fatalf("by address and name: %v %v", got, err)
	}
	for list, want := range map[string]string{
		"203.0.113.9":    "ip_addr_list: no interface has address 203.0.113.9",
		"wlan0":          `ip_addr_list: no interface named "wlan0"`,
		"eth0,192.0.2.7": `ip_addr_list: "192.0.2.7" names interface eth0 a second time`,
	} {
		if _, err := ResolveInterfaces(strings.Split(list, ","), host); err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", list, err, want)
		}
	}
	if _, err := ResolveInterfaces(nil, host[:1]); err == nil {
		t.Error("auto with only loopback should fail")
	}
	if ifs, err := HostInterfaces(); err != nil || len(ifs) == 0 {
		t.Errorf("HostInterfaces: %v %v", ifs, err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add("port_range_list = 1-20,23,50\nip_addr_list = eth0\n")
	f.Add("rdma_devices = eth0=mlx5_0/2, veth1 = rxe0\n")
	f.Add("max_memory = 12\nrmb_size=64K\n# c\n")
	f.Fuzz(func(t *testing.T, in string) {
		c, err := Parse(strings.NewReader(in))
		if err != nil {
			return
		}
		back, err := Parse(strings.NewReader(string(c.Format())))
		if err != nil || !reflect.DeepEqual(back, c) {
			t.Fatalf("formatted config does not parse back: %v", err)
		}
	})
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{90 * time.Second: "1m30s", 10 * time.Minute: "10m", time.Hour: "1h", 250 * time.Millisecond: "250ms", 6 * time.Second: "6s", 90 * time.Minute: "1h30m"} {
		if got := formatDuration(d); got != want {
			t.Errorf("formatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}
