// Firewall rules on a socket's owner, for relayed connections.

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestFirewallOwner: a firewall rule that refuses one user's connections
// refuses them through smcrd too, and lets another user's through, over
// SMC-R. smcrd made the connection as root, and the rule never saw the user.
func TestFirewallOwner(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (nftables) for the firewall rule")
	}
	a, b := hosts(t)
	a.start("providers = shm", ports)
	b.start("providers = shm", ports)
	b.serve(5201)
	rules := `table inet smcrtest {
	chain out {
		type filter hook output priority filter;
		meta skuid 4242 tcp dport 5201 reject with tcp reset
	}
}
`
	nft := a.ns.Command("nft", "-f", "-")
	nft.Stdin = strings.NewReader(rules)
	if out, err := nft.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	// testapp where other users may run it.
	dir, err := os.MkdirTemp("", "smcr-e2e-owner")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	app := filepath.Join(dir, "testapp")
	data, err := os.ReadFile(bins.testapp)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(app, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	dst := fmt.Sprintf("%s:5201", b.ns.Addr4())
	as := func(uid int) (appResult, error) {
		id := fmt.Sprint(uid)
		cmd := a.command("setpriv", "--reuid", id, "--regid", id, "--clear-groups", app, "-connect", dst, "-mode", "echo", "-bytes", "1000", "-timeout", "10s")
		out, err := cmd.Output()
		var r appResult
		if jerr := json.Unmarshal(out, &r); jerr != nil {
			return r, fmt.Errorf("testapp: %v %v: %s", err, jerr, out)
		}
		return r, nil
	}
	if r, err := as(4243); err != nil || r.OK != 1 {
		t.Fatalf("user 4243, not refused by the rule: %+v %v", r, err)
	}
	if n := a.stats().Connections.SMCR; n != 1 {
		t.Errorf("%d SMC-R connections on A after user 4243's, want 1", n)
	}
	for i := range 2 {
		r, err := as(4242)
		if err != nil {
			t.Fatal(err)
		}
		// A reset reads as "broken pipe" to a write that comes after the
		// kernel reported it, or after a FIN came before the RST.
		if r.OK != 0 || !strings.Contains(r.Err, "reset") && !strings.Contains(r.Err, "refused") && !strings.Contains(r.Err, "broken pipe") {
			t.Errorf("user 4242's connection %d, refused by the rule: %+v, want refused or reset", i+1, r)
		}
	}
	if n := a.stats().Connections.SMCR; n != 1 {
		t.Errorf("%d SMC-R connections on A after user 4242's, want still 1", n)
	}
}
