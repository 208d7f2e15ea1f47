// Plots of a report (gonum.org/v1/plot): throughput by write size, latency
// percentiles, setup rate; one line per scenario, median with min–max bars, log
// scales, so SMC-R and its TCP baselines read side by side at a glance.

package bench

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// palette gives each scenario one colour and glyph in every plot.
var palette = []color.RGBA{
	{0x55, 0x55, 0x55, 0xff}, // memcpy
	{0x1f, 0x77, 0xb4, 0xff},
	{0xff, 0x7f, 0x0e, 0xff},
	{0x2c, 0xa0, 0x2c, 0xff},
	{0xd6, 0x27, 0x28, 0xff},
	{0x94, 0x67, 0xbd, 0xff},
	{0x8c, 0x56, 0x4b, 0xff},
	{0xe3, 0x77, 0xc2, 0xff},
	{0x17, 0xbe, 0xcf, 0xff},
}

var glyphs = []draw.GlyphDrawer{draw.CircleGlyph{}, draw.SquareGlyph{}, draw.TriangleGlyph{},
	draw.RingGlyph{}, draw.BoxGlyph{}, draw.PyramidGlyph{}, draw.PlusGlyph{}, draw.CrossGlyph{}}

// WriteAll writes report.md, report.json and the plots into dir and returns the
// files' paths.
func WriteAll(r *Report, dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: output dir: %w", err)
	}
	var files []string
	for _, w := range []struct {
		name  string
		write func(*os.File) error
	}{
		{"report.md", func(f *os.File) error { return r.WriteMarkdown(f) }},
		{"report.json", func(f *os.File) error { return r.WriteJSON(f) }},
	} {
		path := filepath.Join(dir, w.name)
		f, err := os.Create(path)
		if err != nil {
			return files, fmt.Errorf("bench: %w", err)
		}
		err = w.write(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return files, fmt.Errorf("bench: write %s: %w", w.name, err)
		}
		files = append(files, path)
	}
	plots, err := r.WritePlots(dir)
	return append(files, plots...), err
}

// WritePlots writes throughput.png, latency.png and setup.png into dir.
func (r *Report) WritePlots(dir string) ([]string, error) {
	scen := r.scenarioOrder()
	var sizes, lats []string
	for _, s := range ThroughputSizes {
		sizes = append(sizes, sizeName(s))
	}
	var netScen []string
	for _, s := range scen {
		if s != "memcpy" {
			netScen = append(netScen, s)
		}
	}
	var out []string
	save := func(name string, w, h vg.Length, plots ...*plot.Plot) error {
		img := vgimg.New(w, h)
		dc := draw.New(img)
		tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
		canvases := plot.Align([][]*plot.Plot{plots}, tiles, dc)
		for i, p := range plots {
			p.Draw(canvases[0][i])
		}
		path := filepath.Join(dir, name)
		f, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("bench: write %s: %w", name, err)
		}
		out = append(out, path)
		return nil
	}

	// memcpy, 10–100× above every network path, would flatten them into one band;
	// it stays in the tables.
	tp := r.categoryPlot("Throughput, one connection (memcpy: see report.md)", "write size", "MB/s (log)", netScen, sizes, true,
		func(s, cas string) (string, string, string) { return s, "throughput", cas })
	if err := save("throughput.png", 16*vg.Centimeter, 11*vg.Centimeter, tp); err != nil {
		return out, err
	}

	var lp []*plot.Plot
	for _, m := range LatencySizes {
		lats = lats[:0]
		for _, p := range percentiles {
			lats = append(lats, p.name)
		}
		msg := byteName(m)
		lp = append(lp, r.categoryPlot("Request/response latency, "+msg, "percentile", "µs (log)", scen, lats, true,
			func(s, p string) (string, string, string) { return s, "latency-" + p, msg }))
	}
	if err := save("latency.png", 24*vg.Centimeter, 11*vg.Centimeter, lp...); err != nil {
		return out, err
	}

	// One column per scenario, a marker per kind of setup: TCP has only connect,
	// SMC-R first contact and link-group reuse.
	sp := r.categoryPlot("Connection setup", "", "connections/s (log)",
		[]string{"TCP connect", "SMC-R first contact", "SMC-R link-group reuse"}, netScen, false,
		func(kind, s string) (string, string, string) {
			return s, "setup", map[string]string{"TCP connect": "connect", "SMC-R first contact": "first-contact"}[kind] + map[string]string{"SMC-R link-group reuse": "reuse"}[kind]
		})
	if err := save("setup.png", 16*vg.Centimeter, 11*vg.Centimeter, sp); err != nil {
		return out, err
	}
	return out, nil
}

