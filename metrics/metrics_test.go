// Tests that a Prometheus scrape over HTTP reports exactly what `smcrctl stats
// --json` and `smcrctl links --json` report for the same smcrd, and that the
// metric names pass promlint.

package metrics_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/smcr-io/smcr/cmd/smcrctl/cli"
	"github.com/smcr-io/smcr/control"
	"github.com/smcr-io/smcr/control/controltest"
	"github.com/smcr-io/smcr/metrics"
)

// samples maps "name{label=value,...}" (labels sorted) to the value.
type samples map[string]float64

func key(name string, labels ...string) string {
	var ls []string
	for i := 0; i+1 < len(labels); i += 2 {
		ls = append(ls, labels[i]+"="+labels[i+1])
	}
	sort.Strings(ls)
	return name + "{" + strings.Join(ls, ",") + "}"
}

func scrape(t *testing.T, url string) samples {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("scrape: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := samples{}
	for name, f := range fams {
		if !strings.HasPrefix(name, "smcr_") {
			continue // go_ and process_ collectors
		}
		for _, m := range f.Metric {
			var labels []string
			for _, l := range m.Label {
				labels = append(labels, l.GetName(), l.GetValue())
			}
			out[key(name, labels...)] = value(f.GetType(), m)
		}
	}
	return out
}

func value(t dto.MetricType, m *dto.Metric) float64 {
	switch t {
	case dto.MetricType_COUNTER:
		return m.Counter.GetValue()
	case dto.MetricType_GAUGE:
		return m.Gauge.GetValue()
	}
	return m.Untyped.GetValue()
}

// smcrctl runs the CLI in process and decodes its JSON output into v.
func smcrctl(t *testing.T, sock string, v any, args ...string) {
	t.Helper()
	var out, errb bytes.Buffer
	if code := cli.Run(append([]string{"-s", sock}, args...), &out, &errb); code != 0 {
		t.Fatalf("smcrctl %v: exit %d: %s", args, code, errb.String())
	}
	if err := json.Unmarshal(out.Bytes(), v); err != nil {
		t.Fatalf("smcrctl %v: %v", args, err)
	}
}

// expected derives from the CLI's JSON every sample the scrape must contain. It
// walks the JSON generically, so a counter added to control.Stats without a metric
// makes the test fail rather than go unnoticed.
func expected(t *testing.T, statsJSON map[string]any, links []control.Link) samples {
	t.Helper()
	want := samples{}
	scalarNames := map[string]string{
		"since_reset_seconds":          "smcr_stats_since_reset_seconds",
		"connections.handled":          "smcr_connections_handled_total",
		"connections.smcr":             "smcr_connections_smcr_total",
		"connections.fallback":         "smcr_connections_fallback_total",
		"connections.handshake_errors": "smcr_handshake_errors_total",
		"connections.first_contact":    "smcr_connections_first_contact_total",
		"connections.reused":           "smcr_connections_reused_total",
		"connections.active":           "smcr_connections_active",
		"memory_in_use_bytes":          "smcr_memory_in_use_bytes",
		"memory_pooled_bytes":          "smcr_memory_pooled_bytes",
		"memory_peak_bytes":            "smcr_memory_peak_bytes",
		"protocol_errors":              "smcr_protocol_errors_total",
		"aborts":                       "smcr_aborts_total",
		"links.added":                  "smcr_links_added_total",
		"links.deleted":                "smcr_links_deleted_total",
		"links.conns_moved":            "smcr_connections_moved_total",
		"links.conns_continued":        "smcr_connections_continued_total",
	}
	dirNames := map[string]string{
		"bytes": "smcr_bytes_total", "requests": "smcr_requests_total", "fallback_bytes": "smcr_fallback_bytes_total",
		"buffer_full": "smcr_buffer_full_total", "buffer_too_small": "smcr_buffer_too_small_total",
		"downgrades": "smcr_buffer_downgrades_total", "reuses": "smcr_buffer_reuses_total",
	}
	histNames := map[string]string{"buffer_sizes": "smcr_buffer_size_total", "request_sizes": "smcr_request_size_total"}

	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				p := k
				if prefix != "" {
					p = prefix + "." + k
				}
				walk(p, x)
			}
		case float64:
			if name, ok := scalarNames[prefix]; ok {
				want[key(name)] = v
				return
			}
			dir, field, _ := strings.Cut(prefix, ".")
			if name, ok := dirNames[field]; ok && (dir == "rx" || dir == "tx") {
				want[key(name, "direction", dir)] = v
				return
			}
			if dir == "programs" {
				want[key("smcr_program_events_total", "event", field)] = v
				return
			}
			if dir == "direct" {
				want[key("smcr_direct_connections_total", "outcome", field)] = v
				return
			}
			if prefix == "connections.smcr_v1" || prefix == "connections.smcr_v2" {
				want[key("smcr_connections_by_version_total", "version", strings.TrimPrefix(prefix, "connections.smcr_"))] = v
				return
			}
			if role, outcome, ok := strings.Cut(strings.TrimPrefix(prefix, "connections."), "."); ok && (role == "client" || role == "server") {
				want[key("smcr_connections_by_role_total", "role", role, "outcome", outcome)] = v
				return
			}
			t.Errorf("stats field %s has no metric", prefix)
		case []any:
			dir, field, _ := strings.Cut(prefix, ".")
			if prefix == "fallbacks" {
				for _, x := range v {
					f := x.(map[string]any)
					want[key("smcr_connection_fallbacks_total", "code", fmt.Sprintf("0x%08x", uint32(f["code"].(float64))),
						"reason", f["reason"].(string), "side", f["side"].(string))] = f["count"].(float64)
				}
				return
			}
			name, ok := histNames[field]
			if !ok {
				t.Errorf("stats list %s has no metric", prefix)
				return
			}
			var h control.Histogram
			for _, x := range v {
				b := x.(map[string]any)
				h = append(h, control.Bucket{UpTo: uint64(b["up_to"].(float64)), Count: uint64(b["count"].(float64))})
			}
			for i, b := range h {
				want[key(name, "direction", dir, "size", h.Label(i))] = float64(b.Count)
			}
		default:
			t.Errorf("stats field %s: unexpected %T", prefix, v)
		}
	}
	walk("", statsJSON)

	for _, l := range links {
		lg, n := fmt.Sprint(l.LinkGroup), fmt.Sprint(l.Num)
		want[key("smcr_link_bytes_total", "linkgroup", lg, "link", n, "direction", "tx")] = float64(l.TX.Bytes)
		want[key("smcr_link_bytes_total", "linkgroup", lg, "link", n, "direction", "rx")] = float64(l.RX.Bytes)
		want[key("smcr_link_work_requests_total", "linkgroup", lg, "link", n, "direction", "tx")] = float64(l.TX.WorkRequests)
		want[key("smcr_link_work_requests_total", "linkgroup", lg, "link", n, "direction", "rx")] = float64(l.RX.WorkRequests)
		want[key("smcr_link_errors_total", "linkgroup", lg, "link", n)] = float64(l.Errors)
		want[key("smcr_link_connections", "linkgroup", lg, "link", n)] = float64(l.Conns)
		if l.RTTMicros > 0 {
			want[key("smcr_link_rtt_seconds", "linkgroup", lg, "link", n)] = l.RTTMicros / 1e6
		}
		active := 0.0
		if l.State == "active" {
			active = 1
		}
		want[key("smcr_link_active", "linkgroup", lg, "link", n)] = active
		want[key("smcr_link_info", "linkgroup", lg, "link", n, "interface", l.Interface, "device", l.Device,
			"local_gid", l.LocalGID, "peer_gid", l.PeerGID, "local_qpn", fmt.Sprintf("%#06x", l.LocalQPN), "peer_qpn", fmt.Sprintf("%#06x", l.PeerQPN))] = 1
	}
	return want
}

