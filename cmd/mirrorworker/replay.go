package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/deadletter"
	"github.com/mirrorworker/mirrorworker/facts"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/grant"
	"github.com/mirrorworker/mirrorworker/internal/departures"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/pipeline"
	"github.com/mirrorworker/mirrorworker/policy"
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

	workerFlags
	restoreWindow  time.Duration
	progress       string
	streamReplicas int
}

func (c *replayConfig) register(fs *flag.FlagSet) {
	c.nats.registerClient(fs, &c.dataDir)
	fs.StringVar(&c.dataDir, "data-dir", defaultDataDir, "the live worker's data `directory`: the default mirror is <data-dir>/mirror, and without --nats-url the replay reaches the embedded NATS server of the worker running there")
	fs.StringVar(&c.target, "target", "", targetHelp+"; the target to replay into (default file://<data-dir>/mirror, the live worker's)")

	fs.StringVar(&c.fromSeq, "from-seq", "", "replay from this stream sequence of MIRROR_JOBS")
	fs.StringVar(&c.since, "since", "", "replay the jobs stored within this duration (90m, 24h, 7d)")
	fs.StringVar(&c.fromTime, "from-time", "", "replay the jobs stored at or after this RFC 3339 time (2026-11-29T08:00:00Z)")
	fs.Var(&c.tenants, "tenant", "replay only this `tenant`'s jobs (repeatable, or comma-separated)")
	fs.Var(&c.authorities, "authority", "replay only the jobs of this `origin`, as a URL or host:port (repeatable, or comma-separated)")
	fs.BoolVar(&c.dryRun, "dry-run", false, "count the jobs a replay would re-drive, per authority, and fetch nothing")

	c.workerFlags.register(fs, workerDefaults{
		policyHelp:        "policy file of per-authority and group limits (floor, in-flight cap, bandwidth, first step, decay) (use the live worker's; the live policy in MIRROR_POLICY applies over it)",
		ackWaitHelp:       "replay consumer AckWait: an unacknowledged job is redelivered after this",
		maxAckPendingHelp: "replay consumer MaxAckPending: jobs delivered and not yet acknowledged",
		workerIDHelp:      "name of this replay in logs and dead letters (default replay-<hostname>-<pid>)",
		workerIDPrefix:    "replay-",
		logFormat:         "console",
		logLevel:          "warn",
	})
	fs.DurationVar(&c.restoreWindow, "restore-window", facts.DefaultWindow, "pacer facts of MIRROR_EVENTS replayed before the first request: at least the longest pause (10m) and the quiet window (30m)")
	fs.StringVar(&c.progress, "progress", "auto", "progress display: auto (a bar on a terminal, else a line every 10 s), bar, lines or none")
	registerReplicasFlag(fs, &c.streamReplicas)
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
	c.workerFlags.check(bad, durationFlag{"nats-connect-timeout", c.nats.timeout})
	checkReplicas(bad, c.streamReplicas)
	if c.restoreWindow < facts.DefaultWindow {
		bad("--restore-window %s: want at least %s, or the replay could be ruder than the live worker", c.restoreWindow, facts.DefaultWindow)
	}
	switch c.progress {
	case "auto", "bar", "lines", "none":
	default:
		bad("--progress %q: want auto, bar, lines or none", c.progress)
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
		printFlags(fs)
	}
	if err := parseFlags(fs, args, getenv); err != nil {
		return err
	}
	c.explicit, c.getenv = explicitFlags(fs, getenv), getenv
	c.nats.markGiven(fs, getenv)
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("replay: unexpected arguments %q (give origins with --authority)", fs.Args())}
	}
	plan, err := c.check(time.Now())
	if err != nil {
		return err
	}
	log, err := c.logger(stderr)
	if err != nil {
		return err
	}
	return runReplay(ctx, &c, plan, log, stdout, stderr)
}

