package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/admin"
	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/bytesize"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/dirlock"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/internal/departures"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/lifecycle"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/pipeline"
	"github.com/mirrorworker/mirrorworker/worker"
)

// The concrete packages satisfy the worker's interfaces.
var (
	_ worker.Fetcher = (*fetch.Client)(nil)
	_ worker.Target  = (*mirror.FileTarget)(nil)
	_ worker.Pacer   = (*pacer.Pacer)(nil)
)

// startMessage is the message of the start line, which carries the NATS
// URL, the mirror root and the admin URL: where a newcomer finds things, and
// where tests find the ephemeral ports.
const startMessage = "mirrorworker running"

// runConfig is every flag of `mirrorworker run`.
type runConfig struct {
	nats           natsFlags
	dataDir        string
	embeddedListen string
	target         string
	adminAddr      string
	// replayTargets are the targets besides --target that replay jobs may
	// be stored into (--replay-target).
	replayTargets listFlag

	workerFlags
	shutdownGrace  time.Duration
	jobsMaxAge     time.Duration
	jobsMaxBytes   byteSize
	streamReplicas int

	partitions int
	leaseTTL   time.Duration
	parkAfter  time.Duration
	// laneBacklog is worker.Options.LaneBacklog (negative: no lanes); the
	// flag's 0 is parsed into it (laneBacklogFlag).
	laneBacklog int

	// stopNow closes when a stop under way must end at once (a second
	// signal; nil: never).
	stopNow <-chan struct{}

	// onRegistry, when set (tests), is handed the metric registry before
	// anything is registered with it but the process collectors.
	onRegistry func(*metricRegistry)
}

func (c *runConfig) register(fs *flag.FlagSet) {
	c.nats.register(fs, "NATS server URL(s) of an existing deployment; empty starts an embedded JetStream server")
	fs.StringVar(&c.dataDir, "data-dir", defaultDataDir, "directory for the embedded JetStream store (<data-dir>/nats) and the default mirror (<data-dir>/mirror)")
	fs.StringVar(&c.embeddedListen, "embedded-listen", defaultEmbeddedListen, "client address of the embedded NATS server, for enqueue and the nats CLI; empty: in-process only; port 0: any free port")
	fs.StringVar(&c.target, "target", "", targetHelp+" (default file://<data-dir>/mirror)")
	fs.Var(&c.replayTargets, "replay-target", "deprecated: a replay stores its jobs itself, in the pods' pace (docs/adr/0031), and needs none; kept, for one release, for the replay jobs of replays of earlier versions: a mirror `target` besides --target that this pod may store them into (repeatable, or comma-separated)")
	fs.StringVar(&c.adminAddr, "admin-addr", admin.DefaultAddr, "address of the admin HTTP endpoint (/metrics, /healthz, /readyz, /debug/pacer): all interfaces by default so that kubelet probes and Prometheus reach it in a pod; 127.0.0.1:"+admin.DefaultPort+" keeps it on the host; port 0: any free port (env MIRRORWORKER_ADMIN_ADDR)")

	c.workerFlags.register(fs, workerDefaults{
		policyHelp:        "policy file of per-authority and group limits (floor, in-flight cap, bandwidth, first step, decay)",
		ackWaitHelp:       "consumer AckWait: an unacknowledged job is redelivered after this",
		maxAckPendingHelp: "consumer MaxAckPending: jobs delivered and not yet acknowledged, across all workers",
		workerIDHelp:      "name of this worker in logs, events and NATS (default <hostname>-<pid>)",
		logFormat:         "json",
		logLevel:          "info",
	})
	fs.DurationVar(&c.shutdownGrace, "shutdown-grace", worker.DefaultShutdownGrace, "on SIGTERM, time for in-flight jobs to finish before they are handed back")
	fs.DurationVar(&c.jobsMaxAge, "jobs-max-age", jobs.DefaultJobsMaxAge, "MaxAge of the MIRROR_JOBS stream")
	fs.Var(&c.jobsMaxBytes, "jobs-max-bytes", "MaxBytes of the MIRROR_JOBS stream, a `size` in bytes or with a unit (50GiB); 0: unlimited")
	fs.IntVar(&c.partitions, "partitions", jobs.DefaultPartitions, "partitions of MIRROR_JOBS: authorities are split among them and each is served by one pod at a time, so that pods sharing a NATS keep one pace per origin; fixed once the stream has them, at most the useful number of pods. 0: the single shared consumer of earlier versions, for one pod only")
	fs.DurationVar(&c.leaseTTL, "lease-ttl", jobs.DefaultLeaseTTL, "life of a partition lease without renewal: a killed pod's partitions move to the others after about this long (set when the leases bucket is created)")
	c.laneBacklog = worker.DefaultLaneBacklog
	fs.Var((*laneBacklogFlag)(&c.laneBacklog), "lane-backlog", "when a partition has at least this `count` of jobs queued and one of its authorities must wait longer than --park-after, that authority's backlog moves to a lane (a consumer of its own, pulled when it can take requests) and the partition goes on past it without reading it; 0: no lanes, the backlog is parked job by job")
	fs.DurationVar(&c.parkAfter, "park-after", worker.DefaultParkAfter, "a job whose authority cannot take it for longer than this is parked in MIRROR_PARKED (no consumer slot, no memory, no redelivery) until it can")
	registerReplicasFlag(fs, &c.streamReplicas)
	fs.Float64Var(&c.timeScale, "time-scale", 1, "for load tests only (mirrorworker loadtest sets it): multiply the pacer's fixed durations (2 s first step, 60 s cap and fallback, 600 s pause cap, 30 min quiet window, 1 s waits) by this, in (0, 1]; floors and the origin's own delays are not scaled. Leave it at 1 against real origins")
}

