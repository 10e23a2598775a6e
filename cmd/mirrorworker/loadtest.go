package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/loadtest"
	"github.com/mirrorworker/mirrorworker/strategy"
	"github.com/mirrorworker/mirrorworker/worker"
)

// loadtestFlags are the flags of `mirrorworker loadtest`.
type loadtestFlags struct {
	jobs, auths, workers, concurrency int
	skew                              float64
	profile, strategies, reportDir    string
	scratch, logLevel, progressMode   string
	timeLimit, curlSpacing            time.Duration
	curlRetries                       int
	shared, realTime, inProcess       bool
	names                             []string // parsed from strategies
}

// cmdLoadtest is `mirrorworker loadtest`: the whole system against the stub
// origin, once per politeness strategy, with a report.
func cmdLoadtest(ctx context.Context, args []string, getenv func(string) string, _ io.Reader, stdout, stderr io.Writer) error {
	f, err := parseLoadtestFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	o, err := f.options(args, stderr)
	if err != nil {
		return err
	}
	mode := "hostpacer as pods"
	if f.inProcess {
		mode = "all in-process"
	}
	fmt.Fprintf(stderr, "loadtest: %d jobs over %d authorities, %d workers (%s), profile %s (allowed %.4g req/s), strategies %s\n",
		f.jobs, f.auths, f.workers, mode, o.Profile.Name, o.Profile.AllowedRate(f.auths, 1), strings.Join(f.names, ","))
	rep, runErr := loadtest.Run(ctx, o)
	if rep == nil {
		return usageError{"loadtest: " + runErr.Error()}
	}
	return writeLoadtestReport(rep, runErr, f.reportDir, stdout)
}

func parseLoadtestFlags(args []string, getenv func(string) string, stderr io.Writer) (*loadtestFlags, error) {
	var f loadtestFlags
	fs := newFlagSet("loadtest", stderr)
	fs.IntVar(&f.jobs, "jobs", 1000, "jobs to enqueue per strategy")
	fs.IntVar(&f.auths, "authorities", 10, "authorities the stub origin serves (one listener each)")
	fs.IntVar(&f.workers, "workers", 3, "workers per strategy: the hostpacer runs as this many mirrorworker run processes (pods) sharing one pace per origin through the cluster layout, as a deployment does; the other strategies as in-process instances, each with its own pacer state")
	fs.Float64Var(&f.skew, "skew", 0, "share of the jobs on the hottest authority (0: spread evenly)")
	fs.StringVar(&f.profile, "profile", "", "load-test profile `file` (or a plain stub origin profile); default: "+loadtest.DefaultProfileFile+", built into the binary, so it works from any directory")
	fs.StringVar(&f.strategies, "strategy", strategy.HostPacer, "strategies to compare, comma-separated, or all: "+strings.Join(append(strategy.Names(), strategy.References()...), ", "))
	fs.IntVar(&f.curlRetries, "curl-retries", strategy.DefaultCurlRetries, "the curl-retry reference's --retry N")
	fs.DurationVar(&f.curlSpacing, "curl-spacing", 0, "the curl-retry reference's least spacing between two requests to one authority, as curl --rate (100ms is --rate 10/s); 0: none")
	fs.StringVar(&f.reportDir, "report", "loadtest-report", "directory for report.json and report.html")
	fs.DurationVar(&f.timeLimit, "time-limit", 3*time.Minute, "longest run of one strategy")
	fs.IntVar(&f.concurrency, "concurrency", worker.DefaultConcurrency(), "fetch slots of each worker")
	fs.BoolVar(&f.realTime, "real-time", false, "run the strategies at real time constants (scale 1: 2 s first step, 60-600 s cooldowns, 30 min quiet window) whatever the profile's scale")
	fs.BoolVar(&f.inProcess, "in-process", false, "run the hostpacer's workers in this process like the other strategies' (quicker to start; not the cluster layout)")
	fs.BoolVar(&f.shared, "shared-consumer", false, "in-process workers pull from one durable consumer instead of each from its own share of the authorities")
	fs.StringVar(&f.scratch, "scratch-dir", "", "where each strategy's JetStream store and mirror live during its run (default: the system temp dir)")
	fs.StringVar(&f.logLevel, "log-level", "error", "level of the workers' and origin's logs on stderr: trace, debug, info, warn or error")
	fs.StringVar(&f.progressMode, "progress", "auto", "progress display: auto (one updating line on a terminal), line (a line every 5 s) or none")
	if err := parseFlags(fs, args, getenv); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Sprintf("loadtest: unexpected arguments %q", fs.Args())}
	}
	names, err := strategy.Parse(f.strategies)
	if err != nil {
		return nil, usageError{"loadtest: --strategy: " + err.Error()}
	}
	f.names = names
	if bad := f.problems(); len(bad) > 0 {
		return nil, usageError{"loadtest: " + strings.Join(bad, "; ")}
	}
	if err := checkScratchDir(f.scratch); err != nil { // every row would be "error"
		return nil, usageError{"loadtest: " + err.Error()}
	}
	return &f, nil
}

