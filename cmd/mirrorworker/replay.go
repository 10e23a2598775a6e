package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/term"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/replay"
	"github.com/mirrorworker/mirrorworker/worker"
)

// replayConfig is every flag of `mirrorworker replay`.
type replayConfig struct {
	nats    natsFlags
	dataDir string
	target  string

	fromSeq, since, fromTime string
	tenants                  listFlag
	authorities              listFlag
	dryRun                   bool

	concurrency   int
	floor         time.Duration
	maxInFlight   int
	policy        string
	allowPrivate  bool
	maxBodySize   byteSize
	connectTO     time.Duration
	headerTO      time.Duration
	idleTO        time.Duration
	failureBudget int
	ackWait       time.Duration
	maxAckPending int
	restoreWindow time.Duration
	natsTO        time.Duration
	progress      string
	workerID      string

	logFormat string
	logLevel  string

	explicit map[string]bool
}

// defaultNATS is where a running `mirrorworker run` listens by default.
const defaultNATS = "nats://127.0.0.1:4222"

func (c *replayConfig) register(fs *flag.FlagSet) {
	c.nats.defaultTo = defaultNATS
	c.nats.register(fs, "NATS server URL(s); default "+defaultNATS+", the embedded server of a running `mirrorworker run`")
	fs.StringVar(&c.dataDir, "data-dir", "./data", "the worker's data directory: the default mirror is <data-dir>/mirror")
	fs.StringVar(&c.target, "target", "", "mirror target to replay into: file:///abs/dir or a directory (default file://<data-dir>/mirror, the live worker's)")

	fs.StringVar(&c.fromSeq, "from-seq", "", "replay from this stream sequence of MIRROR_JOBS")
	fs.StringVar(&c.since, "since", "", "replay the jobs stored within this duration (90m, 24h, 7d)")
	fs.StringVar(&c.fromTime, "from-time", "", "replay the jobs stored at or after this RFC 3339 time (2026-11-29T08:00:00Z)")
	fs.Var(&c.tenants, "tenant", "replay only this tenant's jobs (repeatable, or comma-separated)")
	fs.Var(&c.authorities, "authority", "replay only the jobs of this origin, as a URL or host:port (repeatable, or comma-separated)")
	fs.BoolVar(&c.dryRun, "dry-run", false, "count the jobs a replay would re-drive, per authority, and fetch nothing")

	fs.IntVar(&c.concurrency, "concurrency", 16, "fetch slots: requests in flight across all authorities")
	fs.DurationVar(&c.floor, "floor", time.Second, "minimum spacing between request starts to one authority, for authorities the policy file does not name (given explicitly, it overrides the policy file's default)")
	fs.IntVar(&c.maxInFlight, "max-in-flight", 2, "cap of requests in flight to one authority, for authorities the policy file does not name")
	fs.StringVar(&c.policy, "policy", "", "policy file of per-authority floors and in-flight caps (use the live worker's)")
	fs.BoolVar(&c.allowPrivate, "allow-private-networks", false, "allow fetching from loopback and private addresses (link-local and cloud metadata stay refused)")
	c.maxBodySize = 16 << 30
	fs.Var(&c.maxBodySize, "max-body-size", "largest body stored, in bytes or with a unit (16GiB, 500MB)")
	fs.DurationVar(&c.connectTO, "connect-timeout", 10*time.Second, "timeout to connect to an origin (TLS handshake included)")
	fs.DurationVar(&c.headerTO, "header-timeout", 30*time.Second, "timeout from a request sent to its response headers")
	fs.DurationVar(&c.idleTO, "idle-timeout", 60*time.Second, "longest wait for a body read to make progress")
	fs.IntVar(&c.failureBudget, "failure-budget", 10, "attempts of a job with transient errors before it is dead-lettered")
	fs.DurationVar(&c.ackWait, "ack-wait", jobs.DefaultAckWait, "replay consumer AckWait: an unacknowledged job is redelivered after this")
	fs.IntVar(&c.maxAckPending, "max-ack-pending", jobs.DefaultMaxAckPending, "replay consumer MaxAckPending: jobs delivered and not yet acknowledged")
	fs.DurationVar(&c.restoreWindow, "restore-window", replay.DefaultWindow, "pacer facts of MIRROR_EVENTS replayed before the first request: at least the longest pause (10m) and the quiet window (30m)")
	fs.DurationVar(&c.natsTO, "nats-connect-timeout", 10*time.Second, "give up connecting to NATS after this long")
	fs.StringVar(&c.progress, "progress", "auto", "progress display: auto (a bar on a terminal, else a line every 10 s), bar, lines or none")
	fs.StringVar(&c.workerID, "worker-id", "", "name of this replay in logs and dead letters (default replay-<hostname>-<pid>)")

	fs.StringVar(&c.logFormat, "log-format", "console", "log format: json or console")
	fs.StringVar(&c.logLevel, "log-level", "warn", "log level: trace, debug, info, warn or error")
}