// check rejects flag values that cannot work, as usage errors (exit 2).
func (c *runConfig) check() error {
	var errs []string
	bad := func(format string, a ...any) { errs = append(errs, fmt.Sprintf(format, a...)) }
	if c.dataDir == "" {
		bad("--data-dir must not be empty")
	}
	if c.nats.url == "" && c.embeddedListen != "" {
		if _, _, err := net.SplitHostPort(c.embeddedListen); err != nil {
			bad("--embedded-listen %q: want host:port or empty", c.embeddedListen)
		}
	}
	if _, _, err := net.SplitHostPort(c.adminAddr); err != nil {
		bad("--admin-addr %q: want host:port", c.adminAddr)
	}
	c.workerFlags.check(bad, durationFlag{"jobs-max-age", c.jobsMaxAge})
	if c.shutdownGrace <= 0 {
		bad("--shutdown-grace %s: want more than 0 (in-flight jobs are handed back when it ends)", c.shutdownGrace)
	}
	if c.jobsMaxBytes < 0 {
		bad("--jobs-max-bytes %d: want 0 (unlimited) or more", c.jobsMaxBytes)
	}
	if c.partitions < 0 || c.partitions > jobs.MaxPartitions {
		bad("--partitions %d: want 0 (one shared consumer) to %d", c.partitions, jobs.MaxPartitions)
	}
	if c.leaseTTL < time.Second {
		bad("--lease-ttl %s: want at least 1s", c.leaseTTL)
	}
	if c.parkAfter <= 0 {
		bad("--park-after %s: want more than 0", c.parkAfter)
	}
	if !(c.timeScale > 0 && c.timeScale <= 1) {
		bad("--time-scale %v: want more than 0 and at most 1 (1 is real time)", c.timeScale)
	}
	checkReplicas(bad, c.streamReplicas)
	if c.nats.url == "" && c.streamReplicas > 1 {
		bad("--stream-replicas %d needs a NATS cluster: the embedded server is one node (pass --nats-url, or leave --stream-replicas unset)", c.streamReplicas)
	}
	if len(errs) > 0 {
		return usageError{"run: " + strings.Join(errs, "; ")}
	}
	return nil
}

