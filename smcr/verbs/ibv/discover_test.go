// Tests of sysfs discovery and the PNET mapping on a fake /sys tree, so they run
// on any machine, with or without the ibv tag.

package ibv

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// fakeSysfs writes the files the kernel exposes for each GID entry.
type fakeGID struct {
	dev         string
	port, index int
	gid, typ    string
	ndev        string
}

func fakeSysfs(t *testing.T, gids []fakeGID, states map[string]string, mtus map[string]string) sysfs {
	t.Helper()
	root := t.TempDir()
	write := func(path, s string) {
		t.Helper()
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range gids {
		port := filepath.Join("class/infiniband", g.dev, "ports", itoa(g.port))
		write(filepath.Join(port, "gids", itoa(g.index)), g.gid)
		if g.typ != "" {
			write(filepath.Join(port, "gid_attrs/types", itoa(g.index)), g.typ)
			write(filepath.Join(port, "gid_attrs/ndevs", itoa(g.index)), g.ndev)
		}
		write(filepath.Join(port, "state"), states[g.dev])
		write(filepath.Join(port, "link_layer"), "Ethernet")
	}
	for ndev, mtu := range mtus {
		write(filepath.Join("class/net", ndev, "mtu"), mtu)
	}
	return sysfs(root)
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestDevicesAndResolve(t *testing.T) {
	fs := fakeSysfs(t, []fakeGID{
		{"mlx5_0", 1, 0, "fe80:0000:0000:0000:5054:00ff:fe12:3456", "IB/RoCE v1", "eth1"},
		{"mlx5_0", 1, 1, "fe80:0000:0000:0000:5054:00ff:fe12:3456", "RoCE v2", "eth1"},
		{"mlx5_0", 1, 2, "0000:0000:0000:0000:0000:ffff:c0a8:0105", "IB/RoCE v1", "eth1"},
		{"mlx5_0", 1, 3, "0000:0000:0000:0000:0000:ffff:c0a8:0105", "RoCE v2", "eth1"},
		{"mlx5_0", 1, 4, "0000:0000:0000:0000:0000:0000:0000:0000", "", ""}, // unpopulated
		{"mlx5_0", 1, 5, "2001:0db8:0000:0000:0000:0000:0000:0005", "RoCE v2", "eth1"},
		{"rxe0", 1, 0, "fe80:0000:0000:0000:64de:94ff:feba:ee78", "RoCE v2", "dummy0"},
		{"rxe0", 1, 1, "0000:0000:0000:0000:0000:ffff:0a63:0001", "RoCE v2", "dummy0"},
		// An entry being torn down: its attribute files are unreadable.
		{"rxe0", 1, 2, "0000:0000:0000:0000:0000:ffff:0a63:0002", "", ""},
	}, map[string]string{"mlx5_0": "4: ACTIVE", "rxe0": "1: DOWN"}, map[string]string{"eth1": "9000", "dummy0": "1500"})

	ports, err := fs.devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 2 || ports[0].Device != "mlx5_0" || ports[1].Device != "rxe0" {
		t.Fatalf("ports %+v", ports)
	}
	m, r := ports[0], ports[1]
	if !m.Active() || r.Active() || r.State != "DOWN" || m.LinkLayer != "Ethernet" {
		t.Errorf("states: %q %q", m.State, r.State)
	}
	if len(m.GIDs) != 5 || len(r.GIDs) != 2 {
		t.Errorf("gid entries: %d and %d, want 5 and 2", len(m.GIDs), len(r.GIDs))
	}
	if m.Netdev != "eth1" || m.MTU != verbs.MTU4096 || r.MTU != verbs.MTU1024 {
		t.Errorf("netdev %q mtu %v / %v", m.Netdev, m.MTU, r.MTU)
	}

	for _, tc := range []struct {
		in       string
		dev      string
		index    int
		wantAddr string
	}{
		{"eth1", "mlx5_0", 3, "192.168.1.5"}, // RoCE v2 and IPv4 beat v1 and IPv6
		{"192.168.1.5", "mlx5_0", 3, "192.168.1.5"},
		{"::ffff:192.168.1.5", "mlx5_0", 3, "192.168.1.5"},
		{"2001:db8::5", "mlx5_0", 5, "2001:db8::5"},
		{"dummy0", "rxe0", 1, "10.99.0.1"},
		{"fe80::64de:94ff:feba:ee78", "rxe0", 0, "fe80::64de:94ff:feba:ee78"},
	} {
		got, err := fs.resolve(tc.in)
		if err != nil {
			t.Errorf("Resolve(%q): %v", tc.in, err)
			continue
		}
		if got.Device != tc.dev || got.Port != 1 || got.GIDIndex != tc.index || got.Addr.String() != tc.wantAddr {
			t.Errorf("Resolve(%q) = %+v, want %s gid %d (%s)", tc.in, got, tc.dev, tc.index, tc.wantAddr)
		}
	}
	for _, in := range []string{"eth0", "10.99.0.2", "not an address"} {
		if _, err := fs.resolve(in); !errors.Is(err, ErrNoDevice) {
			t.Errorf("Resolve(%q): %v, want ErrNoDevice", in, err)
		}
	}
}

func TestNoRDMA(t *testing.T) {
	fs := sysfs(t.TempDir())
	ports, err := fs.devices()
	if err != nil || len(ports) != 0 {
		t.Fatalf("Devices on a machine without RDMA: %v, %v", ports, err)
	}
	if _, err := fs.resolve("eth0"); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Resolve: %v", err)
	}
}

// TestDeviceVanishing: a device removed while Devices reads the tree (its
// directory listed, its ports or GID table gone) is left out; the others stay.
func TestDeviceVanishing(t *testing.T) {
	fs := fakeSysfs(t, []fakeGID{
		{"rxe0", 1, 1, "0000:0000:0000:0000:0000:ffff:0a63:0001", "RoCE v2", "dummy0"},
	}, map[string]string{"rxe0": "4: ACTIVE"}, nil)
	base := filepath.Join(string(fs), "class/infiniband")
	if err := os.MkdirAll(filepath.Join(base, "gone_ports"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(base, "gone_gids", "ports", "1"), 0o755); err != nil {
		t.Fatal(err)
	}
	ports, err := fs.devices()
	if err != nil {
		t.Fatalf("Devices with vanishing devices: %v", err)
	}
	if len(ports) != 1 || ports[0].Device != "rxe0" {
		t.Fatalf("Devices = %+v, want rxe0 only", ports)
	}
	if tg, err := fs.resolve("dummy0"); err != nil || tg.Device != "rxe0" || tg.GIDIndex != 1 {
		t.Fatalf("Resolve(dummy0) = %+v, %v", tg, err)
	}
}

func TestParseGID(t *testing.T) {
	g, err := ParseGID("fe80:0000:0000:0000:64de:94ff:feba:ee78")
	if err != nil || g[0] != 0xfe || g[1] != 0x80 || g[15] != 0x78 {
		t.Fatalf("%x %v", g, err)
	}
	for _, bad := range []string{"", "fe80::1", "zz80:0000:0000:0000:64de:94ff:feba:ee78"} {
		if _, err := ParseGID(bad); err == nil {
			t.Errorf("ParseGID(%q) accepted", bad)
		}
	}
}

func TestRoCEMTU(t *testing.T) {
	for netMTU, want := range map[int]verbs.MTU{9000: verbs.MTU4096, 4192: verbs.MTU4096, 4191: verbs.MTU2048,
		1500: verbs.MTU1024, 1024: verbs.MTU512, 576: verbs.MTU256, 100: verbs.MTU256} {
		if got := RoCEMTU(netMTU); got != want {
			t.Errorf("RoCEMTU(%d) = %v, want %v", netMTU, got, want)
		}
	}
}

// FuzzParseGID: a GID either fails to parse or prints back to the same text.
func FuzzParseGID(f *testing.F) {
	f.Add("fe80:0000:0000:0000:64de:94ff:feba:ee78")
	f.Add("0000:0000:0000:0000:0000:ffff:0a63:0001")
	f.Add("fe80::1")
	f.Fuzz(func(t *testing.T, s string) {
		g, err := ParseGID(s)
		if err != nil {
			return
		}
		var b strings.Builder
		for i := 0; i < 16; i += 2 {
			if i > 0 {
				b.WriteByte(':')
			}
			b.WriteString(strconv.FormatUint(uint64(g[i])<<8|uint64(g[i+1])|1<<16, 16)[1:])
		}
		want := strings.ToLower(strings.ReplaceAll(strings.TrimSpace(s), ":", ""))
		if got := strings.ReplaceAll(b.String(), ":", ""); got != want {
			t.Fatalf("ParseGID(%q) = %s", s, b.String())
		}
	})
}
