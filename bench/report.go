// The report: every figure with its runs, median, min, max and ratios to the
// baselines of the same run, written as JSON and as markdown tables.

package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Report is one benchmark run.
type Report struct {
	Date        time.Time
	Command     string
	Quick       bool
	Repeats     int
	Duration    time.Duration
	Machine     Machine
	Figures     []Figure
	Unavailable []Unavailable `json:",omitempty"`
	Notes       []string      `json:",omitempty"`
}

// Figure is one measured quantity of one scenario.
type Figure struct {
	Scenario string             // memcpy, tcp-loopback, tcp-veth, smcr-shm, smcrd-soft, …
	Metric   string             // throughput, latency-p50, setup, cpu, scale-setup, …
	Case     string             // 4KiB, 64B, first-contact, 256 conns, …
	Unit     string             // MB/s, µs, conn/s, s/GiB, KiB/conn, conns
	Median   float64            // of Runs
	Min, Max float64            // of Runs
	Runs     []float64          // one value per repeat
	Ratios   map[string]float64 `json:",omitempty"` // Median / the named baseline's Median
	Note     string             `json:",omitempty"` // fallbacks, failures: what happened
	// Baseline, where set, is the scenario that stands in for tcp-veth in this
	// figure's ratios: direct TCP measured in the same phase (the smcrd rows).
	Baseline string `json:",omitempty"`
}

// tcpVeth is the baseline of the two-namespace paths.
const tcpVeth = "tcp-veth"

// baselineFor is the scenario whose figure b names for f: its same-phase
// stand-in for tcp-veth where it has one.
func (f *Figure) baselineFor(b string) string {
	if b == tcpVeth && f.Baseline != "" {
		return f.Baseline
	}
	return b
}

// Unavailable names a scenario that could not run here, and why.
type Unavailable struct {
	Scenario string
	Reason   string
}

// newFigure summarizes runs; no runs gives NaNs, which the writers show as "—".
func newFigure(scenario, metric, cas, unit string, runs []float64) Figure {
	f := Figure{Scenario: scenario, Metric: metric, Case: cas, Unit: unit, Runs: runs,
		Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	if len(runs) == 0 {
		return f
	}
	s := slices.Sorted(slices.Values(runs))
	f.Min, f.Max = s[0], s[len(s)-1]
	if n := len(s); n%2 == 1 {
		f.Median = s[n/2]
	} else {
		f.Median = (s[n/2-1] + s[n/2]) / 2
	}
	return f
}

// find returns the figure of (scenario, metric, case), or nil.
func (r *Report) find(scenario, metric, cas string) *Figure {
	for i := range r.Figures {
		f := &r.Figures[i]
		if f.Scenario == scenario && f.Metric == metric && f.Case == cas {
			return f
		}
	}
	return nil
}

// addRatios sets each figure's ratio to the baselines of the same metric and case.
func (r *Report) addRatios(baselines map[string][]string) {
	for i := range r.Figures {
		f := &r.Figures[i]
		for _, b := range baselines[f.Metric] {
			if b = f.baselineFor(b); b == f.Scenario {
				continue
			}
			bf := r.find(b, f.Metric, baselineCase(f.Metric, f.Case))
			if bf == nil || math.IsNaN(bf.Median) || bf.Median == 0 || math.IsNaN(f.Median) {
				continue
			}
			if f.Ratios == nil {
				f.Ratios = map[string]float64{}
			}
			f.Ratios[b] = f.Median / bf.Median
		}
	}
}

// baselineCase maps a case to the baseline's: TCP has one kind of setup.
func baselineCase(metric, cas string) string {
	if metric == "setup" {
		return "connect"
	}
	return cas
}

// jsonFloat writes NaN (a figure with no runs) as null.
type jsonFloat float64

func (f jsonFloat) MarshalJSON() ([]byte, error) {
	if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
		return []byte("null"), nil
	}
	return json.Marshal(float64(f))
}

