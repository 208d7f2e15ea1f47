// Golden-output tests of every smcrctl verb against a real control server backed by
// the fake smcrd of controltest, plus help, usage errors and exit codes.

package cli_test

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/smcr-io/smcr/cmd/smcrctl/cli"
	"github.com/smcr-io/smcr/cmd/smcrctl/cli/clitest"
	"github.com/smcr-io/smcr/config"
	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/control/controltest"
)

func init() { cli.Version = "0.1.0-test" }

// serve starts a fresh fake smcrd and returns a harness for it.
func serve(t *testing.T) (*controltest.Fake, clitest.Harness) {
	t.Helper()
	dir := t.TempDir()
	f := controltest.NewFake(filepath.Join(dir, "smcrd.conf"))
	sock := controltest.Serve(t, f, "")
	return f, clitest.Harness{Dir: "testdata", Socket: sock, Replace: map[string]string{dir: "TMPDIR"}}
}

func TestGolden(t *testing.T) {
	for _, c := range []clitest.Case{
		{Name: "status", Args: []string{"status"}},
		{Name: "status_json", Args: []string{"status", "--json"}},
		{Name: "enable", Args: []string{"enable"}},
		{Name: "disable_persist", Args: []string{"disable", "-P"}},
		{Name: "set", Args: []string{"set", "port_range_list=5201,6379", "max_memory=512"}},
		{Name: "set_persist", Args: []string{"set", "rmb_size=64K", "-P"}},
		{Name: "set_unchanged", Args: []string{"set", "enabled=yes"}},
		{Name: "set_restart", Args: []string{"set", "providers=soft", "rmb_size=128K"}},
		{Name: "set_bad", Args: []string{"set", "port_range_list=20-1", "ip_addr_list=a,b,c", "max_memory=lots"}, Exit: 1},
		{Name: "set_unknown", Args: []string{"set", "mtu=9000"}, Exit: 1},
		{Name: "set_ueid_list_bad", Args: []string{"set", "ueid_list=A,B,C,D,E,F,G,H,I"}, Exit: 1},
		{Name: "set_noargs", Args: []string{"set"}, Exit: 2},
		{Name: "set_not_assignment", Args: []string{"set", "enabled"}, Exit: 2},
		{Name: "show_config", Args: []string{"show", "config"}},
		{Name: "show_config_json", Args: []string{"show", "config", "--json"}},
		{Name: "show_noargs", Args: []string{"show"}, Exit: 2},
		{Name: "show_config_attrs", Args: []string{"show", "config", "rmb_size", "port_range_list"}},
		{Name: "show_config_unknown_attr", Args: []string{"show", "config", "rmb_size", "mtu"}, Exit: 2},
		{Name: "json_not_taken", Args: []string{"--json", "enable"}, Exit: 2},
		{Name: "linkgroups", Args: []string{"linkgroups"}},
		{Name: "linkgroups_json", Args: []string{"linkgroups", "--json"}},
		{Name: "links", Args: []string{"links"}},
		{Name: "links_json", Args: []string{"links", "--json"}},
		{Name: "links_detail", Args: []string{"links", "-d"}},
		{Name: "devices", Args: []string{"devices"}},
		{Name: "devices_json", Args: []string{"devices", "--json"}},
		{Name: "conns", Args: []string{"conns"}},
		{Name: "conns_detail", Args: []string{"conns", "-d"}},
		{Name: "conns_json", Args: []string{"conns", "--json"}},
		{Name: "peers", Args: []string{"peers"}},
		{Name: "peers_json", Args: []string{"peers", "--json"}},
		{Name: "peers_forget", Args: []string{"peers", "--forget", "198.18.0.9", "198.18.0.77"}},
		{Name: "peers_forget_port", Args: []string{"peers", "--forget", "198.18.0.9:6379", "[2001:db8::7]:443"}},
		{Name: "peers_forget_port0", Args: []string{"peers", "--forget", "198.18.0.9:0"}, Exit: 2},
		{Name: "peers_forget_all", Args: []string{"peers", "--forget"}},
		{Name: "peers_forget_bad", Args: []string{"peers", "--forget", "frob"}, Exit: 2},
		{Name: "peers_forget_zone", Args: []string{"peers", "--forget", "198.18.0.9", "fe80::1%v0"}, Exit: 2},
		{Name: "history", Args: []string{"history"}},
		{Name: "history_json", Args: []string{"history", "--json"}},
		{Name: "listeners", Args: []string{"listeners"}},
		{Name: "probe", Args: []string{"probe", "198.18.0.2:5201"}},
		{Name: "probe_negative", Args: []string{"probe", "198.18.0.9:6379"}},
		{Name: "probe_json", Args: []string{"probe", "198.18.0.2:5201", "--json"}},
		{Name: "probe_no_port", Args: []string{"probe", "198.18.0.2"}, Exit: 1},
		{Name: "probe_noargs", Args: []string{"probe"}, Exit: 2},
		{Name: "listeners_json", Args: []string{"listeners", "--json"}},
		{Name: "stats", Args: []string{"stats"}},
		{Name: "stats_detail", Args: []string{"stats", "-d"}},
		{Name: "stats_json", Args: []string{"stats", "--json"}},
		{Name: "version", Args: []string{"version"}},
		{Name: "version_json", Args: []string{"version", "--json"}},
		{Name: "unknown_verb", Args: []string{"frobnicate"}, Exit: 2},
		{Name: "unknown_flag", Args: []string{"links", "-x"}, Exit: 2},
		{Name: "extra_arg", Args: []string{"links", "all"}, Exit: 2},
		{Name: "no_verb", Args: nil, Exit: 2},
	} {
		t.Run(c.Name, func(t *testing.T) {
			_, h := serve(t)
			h.Run(t, c)
		})
	}
}