// scenarioOrder lists the report's scenarios in the order they first appear.
func (r *Report) scenarioOrder() []string {
	var out []string
	for _, f := range r.Figures {
		if !slices.Contains(out, f.Scenario) {
			out = append(out, f.Scenario)
		}
	}
	return out
}

// points are a scenario's medians over the categories, with min/max as error bars.
type points struct {
	x, y, lo, hi []float64
}

func (p points) Len() int                        { return len(p.x) }
func (p points) XY(i int) (float64, float64)     { return p.x[i], p.y[i] }
func (p points) YError(i int) (float64, float64) { return p.y[i] - p.lo[i], p.hi[i] - p.y[i] }

// categoryPlot draws one series per entry of series over the categories, log y,
// joined by lines when lines is set. figure maps (series, category) to the
// (scenario, metric, case) to look up.
func (r *Report) categoryPlot(title, xlabel, ylabel string, series, cats []string, lines bool,
	figure func(series, cat string) (string, string, string)) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	var ticks []plot.Tick
	for i, c := range cats {
		ticks = append(ticks, plot.Tick{Value: float64(i), Label: c})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min, p.X.Max = -0.4, float64(len(cats))-0.6
	top := 0.0
	order := r.scenarioOrder()
	for si, s := range series {
		var pts points
		for i, c := range cats {
			f := r.find(figure(s, c))
			if f == nil || math.IsNaN(f.Median) || f.Median <= 0 || f.Min <= 0 {
				continue
			}
			pts.x = append(pts.x, float64(i))
			pts.y = append(pts.y, f.Median)
			pts.lo = append(pts.lo, f.Min)
			pts.hi = append(pts.hi, f.Max)
		}
		if pts.Len() == 0 {
			continue
		}
		top = max(top, slices.Max(pts.hi))
		// A scenario keeps its colour and glyph in every plot; the setup plot's
		// series are kinds of setup.
		ci := si + 1
		if lines {
			ci = slices.Index(order, s)
		}
		col := palette[ci%len(palette)]
		lp, gl, err := plotter.NewLinePoints(pts)
		if err != nil {
			continue
		}
		lp.Color = col
		lp.Width = vg.Points(1.5)
		if !lines {
			lp.Width = 0
		} else if !isBaseline(s) {
			lp.Width = vg.Points(2.5)
		} else {
			lp.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		gl.GlyphStyle.Color = col
		gl.GlyphStyle.Shape = glyphs[ci%len(glyphs)]
		gl.GlyphStyle.Radius = vg.Points(3.5)
		p.Add(lp, gl)
		if eb, err := plotter.NewYErrorBars(pts); err == nil {
			eb.Color = col
			p.Add(eb)
		}
		p.Legend.Add(s, lp, gl)
	}
	// Room above the data for the legend: a decade on a log axis.
	if top > 0 {
		p.Y.Max = top * 12
	}
	if top == 0 {
		// An empty log axis cannot be drawn; say why instead.
		p.Y.Scale = plot.LinearScale{}
		p.Y.Tick.Marker = plot.DefaultTicks{}
		p.Title.Text += " (no figures in this run)"
	}
	return p
}

func isBaseline(s string) bool {
	return s == "memcpy" || strings.HasPrefix(s, "tcp-")
}