func runReplay(ctx context.Context, c *replayConfig, plan replayPlan, log zerolog.Logger, stdout, stderr io.Writer) error {
	// Everything that can be checked without NATS is checked first.
	var target storeTarget
	var policy *pacer.Policy
	if !c.dryRun {
		var err error
		spec := c.target
		if spec == "" {
			if spec, err = pipeline.DefaultTarget(c.dataDir); err != nil {
				return err
			}
		}
		if target, err = c.targetOpts.openTarget(ctx, spec, readTestHooks(c.getenv).fault, log); err != nil {
			return err
		}
		// The live worker's rule for --floor, --max-in-flight and --policy.
		if policy, err = c.pacerPolicy(); err != nil {
			return err
		}
	}

	nc, err := c.nats.dial(ctx, "mirrorworker "+c.workerID, jobs.JobsStream, stderr, natsLogHandlers(log)...)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("replay: %w", err)
	}
	natsURL := c.nats.resolvedURL
	defer func() {
		_ = nc.FlushTimeout(5 * time.Second)
		nc.Close()
	}()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	// Replay reads what the worker made; it never creates streams, and
	// resizes them only to raise their replicas (--stream-replicas).
	for _, name := range []string{jobs.JobsStream, jobs.EventsStream} {
		if _, err := js.Stream(ctx, name); err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("no stream %s on %s: nothing to replay (has 'mirrorworker run' ever run there?)", name, broker.RedactURL(natsURL))
			}
			return fmt.Errorf("stream %s: %w", name, err)
		}
	}

	if c.dryRun {
		return dryRun(ctx, js, plan, c.allowPrivate, stdout)
	}
	if c.streamReplicas > 0 {
		// Raise only: limits stay the worker's. Dead letters and pacer
		// facts the replay writes are then as safe as the live worker's.
		if err := jobs.EnsureStreams(ctx, js, &jobs.StreamOptions{KeepExisting: true, Replicas: c.streamReplicas}); err != nil {
			return replicasHint(err, c.streamReplicas)
		}
	}
	// The replay's dead letters are its own (replay.DeadLetterStream).
	if err := replay.EnsureDeadLetterStream(ctx, js, c.streamReplicas); err != nil {
		return replicasHint(err, c.streamReplicas)
	}
	// While partitions are leased but no pod is announced (a pod between
	// lease rounds), the replay waits to see it rather than pace alone.
	if _, err := replay.WaitForPods(ctx, js, clock.Real{}, 2*jobs.DefaultLeaseTTL); err != nil {
		return err
	}
	return replayJobs(ctx, nc, js, c, plan, target, policy, log, stdout, stderr)
}

func dryRun(ctx context.Context, js jetstream.JetStream, plan replayPlan, allowPrivate bool, stdout io.Writer) error {
	counts, err := replay.Count(ctx, js, plan.start, plan.subjects, time.Now())
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "dry run: %d %s would be replayed (%s, %s)", counts.Total, plural(counts.Total, "job", "jobs"), plan.start, strings.Join(plan.subjects, " "))
	if counts.Total > 0 {
		fmt.Fprintf(stdout, ": %d stream %s, sequences %d to %d", counts.Messages, plural(counts.Messages, "message", "messages"), counts.FirstSeq, counts.LastSeq)
	}
	if counts.Deletes > 0 {
		fmt.Fprintf(stdout, "; %d fetches and %d %s, applied in stream order", counts.Total-counts.Deletes, counts.Deletes, plural(counts.Deletes, "delete", "deletes"))
	}
	fmt.Fprintln(stdout)
	keys := make([]string, 0, len(counts.ByAuthority))
	for k := range counts.ByAuthority {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if a, b := counts.ByAuthority[keys[i]].Jobs, counts.ByAuthority[keys[j]].Jobs; a != b {
			return a > b
		}
		return keys[i] < keys[j]
	})
	for _, k := range keys {
		a := counts.ByAuthority[k]
		line := fmt.Sprintf("  %-32s %d %s", k, a.Jobs, plural(a.Jobs, "job", "jobs"))
		if a.Messages != a.Jobs {
			line += fmt.Sprintf(" (%d messages: some enqueued more than once)", a.Messages)
		}
		if a.Deletes > 0 {
			line += fmt.Sprintf(", %d %s", a.Deletes, plural(a.Deletes, "delete", "deletes"))
		}
		if a.DeadLettered > 0 {
			reasons := make([]string, 0, len(a.Reasons))
			for r, n := range a.Reasons {
				reasons = append(reasons, fmt.Sprintf("%s %d", r, n))
			}
			sort.Strings(reasons)
			line += fmt.Sprintf(", %d dead-lettered (%s)", a.DeadLettered, strings.Join(reasons, ", "))
		}
		if !allowPrivate {
			if what := privateDestination(k); what != "" {
				line += fmt.Sprintf("; %s: a replay without --allow-private-networks refuses it (pass it if the live worker runs with it)", what)
			}
		}
		fmt.Fprintln(stdout, line)
	}
	if counts.DeadLettered > 0 {
		fmt.Fprintf(stdout, "Dead-lettered jobs are replayed too, and fail the same way unless their cause is gone (see stream %s).\n", jobs.DLQStream)
	}
	return nil
}