func compare(t *testing.T, got, want samples) {
	t.Helper()
	for k, v := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("scrape lacks %s (want %v)", k, v)
			continue
		}
		if g != v {
			t.Errorf("%s = %v, smcrctl says %v", k, g, v)
		}
	}
}

func setup(t *testing.T) (*controltest.Fake, string, string) {
	t.Helper()
	f := controltest.NewFake("")
	sock := controltest.Serve(t, f, "")
	srv := httptest.NewServer(metrics.Handler(f, nil))
	t.Cleanup(srv.Close)
	return f, sock, srv.URL + "/metrics"
}

func TestScrapeMatchesSmcrctl(t *testing.T) {
	f, sock, url := setup(t)
	got := scrape(t, url)

	var st map[string]any
	smcrctl(t, sock, &st, "stats", "--json")
	var links []control.Link
	smcrctl(t, sock, &links, "links", "--json")
	if len(links) == 0 {
		t.Fatal("the fake has no links: the per-link comparison would prove nothing")
	}
	compare(t, got, expected(t, st, links))

	for k, v := range map[string]float64{key("smcr_up"): 1, key("smcr_enabled"): 1, key("smcr_uptime_seconds"): f.St.UptimeSeconds,
		key("smcr_state", "state", "serving"): 1, key("smcr_state", "state", "starting"): 0, key("smcr_state", "state", "draining"): 0} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	var lgs []control.LinkGroup
	smcrctl(t, sock, &lgs, "linkgroups", "--json")
	for _, lg := range lgs {
		id := fmt.Sprint(lg.ID)
		if v := got[key("smcr_linkgroup_connections", "linkgroup", id)]; v != float64(lg.Conns) {
			t.Errorf("link group %s: connections %v, want %d", id, v, lg.Conns)
		}
		if v := got[key("smcr_linkgroup_links", "linkgroup", id)]; v != float64(len(lg.Links)) {
			t.Errorf("link group %s: links %v, want %d", id, v, len(lg.Links))
		}
		if v := got[key("smcr_linkgroup_links_max", "linkgroup", id)]; v != float64(lg.MostLinks) {
			t.Errorf("link group %s: most links %v, want %d", id, v, lg.MostLinks)
		}
		// The group's totals, which count links gone too, not a sum over
		// the links it has now.
		for dir, tr := range map[string]control.LinkTraffic{"tx": lg.TX, "rx": lg.RX} {
			if v := got[key("smcr_linkgroup_bytes_total", "linkgroup", id, "direction", dir)]; v != float64(tr.Bytes) {
				t.Errorf("link group %s: %s bytes %v, want %d", id, dir, v, tr.Bytes)
			}
			if v := got[key("smcr_linkgroup_work_requests_total", "linkgroup", id, "direction", dir)]; v != float64(tr.WorkRequests) {
				t.Errorf("link group %s: %s work requests %v, want %d", id, dir, v, tr.WorkRequests)
			}
		}
		info := key("smcr_linkgroup_info", "linkgroup", id, "role", lg.Role, "peer", lg.Peer, "peer_addr", lg.PeerAddr, "provider", lg.Provider, "state", lg.State)
		if got[info] != 1 {
			t.Errorf("no %s", info)
		}
	}
}

