package loadtest

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The HTML report is one file with inline CSS and inline SVG drawn here from
// the numbers: no script, no font, no stylesheet or image is fetched, so it
// opens offline, in a CI artifact viewer, or attached to an issue, and the
// golden file stays stable. docs/adr/0005-loadtest-report-svg.md says why
// plain SVG rather than a charting library.
//
// Every chart shares one scale: the same seconds on the x axis and the
// same requests per second on the y axis for every strategy, so a slower
// strategy's chart is visibly longer and a ruder one's visibly taller.

// WriteHTML writes the self-contained HTML report.
func (r *Report) WriteHTML(w io.Writer) error {
	v := htmlView{Report: r, Header: tableHeader, Verdict: r.Verdict()}
	sc := newScale(r)
	win := r.winner()
	for i, res := range r.Results {
		v.Rows = append(v.Rows, htmlRow{Strategy: res.Strategy, Cells: res.cells(), Error: res.Error, Winner: i == win})
		v.Charts = append(v.Charts, newChart(res, r.Setup, sc))
	}
	v.Cumulative = newCumulative(r, sc)
	if err := pageTemplate.Execute(w, v); err != nil {
		return fmt.Errorf("render report.html: %w", err)
	}
	return nil
}

type htmlView struct {
	*Report
	Header     []string
	Verdict    []string
	Rows       []htmlRow
	Charts     []chart
	Cumulative cumulative
}

type htmlRow struct {
	Strategy string
	Cells    []cell
	Error    string
	Winner   bool // drained first without being rude
}

// chart is one strategy's requests-per-second chart, laid out in SVG user
// units. Every coordinate is computed here so the template only places them.
type chart struct {
	ID, Strategy, Caption string
	Width, Height         int
	PlotX, PlotY          int // top-left of the plot area
	PlotW, PlotH          int
	Right, Bottom         int // plot area's right edge and x axis
	LabelX, TickY         int // y tick labels' right edge; x tick labels' baseline
	AllowedX              int // left edge of the allowed-rate label, in the right margin
	Bars                  []bar
	Bans                  []banShade // seconds in which some authority was banned
	AllowedY              string     // y of the allowed-rate line; "" when unknown
	AllowedLabel          string
	AllowedLabel2         string
	YTicks, XTicks        []tick
	Marks                 []mark // throttling answers along the time axis
	// Pace is the polyline of requests/s at the origin over the trailing
	// paceWindow: where a strategy's pace settles, and against the allowed
	// rate, how far under it.
	Pace  string
	End   string // x where this strategy's run ended
	Empty bool
}

type bar struct {
	X, W                         string
	Admitted, Lim429, L503, L403 rect
	Title                        string
}

type rect struct{ Y, H string }

type tick struct {
	Pos   string // y for YTicks, x for XTicks
	Label string
}

type mark struct{ X, W string }

// banShade is a bucket of seconds with bans: drawn behind the bars, darker
// the larger the share of authorities banned.
type banShade struct {
	X, W, Opacity, Title string
}

const (
	chartW, chartH   = 760, 240
	marginL, marginR = 52, 84 // the right margin holds the allowed-rate label, clear of the bars
	marginT, marginB = 14, 40
	maxBars          = 300 // longer runs are bucketed so a bar stays visible
	// paceWindow is the pace line's trailing window, in seconds: long
	// enough to smooth a 0.5 r/s pace's 0-1-0 seconds into 0.5.
	paceWindow               = 10
	coordPrecision           = 1
	markBandY, markBandH int = chartH - marginB + 3, 6 // just under the x axis
)

func px(v float64) string { return strconv.FormatFloat(v, 'f', coordPrecision, 64) }

// scale is what every chart of one report shares: seconds per bar, the
// seconds on the x axis and the top of the y axis.
type scale struct {
	per        int // seconds per bar
	last       int // seconds on the x axis
	yMax, step float64
}

type agg struct {
	t                          int
	req, adm, r429, r503, r403 float64
	banned                     float64 // authorities banned, on average
}