// probeDefaultNATS fails at once, saying what to do, when nothing listens
// at the default NATS address: connecting would otherwise retry until
// --nats-connect-timeout for a server that is not there.
func probeDefaultNATS(ctx context.Context, natsURL string) error {
	u, err := url.Parse(natsURL)
	if err != nil {
		return nil // the connect reports it
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return fmt.Errorf("no NATS server at %s (%v): start 'mirrorworker run' first (its embedded server holds the jobs), or pass --nats-url", u.Host, err)
	}
	return conn.Close()
}

// replayJobs is a replay: it fetches and stores its jobs itself, always
// (docs/adr/0031). With no live pod it paces its own requests, with a
// pacer of its own; beside live pods, or once one starts, each request's
// start is granted by the pod that owns its authority (grant.Paced), so
// that the origin sees the pods' one pace (replay.Alone).
func replayJobs(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, c *replayConfig, plan replayPlan,
	target storeTarget, policy *pacer.Policy, log zerolog.Logger, stdout, stderr io.Writer) error {
	// Metrics stay private (a nil registerer); the summary is counted by
	// the worker's OnOutcome hook, and by the pods' reports once they work
	// for it.
	var tally replay.Tally
	// The replay's pacer learns from the same origins as the live worker:
	// its facts are published like the worker's, and it starts from theirs.
	parts, err := pipeline.New(js, c.pipelineConfig(nil, policy, log))
	if err != nil {
		return err
	}
	defer parts.Close()
	// The live pods' facts and operators' pauses while the replay runs, as
	// a pod follows them; the replay's own facts carry its name, so that it
	// skips them and the pods apply them.
	follow, err := parts.Follow(ctx, js, c.workerID, log)
	if err != nil {
		return err
	}
	defer follow.Close() // if it is not run: a start-up step below failed
	if _, err := facts.Restore(ctx, js, parts.Pacer, facts.RestoreOptions{Window: c.restoreWindow, Logger: log}); err != nil {
		return err
	}
	live, watch, err := followLivePolicy(ctx, js, c, parts, policy, log)
	if err != nil {
		return err
	}
	kv, err := replay.EnsureReplaysBucket(ctx, js, c.streamReplicas)
	if err != nil {
		return replicasHint(err, c.streamReplicas)
	}
	lone := &loneReplay{nc: nc, js: js, kv: kv, c: c, parts: parts, policy: watch, spec: pipeline.TargetSpec(target.Root()), target: target,
		run: strings.ToLower(nuid.Next()), tally: &tally, log: log, stderr: stderr}
	// The event sink runs until the replay has returned, so that its last
	// facts are published (pipeline.Run's stop order).
	began := time.Now()
	var res replay.Result
	err = parts.Run(ctx, func(ctx context.Context) error {
		var err error
		w := lone.alone()
		res, err = replay.Run(ctx, js, w.Work, &replay.Options{
			Await:    w.Await,
			Start:    plan.start,
			Subjects: plan.subjects,
			Consumer: &jobs.ConsumerOptions{AckWait: c.ackWait, MaxAckPending: c.maxAckPending, Replicas: c.streamReplicas},
			Progress: newProgress(c.progress, stderr),
			Waits:    loneWaits(replay.PodWaits(js), replay.PacerWaits(parts.Pacer, parts.Clock.Now)),
			Logger:   log,
		})
		return err
	}, &pipeline.RunOptions{Services: []func(context.Context) error{follow.Run, live}})
	run := ""
	if lone.handedOver {
		run = lone.run
	}
	return replayEnd(ctx, js, c, plan, target, res, tally.Summary(), err, began, run, stdout)
}