// TestScrapeAfterReset: smcrctl stats -r resets what Prometheus sees too.
func TestScrapeAfterReset(t *testing.T) {
	_, sock, url := setup(t)
	var before control.Stats
	smcrctl(t, sock, &before, "stats", "-r", "--json")
	got := scrape(t, url)
	if before.Connections.Handled == 0 {
		t.Fatal("fake started with zero counters")
	}
	if v := got[key("smcr_connections_handled_total")]; v != 0 {
		t.Errorf("handled after reset = %v", v)
	}
	if v := got[key("smcr_bytes_total", "direction", "tx")]; v != 0 {
		t.Errorf("tx bytes after reset = %v", v)
	}
	var st map[string]any
	smcrctl(t, sock, &st, "stats", "--json")
	var links []control.Link
	smcrctl(t, sock, &links, "links", "--json")
	compare(t, got, expected(t, st, links))
}

func TestScrapeBackendDown(t *testing.T) {
	f, _, url := setup(t)
	f.Err = errors.New("engine stopped")
	got := scrape(t, url)
	if v, ok := got[key("smcr_up")]; !ok || v != 0 {
		t.Errorf("smcr_up = %v (present %v), want 0", v, ok)
	}
	if len(got) != 1 {
		t.Errorf("a failed snapshot still exported %d series: %v", len(got)-1, got)
	}
}

func TestLint(t *testing.T) {
	problems, err := testutil.CollectAndLint(metrics.NewCollector(controltest.NewFake(""), nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}