// cmdRun is `mirrorworker run`: the worker. It returns nil after a graceful
// stop caused by ctx (SIGTERM, SIGINT).
func cmdRun(ctx context.Context, stopNow <-chan struct{}, args []string, getenv func(string) string, _ io.Reader, _, stderr io.Writer) error {
	var c runConfig
	fs := newFlagSet("run", stderr)
	c.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mirrorworker run [flags]")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Pulls mirror jobs from JetStream, fetches each URL politely and stores it in the")
		fmt.Fprintln(stderr, "mirror target. Without --nats-url it runs an embedded JetStream server under --data-dir.")
		fmt.Fprintln(stderr, "Every flag can also be set from the environment: --data-dir is MIRRORWORKER_DATA_DIR.")
		fmt.Fprintln(stderr)
		printFlags(fs)
	}
	if err := parseFlags(fs, args, getenv); err != nil {
		return err
	}
	c.explicit, c.getenv = explicitFlags(fs, getenv), getenv
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("run: unexpected arguments %q", fs.Args())}
	}
	if err := c.check(); err != nil {
		return err
	}
	log, err := c.logger(stderr)
	if err != nil {
		return err
	}
	c.stopNow = stopNow
	return runWorker(ctx, &c, log)
}

// runWorker checks everything that can be checked without NATS (data dir,
// target, policy, admin port, embedded port) before anything starts, so that
// a mistake is one clear error; then it runs the admin endpoint and the
// pipeline in one group until ctx is cancelled.
func runWorker(ctx context.Context, c *runConfig, log zerolog.Logger) error {
	hooks := readTestHooks(c.getenv)
	dataDir, lock, target, err := openStore(ctx, c, hooks, log)
	if err != nil {
		return err
	}
	defer lock.Release() // after the embedded server is down (defers run last in, first out)
	stored, closeIndex, err := indexTarget(target, hooks.indexLockWait, log)
	if err != nil {
		return err
	}
	defer closeIndex() // after the worker's last Put
	replayTargets, err := openReplayTargets(ctx, c, hooks, target, log)
	if err != nil {
		return err
	}
	replayTargets.OwnT = stored // replay jobs into the pod's own target keep its index too
	policy, err := c.pacerPolicy()
	if err != nil {
		return err
	}
	reg, conn := c.newRegistry()
	var state atomic.Pointer[liveState]
	var connectErr atomic.Pointer[error] // the last failed connect, for /readyz
	c.nats.onRetry = natsRetryReporter(log, c.nats.url, &connectErr)
	adm, err := startAdmin(c.adminAddr, reg, &state, &connectErr, log)
	if err != nil {
		return err
	}
	defer adm.Close()
	// The embedded server starts here, before the group: it is local, so a
	// failure (port in use, store not writable) is reported at once.
	embedded, err := c.startEmbedded(dataDir, log)
	if err != nil {
		return err
	}
	if embedded != nil {
		// The group shuts the server down in its order (runGroup); this is
		// for a return before the group runs (a second Shutdown is a no-op).
		defer embedded.Shutdown()
		// A second worker refused the data directory reads how to join this one here.
		if err := lock.Record(dirlock.Holder{PID: os.Getpid(), NATSURL: embedded.ClientURL(), AdminURL: adm.URL()}); err != nil {
			return err
		}
		if u := embedded.ClientURL(); u != "" {
			// Commands given this --data-dir find this worker's server.
			removeURL, err := broker.WriteClientURL(dataDir, u)
			if err != nil {
				return err
			}
			defer removeURL()
		}
	}
	p := &natsStage{
		c: c, log: log, reg: reg, conn: conn, target: target, stored: stored, replay: replayTargets, policy: policy,
		embedded: embedded, state: &state, hooks: hooks,
		startFields: func(e *zerolog.Event) *zerolog.Event {
			e = e.Str("mirror", target.Root()).Str("admin_url", adm.URL())
			if embedded != nil {
				e = e.Str("nats_store", filepath.Join(dataDir, "nats"))
			}
			return e
		},
	}
	return runGroup(ctx, adm, embedded, p, c.stopNow, log)
}