// loneWaits says what a lone replay's last jobs wait for: the pods'
// states once it has handed them over, its own pacer's before (it follows
// the pods' facts, so its states are theirs when a pod ran lately).
func loneWaits(pods, own replay.Waits) replay.Waits {
	return func(ctx context.Context, auths []string) (map[string]pacer.State, error) {
		out, err := pods(ctx, auths)
		if out == nil {
			out = map[string]pacer.State{}
		}
		mine, _ := own(ctx, auths)
		for a, s := range mine {
			if _, ok := out[a]; !ok {
				out[a] = s
			}
		}
		return out, err
	}
}

// followLivePolicy loads the live policy (MIRROR_POLICY) over the replay's
// own (static: --policy, --floor, --max-in-flight, --max-bandwidth) into
// its pacer, with a pod's precedence (docs/adr/0023), and returns the
// part that follows its changes (its run), and the watcher: a replay that paces its
// own requests keeps the floors, caps and groups operators set on the
// cluster.
func followLivePolicy(ctx context.Context, js jetstream.JetStream, c *replayConfig, parts *pipeline.Parts, static *pacer.Policy, log zerolog.Logger) (func(context.Context) error, *policy.Watcher, error) {
	w, err := policy.Open(ctx, js, policy.Options{Base: static, Apply: parts.SetPolicy, Replicas: c.streamReplicas, Logger: log})
	if err != nil {
		return nil, nil, fmt.Errorf("live policy: %w", replicasHint(err, c.streamReplicas))
	}
	return w.Run, w, nil
}

// loneReplay is what a replay without pods needs to hand over to pods that
// start while it runs.
type loneReplay struct {
	nc         *nats.Conn // the grants' asks and reports
	js         jetstream.JetStream
	kv         jetstream.KeyValue
	c          *replayConfig
	parts      *pipeline.Parts
	policy     *policy.Watcher // the live policy; its changes repace the worker
	spec, run  string
	target     storeTarget
	tally      *replay.Tally
	log        zerolog.Logger
	stderr     io.Writer
	handedOver bool // set before the hand-over's work runs; read after replay.Run returns
	// starts are the replay's request starts, its own and those the owners
	// granted: a replay whose pods have all gone fences its pacer from
	// them. paced is the granted work's pacer, whose LastAnswer says
	// whether any owner still answers.
	starts *replay.Starts
	paced  atomic.Pointer[grant.Paced]
}

// alone is the replay's work: its own worker, then the pods'.
func (l *loneReplay) alone() *replay.Lone {
	starts := &replay.Starts{Clock: l.parts.Clock} // the worker's, below
	l.starts = starts
	local := func(ctx context.Context, cons jetstream.Consumer) error {
		depLog, err := departures.Open(readTestHooks(l.c.getenv).departures)
		if err != nil {
			return err
		}
		defer depLog.Close()
		// Copies the workers wrote into MIRROR_JOBS (jobs brought back from
		// parking, or moved into a partition) are not submitted jobs.
		w, err := l.parts.NewWorker(cons, l.target, replay.LoneGrace, func(o *worker.Options, d *worker.Deps) {
			o.SkipCopies, o.OnOutcome = true, l.tally.Add
			// Its failures are not the live pipeline's: neither its
			// dead letters nor its failed attempts (their budget).
			o.Replay = l.run
			d.JS = replay.SeparateDeadLetters(d.JS)
			starts.Wrap(d)
			d.Fetcher, d.Pacer = depLog.Wrap(d.Fetcher, d.Pacer) // as pods and the granted worker log theirs
		})
		if err != nil {
			return fmt.Errorf("worker: %w", err)
		}
		return w.Run(ctx)
	}
	return replay.Alone(l.js, l.kv, replay.AloneOptions{
		Run: l.run, Target: l.spec, Local: local, Starts: starts, Flush: l.parts.Sink.Flush, Logger: l.log,
		Clock: l.parts.Clock, // the workers' (pipeline.Parts.NewWorker), as Starts's
		Sync:  l.parts.SyncFacts,
		Fence: func(lasts ...map[string]time.Time) int { return l.parts.Pacer.FenceAll(l.parts.Clock.Now(), lasts...) },
		Pods:  func(ctx context.Context) (map[string][]string, error) { return replay.LivePods(ctx, l.js) },
		Waiting: func(e jobs.ReplayRun) {
			fmt.Fprintf(l.stderr, "replay %s: waiting for replay %s (into %s) to end: it paces its own requests, and with no pod running replays run one at a time (a pod that starts does the work of both)\n",
				l.run, e.Run, e.Target)
		},
		Done:    func() int64 { s := l.tally.Summary(); return s.Stored + s.Unchanged + s.DeadLettered },
		Running: func(ctx context.Context) (bool, error) { return replay.PodsRunning(ctx, l.js) },
		Unanswered: func(since time.Time) bool {
			p := l.paced.Load()
			return p == nil || p.LastAnswer().Before(since)
		},
		Orphaned: func(since time.Time) {
			fmt.Fprintf(l.stderr, "replay %s: no pod answers grants (%s empty since %s): pacing alone with the cluster's last facts, its first requests spaced from the last starts the pods granted; a pod that starts takes it back into the pods' pace\n",
				l.run, jobs.PodsBucket, since.Local().Format("15:04:05"))
		},
		Handover: func(pods map[string][]string, base jobs.ReplayRun) (replay.Work, error) {
			if base.Done > 0 {
				fmt.Fprintf(l.stderr, "replay %s: %d %s started after %d jobs: the replay goes on in their pace, each request's start granted by the pod that owns its authority, after their live jobs\n",
					l.run, len(pods), plural(len(pods), "pod", "pods"), base.Done)
			} else {
				fmt.Fprintf(l.stderr, "replay %s: beside %d live %s: the replay fetches and stores its jobs itself, each request's start granted by the pod that owns its authority, after their live jobs; 'mirrorworker status' shows it\n",
					l.run, len(pods), plural(len(pods), "pod", "pods"))
			}
			notePacingFlags(l.c, l.stderr)
			l.handedOver = true
			return l.granted, nil
		},
	})
}

