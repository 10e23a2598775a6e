package main

import (
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

// defaultLoadtestProfile is used when --profile is not given and the file
// exists (running from the repository root).
const defaultLoadtestProfile = "testdata/profiles/loadtest-throttling.json"

// cmdLoadtest is `mirrorworker loadtest`: the whole system against the stub
// origin, once per politeness strategy, with a report.
func cmdLoadtest(ctx context.Context, args []string, getenv func(string) string, _ io.Reader, stdout, stderr io.Writer) error {
	var (
		jobsN, auths, workers, concurrency int
		skew                               float64
		profile, strategies, reportDir     string
		scratch, logLevel, progressMode    string
		timeLimit                          time.Duration
		shared, realTime, inProcess        bool
	)
	fs := newFlagSet("loadtest", stderr)
	fs.IntVar(&jobsN, "jobs", 1000, "jobs to enqueue per strategy")
	fs.IntVar(&auths, "authorities", 10, "authorities the stub origin serves (one listener each)")
	fs.IntVar(&workers, "workers", 3, "workers per strategy: the hostpacer runs as this many mirrorworker run processes (pods) sharing one pace per origin through the cluster layout, as a deployment does; the other strategies as in-process instances, each with its own pacer state")
	fs.Float64Var(&skew, "skew", 0, "share of the jobs on the hottest authority (0: spread evenly)")
	fs.StringVar(&profile, "profile", defaultLoadtestProfile, "load-test profile (or a plain stub origin profile)")
	fs.StringVar(&strategies, "strategy", strategy.HostPacer, "strategies to compare, comma-separated, or all: "+strings.Join(strategy.Names(), ", "))
	fs.StringVar(&reportDir, "report", "loadtest-report", "directory for report.json and report.html")
	fs.DurationVar(&timeLimit, "time-limit", 3*time.Minute, "longest run of one strategy")
	fs.IntVar(&concurrency, "concurrency", worker.DefaultConcurrency(), "fetch slots of each worker")
	fs.BoolVar(&realTime, "real-time", false, "run the strategies at real time constants (scale 1: 2 s first step, 60-600 s cooldowns, 30 min quiet window) whatever the profile's scale")
	fs.BoolVar(&inProcess, "in-process", false, "run the hostpacer's workers in this process like the other strategies' (quicker to start; not the cluster layout)")
	fs.BoolVar(&shared, "shared-consumer", false, "in-process workers pull from one durable consumer instead of each from its own share of the authorities")
	fs.StringVar(&scratch, "scratch-dir", "", "where each strategy's JetStream store and mirror live during its run (default: the system temp dir)")
	fs.StringVar(&logLevel, "log-level", "error", "level of the workers' and origin's logs on stderr: trace, debug, info, warn or error")
	fs.StringVar(&progressMode, "progress", "auto", "progress display: auto (one updating line on a terminal), line (a line every 5 s) or none")
	if err := parseFlags(fs, args, getenv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("loadtest: unexpected arguments %q", fs.Args())}
	}
	names, err := strategy.Parse(strategies)
	if err != nil {
		return usageError{"loadtest: --strategy: " + err.Error()}
	}
	var bad []string
	if jobsN < 1 {
		bad = append(bad, "--jobs: want at least 1")
	}
	if auths < 1 {
		bad = append(bad, "--authorities: want at least 1")
	}
	if workers < 1 {
		bad = append(bad, "--workers: want at least 1")
	}
	if !inProcess && workers > jobs.DefaultPartitions && slices.Contains(names, strategy.HostPacer) {
		bad = append(bad, fmt.Sprintf("--workers %d: the hostpacer's pods serve whole partitions, at most %d pods (or pass --in-process)", workers, jobs.DefaultPartitions))
	}
	if timeLimit <= 0 {
		bad = append(bad, "--time-limit: want more than 0")
	}
	if concurrency < 1 {
		bad = append(bad, "--concurrency: want at least 1")
	}
	if reportDir == "" {
		bad = append(bad, "--report: want a directory")
	}
	if progressMode != "auto" && progressMode != "line" && progressMode != "none" {
		bad = append(bad, "--progress: want auto, line or none")
	}
	if len(bad) > 0 {
		return usageError{"loadtest: " + strings.Join(bad, "; ")}
	}
	if err := checkScratchDir(scratch); err != nil { // every row would be "error"
		return usageError{"loadtest: " + err.Error()}
	}
	log, err := newLogger(stderr, "console", logLevel)
	if err != nil {
		return usageError{"loadtest: " + err.Error()}
	}
	p, err := loadtest.LoadProfile(profile)
	if err != nil {
		return fmt.Errorf("loadtest: %w", err)
	}
	if realTime {
		p = p.RealTime()
	}
	o := loadtest.Options{
		Jobs: jobsN, Authorities: auths, Workers: workers, Skew: skew,
		Profile: p, ProfileFile: profile, Strategies: names,
		TimeLimit: timeLimit, Concurrency: concurrency, Shared: shared, Dir: scratch,
		InProcess: inProcess, PodLogLevel: logLevel,
		Command:  "mirrorworker loadtest " + strings.Join(args, " "),
		Progress: stderr, Logger: log,
	}
	if !inProcess {
		// The pods are this same executable's `run`.
		if o.PodBinary, err = os.Executable(); err != nil {
			return fmt.Errorf("loadtest: find this executable for the pods: %w (pass --in-process)", err)
		}
	}
	switch progressMode {
	case "auto":
		o.Live = isTerminal(stderr)
	case "none":
		o.Progress = io.Discard
	}
	mode := "hostpacer as pods"
	if inProcess {
		mode = "all in-process"
	}
	fmt.Fprintf(stderr, "loadtest: %d jobs over %d authorities, %d workers (%s), profile %s (allowed %.4g req/s), strategies %s\n",
		jobsN, auths, workers, mode, p.Name, p.AllowedRate(auths, 1), strings.Join(names, ","))
	rep, runErr := loadtest.Run(ctx, o)
	if rep == nil {
		return usageError{"loadtest: " + runErr.Error()}
	}
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if err := rep.WriteFiles(reportDir); err != nil {
		return fmt.Errorf("loadtest: %w", err)
	}
	fmt.Fprintf(stdout, "report: %s/report.html and report.json\n", strings.TrimRight(reportDir, "/"))
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
