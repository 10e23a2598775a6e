package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/loadtest"
	"github.com/mirrorworker/mirrorworker/strategy"
	"github.com/mirrorworker/mirrorworker/stuborigin"
)

// BenchmarkPoliteness is issue 35's benchmark, side by side in one run:
// against the nginx-like stub origin (stuborigin.LimitReq: a leaky bucket
// per caller at R r/s, burst 5, nodelay, 429 with a fixed Retry-After of
// 2 s, no rate-limit headers) at 2 and 10 r/s, N files (default 300), the
// worker as the load test runs it (one `mirrorworker run` pod: this test
// binary as main) at --floor 0, 100 ms and 1 s, and beside it the
// curl-retry reference (curl --retry 10: one file at a time, each
// Retry-After honoured per request, no shared pace). Real time: every
// constant of the pacer is the contract's.
//
// It prints one table: per run the drain time, the origin's own bound
// (files / rate, or files x floor where the floor is slower than the
// origin), their ratio, requests, rejections (count and % of requests),
// the requests the origin counted early (before a Retry-After the caller
// was given expired) split in two (loadtest.ClassifyEarly): "while told to
// wait", sent after the origin had written the refusal or not known to
// have left before it, and "crossed a refusal", known to have left before
// (on their way when it was written), gaps below the floor (between two
// arrivals at the origin) and dead letters. Nothing is
// asserted: the numbers are the result. Each rate's load-test report
// (report.html, report.json) goes to MW_BENCH_POLITENESS_REPORT/rate-R
// when it is set, and each run's per-request trace (the origin's arrivals,
// the pod's departures: loadtest.Options.TraceDir) beside it, in
// trace-floor-F/ or trace-curl/.
//
//	make bench-politeness
//	go test -run '^$' -bench Politeness -benchtime 1x -timeout 120m -v ./cmd/mirrorworker/
//
// MW_BENCH_POLITENESS_FILES sets N; MW_BENCH_POLITENESS_CELLS picks runs,
// comma-separated rate:floor pairs and rate:curl ("2:100ms,10:0,2:curl"),
// each with an optional ":503" for nginx's default answer instead (503
// without Retry-After: "10:100ms:503");
// MW_BENCH_POLITENESS_BURST sets the limiter's burst= (default 5; 0 is
// nginx's default, limit_req without burst=);
// MW_BENCH_POLITENESS_LIMIT bounds each run (default 30m: a run that has
// not drained by then is reported undrained); MW_BENCH_POLITENESS_PARALLEL
// runs that many at once (default 1: one after another, so that no run's
// gaps are another's CPU contention); MW_BENCH_POLITENESS_PODLOG=debug keeps
// the pods' log at that level in each trace directory (pods.log). ns/op is
// meaningless.
func BenchmarkPoliteness(b *testing.B) {
	files := 300
	if v, err := strconv.Atoi(os.Getenv("MW_BENCH_POLITENESS_FILES")); err == nil && v > 0 {
		files = v
	}
	limit := 30 * time.Minute
	if v, err := time.ParseDuration(os.Getenv("MW_BENCH_POLITENESS_LIMIT")); err == nil && v > 0 {
		limit = v
	}
	parallel := 1
	if v, err := strconv.Atoi(os.Getenv("MW_BENCH_POLITENESS_PARALLEL")); err == nil && v > 0 {
		parallel = v
	}
	cells, err := politenessCells(os.Getenv("MW_BENCH_POLITENESS_CELLS"))
	if err != nil {
		b.Fatal(err)
	}
	burst := int64(5)
	if v, err := strconv.ParseInt(os.Getenv("MW_BENCH_POLITENESS_BURST"), 10, 64); err == nil && v >= 0 {
		burst = v
	}
	for i := range cells {
		cells[i].burst = burst
	}
	b.Setenv(asMainEnv, "1") // the pods are os.Executable(): this test binary
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		results := make([]politenessResult, len(cells))
		sem := make(chan struct{}, parallel)
		var wg sync.WaitGroup
		for i, c := range cells {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				results[i] = runPolitenessCell(b, c, files, limit, exe)
			})
		}
		wg.Wait()
		var sb strings.Builder
		fmt.Fprintf(&sb, "politeness: %d files, nginx-like origin (limit_req burst %d nodelay; 429 + Retry-After: 2, or, marked 503, nginx's default 503 without Retry-After), %d run(s) at once\n", files, burst, parallel)
		writePolitenessTable(&sb, results)
		fmt.Fprint(os.Stdout, sb.String())
		if dir := os.Getenv("MW_BENCH_POLITENESS_REPORT"); dir != "" {
			if err := writePolitenessReports(dir, results); err != nil {
				b.Error(err)
			}
		}
	}
}

