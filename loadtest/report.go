package loadtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is what one load test measured: the setup and, per strategy, what
// the workers did and what the origin saw. It is written as report.json
// (this struct) and report.html (a rendering of it).
type Report struct {
	Title       string    `json:"title"`
	GeneratedAt time.Time `json:"generated_at"`
	Command     string    `json:"command"`
	Setup       Setup     `json:"setup"`
	// Notes say how the numbers were measured and where they are weaker
	// than they look (shared-process CPU, shared caller identity).
	Notes   []string `json:"notes"`
	Results []Result `json:"results"`
}

// Setup is the load test's configuration, the same for every strategy.
type Setup struct {
	Jobs        int     `json:"jobs"`
	Authorities int     `json:"authorities"`
	Workers     int     `json:"workers"`
	Skew        float64 `json:"skew"` // share of the jobs on the hottest authority
	Profile     string  `json:"profile"`
	ProfileFile string  `json:"profile_file,omitempty"`
	Scale       float64 `json:"scale"` // strategies' time constants are multiplied by this
	// FloorSeconds and MaxInFlight are the politeness policy every strategy keeps.
	FloorSeconds float64 `json:"floor_seconds"`
	MaxInFlight  int     `json:"max_in_flight"`
	// Identities is how many caller identities the origin tells apart per
	// authority (one per worker instance when each has its own address).
	Identities int `json:"identities_per_authority"`
	// AllowedRate is what the profile allows, in admitted requests per
	// second: the sustained quota summed over authorities and identities.
	AllowedRate      float64 `json:"allowed_rate"`
	TimeLimitSeconds float64 `json:"time_limit_seconds"`
	ObjectSize       int64   `json:"object_size"`
	GoVersion        string  `json:"go_version"`
	Platform         string  `json:"platform"`
	CPUs             int     `json:"cpus"`
}

// Modes of Result.Mode.
const (
	ModeInProcess = "in-process" // workers in the load-test process
	ModeProcesses = "processes"  // `mirrorworker run` pods
)

// Result is one strategy's run.
type Result struct {
	Strategy string `json:"strategy"`
	// Mode is how the workers ran: ModeInProcess or ModeProcesses.
	Mode string `json:"mode"`
	// Drained: every job left the queue (stored or dead-lettered) before the
	// time limit.
	Drained      bool    `json:"drained"`
	DrainSeconds float64 `json:"drain_seconds"` // until drained, or the time limit
	JobsStored   int     `json:"jobs_stored"`
	JobsPerSec   float64 `json:"jobs_per_second"`
	// Admitted is what the origin admitted during the run, AdmittedPerSec
	// the same per second of drain time; Goodput is Admitted as a fraction of
	// what the profile allows in the drain time (burst credit included, see
	// Profile.AllowedAdmissions).
	Admitted       int64   `json:"admitted"`
	AdmittedPerSec float64 `json:"admitted_per_second"`
	Goodput        float64 `json:"goodput"`
	// The origin's counts (its own /stats), summed over authorities.
	Requests  int64 `json:"requests"`
	Status429 int64 `json:"status_429"`
	Status503 int64 `json:"status_503"`
	// Early: requests that arrived while their identity had been told to wait.
	Early int64 `json:"early"`
	// GapsBelowFloor: arrivals from one identity closer than the floor to the
	// previous one from that identity. AuthorityGapsBelowFloor counts the
	// same over all identities of an authority together.
	GapsBelowFloor          int64   `json:"gaps_below_floor"`
	AuthorityGapsBelowFloor int64   `json:"authority_gaps_below_floor"`
	MinGapSeconds           float64 `json:"min_gap_seconds"`
	// SentGapsBelowFloor counts the same gaps as the workers timed their
	// departures (per authority); MinSentGapSeconds is the closest pair.
	SentGapsBelowFloor int64   `json:"sent_gaps_below_floor"`
	MinSentGapSeconds  float64 `json:"min_sent_gap_seconds"`
	// Rejections counts the origin's refusals by reason (burst, sustained,
	// tenant_share, shared_capacity...).
	Rejections map[string]int64 `json:"rejections,omitempty"`
	// DeliveriesPerJob is JetStream deliveries over jobs enqueued (1 is
	// ideal; deferrals and retries add to it).
	DeliveriesPerJob float64 `json:"deliveries_per_job"`
	DeadLettered     int     `json:"dead_lettered"`
	// CPUSeconds and PeakHeapBytes are the whole load-test process during
	// this strategy's run (workers, origin and JetStream share it).
	CPUSeconds    float64 `json:"cpu_seconds"`
	PeakHeapBytes uint64  `json:"peak_heap_bytes"`
	// StartupSeconds (pods only) is from starting the pods to every pod
	// holding its share of the partitions, before the run is measured.
	StartupSeconds float64 `json:"startup_seconds,omitempty"`
	// Pods is what each pod did (pods only).
	Pods []PodResult `json:"pods,omitempty"`
	// Series is the origin's timeline, one point per second, summed over
	// authorities.
	Series []Point `json:"series"`
	// Error is set when the run could not complete (setup failure).
	Error string `json:"error,omitempty"`
}