// granted is the replay's work beside live pods: its own worker, fetch
// client and target, every request's start granted by the pod that owns
// its authority (grant.Paced; docs/adr/0031), so that the pods' floor,
// in-flight cap, cooldowns, probe and live jobs first hold for its
// requests as for theirs. Its failures stay its own, as alone.
func (l *loneReplay) granted(ctx context.Context, cons jetstream.Consumer) error {
	client := grant.NewClient(l.nc, l.c.workerID, max(l.c.nats.timeout, grant.DefaultTimeout), nil) // longer than an ask is held
	paced := grant.NewPaced(ctx, grant.PacedLocal(grant.DefaultAsksInFlight), client, &grant.PacedOptions{
		OnUnreported: func(auth string, err error) {
			l.log.Warn().Err(err).Str("authority", auth).Msg("replay: an answer was not reported to the pod that granted it; the replay learned it itself")
		},
		OnLearned: func(now time.Time, auth string, v pacer.Verdict) {
			if v.Throttled && v.Until.After(now) {
				// The replay's own pacer too: if the owner is gone for good,
				// the replay paces alone with it, and must wait this out.
				l.parts.Pacer.Apply(now, pacer.Event{Type: pacer.EventCooldown, Authority: auth, At: now, Reason: v.Reason, Until: v.Until})
			}
		},
	})
	l.paced.Store(paced)
	depLog, err := departures.Open(readTestHooks(l.c.getenv).departures)
	if err != nil {
		return err
	}
	defer depLog.Close()
	w, err := l.parts.NewWorker(cons, l.target, 0, func(o *worker.Options, d *worker.Deps) {
		o.SkipCopies, o.OnOutcome = true, l.tally.Add
		o.Replay = l.run
		d.JS = replay.SeparateDeadLetters(d.JS)
		d.Pacer = paced
		d.Fetcher, d.Pacer = depLog.Wrap(d.Fetcher, d.Pacer)
		l.starts.Wrap(d) // the last grants fence the replay's own pacer if the pods all go
	})
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	return w.Run(ctx)
}

// pacingFlags are the replay's flags that set its pace: beside pods they
// do not apply, the pods' policy does (they grant each start).
var pacingFlags = []string{"floor", "max-in-flight", "policy", "max-bandwidth"}