// politenessCell is one run: the origin's rate and a client.
type politenessCell struct {
	rate  float64
	floor time.Duration
	curl  bool
	// nginxDefault: the origin answers as nginx does by default, 503
	// without Retry-After, instead of 429 with Retry-After: 2.
	nginxDefault bool
	burst        int64 // limit_req burst=
}

// dir names the report directory of the cell's origin.
func (c politenessCell) dir() string {
	if c.nginxDefault {
		return fmt.Sprintf("rate-%g-503", c.rate)
	}
	return fmt.Sprintf("rate-%g", c.rate)
}

func (c politenessCell) origin() string {
	if c.nginxDefault {
		return fmt.Sprintf("%g r/s, 503", c.rate)
	}
	return fmt.Sprintf("%g r/s", c.rate)
}

// traceName names the cell's trace directory beside its origin's report.
func (c politenessCell) traceName() string {
	if c.curl {
		return "curl"
	}
	return "floor-" + c.floor.String()
}

func (c politenessCell) client() string {
	if c.curl {
		return "curl --retry 10"
	}
	return "worker --floor " + c.floor.String()
}

// politenessCells parses MW_BENCH_POLITENESS_CELLS; empty is every cell:
// both rates, the three floors and the reference.
func politenessCells(spec string) ([]politenessCell, error) {
	if spec == "" {
		spec = "2:0,2:100ms,2:1s,2:curl,10:0,10:100ms,10:1s,10:curl"
	}
	var out []politenessCell
	for _, f := range strings.Split(spec, ",") {
		f = strings.TrimSpace(f)
		nginxDefault := strings.HasSuffix(f, ":503")
		r, cl, ok := strings.Cut(strings.TrimSuffix(f, ":503"), ":")
		rate, err := strconv.ParseFloat(r, 64)
		if !ok || err != nil || rate <= 0 {
			return nil, fmt.Errorf("MW_BENCH_POLITENESS_CELLS: %q: want rate:floor or rate:curl, each with an optional :503", f)
		}
		c := politenessCell{rate: rate, nginxDefault: nginxDefault}
		if cl == "curl" {
			c.curl = true
		} else if cl == "0" {
			c.floor = 0
		} else if c.floor, err = time.ParseDuration(cl); err != nil {
			return nil, fmt.Errorf("MW_BENCH_POLITENESS_CELLS: %q: %w", f, err)
		}
		out = append(out, c)
	}
	return out, nil
}

type politenessResult struct {
	cell   politenessCell
	files  int
	res    loadtest.Result
	report *loadtest.Report
}

// bound is the origin's own bound on the drain: files / rate, or files x
// floor where the floor is slower than the origin allows.
func (r politenessResult) bound() float64 {
	b := float64(r.files) / r.cell.rate
	if !r.cell.curl {
		b = math.Max(b, float64(r.files)*r.cell.floor.Seconds())
	}
	return b
}

func runPolitenessCell(b *testing.B, c politenessCell, files int, limit time.Duration, exe string) politenessResult {
	lr := &stuborigin.LimitReq{Rate: c.rate, Burst: c.burst, NoDelay: true,
		Status: 429, RetryAfter: stuborigin.Duration{Duration: 2 * time.Second}}
	if c.nginxDefault {
		lr = &stuborigin.LimitReq{Rate: c.rate, Burst: c.burst, NoDelay: true} // 503, no Retry-After
	}
	p := &loadtest.Profile{
		Name:  fmt.Sprintf("nginx-limit-req-%gr/s", c.rate),
		Scale: 1, Floor: c.floor, MaxInFlight: 2, ObjectSize: 1024,
		Origin: &stuborigin.Profile{Name: fmt.Sprintf("nginx-limit-req-%grs", c.rate), LimitReq: lr},
	}
	name := strategy.HostPacer
	if c.curl {
		name = strategy.CurlRetry
	}
	var traceDir string
	if dir := os.Getenv("MW_BENCH_POLITENESS_REPORT"); dir != "" {
		traceDir = filepath.Join(dir, c.dir(), "trace-"+c.traceName())
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit+5*time.Minute)
	defer cancel()
	log, podLevel, closeLog := podLog(b, traceDir)
	defer closeLog()
	rep, err := loadtest.Run(ctx, loadtest.Options{
		Jobs: files, Authorities: 1, Workers: 1, Profile: p, Strategies: []string{name},
		PodBinary: exe, TimeLimit: limit, Dir: b.TempDir(), TraceDir: traceDir,
		Title:       "politeness: nginx-like origin at " + c.origin(),
		Logger:      log,
		PodLogLevel: podLevel,
	})
	if err != nil {
		b.Errorf("%s, %s: %v", c.origin(), c.client(), err)
	}
	out := politenessResult{cell: c, files: files, report: rep}
	if rep != nil && len(rep.Results) == 1 {
		out.res = rep.Results[0]
		out.res.Strategy = c.client()
		rep.Results[0].Strategy = c.client()
	}
	b.Logf("%s, %s: drained %v in %.2f s, %d requests, %d refused, %d early (%d told to wait, %d crossed a refusal); of the told, %d granted before the pod read a refusal, %d after it or not proved before", c.origin(), c.client(),
		out.res.Drained, out.res.DrainSeconds, out.res.Requests, out.res.Status429+out.res.Status503, out.res.Early, out.res.Told(), out.res.EarlyCrossed,
		out.res.EarlyToldUnread, out.res.ToldAfterRead())
	for _, e := range out.res.EarlyRequests {
		side := ""
		if e.ClientSide != "" {
			side = "; " + e.ClientSide
			if e.ClientReadMs != nil {
				side += fmt.Sprintf(" (granted %.3f ms from %s's first reading of a refusal; negative: before)", *e.ClientReadMs, e.Client)
			}
		}
		b.Logf("%s, %s: early %s: arrived %.6f s, %.3f ms after the refusal was written%s", c.origin(), c.client(), e.Class, e.Arrived, e.MarginMs, side)
	}
	return out
}