// openStore proves the data directory writable, locks it when this worker
// runs the embedded server on it (lockDataDir; the lock is nil with
// --nats-url), and opens the mirror target (by default under it). The
// lock comes before the target: a second worker must not even sweep the
// first one's temporary files.
func openStore(ctx context.Context, c *runConfig, hooks testHooks, log zerolog.Logger) (dataDir string, lock *dirlock.Lock, target storeTarget, err error) {
	if dataDir, err = filepath.Abs(c.dataDir); err != nil {
		return "", nil, nil, fmt.Errorf("data dir: %w", err)
	}
	if err := pipeline.CheckWritableDir(dataDir); err != nil {
		return "", nil, nil, fmt.Errorf("data dir %s: %w (pass --data-dir)", dataDir, err)
	}
	if c.nats.url == "" {
		if lock, err = lockDataDir(dataDir); err != nil {
			return "", nil, nil, err
		}
	}
	spec := c.target
	if spec == "" {
		if spec, err = pipeline.DefaultTarget(dataDir); err != nil {
			lock.Release()
			return "", nil, nil, err
		}
	}
	if target, err = c.targetOpts.openTarget(ctx, spec, hooks.fault, log); err != nil {
		lock.Release()
		return "", nil, nil, err
	}
	return dataDir, lock, target, nil
}

// lockDataDir takes the data directory's lock (broker.StoreLockFile) for
// the embedded server's store: two servers on one store damage it (issue
// 36: "corrupt state file", a consumer past its stream's last sequence).
// Workers that join a deployment with --nats-url take no lock, since they
// may share a data directory as one volume. A directory already locked is
// an error at once that names the holder and how to join it instead.
func lockDataDir(dataDir string) (*dirlock.Lock, error) {
	path := filepath.Join(dataDir, broker.StoreLockFile)
	lock, err := dirlock.Exclusive(path, dirlock.Holder{PID: os.Getpid()})
	var held *dirlock.HeldError
	if !errors.As(err, &held) {
		return lock, err
	}
	who := "another process"
	if held.Holder.PID != 0 {
		who = fmt.Sprintf("the mirrorworker of pid %d", held.Holder.PID)
	}
	join := "then stop it, or pass another --data-dir"
	natsURL := held.Holder.NATSURL
	if natsURL == "" {
		natsURL, _ = broker.ReadClientURL(dataDir)
	}
	if natsURL != "" {
		join = fmt.Sprintf("join it instead with 'mirrorworker run --nats-url %s' (and another --admin-addr), or stop it first", natsURL)
	}
	if held.Holder.AdminURL != "" {
		who += " (admin " + held.Holder.AdminURL + ")"
	}
	return nil, fmt.Errorf("data dir %s is in use by %s, whose embedded NATS server keeps its store there; a second server on that store would damage it: %s", dataDir, who, join)
}

// openReplayTargets opens every --replay-target, as --target is opened
// (proved writable or reachable), keyed by its canonical spec, with the
// pod's own target: for the replay jobs of replays of earlier versions
// (docs/adr/0025), which handed their jobs to the pods. Deprecated
// (docs/adr/0031).
func openReplayTargets(ctx context.Context, c *runConfig, hooks testHooks, own storeTarget, log zerolog.Logger) (*pipeline.ReplayTargets, error) {
	r := &pipeline.ReplayTargets{Own: pipeline.TargetSpec(own.Root()), OwnT: own, Allowed: map[string]worker.Target{}}
	if len(c.replayTargets) > 0 {
		log.Warn().Strs("replay_targets", c.replayTargets).Msg("--replay-target is deprecated: a replay of this version stores its jobs itself, each start granted by the pods, and needs no pod to reach its target (docs/adr/0031); the flag serves only replays of earlier versions, and goes in the next release")
	}
	for _, spec := range c.replayTargets {
		t, err := c.targetOpts.openTarget(ctx, spec, hooks.fault, log)
		if err != nil {
			return nil, fmt.Errorf("--replay-target %s: %w", spec, err)
		}
		r.Allowed[pipeline.TargetSpec(t.Root())] = t
	}
	return r, nil
}

// newRegistry is the process's metric registry with the collectors every
// worker has, and the NATS connection's collector, set once connected.
func (c *runConfig) newRegistry() (*metricRegistry, *broker.ConnCollector) {
	reg := newMetricRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(newBuildInfo(version))
	conn := broker.NewConnCollector()
	reg.MustRegister(conn)
	if c.onRegistry != nil {
		c.onRegistry(reg)
	}
	return reg, conn
}