// listFlag is a repeatable flag whose values may also be comma-separated
// (the only way to give several in one environment variable).
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l = append(*l, v)
		}
	}
	return nil
}

// replayPlan is what the flags ask for, checked.
type replayPlan struct {
	start    replay.Start
	filter   replay.Filter
	subjects []string
}

// check rejects flag values that cannot work, as usage errors (exit 2), and
// builds the plan.
func (c *replayConfig) check(now time.Time) (replayPlan, error) {
	var errs []string
	bad := func(format string, a ...any) { errs = append(errs, fmt.Sprintf(format, a...)) }
	var p replayPlan
	var err error
	if p.start, err = replay.ParseStart(c.fromSeq, c.since, c.fromTime, now); err != nil {
		bad("%s", strings.TrimPrefix(err.Error(), replay.ErrStart.Error()+": "))
	}
	p.filter.Tenants = c.tenants
	for _, s := range c.authorities {
		a, err := replay.ParseAuthority(s)
		if err != nil {
			bad("%s", strings.TrimPrefix(err.Error(), replay.ErrFilter.Error()+": "))
			continue
		}
		p.filter.Authorities = append(p.filter.Authorities, a)
	}
	if p.subjects, err = p.filter.Subjects(); err != nil {
		bad("%s", strings.TrimPrefix(err.Error(), replay.ErrFilter.Error()+": "))
	}
	if c.dataDir == "" && c.target == "" {
		bad("--data-dir must not be empty")
	}
	if c.concurrency < 1 {
		bad("--concurrency %d: want at least 1", c.concurrency)
	}
	if c.floor < 0 {
		bad("--floor %s: want 0 or more", c.floor)
	}
	if c.maxInFlight < 1 {
		bad("--max-in-flight %d: want at least 1", c.maxInFlight)
	}
	if c.maxBodySize <= 0 {
		bad("--max-body-size %d: want more than 0", c.maxBodySize)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"connect-timeout", c.connectTO}, {"header-timeout", c.headerTO}, {"idle-timeout", c.idleTO}, {"ack-wait", c.ackWait}, {"nats-connect-timeout", c.natsTO}} {
		if d.v <= 0 {
			bad("--%s %s: want more than 0", d.name, d.v)
		}
	}
	if c.restoreWindow < replay.DefaultWindow {
		bad("--restore-window %s: want at least %s, or the replay could be ruder than the live worker", c.restoreWindow, replay.DefaultWindow)
	}
	if c.failureBudget < 1 {
		bad("--failure-budget %d: want at least 1", c.failureBudget)
	}
	if c.maxAckPending < 1 {
		bad("--max-ack-pending %d: want at least 1", c.maxAckPending)
	}
	switch c.progress {
	case "auto", "bar", "lines", "none":
	default:
		bad("--progress %q: want auto, bar, lines or none", c.progress)
	}
	if c.logFormat != "json" && c.logFormat != "console" {
		bad("--log-format %q: want json or console", c.logFormat)
	}
	if _, err := zerolog.ParseLevel(c.logLevel); err != nil || c.logLevel == "" {
		bad("--log-level %q: want trace, debug, info, warn or error", c.logLevel)
	}
	if len(errs) > 0 {
		return p, usageError{"replay: " + strings.Join(errs, "; ")}
	}
	return p, nil
}

