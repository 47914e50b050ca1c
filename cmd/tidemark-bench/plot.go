package main

import (
	"fmt"
	"image/color"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// drawCurves draws each curve of rep as dir/<name>.png: measured records/s
// and the theoretical line against the curve's parameter, both axes
// logarithmic (the parameters and rates span several decades); and the
// partitions workload, when rep has it, as dir/partitions.png.
func drawCurves(rep *Report, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if rep.Scaling != nil {
		if err := drawScaling(rep.Scaling, rep.At, filepath.Join(dir, "partitions.png")); err != nil {
			return fmt.Errorf("plot partitions: %w", err)
		}
	}
	for _, cv := range rep.Curves {
		p, err := curvePlot(cv, rep.At)
		if err != nil {
			return fmt.Errorf("plot %s: %w", cv.Name, err)
		}
		path := filepath.Join(dir, cv.Name+".png")
		if err := p.Save(7*vg.Inch, 4.5*vg.Inch, path); err != nil {
			return fmt.Errorf("plot %s: %w", cv.Name, err)
		}
	}
	return nil
}

// curvePlot builds the plot of one curve.
func curvePlot(cv Curve, at string) (*plot.Plot, error) {
	if len(cv.Points) == 0 {
		return nil, fmt.Errorf("no points")
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("tidemark: records/s against %s\n%s (%s)", cv.X, cv.Fixed, at)
	p.X.Label.Text = cv.X
	p.Y.Label.Text = "records/s"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = intTicks{cv.Points}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true

	measured := make(plotter.XYs, len(cv.Points))
	for i, pt := range cv.Points {
		measured[i] = plotter.XY{X: float64(pt.X), Y: max(pt.PerSecond, 1)}
	}
	theory := theoryLine(cv)
	tl, err := plotter.NewLine(theory)
	if err != nil {
		return nil, err
	}
	tl.Color = color.RGBA{R: 150, G: 150, B: 150, A: 255}
	tl.Dashes = []vg.Length{vg.Points(6), vg.Points(4)}
	tl.Width = vg.Points(1.5)

	ml, ms, err := plotter.NewLinePoints(measured)
	if err != nil {
		return nil, err
	}
	blue := color.RGBA{R: 31, G: 119, B: 180, A: 255}
	ml.Color, ml.Width = blue, vg.Points(2)
	ms.Color, ms.Shape, ms.Radius = blue, draw.CircleGlyph{}, vg.Points(3)

	labels, err := plotter.NewLabels(plotter.XYLabels{XYs: measured, Labels: percentLabels(cv.Points)})
	if err != nil {
		return nil, err
	}
	for i := range labels.TextStyle {
		labels.TextStyle[i].Font.Size = vg.Points(8)
		labels.TextStyle[i].XAlign = draw.XCenter
	}
	labels.Offset = vg.Point{Y: -vg.Points(12)}

	p.Add(plotter.NewGrid(), tl, ml, ms, labels)
	p.Y.Max *= 2 // room above the lines for the legend
	p.Legend.Add(cv.Theory, tl)
	p.Legend.Add("measured (label: % of theory)", ml, ms)
	return p, nil
}

// theoryLine samples the theoretical line densely between the first and
// the last point (64 steps per decade), so its knees — K = C, C/L = the
// ceiling — are drawn where they are, not cut between two measured points.
// A curve without L (an older report) gets the points' own theory.
func theoryLine(cv Curve) plotter.XYs {
	first, last := float64(cv.Points[0].X), float64(cv.Points[len(cv.Points)-1].X)
	if cv.SleepSeconds <= 0 || last <= first {
		xys := make(plotter.XYs, len(cv.Points))
		for i, pt := range cv.Points {
			xys[i] = plotter.XY{X: float64(pt.X), Y: pt.Theoretical}
		}
		return xys
	}
	steps := int(64*math.Log10(last/first)) + 1
	xys := make(plotter.XYs, 0, steps+1)
	for i := range steps + 1 {
		x := first * math.Pow(last/first, float64(i)/float64(steps))
		xys = append(xys, plotter.XY{X: x, Y: cv.theoryAt(x)})
	}
	return xys
}

func percentLabels(pts []Point) []string {
	out := make([]string, len(pts))
	for i, p := range pts {
		out[i] = strconv.Itoa(int(100*p.OfTheory+0.5)) + "%"
	}
	return out
}

// intTicks puts a labelled tick at each point's parameter value, so the
// axis reads 1, 4, 16, … rather than only powers of ten.
type intTicks struct{ pts []Point }

func (t intTicks) Ticks(_, _ float64) []plot.Tick {
	ts := make([]plot.Tick, len(t.pts))
	for i, p := range t.pts {
		ts[i] = plot.Tick{Value: float64(p.X), Label: strconv.Itoa(p.X)}
	}
	return ts
}

// seriesStyle is how each series of the partitions workload is drawn.
var seriesStyle = map[string]struct {
	c      color.RGBA
	dashed bool
	label  string
}{
	"baseline-noop":  {color.RGBA{R: 120, G: 120, B: 120, A: 255}, false, "plain franz-go poll loop, no-op topics (baseline)"},
	"baseline-sleep": {color.RGBA{R: 120, G: 120, B: 120, A: 255}, true, "plain franz-go poll loop, sleep topics (baseline)"},
	"franz-noop":     {color.RGBA{R: 31, G: 119, B: 180, A: 255}, false, "tidemark over franz, no-op"},
	"franz-sleep":    {color.RGBA{R: 31, G: 119, B: 180, A: 255}, true, "tidemark over franz, sleep"},
	"kafkago-noop":   {color.RGBA{R: 230, G: 120, B: 20, A: 255}, false, "tidemark over kafkago, no-op"},
	"kafkago-sleep":  {color.RGBA{R: 230, G: 120, B: 20, A: 255}, true, "tidemark over kafkago, sleep"},
}

// drawScaling draws the partitions workload into one PNG at path: on the
// left every consumer's CPU µs per record against the partition count,
// on the right each tidemark series' ratio to the baseline, divided by its
// ratio at the smallest count, with the goal's line.
func drawScaling(sc *Scaling, at, path string) error {
	if len(sc.Rows) == 0 {
		return fmt.Errorf("no rows")
	}
	cpu, growth := plot.New(), plot.New()
	cpu.Title.Text = fmt.Sprintf("CPU per record (child's user+sys, whole life)\n%s, median of %d (%s)", recordsText(sc.Records), sc.Repeat, at)
	cpu.Y.Label.Text = "CPU µs per record"
	cpu.Y.Scale, cpu.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	growth.Title.Text = fmt.Sprintf("tidemark's CPU per record ÷ the baseline's,\nrelative to %d partitions (goal ≤ %.1f)", sc.Partitions[0], sc.Goal)
	growth.Y.Label.Text = fmt.Sprintf("ratio ÷ ratio at %d partitions", sc.Partitions[0])
	for _, p := range []*plot.Plot{cpu, growth} {
		p.X.Label.Text = "partitions"
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, countTicks(sc.Partitions)
		p.Legend.Top, p.Legend.Left = true, true
		p.Add(plotter.NewGrid())
	}
	var order []string
	by := map[string]plotter.XYs{}
	byGrowth := map[string]plotter.XYs{}
	for _, r := range sc.Rows {
		if _, ok := by[r.Series]; !ok {
			order = append(order, r.Series)
		}
		by[r.Series] = append(by[r.Series], plotter.XY{X: float64(r.Partitions), Y: r.CPUPerRecord})
		if r.Growth > 0 {
			byGrowth[r.Series] = append(byGrowth[r.Series], plotter.XY{X: float64(r.Partitions), Y: r.Growth})
		}
	}
	first, last := float64(sc.Partitions[0]), float64(sc.Partitions[len(sc.Partitions)-1])
	goal, err := plotter.NewLine(plotter.XYs{{X: first, Y: sc.Goal}, {X: last, Y: sc.Goal}})
	if err != nil {
		return err
	}
	goal.Color, goal.Width = color.RGBA{R: 200, G: 30, B: 30, A: 255}, vg.Points(1.5)
	goal.Dashes = []vg.Length{vg.Points(6), vg.Points(4)}
	growth.Add(goal)
	growth.Legend.Add(fmt.Sprintf("goal: %.1f", sc.Goal), goal)
	growth.Y.Min, growth.Y.Max = 0.8, sc.Goal+0.2
	for _, series := range order {
		st, ok := seriesStyle[series]
		if !ok {
			st.c, st.label = color.RGBA{A: 255}, series
		}
		add := func(p *plot.Plot, xys plotter.XYs, labelled bool) error {
			l, pts, err := plotter.NewLinePoints(xys)
			if err != nil {
				return err
			}
			l.Color, l.Width = st.c, vg.Points(2)
			if st.dashed {
				l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			}
			pts.Color, pts.Shape, pts.Radius = st.c, draw.CircleGlyph{}, vg.Points(3)
			p.Add(l, pts)
			p.Legend.Add(st.label, l, pts)
			if labelled {
				text := make([]string, len(xys))
				for i, xy := range xys {
					text[i] = fmt.Sprintf("%.2f", xy.Y)
				}
				lb, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: text})
				if err != nil {
					return err
				}
				for i := range lb.TextStyle {
					lb.TextStyle[i].Font.Size = vg.Points(8)
					lb.TextStyle[i].Color = st.c
				}
				lb.Offset = vg.Point{X: vg.Points(4), Y: vg.Points(2)}
				p.Add(lb)
			}
			return nil
		}
		if err := add(cpu, by[series], false); err != nil {
			return err
		}
		if xys := byGrowth[series]; len(xys) > 0 {
			growth.Y.Max = max(growth.Y.Max, slicesMax(xys)+0.2)
			if err := add(growth, xys, true); err != nil {
				return err
			}
		}
	}
	cpu.Y.Max *= 3 // room above the lines for the legend
	growth.Y.Max += 0.3 * (growth.Y.Max - growth.Y.Min)

	img := vgimg.New(13*vg.Inch, 5*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Points(24), PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(12)}
	canvases := plot.Align([][]*plot.Plot{{cpu, growth}}, tiles, dc)
	cpu.Draw(canvases[0][0])
	growth.Draw(canvases[0][1])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func slicesMax(xys plotter.XYs) float64 {
	m := math.Inf(-1)
	for _, xy := range xys {
		m = max(m, xy.Y)
	}
	return m
}

// countTicks puts a labelled tick at each partition count.
type countTicks []int

func (t countTicks) Ticks(_, _ float64) []plot.Tick {
	ts := make([]plot.Tick, len(t))
	for i, n := range t {
		ts[i] = plot.Tick{Value: float64(n), Label: strconv.Itoa(n)}
	}
	return ts
}

// recordsText says how many records each handler's topics held.
func recordsText(records map[string]int) string {
	var parts []string
	for _, h := range slices.Sorted(maps.Keys(records)) {
		parts = append(parts, fmt.Sprintf("%s %d", h, records[h]))
	}
	return "records per topic: " + strings.Join(parts, ", ")
}