// podLog is the pods' log of a run: with MW_BENCH_POLITENESS_PODLOG set to
// a level ("debug") and a trace directory, every pod's lines at that level
// go to pods.log in it (the scheduler's deferrals and parkings, each store),
// beside the arrivals and departures they explain; otherwise nothing.
func podLog(b *testing.B, traceDir string) (zerolog.Logger, string, func()) {
	level := os.Getenv("MW_BENCH_POLITENESS_PODLOG")
	if level == "" || traceDir == "" {
		return zerolog.Nop(), "", func() {}
	}
	if err := os.MkdirAll(traceDir, 0o755); err != nil {
		b.Fatal(err)
	}
	f, err := os.Create(filepath.Join(traceDir, "pods.log"))
	if err != nil {
		b.Fatal(err)
	}
	return zerolog.New(f).With().Timestamp().Logger(), level, func() { f.Close() }
}

func writePolitenessTable(sb *strings.Builder, results []politenessResult) {
	tw := tabwriter.NewWriter(sb, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "origin\tclient\tdrained\tdrain s\tbound s\tratio\trequests\trejections\t% of requests\twhile told to wait\t(of which after the pod read it)\tcrossed a refusal\tgaps<floor\tdead letters\t")
	for _, r := range results {
		res := r.res
		rej := res.Status429 + res.Status503 + res.Status403
		pct := 0.0
		if res.Requests > 0 {
			pct = 100 * float64(rej) / float64(res.Requests)
		}
		drained := "yes"
		if !res.Drained {
			drained = fmt.Sprintf("no (%d stored)", res.JobsStored)
		}
		if res.Error != "" {
			drained = "error: " + res.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%.1f\t%.3f\t%d\t%d\t%.1f\t%d\t%d\t%d\t%d\t%d\t\n",
			r.cell.origin(), r.cell.client(), drained, res.DrainSeconds, r.bound(), res.DrainSeconds/r.bound(),
			res.Requests, rej, pct, res.Told(), res.ToldAfterRead(), res.EarlyCrossed, res.GapsBelowFloor, res.DeadLettered)
	}
	tw.Flush()
}

// writePolitenessReports writes one load-test report per origin, every
// client of it side by side, under dir/rate-R (dir/rate-R-503 for nginx's
// default answer).
func writePolitenessReports(dir string, results []politenessResult) error {
	byRate := map[string]*loadtest.Report{}
	var rates []string
	for _, r := range results {
		if r.report == nil || len(r.report.Results) != 1 {
			continue
		}
		rep, ok := byRate[r.cell.dir()]
		if !ok {
			cp := *r.report
			cp.Results = nil
			cp.Setup.FloorSeconds = 0
			cp.Setup.FloorNote = "the floor of each worker run is in its name (the curl reference has none)"
			cp.Notes = append([]string{"Each row is its own run against a fresh origin; the worker rows differ in --floor (in their names), the curl row is the curl --retry 10 reference."}, cp.Notes...)
			rep = &cp
			byRate[r.cell.dir()] = rep
			rates = append(rates, r.cell.dir())
		}
		rep.Results = append(rep.Results, r.report.Results[0])
		if len(r.report.Setup.Allowance) > len(rep.Setup.Allowance) {
			rep.Setup.Allowance = r.report.Setup.Allowance
		}
	}
	for _, rate := range rates {
		if err := byRate[rate].WriteFiles(filepath.Join(dir, rate)); err != nil {
			return err
		}
	}
	return nil
}