// startAdmin binds the admin endpoint before anything starts, so that a
// port in use is one clear error; it serves what state holds once the
// worker is wired, and says "starting" until then.
func startAdmin(addr string, reg *metricRegistry, state *atomic.Pointer[liveState], connectErr *atomic.Pointer[error], log zerolog.Logger) (*admin.Server, error) {
	ready := func() error {
		s := state.Load()
		if s == nil {
			return startingError(connectErr.Load())
		}
		return s.ready()
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "mirrorworker_ready",
		Help: "1 when /readyz answers 200 (NATS connected, consumer bound, mirror target working), else 0.",
	}, func() float64 {
		if ready() != nil {
			return 0
		}
		return 1
	}))
	adm, err := admin.Listen(addr, admin.New(&admin.Options{
		Gatherer: reg,
		Ready:    ready,
		Pacer: func() []pacer.State {
			if s := state.Load(); s != nil {
				return s.pacer.Snapshot(clock.Real{}.Now())
			}
			return nil
		},
		Parked: func() map[string]int64 {
			if s := state.Load(); s != nil && s.parked != nil {
				return s.parked()
			}
			return nil
		},
		Fetches: func() map[string][]fetch.Progress {
			s := state.Load()
			if s == nil || s.fetches == nil {
				return nil
			}
			out := map[string][]fetch.Progress{}
			for _, f := range s.fetches(clock.Real{}.Now()) {
				k := s.pacer.PaceKey(f.Authority)
				out[k] = append(out[k], f)
			}
			return out
		},
		Logger: log,
	}))
	if err != nil {
		return nil, fmt.Errorf("%w (pass --admin-addr)", err)
	}
	adm.LogErrorsTo(log)
	log.Debug().Str("admin_url", adm.URL()).Msg("admin endpoint listening")
	return adm, nil
}

// startEmbedded starts the embedded NATS server under dataDir, unless
// --nats-url names a deployment (then it returns nil).
func (c *runConfig) startEmbedded(dataDir string, log zerolog.Logger) (*broker.Embedded, error) {
	if c.nats.url != "" {
		if c.explicit["embedded-listen"] {
			log.Warn().Msg("--embedded-listen is ignored with --nats-url")
		}
		return nil, nil
	}
	if c.embeddedListen != "" {
		if err := checkPortFree(c.embeddedListen); err != nil {
			return nil, fmt.Errorf("embedded NATS %s: %w (is another mirrorworker or nats-server running? pass --embedded-listen or --nats-url)", c.embeddedListen, err)
		}
	}
	return broker.StartEmbedded(broker.EmbeddedOptions{
		StoreDir: filepath.Join(dataDir, "nats"),
		Listen:   c.embeddedListen,
		Logger:   log.With().Str("component", "nats-server").Logger(),
	})
}