// TestShowConfigPending: an attribute read only at start, set since, shows
// the value in effect and the pending one. It showed the one set, as if in
// effect.
func TestShowConfigPending(t *testing.T) {
	_, h := serve(t)
	h.Run(t, clitest.Case{Name: "set_restart", Args: []string{"set", "providers=soft", "rmb_size=128K"}})
	h.Run(t, clitest.Case{Name: "show_config_pending", Args: []string{"show", "config"}})
	r := h.Exec("show", "config", "--json")
	var attrs []control.Attribute
	if err := json.Unmarshal([]byte(r.Stdout), &attrs); err != nil {
		t.Fatal(err)
	}
	for _, a := range attrs {
		switch a.Name {
		case "providers":
			if a.Value != "rdma,shm,soft" || a.Pending != "soft" {
				t.Errorf("providers: %+v, want in effect rdma,shm,soft, pending soft", a)
			}
		case "rmb_size": // applies at once
			if a.Value != "128K" || a.Pending != "" {
				t.Errorf("rmb_size: %+v, want 128K, nothing pending", a)
			}
		}
	}
}

// TestJSONBeforeVerb: --json before the verb is --json after it. It was
// refused: flags came only after the verb.
func TestJSONBeforeVerb(t *testing.T) {
	_, h := serve(t)
	for _, verb := range [][]string{{"status"}, {"stats"}, {"show", "config", "rmb_size"}} {
		before := h.Exec(append([]string{"--json"}, verb...)...)
		after := h.Exec(append(verb, "--json")...)
		if before != after || before.Exit != 0 {
			t.Errorf("smcrctl --json %s: %+v, want as smcrctl %s --json: %+v", strings.Join(verb, " "), before, strings.Join(verb, " "), after)
		}
	}
}

// TestStatusNoDevice: an smcrd whose providers opened no device says what that
// means rather than a bare dash.
func TestStatusNoDevice(t *testing.T) {
	f, h := serve(t)
	f.St.Providers = nil
	h.Run(t, clitest.Case{Name: "status_no_device", Args: []string{"status"}})
}

// TestStatusDraining: an smcrd that was told to stop says that new connections
// go direct while its open ones finish.
func TestStatusDraining(t *testing.T) {
	f, h := serve(t)
	f.St.State = control.StateDraining
	h.Run(t, clitest.Case{Name: "status_draining", Args: []string{"status"}})
}

// TestHelp checks every verb's --help (and help VERB, and -h) against a golden file
// and that each explains itself with examples.
func TestHelp(t *testing.T) {
	_, h := serve(t)
	h.Run(t, clitest.Case{Name: "help", Args: []string{"--help"}})
	for _, verb := range verbs() {
		t.Run(verb, func(t *testing.T) {
			r := h.Run(t, clitest.Case{Name: "help_" + verb, Args: []string{verb, "--help"}})
			if !strings.Contains(r.Stdout, "Examples:\n  smcrctl "+verb) {
				t.Errorf("%s --help has no example of itself", verb)
			}
			for _, alt := range [][]string{{verb, "-h"}, {"help", verb}} {
				if r2 := h.Exec(alt...); r2 != r {
					t.Errorf("smcrctl %s differs from smcrctl %s --help", strings.Join(alt, " "), verb)
				}
			}
		})
	}
}

// TestSetHelpListsRestartOnly pins that set --help names every attribute smcrd
// reads only at start: the list comes from config's own table.
func TestSetHelpListsRestartOnly(t *testing.T) {
	r := clitest.Harness{}.Exec("set", "--help")
	_, list, _ := strings.Cut(r.Stdout, "reads only at start:\n")
	list, _, _ = strings.Cut(list, "\nFor these")
	names := strings.Fields(strings.ReplaceAll(list, ",", " "))
	if want := config.RestartOnly(); !reflect.DeepEqual(names, want) || !slices.Contains(want, "rdma_devices") {
		t.Errorf("set --help lists %v as applying at restart, want %v", names, want)
	}
}

// verbs reads the verb list from the global help, so a new verb without a help
// test cannot slip in.
func verbs() []string {
	r := clitest.Harness{}.Exec("--help")
	_, list, _ := strings.Cut(r.Stdout, "Verbs:\n")
	list, _, _ = strings.Cut(list, "\n\n")
	var out []string
	for _, line := range strings.Split(list, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			out = append(out, f[0])
		}
	}
	return out
}

