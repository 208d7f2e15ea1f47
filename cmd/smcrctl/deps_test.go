// smcrctl must stay a small, pure-Go binary that runs anywhere smcrd's socket is
// reachable: it links neither cgo, nor cilium/ebpf, nor the engine, nor prometheus
// (STYLE.md 7, after tailscale's tstest/deptest).

package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// forbidden are import paths (exact, or a prefix when ending in "/") smcrctl must
// not depend on, with the reason shown when one appears.
var forbidden = map[string]string{
	"runtime/cgo":                     "cgo",
	"C":                               "cgo",
	"github.com/cilium/ebpf/":         "the eBPF loader belongs to smcrd",
	"github.com/smcr-io/smcr/smcr":    "the engine belongs to smcrd",
	"github.com/smcr-io/smcr/smcr/":   "the engine belongs to smcrd",
	"github.com/smcr-io/smcr/bpf":     "the eBPF programs belong to smcrd",
	"github.com/smcr-io/smcr/bpf/":    "the eBPF programs belong to smcrd",
	"github.com/smcr-io/smcr/metrics": "metrics belong to smcrd",
	"github.com/prometheus/":          "metrics belong to smcrd",
	"github.com/vishvananda/netlink":  "smcrctl only talks to the control socket",
	"github.com/vishvananda/netlink/": "smcrctl only talks to the control socket",
}

func TestDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("go list is slow on a shared machine; runs without -short")
	}
	// netgo and osusergo take the standard library's own cgo users out (the DNS
	// resolver, user lookup), so any cgo left would be ours. The build in the
	// Makefile uses CGO_ENABLED=0, which these tags mirror.
	cmd := exec.Command("go", "list", "-deps", "-tags", "netgo,osusergo", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list returned %d packages: %q", len(deps), out)
	}
	var sawControl bool
	for _, d := range deps {
		sawControl = sawControl || d == "github.com/smcr-io/smcr/control"
		for bad, why := range forbidden {
			if d == bad || (strings.HasSuffix(bad, "/") && strings.HasPrefix(d, bad)) {
				t.Errorf("smcrctl depends on %s: %s", d, why)
			}
		}
	}
	if !sawControl {
		t.Error("smcrctl does not depend on package control: is go list looking at the right package?")
	}
}