// runGroup runs the process's parts in one group (pipeline.NewGroup) until
// ctx ends or one of them returns, and stops them in the pipeline's order
// (pipeline.StageAdmission has the table): the pod's parts, which natsStage
// adds once NATS is reached, then the NATS connection, the embedded server
// (nil with --nats-url) and last the admin endpoint.
//
// A stop ended at once by stopNow (a second signal) is an error: the
// operator cut the grace short, and the jobs in flight were handed back
// unfinished.
func runGroup(ctx context.Context, adm *admin.Server, embedded *broker.Embedded, p *natsStage, stopNow <-chan struct{}, log zerolog.Logger) error {
	g := pipeline.NewGroup(log)
	// The admin endpoint serves from the start, so /healthz answers and
	// /readyz says why not while NATS is being reached.
	g.Add(pipeline.StageAdmin, "admin endpoint", func(actx context.Context) error {
		if err := adm.Run(actx); err != nil {
			return err
		}
		if actx.Err() == nil {
			return errors.New("admin endpoint stopped")
		}
		return nil
	})
	if embedded != nil {
		// Down only once the connection has flushed the worker's last acks.
		g.Add(pipeline.StageServer, "embedded NATS server", func(sctx context.Context) error {
			<-sctx.Done()
			embedded.Shutdown()
			return nil
		})
	}
	g.Add(pipeline.StageConn, "NATS connection", func(cctx context.Context) error { return p.run(cctx, g) })
	var began time.Time
	// The first stage: says what the stop does, as it begins.
	g.Add(pipeline.StageAdmission, "stop plan", func(sctx context.Context) error {
		<-sctx.Done()
		began = time.Now()
		then := "its leases and pacer facts, the NATS connection"
		if embedded != nil {
			then += ", the embedded NATS server"
		}
		log.Info().Str("grace", p.c.shutdownGrace.String()).
			Msgf("stopping: the worker first (it takes no new job; fetches in flight get up to %s, then its held jobs are handed back), then %s, and the admin endpoint last",
				p.c.shutdownGrace, then)
		return nil
	})
	err := g.Run(ctx)
	if ctx.Err() != nil {
		// Asked to stop: the stop is graceful unless the worker failed,
		// including while stopping.
		if err != nil {
			return err
		}
		select {
		case <-stopNow:
			return errors.New("stopped at once by a second signal: the jobs in flight were handed back unfinished, for redelivery now")
		default:
		}
		log.Info().Str("took", time.Since(began).Round(time.Millisecond).String()).Msg("mirrorworker stopped")
		return nil
	}
	return err
}

// natsStage is the part of the worker that needs NATS: streams, consumer,
// pacer, fetcher and the consume loop. It runs as the NATS connection's
// actor of run's group, and adds the pod's parts to that group once wired.
type natsStage struct {
	c        *runConfig
	log      zerolog.Logger
	reg      prometheus.Registerer
	conn     *broker.ConnCollector
	target   storeTarget
	stored   worker.Target // target, keeping its sha256 index (sumindex.go)
	replay   *pipeline.ReplayTargets
	policy   *pacer.Policy
	embedded *broker.Embedded // nil: join c.nats.url
	state    *atomic.Pointer[liveState]
	hooks    testHooks
	// startFields adds what the start line tells a newcomer beyond NATS.
	startFields func(*zerolog.Event) *zerolog.Event
}

// run connects and wires the pod, adds its parts to g (pipeline.Pod.Add),
// and holds the connection until ctx ends, which is once the pod's parts
// have returned (the group's order); then it flushes the last acks and
// closes. It returns nil after a stop asked for by ctx, even one during
// start-up.
func (p *natsStage) run(ctx context.Context, g *lifecycle.Group) error {
	c, log := p.c, p.log
	nc, natsURL, err := p.connect(ctx)
	if err != nil {
		return stoppedOr(ctx, err)
	}
	defer func() {
		// The acks and NAKs of the last jobs may still be buffered.
		if err := nc.FlushTimeout(5 * time.Second); err != nil {
			log.Warn().Err(err).Msg("flush NATS at exit")
		}
		nc.Close()
	}()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	if err := jobs.EnsureStreams(ctx, js, c.streamOptions()); err != nil {
		return stoppedOr(ctx, fmt.Errorf("ensure streams: %w", replicasHint(err, c.streamReplicas)))
	}
	parts, err := pipeline.New(js, c.pipelineConfig(p.reg, p.policy, log))
	if err != nil {
		return err
	}
	defer parts.Close()
	if err := registerPacerMetrics(p.reg, parts.Pacer); err != nil {
		return err
	}
	// The pods of `mirrorworker loadtest` record when each request leaves,
	// so the load test can time departures across processes; nil otherwise.
	depLog, err := departures.Open(p.hooks.departures)
	if err != nil {
		return err
	}
	defer depLog.Close()
	pod, err := parts.StartPod(ctx, p.podOptions(depLog))
	if err != nil {
		return stoppedOr(ctx, replicasHint(err, c.streamReplicas))
	}
	if err := p.reg.Register(broker.NewConsumerLagCollector(js, broker.ConsumerLagOptions{
		Consumers: func() []broker.ConsumerRef { return consumerRefs(pod, c.consumerOptions()) },
	})); err != nil {
		return fmt.Errorf("register consumer lag: %w", err)
	}
	w := pod.Worker
	p.state.Store(&liveState{pacer: parts.Pacer, ready: func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("NATS connection %s", strings.ToLower(nc.Status().String()))
		}
		if err := w.Ready(); err != nil {
			return err
		}
		return pod.Serving() // readiness means serving its share (docs/adr/0007)
	}, parked: w.Parked, fetches: w.Fetches})
	if err := pod.Add(ctx, g); err != nil {
		if errors.Is(err, lifecycle.ErrStopping) {
			return nil // a stop asked for during start-up
		}
		return err
	}
	p.logStart(natsURL, pod.Partitions)
	<-ctx.Done()
	return nil
}