// MarshalJSON writes NaN medians as null, which JSON has no number for.
func (f Figure) MarshalJSON() ([]byte, error) {
	type plain Figure
	return json.Marshal(struct {
		plain
		Median, Min, Max jsonFloat
	}{plain(f), jsonFloat(f.Median), jsonFloat(f.Min), jsonFloat(f.Max)})
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// table is one markdown table: rows are scenarios, columns are (metric, case) pairs.
type table struct {
	title   string
	unit    string
	cols    []col
	ratioTo string // baseline shown beside each cell, "" for none
	lower   bool   // lower is better (latency, CPU)
}

type col struct{ metric, cas, head string }

func (r *Report) tables() []table {
	tput := table{title: "Throughput, one connection", unit: "MB/s", ratioTo: "tcp-veth"}
	cpu := table{title: "CPU per GiB moved (all processes on the path)", unit: "s/GiB", ratioTo: "tcp-veth", lower: true}
	for _, s := range ThroughputSizes {
		tput.cols = append(tput.cols, col{"throughput", sizeName(s), sizeName(s) + " writes"})
		cpu.cols = append(cpu.cols, col{"cpu", sizeName(s), sizeName(s) + " writes"})
	}
	var lat []table
	for _, m := range LatencySizes {
		t := table{title: fmt.Sprintf("Request/response latency, %s", byteName(m)), unit: "µs", ratioTo: "tcp-veth", lower: true}
		for _, p := range percentiles {
			t.cols = append(t.cols, col{"latency-" + p.name, byteName(m), p.name})
		}
		lat = append(lat, t)
	}
	setup := table{title: "Connection setup", unit: "conn/s", ratioTo: "tcp-veth", cols: []col{
		{"setup", "connect", "TCP connect"}, {"setup", "first-contact", "first contact"}, {"setup", "reuse", "link-group reuse"}}}
	handoff := table{title: "Placement: core hand-off before each run, CPU 0 to 1", unit: "ns", lower: true,
		cols: []col{{"core-handoff", "cpu0-cpu1", "hand-off"}}}
	copies := table{title: "Placement: two 32 MiB copies at once before each run", unit: "MB/s",
		cols: []col{{"parallel-copy", "2x32MiB", "aggregate"}}}
	out := append([]table{tput}, lat...)
	out = append(out, setup, cpu, handoff, copies)
	var scaleCols []col
	var memCols []col
	for _, f := range r.Figures {
		if f.Metric == "scale-throughput" && !slices.ContainsFunc(scaleCols, func(c col) bool { return c.cas == f.Case }) {
			scaleCols = append(scaleCols, col{"scale-throughput", f.Case, f.Case})
			memCols = append(memCols, col{"memory-per-conn", f.Case, f.Case})
		}
	}
	if len(scaleCols) > 0 {
		out = append(out,
			table{title: "Scale: all connections sending at once, aggregate", unit: "MB/s", cols: scaleCols},
			table{title: fmt.Sprintf("Scale: setup rate, %d dialing at once", scaleDialers), unit: "conn/s", cols: colsFor(scaleCols, "scale-setup")},
			table{title: "Scale: connections opened", unit: "conns", cols: colsFor(scaleCols, "scale-opened")},
			table{title: "Scale: resident memory per connection after sending (client and server, and the smcrds; TCP's kernel buffers not counted)", unit: "KiB/conn", cols: memCols, lower: true})
	}
	var memCheck []col
	for _, f := range r.Figures {
		if f.Metric == "max-memory-smcr" && !slices.ContainsFunc(memCheck, func(c col) bool { return c.cas == f.Case }) {
			memCheck = append(memCheck, col{f.Metric, f.Case, f.Case})
		}
	}
	if len(memCheck) > 0 {
		out = append(out, table{title: "max_memory: connections that went SMC-R (the rest must fall back)", unit: "conns", cols: memCheck})
	}
	return out
}

func colsFor(cs []col, metric string) []col {
	out := make([]col, len(cs))
	for i, c := range cs {
		out[i] = col{metric, c.cas, c.head}
	}
	return out
}

// WriteMarkdown writes the report as markdown: the machine, then one table per
// measurement with median [min–max] and the ratio to the baseline in each cell.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# smcr benchmarks\n\n")
	fmt.Fprintf(&b, "Run %s with `%s` in %s (%d repeats%s).\n\n", r.Date.UTC().Format("2006-01-02 15:04 UTC"),
		r.Command, r.Duration.Round(time.Second), r.Repeats, map[bool]string{true: ", quick", false: ""}[r.Quick])
	m := r.Machine
	fmt.Fprintf(&b, "Machine: %s, %d cores, %s memory, Linux %s, %s %s/%s.\n\n", orDash(m.CPU), m.Cores, orDash(memName(m.MemTotal)), orDash(m.Kernel), m.Go, m.OS, m.Arch)
	fmt.Fprintf(&b, "Each cell: median [min–max] of the repeats, and × the median of the baseline named in the heading, measured in the same run.")
	if slices.ContainsFunc(r.Figures, func(f Figure) bool { return f.Baseline != "" }) {
		fmt.Fprintf(&b, " The smcrd rows' × tcp-veth is to the row above them, \"tcp-veth (smcrd-… phase)\": "+
			"direct TCP between the same programs, run beside each smcrd repeat while the smcrds were up.")
	}
	fmt.Fprintf(&b, "\n\n")
	for _, t := range r.tables() {
		scen := r.scenariosWith(t.cols)
		if len(scen) == 0 {
			continue
		}
		fmt.Fprintf(&b, "## %s (%s", t.title, t.unit)
		if t.ratioTo != "" {
			fmt.Fprintf(&b, "; × %s", t.ratioTo)
		}
		if t.lower {
			fmt.Fprintf(&b, "; lower is better")
		}
		fmt.Fprintf(&b, ")\n\n| scenario |")
		for _, c := range t.cols {
			fmt.Fprintf(&b, " %s |", c.head)
		}
		fmt.Fprintf(&b, "\n|---|")
		for range t.cols {
			fmt.Fprintf(&b, "---:|")
		}
		fmt.Fprintln(&b)
		var notes []string
		for _, s := range scen {
			fmt.Fprintf(&b, "| %s |", s)
			for _, c := range t.cols {
				f := r.find(s, c.metric, c.cas)
				fmt.Fprintf(&b, " %s |", cell(f, t.ratioTo))
				if f != nil && f.Note != "" {
					notes = append(notes, fmt.Sprintf("%s, %s: %s", s, c.head, f.Note))
				}
			}
			fmt.Fprintln(&b)
		}
		for _, n := range notes {
			fmt.Fprintf(&b, "\n- %s", n)
		}
		fmt.Fprintf(&b, "\n\n")
	}
	if len(r.Unavailable) > 0 {
		fmt.Fprintf(&b, "## Not available\n\n")
		for _, u := range r.Unavailable {
			fmt.Fprintf(&b, "- %s: not available: %s\n", u.Scenario, u.Reason)
		}
		fmt.Fprintln(&b)
	}
	if len(r.Notes) > 0 {
		fmt.Fprintf(&b, "## Notes\n\n")
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
		fmt.Fprintln(&b)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// scenariosWith lists, in report order, the scenarios having a figure in cols.
func (r *Report) scenariosWith(cols []col) []string {
	var out []string
	for _, f := range r.Figures {
		if slices.Contains(out, f.Scenario) {
			continue
		}
		for _, c := range cols {
			if f.Metric == c.metric && f.Case == c.cas {
				out = append(out, f.Scenario)
				break
			}
		}
	}
	return out
}

func cell(f *Figure, ratioTo string) string {
	if f == nil || math.IsNaN(f.Median) {
		if f != nil && f.Note != "" {
			return "failed"
		}
		return "—"
	}
	s := num(f.Median)
	if len(f.Runs) > 1 {
		s += fmt.Sprintf(" [%s–%s]", num(f.Min), num(f.Max))
	}
	if r, ok := f.Ratios[f.baselineFor(ratioTo)]; ok {
		s += fmt.Sprintf(" ×%.2f", r)
	}
	return s
}

// num prints three significant digits or so, without exponents; whole numbers
// (counts) as they are.
func num(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e9 {
		return fmt.Sprintf("%.0f", v)
	}
	switch a := math.Abs(v); {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

// memName turns /proc/meminfo's "24684092 kB" into "23.5 GiB".
func memName(s string) string {
	var kb float64
	if _, err := fmt.Sscanf(s, "%f kB", &kb); err != nil {
		return s
	}
	return fmt.Sprintf("%.1f GiB", kb/(1<<20))
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

func byteName(n int) string {
	if n < 1<<10 {
		return fmt.Sprintf("%dB", n)
	}
	return sizeName(n)
}
