package daemon

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/smcr-io/smcr/config"
)

// rdma_devices picks the device of the interfaces it names; the others keep the
// GID-table lookup, and an entry for an interface not in use is reported.
func TestRDMADevices(t *testing.T) {
	rdma := []config.RDMADevice{{Interface: "veth0", Device: "rxe0", Port: 1}, {Interface: "eth1", Device: "mlx5_1", Port: 2}}
	if c := ibvConfig("eth1", rdma, nil); c.Device != "mlx5_1" || c.Port != 2 || c.GIDIndex != -1 {
		t.Errorf("eth1: %+v, want mlx5_1 port 2, best GID", c)
	}
	if c := ibvConfig("eth0", rdma, nil); c.Device != "" || c.Interface != "eth0" {
		t.Errorf("eth0 (not mapped): %+v, want a lookup by interface", c)
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	devs := openDevices(nil, []config.Interface{{Name: "eth1"}}, rdma, t.TempDir(), nil, log)
	if len(devs) != 0 {
		t.Fatalf("no provider asked for, %d devices opened", len(devs))
	}
	if out := buf.String(); !strings.Contains(out, "rdma_devices names an interface smcrd does not use") || !strings.Contains(out, `entry="veth0=rxe0"`) || strings.Contains(out, "mlx5_1") {
		t.Errorf("log:\n%s\nwant a warning for veth0=rxe0 only", out)
	}
}

// TestNoDeviceWarned: an smcrd left without any device says so once, plainly:
// each provider's own warning does not tell that nothing at all opened.
func TestNoDeviceWarned(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	// soft with an interface that has no address: nothing to listen on.
	if devs := openDevices([]string{"soft"}, []config.Interface{{Name: "eth9"}}, nil, t.TempDir(), nil, log); len(devs) != 0 {
		t.Fatalf("%d devices opened", len(devs))
	}
	if out := buf.String(); !strings.Contains(out, "level=WARN msg=\"no provider opened a device") || !strings.Contains(out, "providers=soft") {
		t.Errorf("log:\n%s\nwant the warning that no device opened", out)
	}
}