// buckets averages series over per seconds.
func buckets(series []Point, per int) []agg {
	var bs []agg
	for i := 0; i < len(series); i += per {
		a := agg{t: series[i].T}
		n := 0
		for j := i; j < len(series) && j < i+per; j++ {
			p := series[j]
			a.req += float64(p.Requests)
			a.adm += float64(p.Admitted)
			a.r429 += float64(p.Status429)
			a.r503 += float64(p.Status503)
			a.r403 += float64(p.Status403)
			a.banned += p.Banned
			n++
		}
		f := float64(n)
		a.req, a.adm, a.r429, a.r503, a.r403, a.banned = a.req/f, a.adm/f, a.r429/f, a.r503/f, a.r403/f, a.banned/f
		bs = append(bs, a)
	}
	return bs
}

func newScale(r *Report) scale {
	longest := 0
	for _, res := range r.Results {
		longest = max(longest, len(res.Series))
	}
	sc := scale{per: max((longest+maxBars-1)/maxBars, 1)}
	top := r.Setup.AllowedRate
	for _, res := range r.Results {
		for _, a := range buckets(res.Series, sc.per) {
			top = math.Max(top, a.req)
		}
	}
	sc.step = niceStep(top / 4)
	sc.yMax = sc.step * math.Ceil(top*1.05/sc.step)
	if sc.yMax <= 0 {
		sc.yMax, sc.step = 1, 0.25
	}
	sc.last = max(((longest+sc.per-1)/sc.per)*sc.per, 1)
	return sc
}

func (sc scale) xTicks(x0, w float64) []tick {
	var ts []tick
	xstep := max(int(niceStep(float64(sc.last)/8)), 1)
	for t := 0; t <= sc.last; t += xstep {
		ts = append(ts, tick{Pos: px(x0 + float64(t)/float64(sc.last)*w), Label: strconv.Itoa(t)})
	}
	return ts
}

