package main

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// drawCurves draws each curve of rep as dir/<name>.png: measured records/s
// and the theoretical line against the curve's parameter, both axes
// logarithmic (the parameters and rates span several decades).
func drawCurves(rep *Report, dir string) error {
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