// notePacingFlags says, in one line on stderr, that the pacing flags given
// do not apply beside pods, and what does.
func notePacingFlags(c *replayConfig, stderr io.Writer) {
	var given []string
	for _, f := range pacingFlags {
		if c.explicit[f] {
			given = append(given, "--"+f)
		}
	}
	if len(given) == 0 {
		return
	}
	fmt.Fprintf(stderr, "replay: %s %s not apply beside the pods: they grant each request's start, in their policy (their --policy and the live policy: 'mirrorworker policy list' shows it, 'mirrorworker policy set' changes it)\n",
		strings.Join(given, ", "), map[bool]string{true: "does", false: "do"}[len(given) == 1])
}

// replayEnd prints a replay's summary, or says how to finish an
// interrupted one. run is the replay run whose dead letters the pods
// wrote ("": the replay did the work itself).
func replayEnd(ctx context.Context, js jetstream.JetStream, c *replayConfig, plan replayPlan, target storeTarget,
	res replay.Result, sum replay.Summary, err error, began time.Time, run string, stdout io.Writer) error {
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(stdout, "replay interrupted after %s: %s\n", res.Elapsed.Round(time.Millisecond), sum)
			return fmt.Errorf("replay interrupted: run it again to finish (objects already stored cost a conditional request each)")
		}
		return err
	}
	fmt.Fprintf(stdout, "replayed %d jobs (%s, %s) into %s in %s: %s\n",
		res.Jobs, plan.start, strings.Join(plan.subjects, " "), target.Root(), res.Elapsed.Round(time.Millisecond), sum)
	if res.Later > 0 {
		fmt.Fprintf(stdout, "%d %s stored after the replay began (after sequence %d) left to the live workers\n", res.Later, plural(int(res.Later), "job", "jobs"), res.LastSeq)
	}
	if sum.DeadLettered > 0 {
		fmt.Fprintf(stdout, "%d jobs dead-lettered by this replay (worker %s): 'mirrorworker dlq list --replays' lists them (stream %s; the live %s is untouched)\n",
			sum.DeadLettered, c.workerID, replay.DeadLetterStream, jobs.DLQStream)
		explainReplayFailures(ctx, js, c, run, began, stdout)
	}
	return nil
}

// newProgress picks the progress display: a bar on a terminal, plain lines
// in a log or a pipe.
func newProgress(mode string, stderr io.Writer) replay.Progress {
	if mode == "auto" {
		mode = "lines"
		if isTerminal(stderr) {
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

// explainReplayFailures says why the replay's jobs were dead-lettered, by
// reason, and what to pass when the reason is one of the replay's own
// settings: a destination the live worker was allowed to fetch.
func explainReplayFailures(ctx context.Context, js jetstream.JetStream, c *replayConfig, run string, since time.Time, w io.Writer) {
	recs, err := deadletter.List(ctx, js, deadletter.Query{Replays: true, Since: since.Add(-time.Second)})
	if err != nil {
		return // the summary line above already says where they are
	}
	reasons := map[string]int{}
	for _, r := range recs {
		if r.Record.Worker == c.workerID || run != "" && r.Record.Replay == run {
			reasons[r.Record.Reason]++
		}
	}
	if len(reasons) == 0 {
		return
	}
	names := make([]string, 0, len(reasons))
	for r := range reasons {
		names = append(names, r)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, r := range names {
		parts[i] = fmt.Sprintf("%s %d", r, reasons[r])
	}
	fmt.Fprintf(w, "  by reason: %s\n", strings.Join(parts, ", "))
	if n := reasons[jobs.ReasonDestinationRefused]; n > 0 && !c.allowPrivate { // the replay fetches with its own flags, beside pods too
		fmt.Fprintf(w, "  %d %s refused as loopback or private destinations: if the live worker runs with --allow-private-networks, pass it to the replay too\n",
			n, plural(n, "was", "were"))
	}
}

// privateDestination says "a loopback address" or "a private address" for
// an authority ("host:port") a worker refuses without
// --allow-private-networks, judged, as enqueue does, on literal addresses
// and localhost only; "" otherwise.
func privateDestination(auth string) string {
	host, _, err := net.SplitHostPort(auth)
	if err != nil {
		return ""
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return "a loopback address"
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return ""
	}
	return map[string]string{fetch.ReasonLoopback: "a loopback address", fetch.ReasonPrivate: "a private address"}[fetch.CheckAddr(a, false)]
}