// cmdReplay is `mirrorworker replay`: re-drive jobs already in MIRROR_JOBS
// into a mirror target, through a worker and a pacer of its own, the pacer
// restored from MIRROR_EVENTS first.
func cmdReplay(ctx context.Context, args []string, getenv func(string) string, _ io.Reader, stdout, stderr io.Writer) error {
	var c replayConfig
	fs := newFlagSet("replay", stderr)
	c.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: mirrorworker replay [--from-seq N | --since D | --from-time T] [--tenant T]... [--authority A]... [--target URL] [--dry-run] [flags]")
		fmt.Fprintln(fs.Output())
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, getenv); err != nil {
		return err
	}
	c.explicit = explicitFlags(fs, getenv)
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("replay: unexpected arguments %q (give origins with --authority)", fs.Args())}
	}
	plan, err := c.check(time.Now())
	if err != nil {
		return err
	}
	log, err := newLogger(zerolog.SyncWriter(stderr), c.logFormat, c.logLevel)
	if err != nil {
		return usageError{err.Error()}
	}
	if c.workerID == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "mirrorworker"
		}
		c.workerID = fmt.Sprintf("replay-%s-%d", host, os.Getpid())
	}
	log = log.With().Str("worker_id", c.workerID).Logger()
	return runReplay(ctx, &c, plan, log, stdout, stderr)
}

func runReplay(ctx context.Context, c *replayConfig, plan replayPlan, log zerolog.Logger, stdout, stderr io.Writer) error {
	// Everything that can be checked without NATS is checked first.
	var target *mirror.FileTarget
	var policy *pacer.Policy
	if !c.dryRun {
		spec := c.target
		if spec == "" {
			dataDir, err := filepath.Abs(c.dataDir)
			if err != nil {
				return fmt.Errorf("data dir: %w", err)
			}
			spec = "file://" + filepath.Join(dataDir, "mirror")
		}
		var err error
		if target, err = mirror.Open(spec); err != nil {
			return fmt.Errorf("%w (pass --target)", err)
		}
		if err := checkWritableDir(filepath.Join(target.Root(), ".mirrorworker")); err != nil {
			return fmt.Errorf("mirror target %s: %w (pass --target)", target.Root(), err)
		}
		// The live worker's rule for --floor, --max-in-flight and --policy.
		rc := runConfig{policy: c.policy, floor: c.floor, maxInFlight: c.maxInFlight, explicit: c.explicit}
		if policy, err = rc.pacerPolicy(); err != nil {
			return err
		}
	}

	natsURL := c.nats.url
	if natsURL == "" {
		natsURL = c.nats.defaultTo
	}
	cctx, cancel := context.WithTimeout(ctx, c.natsTO)
	nc, err := c.nats.connect(cctx, "mirrorworker "+c.workerID, natsLogHandlers(log)...)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w (is `mirrorworker run` running? pass --nats-url)", err)
	}
	defer func() {
		_ = nc.FlushTimeout(5 * time.Second)
		nc.Close()
	}()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	// Replay reads what the worker made; it never creates or resizes streams.
	for _, name := range []string{jobs.JobsStream, jobs.EventsStream} {
		if _, err := js.Stream(ctx, name); err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("no stream %s on %s: nothing to replay (has `mirrorworker run` ever run there?)", name, redactedURLs(natsURL))
			}
			return fmt.Errorf("stream %s: %w", name, err)
		}
	}

	if c.dryRun {
		return dryRun(ctx, js, plan, stdout)
	}
	return replayJobs(ctx, js, c, plan, target, policy, log, stdout, stderr)
}

func dryRun(ctx context.Context, js jetstream.JetStream, plan replayPlan, stdout io.Writer) error {
	counts, err := replay.Count(ctx, js, plan.start, plan.subjects, time.Now())
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "dry run: %d jobs would be replayed (%s, %s)", counts.Total, plan.start, strings.Join(plan.subjects, " "))
	if counts.Total > 0 {
		fmt.Fprintf(stdout, ", stream sequences %d to %d", counts.FirstSeq, counts.LastSeq)
	}
	fmt.Fprintln(stdout)
	keys := make([]string, 0, len(counts.ByAuthority))
	for k := range counts.ByAuthority {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if a, b := counts.ByAuthority[keys[i]], counts.ByAuthority[keys[j]]; a != b {
			return a > b
		}
		return keys[i] < keys[j]
	})
	for _, k := range keys {
		fmt.Fprintf(stdout, "  %-40s %d\n", k, counts.ByAuthority[k])
	}
	return nil
}