func TestVerbList(t *testing.T) {
	got := verbs()
	want := []string{"status", "enable", "disable", "set", "show", "linkgroups", "links", "devices", "conns", "history", "peers", "listeners", "probe", "stats", "run", "version"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("verbs = %v, want %v", got, want)
	}
}

// TestNotRunning: every verb that talks to smcrd says plainly that smcrd is not
// running and exits 3.
func TestNotRunning(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "smcrd.sock")
	h := clitest.Harness{Dir: "testdata", Socket: sock}
	h.Run(t, clitest.Case{Name: "not_running", Args: []string{"links"}, Exit: cli.ExitNotRunning})
	h.Run(t, clitest.Case{Name: "not_running_version", Args: []string{"version"}, Exit: cli.ExitNotRunning})
	for _, args := range [][]string{{"status"}, {"enable"}, {"disable"}, {"set", "enabled=no"}, {"show", "config"},
		{"linkgroups"}, {"devices"}, {"conns"}, {"peers"}, {"stats"}, {"stats", "-r"}} {
		r := h.Exec(args...)
		want := "smcrctl: smcrd is not running: no control socket at " + sock + "\n"
		if r.Exit != cli.ExitNotRunning || r.Stderr != want {
			t.Errorf("smcrctl %s: exit %d, stderr %q; want 3, %q", strings.Join(args, " "), r.Exit, r.Stderr, want)
		}
	}
}

// TestStatsReset: -r really resets the daemon's counters, prints the values from
// before, and the next stats shows zeros.
func TestStatsReset(t *testing.T) {
	f, h := serve(t)
	r := h.Run(t, clitest.Case{Name: "stats_reset", Args: []string{"stats", "-r"}})
	if f.Resets != 1 {
		t.Fatalf("backend saw %d resets, want 1", f.Resets)
	}
	if !strings.Contains(r.Stdout, "handled            40") {
		t.Errorf("stats -r did not print the counters from before the reset:\n%s", r.Stdout)
	}
	h.Run(t, clitest.Case{Name: "stats_after_reset", Args: []string{"stats"}})

	r = h.Exec("stats", "--json")
	var st control.Stats
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatal(err)
	}
	if st.Connections.Handled != 0 || st.TX.Bytes != 0 || st.RX.Requests != 0 || len(st.Fallbacks) != 0 {
		t.Errorf("after reset: %+v", st)
	}
	if st.Connections.Active != 2 {
		t.Errorf("reset zeroed the open-connections gauge: %d", st.Connections.Active)
	}
}

// fullDisk refuses every write, as stdout redirected to /dev/full does.
type fullDisk struct{}

func (fullDisk) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// TestStatsResetWriteFailure pins that stats -r whose output cannot be written exits
// 1 and says the counters were reset, since smcrd no longer has their values.
func TestStatsResetWriteFailure(t *testing.T) {
	for _, args := range [][]string{{"stats", "-r"}, {"stats", "-r", "-d"}, {"stats", "-r", "--json"}} {
		f, h := serve(t)
		var stderr strings.Builder
		code := cli.Run(append([]string{"-s", h.Socket}, args...), fullDisk{}, &stderr)
		want := "smcrctl stats: the counters were reset in smcrd, but their values could not be written: no space left on device\n"
		if code != cli.ExitError || stderr.String() != want {
			t.Errorf("smcrctl %s to a full disk: exit %d, stderr %q; want 1, %q", strings.Join(args, " "), code, stderr.String(), want)
		}
		if f.Resets != 1 {
			t.Errorf("smcrctl %s: backend saw %d resets, want 1", strings.Join(args, " "), f.Resets)
		}
	}
}

// TestSetApplies checks that set and enable/disable reach the daemon, not just print.
func TestSetApplies(t *testing.T) {
	_, h := serve(t)
	if r := h.Exec("set", "port_range_list=5201", "-P"); r.Exit != 0 {
		t.Fatalf("set: %+v", r)
	}
	if r := h.Exec("disable"); r.Exit != 0 {
		t.Fatalf("disable: %+v", r)
	}
	r := h.Exec("show", "config", "--json")
	var attrs []control.Attribute
	if err := json.Unmarshal([]byte(r.Stdout), &attrs); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, a := range attrs {
		got[a.Name] = a.Value
	}
	if got["port_range_list"] != "5201" || got["enabled"] != "no" {
		t.Errorf("after set and disable: port_range_list=%s enabled=%s", got["port_range_list"], got["enabled"])
	}
	if r := h.Exec("set", "max_memory=1", "rmb_size=3"); r.Exit != cli.ExitError {
		t.Errorf("bad set: exit %d", r.Exit)
	}
	r = h.Exec("show", "config", "--json")
	json.Unmarshal([]byte(r.Stdout), &attrs)
	for _, a := range attrs {
		if a.Name == "max_memory" && a.Value != "256" {
			t.Errorf("a refused set changed max_memory to %s", a.Value)
		}
	}
}