func newChart(res Result, setup Setup, sc scale) chart {
	c := chart{
		ID: "chart-" + res.Strategy, Strategy: res.Strategy,
		Width: chartW, Height: chartH,
		PlotX: marginL, PlotY: marginT,
		PlotW: chartW - marginL - marginR, PlotH: chartH - marginT - marginB,
		Right: chartW - marginR, Bottom: chartH - marginB,
		LabelX: marginL - 6, TickY: chartH - marginB + 22,
		AllowedX: chartW - marginR + 6,
	}
	series := res.Series
	if len(series) == 0 {
		c.Empty = true
		c.Caption = res.Strategy + ": no requests recorded"
		return c
	}
	bs := buckets(series, sc.per)
	plotH, plotW := float64(c.PlotH), float64(c.PlotW)
	y := func(v float64) float64 { return float64(c.PlotY) + plotH - v/sc.yMax*plotH }
	bw := plotW / float64(sc.last) * float64(sc.per)
	for i, a := range bs {
		x := float64(c.PlotX) + float64(i)*bw
		// Stack from the axis up: admitted, then 403, 503, 429 on top.
		h1 := a.adm / sc.yMax * plotH
		h4 := a.r403 / sc.yMax * plotH
		h2 := a.r503 / sc.yMax * plotH
		h3 := a.r429 / sc.yMax * plotH
		base := float64(c.PlotY) + plotH
		w := px(math.Max(bw-0.5, 0.5))
		b := bar{
			X: px(x), W: w,
			Admitted: rect{Y: px(base - h1), H: px(h1)},
			L403:     rect{Y: px(base - h1 - h4), H: px(h4)},
			L503:     rect{Y: px(base - h1 - h4 - h2), H: px(h2)},
			Lim429:   rect{Y: px(base - h1 - h4 - h2 - h3), H: px(h3)},
		}
		b.Title = fmt.Sprintf("t=%ds: %s req/s, %s admitted, %s 429, %s 503", a.t, fmtG(a.req), fmtG(a.adm), fmtG(a.r429), fmtG(a.r503))
		if a.r403 > 0 {
			b.Title += ", " + fmtG(a.r403) + " 403"
		}
		if a.banned > 0 {
			b.Title += fmt.Sprintf(", %s of %d authorities banned", fmtG(a.banned), setup.Authorities)
		}
		c.Bars = append(c.Bars, b)
		if a.r429+a.r503+a.r403 > 0 {
			c.Marks = append(c.Marks, mark{X: px(x), W: w})
		}
		if a.banned > 0 {
			share := math.Min(a.banned/float64(max(setup.Authorities, 1)), 1)
			c.Bans = append(c.Bans, banShade{
				X: px(x), W: px(bw), Opacity: strconv.FormatFloat(0.15+0.55*share, 'f', 2, 64),
				Title: fmt.Sprintf("t=%ds: %s of %d authorities banned this caller", a.t, fmtG(a.banned), setup.Authorities),
			})
		}
	}
	c.End = px(float64(c.PlotX) + math.Min(res.DrainSeconds/float64(sc.last), 1)*plotW)
	c.Pace = pacePoints(series, res.DrainSeconds, sc, float64(c.PlotX), plotW, y)
	if setup.AllowedRate > 0 {
		c.AllowedY = px(y(setup.AllowedRate))
		c.AllowedLabel = fmtG(setup.AllowedRate) + "/s in total"
		if setup.Authorities > 0 {
			c.AllowedLabel2 = fmt.Sprintf("(%s/s × %d)", fmtG(setup.AllowedRate/float64(setup.Authorities)), setup.Authorities)
		}
	}
	for v := 0.0; v <= sc.yMax+sc.step/2; v += sc.step {
		c.YTicks = append(c.YTicks, tick{Pos: px(y(v)), Label: fmtG(v)})
	}
	c.XTicks = sc.xTicks(float64(c.PlotX), plotW)
	var n429, n503 int64
	for _, p := range series {
		n429 += p.Status429
		n503 += p.Status503
	}
	secs := len(c.Marks) * sc.per
	c.Caption = fmt.Sprintf("%s: requests per second at the origin, all authorities (admitted, 403, 503, 429 stacked) against the long-run allowed rate; %d %s with refusals marked below the axis (%d %s, %d %s)",
		res.Strategy, secs, plural(secs, "second", "seconds"), n429, plural64(n429, "429", "429s"), n503, plural64(n503, "503", "503s"))
	if res.Bans > 0 {
		c.Caption += fmt.Sprintf("; shaded: %d %s, %s s banned, %d requests wasted during them",
			res.Bans, plural64(res.Bans, "ban", "bans"), f1(res.BannedSeconds), res.RequestsDuringBans)
	}
	return c
}

// pacePoints is the pace line: at the end of every bar, the requests per
// second at the origin over the trailing paceWindow seconds (fewer at the
// start, so the first seconds are not diluted by a window not yet begun),
// up to the second the run ended in: after it, nothing was sent, and a
// falling line there would be no pace of the strategy's.
func pacePoints(series []Point, drain float64, sc scale, x0, w float64, y func(float64) float64) string {
	var pts []string
	sum := 0.0
	if n := int(math.Ceil(drain)); n < len(series) && n > 0 {
		series = series[:n]
	}
	for i, p := range series {
		sum += float64(p.Requests)
		if i >= paceWindow {
			sum -= float64(series[i-paceWindow].Requests)
		}
		if (i+1)%sc.per != 0 && i != len(series)-1 {
			continue
		}
		mean := sum / float64(min(i+1, paceWindow))
		pts = append(pts, px(x0+float64(i+1)/float64(sc.last)*w)+","+px(y(math.Min(mean, sc.yMax))))
	}
	return strings.Join(pts, " ")
}

