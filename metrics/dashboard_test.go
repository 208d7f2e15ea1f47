// The Grafana dashboard in configs/ must only query metrics this package exports,
// so renaming a metric without the dashboard fails here, not on an operator's screen.

package metrics_test

import (
	"encoding/json"
	"os"
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/smcr-io/smcr/control/controltest"
	"github.com/smcr-io/smcr/metrics"
)

func TestDashboardUsesExportedMetrics(t *testing.T) {
	b, err := os.ReadFile("../configs/grafana-smcr.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v", err)
	}

	exported := map[string]bool{}
	ch := make(chan *prometheus.Desc, 100)
	go func() { metrics.NewCollector(controltest.NewFake(""), nil).Describe(ch); close(ch) }()
	fqName := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			exported[m[1]] = true
		}
	}
	if len(exported) < 20 {
		t.Fatalf("found only %d exported metric names: descriptor format changed?", len(exported))
	}

	name := regexp.MustCompile(`\bsmcr_[a-z_]+`)
	used := 0
	check := func(where, expr string) {
		for _, n := range name.FindAllString(expr, -1) {
			used++
			if !exported[n] {
				t.Errorf("%s: %s is not a metric package metrics exports", where, n)
			}
		}
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			check("panel "+p.Title, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		check("variable", v.Definition)
	}
	if used == 0 {
		t.Error("the dashboard queries no smcr_ metric")
	}
	// Every exported family should be on the dashboard somewhere.
	for n := range exported {
		if !regexp.MustCompile(`\b` + n + `\b`).Match(b) {
			t.Errorf("metric %s is on no dashboard panel", n)
		}
	}
}