// podReconnectWait is how long a pod waits between attempts to reconnect
// to a NATS deployment.
const podReconnectWait = 250 * time.Millisecond

// connect joins the embedded server or the deployment of --nats-url.
func (p *natsStage) connect(ctx context.Context) (nc *nats.Conn, natsURL string, err error) {
	name := "mirrorworker " + p.c.workerID
	if p.embedded != nil {
		nc, err = p.embedded.Connect(name, natsLogHandlers(p.log)...)
		natsURL = p.embedded.ClientURL()
	} else {
		natsURL = broker.RedactURL(p.c.nats.url)
		p.log.Info().Str("nats_url", natsURL).Msg("connecting to NATS")
		// A link that comes back is rejoined within a quarter second (not
		// nats.go's 2 s), so that the pacer facts the pod could not publish
		// meanwhile reach the pod that took its partitions over while that
		// pod still holds their first requests (docs/adr/0007).
		opts := append(natsLogHandlers(p.log), nats.ReconnectWait(podReconnectWait))
		nc, err = p.c.nats.connect(ctx, name, opts...)
	}
	if err != nil {
		return nil, "", err
	}
	p.conn.SetConn(nc)
	return nc, natsURL, nil
}

// streamOptions are the streams' settings from the flags.
func (c *runConfig) streamOptions() *jobs.StreamOptions {
	so := &jobs.StreamOptions{Replicas: c.streamReplicas, JobsMaxAge: c.jobsMaxAge, JobsMaxBytes: int64(c.jobsMaxBytes)}
	if c.explicit["partitions"] && c.partitions > 0 {
		so.Partitions = c.partitions
	}
	return so
}

// consumerOptions are the consumers' settings from the flags.
func (c *runConfig) consumerOptions() *jobs.ConsumerOptions {
	return &jobs.ConsumerOptions{AckWait: c.ackWait, MaxAckPending: c.maxAckPending, Replicas: c.streamReplicas}
}

// podOptions bind the worker as the flags say, with the test hooks.
func (p *natsStage) podOptions(depLog *departures.Log) *pipeline.PodOptions {
	c := p.c
	o := &pipeline.PodOptions{
		Consumer: c.consumerOptions(), LeaseTTL: c.leaseTTL, Replicas: c.streamReplicas,
		ParkAfter: c.parkAfter, LaneBacklog: c.laneBacklog,
		PodID: c.workerID, Version: version, Target: p.stored, ReplayTargets: p.replay, ShutdownGrace: c.shutdownGrace,
		Logger: p.log,
		Adjust: func(o *worker.Options, d *worker.Deps) {
			o.StopNow = c.stopNow
			d.Fetcher, d.Pacer = depLog.Wrap(d.Fetcher, d.Pacer)
			p.hooks.adjust(o, d)
		},
	}
	if c.partitions > 0 {
		o.Partitions = c.partitions
	}
	return o
}

// registerPacerMetrics registers the gauges read from the pacer.
func registerPacerMetrics(reg prometheus.Registerer, pc *pacer.Pacer) error {
	if err := worker.RegisterPacerGauge(reg, pc.Counts, clock.Real{}); err != nil {
		return err
	}
	if err := reg.Register(worker.NewCoolingCollector(pc.Snapshot, clock.Real{})); err != nil {
		return fmt.Errorf("register cooling gauge: %w", err)
	}
	return nil
}

