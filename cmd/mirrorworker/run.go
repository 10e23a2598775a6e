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
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	oklogrun "github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/admin"
	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/cluster"
	"github.com/mirrorworker/mirrorworker/facts"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/loadtest"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/pipeline"
	"github.com/mirrorworker/mirrorworker/policy"
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

	workerFlags
	shutdownGrace  time.Duration
	jobsMaxAge     time.Duration
	jobsMaxBytes   byteSize
	streamReplicas int

	partitions  int
	leaseTTL    time.Duration
	parkAfter   time.Duration
	laneBacklog int

	// onRegistry, when set (tests), is handed the metric registry before
	// anything is registered with it but the process collectors.
	onRegistry func(*metricRegistry)
}

func (c *runConfig) register(fs *flag.FlagSet) {
	c.nats.register(fs, "NATS server URL(s) of an existing deployment; empty starts an embedded JetStream server")
	fs.StringVar(&c.dataDir, "data-dir", "./data", "directory for the embedded JetStream store (<data-dir>/nats) and the default mirror (<data-dir>/mirror)")
	fs.StringVar(&c.embeddedListen, "embedded-listen", "127.0.0.1:4222", "client address of the embedded NATS server, for enqueue and the nats CLI; empty: in-process only; port 0: any free port")
	fs.StringVar(&c.target, "target", "", "mirror target: file:///abs/dir or a directory (default file://<data-dir>/mirror)")
	fs.StringVar(&c.adminAddr, "admin-addr", admin.DefaultAddr, "address of the admin HTTP endpoint (/metrics, /healthz, /readyz, /debug/pacer): all interfaces by default so that kubelet probes and Prometheus reach it in a pod; 127.0.0.1:"+admin.DefaultPort+" keeps it on the host; port 0: any free port (env MIRRORWORKER_ADMIN_ADDR)")

	c.workerFlags.register(fs, workerDefaults{
		policyHelp:        "policy file of per-authority floors and in-flight caps",
		ackWaitHelp:       "consumer AckWait: an unacknowledged job is redelivered after this",
		maxAckPendingHelp: "consumer MaxAckPending: jobs delivered and not yet acknowledged, across all workers",
		workerIDHelp:      "name of this worker in logs, events and NATS (default <hostname>-<pid>)",
		logFormat:         "json",
		logLevel:          "info",
	})
	fs.DurationVar(&c.shutdownGrace, "shutdown-grace", 20*time.Second, "on SIGTERM, time for in-flight jobs to finish before they are handed back")
	fs.DurationVar(&c.jobsMaxAge, "jobs-max-age", jobs.DefaultJobsMaxAge, "MaxAge of the MIRROR_JOBS stream")
	fs.Var(&c.jobsMaxBytes, "jobs-max-bytes", "MaxBytes of the MIRROR_JOBS stream, a `size` in bytes or with a unit (50GiB); 0: unlimited")
	fs.IntVar(&c.partitions, "partitions", jobs.DefaultPartitions, "partitions of MIRROR_JOBS: authorities are split among them and each is served by one pod at a time, so that pods sharing a NATS keep one pace per origin; fixed once the stream has them, at most the useful number of pods. 0: the single shared consumer of earlier versions, for one pod only")
	fs.DurationVar(&c.leaseTTL, "lease-ttl", jobs.DefaultLeaseTTL, "life of a partition lease without renewal: a killed pod's partitions move to the others after about this long (set when the leases bucket is created)")
	fs.IntVar(&c.laneBacklog, "lane-backlog", worker.DefaultLaneBacklog, "when a partition has at least this many jobs queued and one of its authorities must wait longer than --park-after, that authority's backlog moves to a lane (a consumer of its own, pulled when it can take requests) and the partition goes on past it without reading it; 0: no lanes, the backlog is parked job by job")
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
	if c.laneBacklog < 0 {
		bad("--lane-backlog %d: want 0 (no lanes) or more", c.laneBacklog)
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
func cmdRun(ctx context.Context, args []string, getenv func(string) string, _ io.Reader, _, stderr io.Writer) error {
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
	c.explicit = explicitFlags(fs, getenv)
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
	return runWorker(ctx, &c, log)
}

// runWorker checks everything that can be checked without NATS (data dir,
// target, policy, admin port, embedded port) before anything starts, so that
// a mistake is one clear error; then it runs the admin endpoint and the
// pipeline in one group until ctx is cancelled.
func runWorker(ctx context.Context, c *runConfig, log zerolog.Logger) error {
	dataDir, err := filepath.Abs(c.dataDir)
	if err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	if err := pipeline.CheckWritableDir(dataDir); err != nil {
		return fmt.Errorf("data dir %s: %w (pass --data-dir)", dataDir, err)
	}
	targetSpec := c.target
	if targetSpec == "" {
		if targetSpec, err = pipeline.DefaultTarget(dataDir); err != nil {
			return err
		}
	}
	target, err := openTarget(targetSpec)
	if err != nil {
		return err
	}
	mirrorRoot := target.Root()

	policy, err := c.pacerPolicy()
	if err != nil {
		return err
	}

	reg := newMetricRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(newBuildInfo(version))
	conn := broker.NewConnCollector()
	reg.MustRegister(conn)
	if c.onRegistry != nil {
		c.onRegistry(reg)
	}

	// The admin endpoint is bound before anything starts, so that a port in
	// use is one clear error.
	var state atomic.Pointer[liveState]
	ready := func() error {
		s := state.Load()
		if s == nil {
			return errors.New("starting: connecting to NATS and binding the consumer")
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
	adm, err := admin.Listen(c.adminAddr, admin.New(&admin.Options{
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
		Logger: log,
	}))
	if err != nil {
		return fmt.Errorf("%w (pass --admin-addr)", err)
	}
	defer adm.Close()
	adm.LogErrorsTo(log)
	log.Debug().Str("admin_url", adm.URL()).Msg("admin endpoint listening")

	// The embedded server starts here, before the group: it is local, so a
	// failure (port in use, store not writable) is reported at once.
	var embedded *broker.Embedded
	if c.nats.url == "" {
		if c.embeddedListen != "" {
			if err := checkPortFree(c.embeddedListen); err != nil {
				return fmt.Errorf("embedded NATS %s: %w (is another mirrorworker or nats-server running? pass --embedded-listen or --nats-url)", c.embeddedListen, err)
			}
		}
		embedded, err = broker.StartEmbedded(broker.EmbeddedOptions{
			StoreDir: filepath.Join(dataDir, "nats"),
			Listen:   c.embeddedListen,
			Logger:   log.With().Str("component", "nats-server").Logger(),
		})
		if err != nil {
			return err
		}
		defer embedded.Shutdown() // after the group: the worker acks until its last job
	} else if c.explicit["embedded-listen"] {
		log.Warn().Msg("--embedded-listen is ignored with --nats-url")
	}

	p := &natsStage{
		c: c, log: log, reg: reg, conn: conn, target: target, policy: policy,
		embedded: embedded, state: &state,
		startFields: func(e *zerolog.Event) *zerolog.Event {
			e = e.Str("mirror", mirrorRoot).Str("admin_url", adm.URL())
			if embedded != nil {
				e = e.Str("nats_store", filepath.Join(dataDir, "nats"))
			}
			return e
		},
	}

	// One run group owns every long-running part; the first to return stops
	// the others. The process context (SIGTERM, SIGINT) is one of them.
	var (
		g       oklogrun.Group
		pipeErr error // set by the pipeline actor before it returns
	)
	g.Add(oklogrun.ContextHandler(ctx))
	{
		// The admin endpoint serves from the start, so /healthz answers and
		// /readyz says why not while NATS is being reached.
		actx, cancel := context.WithCancel(context.Background())
		g.Add(func() error {
			if err := adm.Run(actx); err != nil {
				return err
			}
			return errors.New("admin endpoint stopped")
		}, func(error) { cancel() })
	}
	{
		pctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error {
			pipeErr = p.run(pctx)
			if pipeErr == nil && pctx.Err() == nil {
				pipeErr = errors.New("worker stopped on its own")
			}
			return pipeErr
		}, func(error) { cancel() })
	}
	err = g.Run()
	if ctx.Err() != nil {
		// Asked to stop: the stop is graceful unless the worker failed,
		// including while stopping.
		if pipeErr != nil {
			return pipeErr
		}
		log.Info().Msg("mirrorworker stopped")
		return nil
	}
	return err
}

// natsStage is the part of the worker that needs NATS: streams, consumer,
// pacer, fetcher and the consume loop. It runs as one actor of run's group.
type natsStage struct {
	c        *runConfig
	log      zerolog.Logger
	reg      prometheus.Registerer
	conn     *broker.ConnCollector
	target   *mirror.FileTarget
	policy   *pacer.Policy
	embedded *broker.Embedded // nil: join c.nats.url
	state    *atomic.Pointer[liveState]
	// startFields adds what the start line tells a newcomer beyond NATS.
	startFields func(*zerolog.Event) *zerolog.Event
}

// run connects, wires and runs the worker until ctx is cancelled, then stops
// it gracefully. It returns nil after a stop asked for by ctx, even one
// during start-up.
func (p *natsStage) run(ctx context.Context) error {
	c, log := p.c, p.log
	name := "mirrorworker " + c.workerID
	var (
		nc      *nats.Conn
		natsURL string
		err     error
	)
	if p.embedded != nil {
		natsURL = p.embedded.ClientURL()
		nc, err = p.embedded.Connect(name, natsLogHandlers(log)...)
	} else {
		natsURL = broker.RedactURL(c.nats.url)
		log.Info().Str("nats_url", natsURL).Msg("connecting to NATS")
		nc, err = c.nats.connect(ctx, name, natsLogHandlers(log)...)
	}
	if err != nil {
		return stoppedOr(ctx, err)
	}
	p.conn.SetConn(nc)
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
	so := &jobs.StreamOptions{
		Replicas:     c.streamReplicas,
		JobsMaxAge:   c.jobsMaxAge,
		JobsMaxBytes: int64(c.jobsMaxBytes),
	}
	if c.explicit["partitions"] && c.partitions > 0 {
		so.Partitions = c.partitions
	}
	if err := jobs.EnsureStreams(ctx, js, so); err != nil {
		return stoppedOr(ctx, fmt.Errorf("ensure streams: %w", replicasHint(err, c.streamReplicas)))
	}
	consOpts := &jobs.ConsumerOptions{
		AckWait:       c.ackWait,
		MaxAckPending: c.maxAckPending,
		Replicas:      c.streamReplicas,
	}
	var (
		cons       jetstream.Consumer
		partitions int
		mgrp       atomic.Pointer[cluster.Manager] // set once the manager is built
		// The consumers this worker pulls from, for the consumer lag
		// metrics: the partitions it serves, or the one shared consumer.
		consumerRefs = func() []broker.ConsumerRef {
			return []broker.ConsumerRef{{Stream: jobs.JobsStream, Consumer: jobs.ConsumerConfig(consOpts).Durable}}
		}
	)
	if c.partitions > 0 {
		if err := jobs.CheckServer(nc); err != nil {
			return err
		}
		wo := jobs.WorkOptions{LeaseTTL: c.leaseTTL, Replicas: c.streamReplicas, Consumer: consOpts}
		if partitions, err = jobs.EnsureWork(ctx, js, &wo); err != nil {
			return stoppedOr(ctx, fmt.Errorf("ensure work streams: %w", replicasHint(err, c.streamReplicas)))
		}
		consumerRefs = func() []broker.ConsumerRef {
			var refs []broker.ConsumerRef
			if mgr := mgrp.Load(); mgr != nil {
				for _, p := range mgr.Owned() {
					refs = append(refs, broker.ConsumerRef{Stream: jobs.JobsStream, Consumer: jobs.PartitionConsumer(p)})
				}
			}
			return refs
		}
	} else if cons, err = jobs.EnsureConsumer(ctx, js, consOpts); err != nil {
		return stoppedOr(ctx, fmt.Errorf("ensure consumer: %w", replicasHint(err, c.streamReplicas)))
	}
	if err := p.reg.Register(broker.NewConsumerLagCollector(js, broker.ConsumerLagOptions{
		Consumers: func() []broker.ConsumerRef { return consumerRefs() },
	})); err != nil {
		return fmt.Errorf("register consumer lag: %w", err)
	}

	parts, err := pipeline.New(js, c.pipelineConfig(p.reg, p.policy, log))
	if err != nil {
		return err
	}
	defer parts.Close()
	// The pods of `mirrorworker loadtest` record when each request leaves,
	// so the load test can time departures across processes; nil otherwise.
	departures, err := loadtest.OpenDepartureLog(os.Getenv(loadtest.DeparturesEnv))
	if err != nil {
		return err
	}
	defer departures.Close()
	pc := parts.Pacer
	if err := worker.RegisterPacerGauge(p.reg, pc.Counts, clock.Real{}); err != nil {
		return err
	}
	if err := p.reg.Register(worker.NewCoolingCollector(pc.Snapshot, clock.Real{})); err != nil {
		return fmt.Errorf("register cooling gauge: %w", err)
	}
	// The live policy (MIRROR_POLICY) over --policy/--floor/--max-in-flight,
	// loaded before any request and followed while the pod runs.
	livePolicy, err := policy.Open(ctx, js, policy.Options{Base: p.policy, Apply: pc.SetPolicy,
		Replicas: c.streamReplicas, Registerer: p.reg, Logger: log})
	if err != nil {
		return stoppedOr(ctx, fmt.Errorf("live policy: %w", err))
	}
	var follow pipeline.Actor
	if partitions > 0 {
		// Other pods' facts and operators' pauses, live; started before the
		// restore so that nothing published in between is missed.
		if follow, err = parts.Follow(js, c.workerID, log); err != nil {
			return stoppedOr(ctx, err)
		}
	}
	// Cold start: come up with the cooldowns and intervals this worker (or
	// another) learned recently, so a restart is never ruder than before.
	// Starting without them would be, so a read error is fatal.
	if _, err := facts.Restore(ctx, js, pc, facts.RestoreOptions{Logger: log}); err != nil {
		return stoppedOr(ctx, fmt.Errorf("restore pacer state: %w", err))
	}
	w, err := parts.NewWorker(cons, p.target, c.shutdownGrace, func(o *worker.Options, d *worker.Deps) {
		d.Fetcher = departures.Fetcher(d.Fetcher)
		if partitions > 0 {
			o.Partitions, o.ParkAfter = partitions, c.parkAfter
			o.LaneBacklog = c.laneBacklog
			if o.LaneBacklog == 0 {
				o.LaneBacklog = -1
			}
			if legacy, err := js.Consumer(ctx, jobs.JobsStream, jobs.ConsumerName); err == nil {
				d.Legacy = legacy // EnsureWork narrowed it to the unpartitioned jobs
			}
			o.FaultHook = faultHook(os.Getenv(faultEnv))
			d.Owns = func(p int) bool { m := mgrp.Load(); return m != nil && m.Owns(p) }
		}
	})
	if err != nil {
		return err
	}
	livePolicy.OnChange(w.Repace) // jobs waiting on a floor just lowered ask again
	var mgr *cluster.Manager
	if partitions > 0 {
		if mgr, err = p.newManager(ctx, js, w, pc, partitions, consOpts); err != nil {
			return stoppedOr(ctx, err)
		}
		mgrp.Store(mgr)
	}
	p.state.Store(&liveState{pacer: pc, ready: func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("NATS connection %s", strings.ToLower(nc.Status().String()))
		}
		return w.Ready()
	}, parked: w.Parked})

	ev := p.startFields(log.Info())
	switch {
	case p.embedded == nil:
		ev = ev.Str("nats_url", natsURL)
	case natsURL == "":
		ev = ev.Str("nats_url", "in-process only (--embedded-listen is empty)")
	default:
		ev = ev.Str("nats_url", natsURL).Str("enqueue", "mirrorworker enqueue --nats-url "+natsURL+" URL...")
	}
	ev = ev.Int("concurrency", c.concurrency).Str("floor", c.floor.String())
	if partitions > 0 {
		ev = ev.Int("partitions", partitions).Str("pod", c.workerID)
	}
	ev.Msg(startMessage)

	// The worker, the event sink and, in a cluster, the lease manager and
	// the event follower, in the pipeline's stop order (pipeline.Run): the
	// worker stops first (stop pulling, finish or hand back in-flight jobs
	// within --shutdown-grace); the sink and the manager only after it, so
	// that pacer facts learned during the grace period are still published
	// and leases are kept until every held job is handed back.
	ro := &pipeline.RunOptions{}
	if mgr != nil {
		ro.Stopping = mgr.StopTaking // a stopping pod takes no partition another pod just gave up
		ro.Trailing = append(ro.Trailing, func(mctx context.Context) error {
			// Leases are taken once the worker runs, so a partition taken
			// is served at once.
			for w.Ready() != nil && mctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			err := mgr.Run(mctx)
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if cerr := mgr.Close(cctx); cerr != nil {
				log.Warn().Err(cerr).Msg("give up leases at exit (they expire by themselves)")
			}
			return err
		})
		ro.Actors = append(ro.Actors, follow)
	}
	policyCtx, stopPolicy := context.WithCancel(context.Background())
	defer stopPolicy()
	ro.Actors = append(ro.Actors, pipeline.Actor{Execute: func() error { return livePolicy.Run(policyCtx) }, Interrupt: func(error) { stopPolicy() }})
	return parts.Run(ctx, func(wctx context.Context) error {
		err := w.Run(wctx)
		switch {
		case err != nil:
			return fmt.Errorf("worker: %w", err)
		case wctx.Err() == nil:
			return errors.New("worker: stopped on its own")
		}
		return nil
	}, ro)
}

// liveState is what the admin endpoint reads once the worker is wired.
type liveState struct {
	pacer  *pacer.Pacer
	ready  func() error
	parked func() map[string]int64 // parked jobs per authority
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
// (KB, MB, GB, TB in powers of 1000; KiB, MiB, GiB, TiB in powers of 1024).
type byteSize int64

// String is the size with the largest binary unit that divides it exactly
// (16GiB, 1500B), so that help and errors read as people write sizes.
func (b *byteSize) String() string {
	n := int64(*b)
	for _, u := range []struct {
		name string
		mult int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

func (b *byteSize) Set(s string) error {
	s = strings.TrimSpace(s)
	num := strings.TrimRightFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	unit := strings.TrimSpace(s[len(num):])
	mult, ok := map[string]int64{
		"": 1, "B": 1,
		"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
		"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
	}[unit]
	if !ok {
		return fmt.Errorf("unit %q: want B, KB, MB, GB, TB, KiB, MiB, GiB or TiB", unit)
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return fmt.Errorf("%q: want a number of bytes, e.g. 16GiB", s)
	}
	if n > 0 && n > (1<<63-1)/mult {
		return fmt.Errorf("%q: too large", s)
	}
	*b = byteSize(n * mult)
	return nil
}

// newManager builds the lease manager of a partitioned worker: a partition
// taken gets its consumer and is added to the worker; one given up is
// removed (its jobs handed back, its requests ended) before the lease goes.
func (p *natsStage) newManager(ctx context.Context, js jetstream.JetStream, w *worker.Worker, pc *pacer.Pacer, partitions int, consOpts *jobs.ConsumerOptions) (*cluster.Manager, error) {
	leases, err := js.KeyValue(ctx, jobs.LeasesBucket)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", jobs.LeasesBucket, err)
	}
	pods, err := js.KeyValue(ctx, jobs.PodsBucket)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", jobs.PodsBucket, err)
	}
	var mgr *cluster.Manager
	hooks := &podHooks{js: js, w: w, pc: pc, pod: p.c.workerID, consOpts: consOpts, mgr: func() *cluster.Manager { return mgr }}
	mgr, err = cluster.New(cluster.KV{KeyValue: leases}, cluster.KV{KeyValue: pods}, hooks, cluster.Options{
		PodID: p.c.workerID, Partitions: partitions, TTL: p.c.leaseTTL, Logger: p.log,
	})
	return mgr, err
}

// podHooks connect the lease manager to the worker.
type podHooks struct {
	js       jetstream.JetStream
	w        *worker.Worker
	pc       *pacer.Pacer
	pod      string
	consOpts *jobs.ConsumerOptions
	mgr      func() *cluster.Manager
}

func (h *podHooks) Acquired(ctx context.Context, p int, since time.Time) error {
	// EnsureWork created every partition's consumer; bind to it (and
	// apply changed settings).
	c, err := jobs.EnsurePartitionConsumer(ctx, h.js, p, h.consOpts, 0)
	if err != nil {
		return err
	}
	return h.w.AddPartition(p, c, since)
}

func (h *podHooks) Release(ctx context.Context, p int) { h.w.RemovePartition(ctx, p) }

func (h *podHooks) Status() []byte {
	var owned []int
	if m := h.mgr(); m != nil {
		owned = m.Owned()
	}
	return h.w.StatusJSON(h.pod, version, owned, h.pc.Snapshot(time.Now()))
}

// faultEnv names a parking step, or a step of the mirror target's Put
// (mirror.Fault*), at which the process kills itself with SIGKILL, for the
// crash tests (never a flag: it is not a MIRRORWORKER_
// variable, and only tests set it).
const faultEnv = "MW_FAULT_POINT"

func faultHook(point string) func(string) {
	if point == "" {
		return nil
	}
	return func(p string) {
		if p == point {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never continue past the fault point
		}
	}
}