func replayJobs(ctx context.Context, js jetstream.JetStream, c *replayConfig, plan replayPlan,
	target *mirror.FileTarget, policy *pacer.Policy, log zerolog.Logger, stdout, stderr io.Writer) error {
	// Metrics on a registry of the replay's own: they are its summary.
	reg := prometheus.NewRegistry()
	metrics, err := worker.NewMetrics(reg, 0)
	if err != nil {
		return err
	}
	// The replay's pacer learns from the same origins as the live worker:
	// its facts are published like the worker's, and it starts from theirs.
	sink := worker.NewEventSink(js, log, metrics)
	pc := pacer.New(&pacer.Options{Policy: policy, Logger: log, OnEvent: sink.Handle})
	if _, err := replay.RestorePacer(ctx, js, pc, replay.RestoreOptions{Window: c.restoreWindow, Logger: log}); err != nil {
		return err
	}
	fc := fetch.New(&fetch.Options{
		ConnectTimeout:        c.connectTO,
		TLSHandshakeTimeout:   c.connectTO,
		ResponseHeaderTimeout: c.headerTO,
		IdleTimeout:           c.idleTO,
		MaxBodySize:           int64(c.maxBodySize),
		AllowPrivate:          c.allowPrivate,
		UserAgent:             fetch.UserAgent(version),
	})
	defer fc.CloseIdleConnections()

	sctx, stopSink := context.WithCancel(context.WithoutCancel(ctx))
	sinkDone := make(chan struct{})
	go func() { defer close(sinkDone); _ = sink.Run(sctx) }()
	defer func() { stopSink(); <-sinkDone }() // flushes the last facts

	work := func(ctx context.Context, cons jetstream.Consumer) error {
		w, err := worker.New(worker.Deps{JS: js, Consumer: cons, Fetcher: fc, Target: target, Pacer: pc}, &worker.Options{
			Concurrency:   c.concurrency,
			FailureBudget: c.failureBudget,
			AckWait:       c.ackWait,
			WorkerID:      c.workerID,
			Clock:         clock.Real{},
			Logger:        log,
			Metrics:       metrics,
		})
		if err != nil {
			return fmt.Errorf("worker: %w", err)
		}
		return w.Run(ctx)
	}
	res, err := replay.Run(ctx, js, work, &replay.Options{
		Start:    plan.start,
		Subjects: plan.subjects,
		Consumer: &jobs.ConsumerOptions{AckWait: c.ackWait, MaxAckPending: c.maxAckPending},
		Progress: newProgress(c.progress, stderr),
		Logger:   log,
	})
	sum, serr := replay.SummaryFrom(reg)
	if serr != nil {
		log.Warn().Err(serr).Msg("replay summary")
	}
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(stdout, "replay interrupted after %s: %s\n", res.Elapsed.Round(time.Millisecond), sum)
			return fmt.Errorf("replay interrupted: run it again to finish (objects already stored cost a conditional request each)")
		}
		return err
	}
	fmt.Fprintf(stdout, "replayed %d jobs (%s, %s) into %s in %s: %s\n",
		res.Jobs, plan.start, strings.Join(plan.subjects, " "), target.Root(), res.Elapsed.Round(time.Millisecond), sum)
	if sum.DeadLettered > 0 {
		fmt.Fprintf(stdout, "%d jobs dead-lettered: see stream %s\n", sum.DeadLettered, jobs.DLQStream)
	}
	return nil
}

// newProgress picks the progress display: a bar on a terminal, plain lines
// in a log or a pipe.
func newProgress(mode string, stderr io.Writer) replay.Progress {
	if mode == "auto" {
		mode = "lines"
		if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			mode = "bar"
		}
	}
	switch mode {
	case "bar":
		return replay.NewBar(stderr)
	case "lines":
		return replay.NewLines(stderr, 10*time.Second, clock.Real{})
	}
	return nil
}