// consumerRefs are the consumers the pod pulls, for the consumer lag
// metrics: the partitions it serves, or the one shared consumer.
func consumerRefs(pod *pipeline.Pod, co *jobs.ConsumerOptions) []broker.ConsumerRef {
	if pod.Partitions == 0 {
		return []broker.ConsumerRef{{Stream: jobs.JobsStream, Consumer: jobs.ConsumerConfig(co).Durable}}
	}
	var refs []broker.ConsumerRef
	for _, part := range pod.Owned() {
		refs = append(refs, broker.ConsumerRef{Stream: jobs.JobsStream, Consumer: jobs.PartitionConsumer(part)})
	}
	return refs
}

// logStart writes the start line: where a newcomer finds things.
func (p *natsStage) logStart(natsURL string, partitions int) {
	ev := p.startFields(p.log.Info())
	switch {
	case p.embedded == nil:
		ev = ev.Str("nats_url", natsURL)
	case natsURL == "":
		ev = ev.Str("nats_url", "in-process only (--embedded-listen is empty)")
	default:
		ev = ev.Str("nats_url", natsURL).Str("enqueue", "mirrorworker enqueue --nats-url "+natsURL+" URL...")
	}
	ev = ev.Int("concurrency", p.c.concurrency).Str("floor", p.c.floor.String())
	if partitions > 0 {
		ev = ev.Int("partitions", partitions).Str("pod", p.c.workerID)
	}
	ev.Msg(startMessage)
}

// liveState is what the admin endpoint reads once the worker is wired.
type liveState struct {
	pacer  *pacer.Pacer
	ready  func() error
	parked func() map[string]int64 // parked jobs per authority
	// fetches are the fetches in flight at an instant (Worker.Fetches).
	fetches func(time.Time) []fetch.Progress
}

// stoppedOr returns nil when ctx was cancelled (a stop asked for during
// start-up is not an error), else err.
func stoppedOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// natsLogHandlers reports connection trouble, which the worker otherwise
// only sees as stalled pulls, and every asynchronous error of nats.go,
// through the worker's logger (never as plain text on stderr).
func natsLogHandlers(log zerolog.Logger) []nats.Option {
	return broker.ClientLogOptions(log)
}

// checkPortFree reports an address in use. The embedded server would only
// time out on one, which tells the operator nothing.
func checkPortFree(addr string) error {
	if _, port, _ := net.SplitHostPort(addr); port == "0" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return ln.Close()
}

// byteSize is a flag of bytes: a plain integer or one with a unit
// (bytesize.Parse: KB, MB, GB, TB in powers of 1000; KiB, MiB, GiB, TiB in
// powers of 1024).
type byteSize int64

// String is the size with the largest binary unit that divides it exactly
// (16GiB, 1500B), so that help and errors read as people write sizes.
func (b *byteSize) String() string { return bytesize.Format(int64(*b)) }

func (b *byteSize) Set(s string) error {
	n, err := bytesize.Parse(s)
	if err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), bytesize.ErrSyntax.Error()+": "))
	}
	*b = byteSize(n)
	return nil
}

// rateFlag is a flag of bytes per second (bytesize.ParseRate: 1MiB/s,
// 500KB/s, a plain number); 0 is none.
type rateFlag int64

func (r *rateFlag) String() string {
	if r == nil || *r == 0 {
		return "0"
	}
	return bytesize.FormatRate(int64(*r))
}

func (r *rateFlag) Set(s string) error {
	n, err := bytesize.ParseRate(s)
	if err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), bytesize.ErrSyntax.Error()+": "))
	}
	*r = rateFlag(n)
	return nil
}

// laneBacklogFlag is --lane-backlog: a count of jobs, 0 for no lanes. It
// stores worker.Options.LaneBacklog's meaning (negative: no lanes), so that
// the value means one thing past the flag parser.
type laneBacklogFlag int

func (f *laneBacklogFlag) String() string {
	if f == nil || *f < 0 {
		return "0"
	}
	return strconv.Itoa(int(*f))
}

func (f *laneBacklogFlag) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 {
		return fmt.Errorf("%q: want 0 (no lanes) or a number of jobs", s)
	}
	if n == 0 {
		n = -1
	}
	*f = laneBacklogFlag(n)
	return nil
}