// cumulative is the chart of admitted requests so far, every strategy on
// one axis, against the most the origin admits by each second: the bound
// no strategy passes, and where bans show as flat stretches.
type cumulative struct {
	Width, Height, PlotX, PlotY, PlotW, PlotH, Right, Bottom, LabelX, TickY int
	Allowance                                                               string // polyline points
	Lines                                                                   []line
	YTicks, XTicks                                                          []tick
	Caption                                                                 string
	Empty                                                                   bool
}

type line struct {
	Strategy, Points, Color string
	LabelX, LabelY          string
	lx, ly                  float64
}

// spreadLabels moves the end labels of lines that end close together
// apart, so that strategies which drained at about the same time and count
// stay readable; each label keeps its x.
func spreadLabels(ls []line) {
	// near is how far apart two labels' starts must be to share a row: the
	// left one's width (about 6.6 units a character of the chart's 11px
	// bold font), so that long names ("worker --floor 100ms") do not run
	// into the next.
	const gap = 12.0
	near := func(a, b line) float64 {
		left := a
		if b.lx < a.lx {
			left = b
		}
		return math.Max(70, 6.6*float64(len(left.Strategy))+6)
	}
	order := make([]int, len(ls))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return ls[order[a]].ly < ls[order[b]].ly })
	for k, i := range order {
		for _, j := range order[:k] {
			if math.Abs(ls[i].lx-ls[j].lx) < near(ls[i], ls[j]) && ls[i].ly < ls[j].ly+gap {
				ls[i].ly = ls[j].ly + gap
			}
		}
	}
	for i := range ls {
		ls[i].LabelY = px(ls[i].ly)
	}
}

// palette colours the strategies in the cumulative chart, in report order.
var palette = []string{"#2f5fb3", "#d1495b", "#2a9d8f", "#8f5bb5", "#e07b24", "#586174"}