// PodResult is one `mirrorworker run` process of a pods run.
type PodResult struct {
	ID string `json:"id"`
	// Requests it sent (its departure log).
	Requests int64 `json:"requests"`
	// CPUSeconds (user and system) and MaxRSSBytes (peak resident set) over
	// its whole life, from its exit status.
	CPUSeconds  float64 `json:"cpu_seconds"`
	MaxRSSBytes uint64  `json:"max_rss_bytes"`
	ExitCode    int     `json:"exit_code"`
}

// Point is one second of the origin's timeline.
type Point struct {
	T         int   `json:"t"` // seconds since the strategy's run started
	Requests  int64 `json:"requests"`
	Admitted  int64 `json:"admitted"`
	Status429 int64 `json:"status_429"`
	Status503 int64 `json:"status_503"`
}

// WriteFiles writes dir/report.json and dir/report.html, creating dir.
func (r *Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report dir: %w", err)
	}
	var js, page bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		return err
	}
	if err := r.WriteHTML(&page); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), js.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write report.json: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.html"), page.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write report.html: %w", err)
	}
	return nil
}

// WriteJSON writes r as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	return nil
}

// tableHeader names the summary columns, shared by the text table and the
// HTML table so the two never disagree.
var tableHeader = []string{
	"strategy", "mode", "drained", "drain s", "jobs/s", "goodput", "429s", "503s", "early",
	"gaps<floor", "min gap ms", "sent<floor", "deliv/job", "dead", "cpu s", "heap MiB",
}

func (r Result) row() []string {
	drained := "yes"
	if !r.Drained {
		drained = "no"
	}
	if r.Error != "" {
		drained = "error"
	}
	return []string{
		r.Strategy, r.Mode, drained, f1(r.DrainSeconds), f1(r.JobsPerSec), f2(r.Goodput),
		itoa(r.Status429), itoa(r.Status503), itoa(r.Early), itoa(r.GapsBelowFloor), f1(r.MinGapSeconds * 1000), itoa(r.SentGapsBelowFloor),
		f2(r.DeliveriesPerJob), strconv.Itoa(r.DeadLettered), f1(r.CPUSeconds),
		f1(float64(r.PeakHeapBytes) / (1 << 20)),
	}
}