// problems lists every flag value that cannot run.
func (f *loadtestFlags) problems() []string {
	var bad []string
	if f.jobs < 1 {
		bad = append(bad, "--jobs: want at least 1")
	}
	if f.auths < 1 {
		bad = append(bad, "--authorities: want at least 1")
	}
	if f.workers < 1 {
		bad = append(bad, "--workers: want at least 1")
	}
	if !f.inProcess && f.workers > jobs.DefaultPartitions && slices.Contains(f.names, strategy.HostPacer) {
		bad = append(bad, fmt.Sprintf("--workers %d: the hostpacer's pods serve whole partitions, at most %d pods (or pass --in-process)", f.workers, jobs.DefaultPartitions))
	}
	if f.timeLimit <= 0 {
		bad = append(bad, "--time-limit: want more than 0")
	}
	if f.curlRetries < 1 || f.curlSpacing < 0 {
		bad = append(bad, "--curl-retries: want at least 1; --curl-spacing: not negative")
	}
	if f.concurrency < 1 {
		bad = append(bad, "--concurrency: want at least 1")
	}
	if f.reportDir == "" {
		bad = append(bad, "--report: want a directory")
	}
	if f.progressMode != "auto" && f.progressMode != "line" && f.progressMode != "none" {
		bad = append(bad, "--progress: want auto, line or none")
	}
	return bad
}

// options builds the load test's options: logger, profile, pod binary and
// progress display.
func (f *loadtestFlags) options(args []string, stderr io.Writer) (loadtest.Options, error) {
	log, err := newLogger(stderr, "console", f.logLevel)
	if err != nil {
		return loadtest.Options{}, usageError{"loadtest: " + err.Error()}
	}
	p, err := loadtest.LoadProfile(f.profile)
	if err != nil {
		return loadtest.Options{}, fmt.Errorf("loadtest: %w", err)
	}
	if f.realTime {
		p = p.RealTime()
	}
	o := loadtest.Options{
		Jobs: f.jobs, Authorities: f.auths, Workers: f.workers, Skew: f.skew,
		Profile: p, ProfileFile: cmp.Or(f.profile, loadtest.DefaultProfileFile+" (built in)"), Strategies: f.names,
		TimeLimit: f.timeLimit, Concurrency: f.concurrency, Shared: f.shared, Dir: f.scratch,
		InProcess: f.inProcess, PodLogLevel: f.logLevel,
		Curl:     loadtest.CurlOptions{Retries: f.curlRetries, Spacing: f.curlSpacing},
		Command:  "mirrorworker loadtest " + strings.Join(args, " "),
		Progress: stderr, Logger: log,
	}
	if !f.inProcess {
		// The pods are this same executable's `run`.
		if o.PodBinary, err = os.Executable(); err != nil {
			return loadtest.Options{}, fmt.Errorf("loadtest: find this executable for the pods: %w (pass --in-process)", err)
		}
	}
	switch f.progressMode {
	case "auto":
		o.Live = isTerminal(stderr)
	case "none":
		o.Progress = io.Discard
	}
	return o, nil
}

// writeLoadtestReport prints the verdict and table, writes the report
// files, and returns the run's error, if any, as the command's.
func writeLoadtestReport(rep *loadtest.Report, runErr error, dir string, stdout io.Writer) error {
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if err := rep.WriteFiles(dir); err != nil {
		return fmt.Errorf("loadtest: %w", err)
	}
	fmt.Fprintf(stdout, "report: %s/report.html and report.json\n", strings.TrimRight(dir, "/"))
	if runErr != nil {
		if errors.Is(runErr, context.Canceled) {
			return errors.New("loadtest: interrupted; the report covers the strategies that ran")
		}
		return fmt.Errorf("loadtest: %w", runErr)
	}
	for _, r := range rep.Results {
		if r.Error != "" {
			return fmt.Errorf("loadtest: strategy %s could not run: %s", r.Strategy, r.Error)
		}
	}
	return nil
}