func newCumulative(r *Report, sc scale) cumulative {
	c := cumulative{Width: chartW, Height: chartH + 20, PlotX: marginL, PlotY: marginT,
		PlotW: chartW - marginL - marginR - 20, PlotH: chartH + 20 - marginT - marginB,
		LabelX: marginL - 6}
	c.Right, c.Bottom, c.TickY = c.PlotX+c.PlotW, c.PlotY+c.PlotH, c.PlotY+c.PlotH+22
	var top float64
	for _, res := range r.Results {
		var sum float64
		for _, p := range res.Series {
			sum += float64(p.Admitted)
		}
		top = math.Max(top, sum)
	}
	if top == 0 {
		c.Empty = true
		return c
	}
	step := niceStep(top / 4)
	yMax := step * math.Ceil(top*1.1/step)
	plotH, plotW := float64(c.PlotH), float64(c.PlotW)
	x := func(t float64) float64 { return float64(c.PlotX) + t/float64(sc.last)*plotW }
	y := func(v float64) float64 { return float64(c.PlotY) + plotH - math.Min(v, yMax)/yMax*plotH }
	var pts []string
	for t, v := range r.Setup.Allowance {
		if t > sc.last {
			break
		}
		pts = append(pts, px(x(float64(t)))+","+px(y(v)))
		if v >= yMax {
			break
		}
	}
	c.Allowance = strings.Join(pts, " ")
	for i, res := range r.Results {
		if len(res.Series) == 0 {
			continue
		}
		var sum float64
		ps := []string{px(x(0)) + "," + px(y(0))}
		for j, p := range res.Series {
			sum += float64(p.Admitted)
			ps = append(ps, px(x(math.Min(float64(j+1), res.DrainSeconds)))+","+px(y(sum)))
		}
		lx, ly := x(math.Min(res.DrainSeconds, float64(sc.last))), y(sum)
		c.Lines = append(c.Lines, line{Strategy: res.Strategy, Points: strings.Join(ps, " "), Color: palette[i%len(palette)],
			LabelX: px(lx + 4), lx: lx + 4, ly: ly + 4})
	}
	spreadLabels(c.Lines)
	for v := 0.0; v <= yMax+step/2; v += step {
		c.YTicks = append(c.YTicks, tick{Pos: px(y(v)), Label: fmtG(v)})
	}
	c.XTicks = sc.xTicks(float64(c.PlotX), plotW)
	c.Caption = "Requests admitted so far, all authorities, per strategy, against the most the origin admits by each second from full buckets (dashed). A line that runs flat while others climb is a strategy waiting: banned, or backing off."
	return c
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func plural64(n int64, one, many string) string { return plural(int(min(n, 2)), one, many) }

// niceStep rounds v up to 1, 2 or 5 times a power of ten.
func niceStep(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

var pageTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"pct":   func(v float64) string { return strconv.FormatFloat(v*100, 'f', 0, 64) + "%" },
	"f1":    f1,
	"fmtG":  fmtG,
	"stamp": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"markY": func() int { return markBandY },
	"markH": func() int { return markBandH },
}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
<style>
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5rem auto;max-width:1600px;padding:0 1.5rem;color:#1d2330;background:#fff}
p,ul,dl{max-width:60rem}
h1{font-size:1.5rem;margin-bottom:.2rem}
h2{font-size:1.15rem;margin-top:2rem}
h3{font-size:1rem;margin:.2rem 0}
code{font:13px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#f2f4f7;padding:.1rem .3rem;border-radius:3px}
.meta{color:#586174;margin-top:0}
.verdict{border-left:4px solid #2a9d8f;background:#f1faf8;padding:.6rem 1rem;margin:1rem 0;max-width:60rem}
.verdict p{margin:.25rem 0}
.verdict p.first{font-weight:600;font-size:1.05rem}
dl.setup{display:grid;grid-template-columns:max-content 1fr;gap:.15rem 1rem;margin:1rem 0}
dl.setup dt{color:#586174}
dl.setup dd{margin:0}
.scroll{overflow-x:auto}
table.summary{border-collapse:collapse;font-size:14px;font-variant-numeric:tabular-nums}
table.summary th,table.summary td{border-bottom:1px solid #dde1e8;padding:.35rem .3rem;text-align:right;white-space:nowrap}
table.summary thead th{white-space:normal;vertical-align:bottom;min-width:2.8em}
table.summary th:first-child,table.summary td:first-child{text-align:left}
table.summary thead th{background:#f2f4f7;font-weight:600}
table.summary tr.winner td{background:#f1faf8}
table.summary tr.winner td:first-child{font-weight:600}
table.summary td.rude{color:#a4161a;font-weight:700;background:#fdecee}
table.summary td.warn{color:#8a5a00}
.err{color:#a4161a}
figure{margin:1rem 0 2rem}
figcaption{color:#586174;font-size:.9rem;max-width:60rem}
svg.chart{width:100%;height:auto;max-width:960px;display:block}
svg.chart text{font:11px system-ui,sans-serif;fill:#586174}
.adm{fill:#4f7cc9}.r429{fill:#d1495b}.r503{fill:#edae49}.r403{fill:#7a1f2b}.mark{fill:#d1495b}.ban{fill:#8f5bb5}
.allowed{stroke:#1d2330;stroke-width:1.5;stroke-dasharray:6 4;fill:none}
.end{stroke:#1d2330;stroke-width:1}
.pace{fill:none;stroke:#1d2330;stroke-width:1.8;stroke-linejoin:round}
.grid{stroke:#e6e9ef}.axis{stroke:#8a93a5}
.cum{fill:none;stroke-width:2}
.legend span{display:inline-block;margin-right:1.2rem;font-size:.9rem}
.legend i{display:inline-block;width:.8rem;height:.8rem;margin-right:.3rem;vertical-align:-1px}
ul.notes li{margin:.3rem 0}
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<p class="meta">Generated {{stamp .GeneratedAt}} · <code>{{.Command}}</code></p>
<div class="verdict" id="verdict">{{range $i, $l := .Verdict}}<p{{if eq $i 0}} class="first"{{end}}>{{$l}}</p>{{end}}</div>
<dl class="setup">
<dt>jobs</dt><dd>{{.Setup.Jobs}} over {{.Setup.Authorities}} authorities, {{pct .Setup.Skew}} on the hottest</dd>
<dt>workers</dt><dd>{{.Setup.Workers}} per strategy: <b>processes</b> are <code>mirrorworker run</code> pods sharing one pace per origin (the hostpacer), <b>in-process</b> are instances each with its own pacer state; <b>reference</b> is the curl --retry client, one file at a time per authority, no worker</dd>
<dt>profile</dt><dd>{{.Setup.Profile}}{{if .Setup.ProfileFile}} (<code>{{.Setup.ProfileFile}}</code>){{end}}, time scale {{fmtG .Setup.Scale}}</dd>
<dt>politeness</dt><dd>{{if .Setup.FloorNote}}{{.Setup.FloorNote}}{{else}}floor {{fmtG .Setup.FloorSeconds}} s{{end}}, at most {{.Setup.MaxInFlight}} in flight per authority</dd>
<dt>allowed rate</dt><dd>{{fmtG .Setup.AllowedRate}} admitted requests/s in the long run, all {{.Setup.Authorities}} authorities together ({{.Setup.Identities}} caller {{if eq .Setup.Identities 1}}identity{{else}}identities{{end}} per authority); buckets start full, so the first seconds may go above it without a 429</dd>
{{if .Setup.Penalty}}<dt>penalty</dt><dd>{{.Setup.Penalty}}, per authority and caller identity</dd>
{{end}}<dt>time limit</dt><dd>{{f1 .Setup.TimeLimitSeconds}} s per strategy</dd>
<dt>machine</dt><dd>{{.Setup.Platform}}, {{.Setup.CPUs}} CPUs, {{.Setup.GoVersion}}</dd>
</dl>
<h2>Summary</h2>
<div class="scroll"><table class="summary" id="summary">
<thead><tr>{{range .Header}}<th scope="col">{{.}}</th>{{end}}</tr></thead>
<tbody>
{{range .Rows}}<tr class="{{.Strategy}}{{if .Winner}} winner{{end}}">{{range .Cells}}<td{{if .Class}} class="{{.Class}}"{{end}}>{{.Text}}</td>{{end}}</tr>
{{if .Error}}<tr><td class="err" colspan="{{len $.Header}}">{{.Strategy}}: {{.Error}}</td></tr>
{{end}}{{end}}</tbody>
</table></div>
<p class="legend"><span><i style="background:#fdecee;border:1px solid #a4161a"></i>rude, by the origin's account: requests sent while told to wait, bans</span><span><i style="background:#fff;border:1px solid #8a5a00"></i>worth a look, not rude by itself: refusals (429, 503), requests sent closer than the floor</span></p>
<h2>Admitted so far</h2>
{{with .Cumulative}}{{if not .Empty}}{{$c := .}}<figure id="chart-cumulative">
<svg class="chart cumulative" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {{.Width}} {{.Height}}" role="img" aria-label="{{.Caption}}">
{{range .YTicks}}<line class="grid" x1="{{$c.PlotX}}" y1="{{.Pos}}" x2="{{$c.Right}}" y2="{{.Pos}}"/><text x="{{$c.LabelX}}" y="{{.Pos}}" dy="4" text-anchor="end">{{.Label}}</text>
{{end}}{{if .Allowance}}<polyline class="allowed" points="{{.Allowance}}"/>
{{end}}{{range .Lines}}<polyline class="cum" stroke="{{.Color}}" points="{{.Points}}"/><text x="{{.LabelX}}" y="{{.LabelY}}" style="fill:{{.Color}};font-weight:600">{{.Strategy}}</text>
{{end}}<line class="axis" x1="{{.PlotX}}" y1="{{.Bottom}}" x2="{{.Right}}" y2="{{.Bottom}}"/>
{{range .XTicks}}<text x="{{.Pos}}" y="{{$c.TickY}}" text-anchor="middle">{{.Label}}</text>{{end}}
<text x="{{.Right}}" y="{{.Height}}" dy="-3" text-anchor="end">seconds since the run started</text>
<text x="4" y="10">admitted</text>
</svg>
<figcaption>{{.Caption}}</figcaption>
</figure>{{end}}{{end}}
<h2>Requests per second by strategy</h2>
<p class="legend"><span><i class="adm" style="background:#4f7cc9"></i>admitted</span><span><i style="background:#7a1f2b"></i>403</span><span><i style="background:#edae49"></i>503</span><span><i style="background:#d1495b"></i>429</span><span><i style="background:#8f5bb5;opacity:.5"></i>banned (darker: more authorities)</span><span><i style="border-top:2px dashed #1d2330;height:0;width:1.2rem"></i>long-run allowed rate, all authorities</span><span><i style="border-top:2px solid #1d2330;height:0;width:1.2rem"></i>pace: requests/s over the last 10 s</span></p>
<p>Every chart has the same scales: the same seconds and the same requests per second, so a longer chart took longer and a taller one sent more. The thin vertical line is where that strategy's run ended.</p>
{{range .Charts}}{{$c := .}}<figure id="{{.ID}}">
<h3>{{.Strategy}}</h3>
{{if .Empty}}<p>{{.Caption}}</p>{{else}}<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {{.Width}} {{.Height}}" role="img" aria-label="{{.Caption}}">
{{range .Bans}}<rect class="ban" x="{{.X}}" y="{{$c.PlotY}}" width="{{.W}}" height="{{$c.PlotH}}" fill-opacity="{{.Opacity}}"><title>{{.Title}}</title></rect>
{{end}}{{range .YTicks}}<line class="grid" x1="{{$c.PlotX}}" y1="{{.Pos}}" x2="{{$c.Right}}" y2="{{.Pos}}"/><text x="{{$c.LabelX}}" y="{{.Pos}}" dy="4" text-anchor="end">{{.Label}}</text>
{{end}}{{range .Bars}}<g><title>{{.Title}}</title><rect class="adm" x="{{.X}}" y="{{.Admitted.Y}}" width="{{.W}}" height="{{.Admitted.H}}"/><rect class="r403" x="{{.X}}" y="{{.L403.Y}}" width="{{.W}}" height="{{.L403.H}}"/><rect class="r503" x="{{.X}}" y="{{.L503.Y}}" width="{{.W}}" height="{{.L503.H}}"/><rect class="r429" x="{{.X}}" y="{{.Lim429.Y}}" width="{{.W}}" height="{{.Lim429.H}}"/></g>
{{end}}{{if .AllowedY}}<line class="allowed" x1="{{.PlotX}}" y1="{{.AllowedY}}" x2="{{.Right}}" y2="{{.AllowedY}}"/><text class="allowed-label" x="{{.AllowedX}}" y="{{.AllowedY}}" dy="-2">{{.AllowedLabel}}</text><text class="allowed-label" x="{{.AllowedX}}" y="{{.AllowedY}}" dy="11">{{.AllowedLabel2}}</text>
{{end}}{{if .Pace}}<polyline class="pace" points="{{.Pace}}"/>
{{end}}<line class="axis" x1="{{.PlotX}}" y1="{{.Bottom}}" x2="{{.Right}}" y2="{{.Bottom}}"/>
<line class="end" x1="{{.End}}" y1="{{.PlotY}}" x2="{{.End}}" y2="{{.Bottom}}"/>
{{range .Marks}}<rect class="mark" x="{{.X}}" y="{{markY}}" width="{{.W}}" height="{{markH}}"/>{{end}}
{{range .XTicks}}<text x="{{.Pos}}" y="{{$c.TickY}}" text-anchor="middle">{{.Label}}</text>{{end}}
<text x="{{.Right}}" y="{{.Height}}" dy="-3" text-anchor="end">seconds since the run started</text>
<text x="4" y="10">req/s</text>
</svg>
<figcaption>{{.Caption}}</figcaption>{{end}}
</figure>
{{end}}<h2>How to read this</h2>
<ul class="notes">
<li><b>mode</b>: <b>processes</b> ran the strategy as <code>mirrorworker run</code> pods on the partitioned cluster layout, as a deployment runs it; <b>in-process</b> ran worker instances in the load-test process; <b>reference</b> is the curl-retry client (<code>curl --retry 10</code>: each file on its own, a Retry-After honoured per request, else 1, 2, 4... s; no pace kept between files, no floor), the yardstick for time and refusals.</li>
<li><b>drained</b>, <b>drain s</b> and <b>jobs/s</b>: whether every job left the queue (stored or dead-lettered) before the time limit, how long that took, and stored jobs per second.</li>
<li><b>goodput</b> is what the origin admitted during the run as a fraction of the most it admits in that time (the dashed line of <i>Admitted so far</i>): per authority and caller identity, the least of the burst bucket's capacity plus its refill, the sustained bucket's capacity plus its rate times the drain time, and the shared shard's tenant share of each window. Near 1, the strategy used what the origin offered; well below 1, it waited longer than it had to. With a skew, authorities that ran out of jobs early still count in the denominator.</li>
<li><b>429s</b> and <b>503s</b> come from the origin's own statistics, and so does its count of early requests (report.json: early): requests that arrived before a deadline their caller had been told (Retry-After or an exhausted rate-limit reset). The origin cannot tell when a request left its client, so the report splits that count with the clients' departure logs and the instant the origin wrote each answer that told a deadline (one host, one clock). <b>crossed</b> counts requests known to have left before the origin wrote the refusal they are counted against: they were on their way when it was written (their arrival at the origin's kernel, which a request cannot precede, is earlier), and no client could have held them. <b>told to wait</b> counts the rest: sent after the refusal had been written, or not known to have left before it. That is the rudest kind of request, which a polite client keeps at 0; without departure logs every early request counts as told.</li>
<li><b>bans</b>, <b>banned s</b> and <b>in bans</b> are the origin's penalties (the profile's penalty): bans started, the time callers spent banned (summed over authorities), and requests answered with a ban, which a ban wastes. A polite strategy earns none.</li>
<li><b>gaps&lt;floor</b> counts arrivals from one caller closer than the policy floor to its previous one, as the origin timed them, and min gap is the closest pair (in report.json: min_gap_seconds); <b>sent&lt;floor</b> counts the same gaps as the workers timed their departures (pods log theirs; pairs from two pods count). Short gaps at the origin with none sent are timing noise between the two (a busy CPU, a new connection), not a pacer granting too early. Every strategy spaces each departure from the previous request's actual start, as the HostPacer does, so sent&lt;floor should be 0 for all of them unless workers share a consumer (<code>--shared-consumer</code>: several pacers per authority); a handful on a loaded machine is worth a look, and the table marks it, but the verdict counts as rude only what the origin saw: requests told to wait, and bans.</li>
<li><b>deliv/job</b> is JetStream deliveries per job: every deferral and retry is one more. <b>dead</b> is jobs dead-lettered. <b>cpu s</b> and <b>heap MiB</b> (peak) are the whole process, origin and JetStream included (for pods, cpu s adds the pods' CPU time, and heap is the load-test process only): they compare strategies, they are not one worker's footprint.</li>
<li>In the per-second charts, blue is admitted, dark red 403, yellow 503 and red 429 per second, stacked, all authorities together; the dashed line is the long-run allowed rate of all authorities together (each authority's sustained quota, summed). The origin's buckets start full, so a strategy may be admitted above that line for the first seconds without a single 429; <i>Admitted so far</i> shows the bound that holds at every second. Purple shading marks seconds in which callers were banned, darker the more authorities banned them; red ticks under the axis mark seconds with refusals. The solid line is the pace: requests per second at the origin over the last 10 s, so a strategy that settles shows a level line, and how far under the dashed line it settles is what its caution costs. Hover a bar for its numbers.</li>
{{range .Notes}}<li>{{.}}</li>
{{end}}</ul>
</body>
</html>
`))