// WriteTable writes the summary as an aligned text table.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(tableHeader, "\t")+"\t")
	for _, res := range r.Results {
		fmt.Fprintln(tw, strings.Join(res.row(), "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	for _, res := range r.Results {
		if res.Error != "" {
			fmt.Fprintf(w, "%s: %s\n", res.Strategy, res.Error)
		}
		if len(res.Pods) > 0 {
			var each []string
			for _, p := range res.Pods {
				each = append(each, fmt.Sprintf("%s %d", p.ID, p.Requests))
			}
			fmt.Fprintf(w, "%s: %d pods, sharing the partitions %.1f s after they started; requests sent: %s\n",
				res.Strategy, len(res.Pods), res.StartupSeconds, strings.Join(each, ", "))
		}
	}
	return nil
}

func f1(v float64) string   { return strconv.FormatFloat(v, 'f', 1, 64) }
func f2(v float64) string   { return strconv.FormatFloat(v, 'f', 2, 64) }
func itoa(v int64) string   { return strconv.FormatInt(v, 10) }
func fmtG(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }

// The HTML report is one file with inline CSS and inline SVG drawn here from
// the numbers: no script, no font, no stylesheet or image is fetched, so it
// opens offline, in a CI artifact viewer, or attached to an issue, and the
// golden file stays stable. docs/adr/0005-loadtest-report-svg.md says why
// plain SVG rather than a charting library.

// WriteHTML writes the self-contained HTML report.
func (r *Report) WriteHTML(w io.Writer) error {
	v := htmlView{Report: r, Header: tableHeader}
	for _, res := range r.Results {
		v.Rows = append(v.Rows, htmlRow{Strategy: res.Strategy, Cells: res.row(), Error: res.Error})
		v.Charts = append(v.Charts, newChart(res, r.Setup.AllowedRate))
	}
	if err := pageTemplate.Execute(w, v); err != nil {
		return fmt.Errorf("render report.html: %w", err)
	}
	return nil
}

type htmlView struct {
	*Report
	Header []string
	Rows   []htmlRow
	Charts []chart
}

type htmlRow struct {
	Strategy string
	Cells    []string
	Error    string
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
	AllowedY              string // y of the allowed-rate line; "" when unknown
	AllowedLabel          string
	YTicks, XTicks        []tick
	Marks                 []mark // throttling answers along the time axis
	Empty                 bool
}

type bar struct {
	X, W                   string
	Admitted, Lim429, L503 rect
	Title                  string
}

type rect struct{ Y, H string }

type tick struct {
	Pos   string // y for YTicks, x for XTicks
	Label string
}

type mark struct{ X, W string }

const (
	chartW, chartH           = 760, 240
	marginL, marginR         = 52, 84 // the right margin holds the allowed-rate label, clear of the bars
	marginT, marginB         = 14, 40
	maxBars                  = 300 // longer runs are bucketed so a bar stays visible
	coordPrecision           = 1
	markBandY, markBandH int = chartH - marginB + 3, 6 // just under the x axis
)

func px(v float64) string { return strconv.FormatFloat(v, 'f', coordPrecision, 64) }

func newChart(res Result, allowed float64) chart {
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
	// Bucket seconds so at most maxBars bars are drawn; values stay per
	// second (averaged over the bucket).
	per := (len(series) + maxBars - 1) / maxBars
	type agg struct {
		t                    int
		req, adm, r429, r503 float64
	}
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
			n++
		}
		a.req, a.adm, a.r429, a.r503 = a.req/float64(n), a.adm/float64(n), a.r429/float64(n), a.r503/float64(n)
		bs = append(bs, a)
	}
	top := allowed
	for _, a := range bs {
		top = math.Max(top, a.req)
	}
	step := niceStep(top / 4)
	yMax := step * math.Ceil(top*1.05/step)
	if yMax <= 0 {
		yMax, step = 1, 0.25
	}
	plotH, plotW := float64(c.PlotH), float64(c.PlotW)
	y := func(v float64) float64 { return float64(c.PlotY) + plotH - v/yMax*plotH }
	bw := plotW / float64(len(bs))
	for i, a := range bs {
		x := float64(c.PlotX) + float64(i)*bw
		// Stack from the axis up: admitted, then 503, then 429 on top.
		h1 := a.adm / yMax * plotH
		h2 := a.r503 / yMax * plotH
		h3 := a.r429 / yMax * plotH
		base := float64(c.PlotY) + plotH
		b := bar{
			X: px(x), W: px(math.Max(bw-0.5, 0.5)),
			Admitted: rect{Y: px(base - h1), H: px(h1)},
			L503:     rect{Y: px(base - h1 - h2), H: px(h2)},
			Lim429:   rect{Y: px(base - h1 - h2 - h3), H: px(h3)},
		}
		b.Title = fmt.Sprintf("t=%ds: %s req/s, %s admitted, %s 429, %s 503", a.t, fmtG(a.req), fmtG(a.adm), fmtG(a.r429), fmtG(a.r503))
		c.Bars = append(c.Bars, b)
		if a.r429+a.r503 > 0 {
			c.Marks = append(c.Marks, mark{X: px(x), W: px(math.Max(bw-0.5, 0.5))})
		}
	}
	if allowed > 0 {
		c.AllowedY = px(y(allowed))
		c.AllowedLabel = "allowed " + fmtG(allowed) + "/s"
	}
	for v := 0.0; v <= yMax+step/2; v += step {
		c.YTicks = append(c.YTicks, tick{Pos: px(y(v)), Label: fmtG(v)})
	}
	last := bs[len(bs)-1].t + per
	xstep := int(niceStep(float64(last) / 8))
	if xstep < 1 {
		xstep = 1
	}
	for t := 0; t <= last; t += xstep {
		c.XTicks = append(c.XTicks, tick{Pos: px(float64(c.PlotX) + float64(t)/float64(last)*plotW), Label: strconv.Itoa(t)})
	}
	var n429, n503 int64
	for _, p := range series {
		n429 += p.Status429
		n503 += p.Status503
	}
	secs := len(c.Marks) * per
	c.Caption = fmt.Sprintf("%s: requests per second at the origin (admitted, 503, 429 stacked) against the allowed rate; %d %s with throttling answers marked below the axis (%d %s, %d %s)",
		res.Strategy, secs, plural(secs, "second", "seconds"), n429, plural64(n429, "429", "429s"), n503, plural64(n503, "503", "503s"))
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
code{font:13px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#f2f4f7;padding:.1rem .3rem;border-radius:3px}
.meta{color:#586174;margin-top:0}
dl.setup{display:grid;grid-template-columns:max-content 1fr;gap:.15rem 1rem;margin:1rem 0}
dl.setup dt{color:#586174}
dl.setup dd{margin:0}
.scroll{overflow-x:auto}
table.summary{border-collapse:collapse;font-size:14px;font-variant-numeric:tabular-nums}
table.summary th,table.summary td{border-bottom:1px solid #dde1e8;padding:.35rem .45rem;text-align:right;white-space:nowrap}
table.summary thead th{white-space:normal;vertical-align:bottom;min-width:3.2em}
table.summary th:first-child,table.summary td:first-child{text-align:left}
table.summary thead th{background:#f2f4f7;font-weight:600}
table.summary tr.hostpacer td{font-weight:600;background:#f5f9ff}
.err{color:#a4161a}
figure{margin:1rem 0 2rem}
figcaption{color:#586174;font-size:.9rem}
svg.chart{width:100%;height:auto;max-width:960px;display:block}
svg.chart text{font:11px system-ui,sans-serif;fill:#586174}
.adm{fill:#4f7cc9}.r429{fill:#d1495b}.r503{fill:#edae49}.mark{fill:#d1495b}
.allowed{stroke:#1d2330;stroke-width:1.5;stroke-dasharray:6 4}
.grid{stroke:#e6e9ef}.axis{stroke:#8a93a5}
.legend span{display:inline-block;margin-right:1.2rem;font-size:.9rem}
.legend i{display:inline-block;width:.8rem;height:.8rem;margin-right:.3rem;vertical-align:-1px}
ul.notes li{margin:.3rem 0}
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<p class="meta">Generated {{stamp .GeneratedAt}} · <code>{{.Command}}</code></p>
<dl class="setup">
<dt>jobs</dt><dd>{{.Setup.Jobs}} over {{.Setup.Authorities}} authorities, {{pct .Setup.Skew}} on the hottest</dd>
<dt>workers</dt><dd>{{.Setup.Workers}} per strategy: <b>processes</b> are <code>mirrorworker run</code> pods sharing one pace per origin (the hostpacer), <b>in-process</b> are instances each with its own pacer state</dd>
<dt>profile</dt><dd>{{.Setup.Profile}}{{if .Setup.ProfileFile}} (<code>{{.Setup.ProfileFile}}</code>){{end}}, time scale {{fmtG .Setup.Scale}}</dd>
<dt>politeness</dt><dd>floor {{fmtG .Setup.FloorSeconds}} s, at most {{.Setup.MaxInFlight}} in flight per authority</dd>
<dt>allowed rate</dt><dd>{{fmtG .Setup.AllowedRate}} admitted requests/s ({{.Setup.Identities}} caller {{if eq .Setup.Identities 1}}identity{{else}}identities{{end}} per authority)</dd>
<dt>time limit</dt><dd>{{f1 .Setup.TimeLimitSeconds}} s per strategy</dd>
<dt>machine</dt><dd>{{.Setup.Platform}}, {{.Setup.CPUs}} CPUs, {{.Setup.GoVersion}}</dd>
</dl>
<h2>Summary</h2>
<div class="scroll"><table class="summary" id="summary">
<thead><tr>{{range .Header}}<th scope="col">{{.}}</th>{{end}}</tr></thead>
<tbody>
{{range .Rows}}<tr class="{{.Strategy}}">{{range .Cells}}<td>{{.}}</td>{{end}}</tr>
{{if .Error}}<tr><td class="err" colspan="{{len $.Header}}">{{.Strategy}}: {{.Error}}</td></tr>
{{end}}{{end}}</tbody>
</table></div>
<h2>How to read this</h2>
<ul class="notes">
<li><b>mode</b>: <b>processes</b> ran the strategy as <code>mirrorworker run</code> pods on the partitioned cluster layout, as a deployment runs it; <b>in-process</b> ran worker instances in the load-test process.</li>
<li><b>drained</b>, <b>drain s</b> and <b>jobs/s</b>: whether every job left the queue (stored or dead-lettered) before the time limit, how long that took, and stored jobs per second.</li>
<li><b>goodput</b> is what the origin admitted during the run as a fraction of what the profile allows in that time: per authority and caller identity, the sustained bucket's capacity plus its rate times the drain time (less when the shared shard's tenant share binds first). Near 1, the strategy used what the origin offered; well below 1, it waited longer than it had to. With a skew, authorities that ran out of jobs early still count in the denominator.</li>
<li><b>429s</b>, <b>503s</b> and <b>early</b> come from the origin's own statistics. <b>early</b> counts requests sent while their caller had been told to wait (Retry-After or an exhausted rate-limit reset): the rudest kind of request, which a polite client keeps at 0.</li>
<li><b>gaps&lt;floor</b> counts arrivals from one caller closer than the policy floor to its previous one, as the origin timed them, and <b>min gap ms</b> is the closest pair; <b>sent&lt;floor</b> counts the same gaps as the workers timed their departures (pods log theirs; pairs from two pods count). Short gaps at the origin with none sent are timing noise between the two (a busy CPU, a new connection), not a pacer granting too early. Every strategy spaces each departure from the previous request's actual start, as the HostPacer does, so sent&lt;floor is 0 for all of them unless workers share a consumer (<code>--shared-consumer</code>: several pacers per authority).</li>
<li><b>deliv/job</b> is JetStream deliveries per job: every deferral and retry is one more. <b>dead</b> is jobs dead-lettered. <b>cpu s</b> and <b>heap MiB</b> (peak) are the whole process, origin and JetStream included (for pods, cpu s adds the pods' CPU time, and heap is the load-test process only): they compare strategies, they are not one worker's footprint.</li>
<li>In the charts, blue is admitted, yellow 503 and red 429 per second, stacked; the dashed line is the allowed rate; red ticks under the axis mark seconds with throttling answers. Hover a bar for its numbers.</li>
{{range .Notes}}<li>{{.}}</li>
{{end}}</ul>
<h2>Requests per second by strategy</h2>
<p class="legend"><span><i class="adm" style="background:#4f7cc9"></i>admitted</span><span><i style="background:#edae49"></i>503</span><span><i style="background:#d1495b"></i>429</span><span><i style="border-top:2px dashed #1d2330;height:0;width:1.2rem"></i>allowed rate</span></p>
{{range .Charts}}{{$c := .}}<figure id="{{.ID}}">
<h3>{{.Strategy}}</h3>
{{if .Empty}}<p>{{.Caption}}</p>{{else}}<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {{.Width}} {{.Height}}" role="img" aria-label="{{.Caption}}">
{{range .YTicks}}<line class="grid" x1="{{$c.PlotX}}" y1="{{.Pos}}" x2="{{$c.Right}}" y2="{{.Pos}}"/><text x="{{$c.LabelX}}" y="{{.Pos}}" dy="4" text-anchor="end">{{.Label}}</text>
{{end}}{{range .Bars}}<g><title>{{.Title}}</title><rect class="adm" x="{{.X}}" y="{{.Admitted.Y}}" width="{{.W}}" height="{{.Admitted.H}}"/><rect class="r503" x="{{.X}}" y="{{.L503.Y}}" width="{{.W}}" height="{{.L503.H}}"/><rect class="r429" x="{{.X}}" y="{{.Lim429.Y}}" width="{{.W}}" height="{{.Lim429.H}}"/></g>
{{end}}{{if .AllowedY}}<line class="allowed" x1="{{.PlotX}}" y1="{{.AllowedY}}" x2="{{.Right}}" y2="{{.AllowedY}}"/><text class="allowed-label" x="{{.AllowedX}}" y="{{.AllowedY}}" dy="4">{{.AllowedLabel}}</text>
{{end}}<line class="axis" x1="{{.PlotX}}" y1="{{.Bottom}}" x2="{{.Right}}" y2="{{.Bottom}}"/>
{{range .Marks}}<rect class="mark" x="{{.X}}" y="{{markY}}" width="{{.W}}" height="{{markH}}"/>{{end}}
{{range .XTicks}}<text x="{{.Pos}}" y="{{$c.TickY}}" text-anchor="middle">{{.Label}}</text>{{end}}
<text x="{{.Right}}" y="{{.Height}}" dy="-3" text-anchor="end">seconds since the run started</text>
<text x="4" y="10">req/s</text>
</svg>
<figcaption>{{.Caption}}</figcaption>{{end}}
</figure>
{{end}}</body>
</html>
`))
