// Package pipeline builds and runs a worker pipeline, the one way every
// command does (mirrorworker run, replay and the load test's in-process
// workers): the metrics, the event sink that logs, counts and publishes the
// pacer's facts, the HostPacer, the bandwidth caps, the fetch client and the
// worker, and the order in which they stop; and a pod's start-up (StartPod:
// consumers, the follower and the restore of the pacer's facts, the
// worker's partition options, the lease manager). It also holds the rule
// for the default mirror target.
//
// It does not: parse flags (cmd/mirrorworker does, and fills a Config and
// PodOptions), connect to NATS, define streams or consumers (package jobs
// does; StartPod asks it to ensure them), or read and publish pacer facts
// itself (package facts does).
package pipeline

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/bandwidth"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/credentials"
	"github.com/mirrorworker/mirrorworker/facts"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/lifecycle"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/worker"
)

// Config is what a pipeline is built from. Every zero field is the default
// of the option it fills (worker.Options, pacer.Options, fetch.Options).
type Config struct {
	Concurrency   int           // worker.Options.Concurrency
	FailureBudget int           // worker.Options.FailureBudget
	AckWait       time.Duration // worker.Options.AckWait; must match the consumer's
	AckBatch      time.Duration // worker.Options.AckBatch; 0: each ack at once
	WorkerID      string        // worker.Options.WorkerID
	Policy        *pacer.Policy // the HostPacer's limits (floors, caps, bandwidth, steps, groups)
	TimeScale     float64       // pacer.Options.Scale: load tests only
	// Pacer, if set, is used instead of a HostPacer built from Policy and
	// TimeScale; it is not wired to the event sink (the load test's
	// strategies publish nothing).
	Pacer *pacer.Pacer
	Fetch *fetch.Options
	// MaxBandwidth caps the bytes per second of every body together
	// (bandwidth.Options.PodLimit, run's --max-bandwidth); 0: no cap. The
	// authorities' own caps come from Policy and the live policy.
	MaxBandwidth int64
	// Credentials, if set, is the credentials file or directory
	// (package credentials): New loads it (an error if it does not load),
	// the fetch client sends each authority its credential, Run reloads it
	// every credentials.DefaultReloadInterval, and a change ends the
	// workers' auth holds on the authorities it changed.
	Credentials string
	// CredentialsReload is how often Run re-reads them;
	// credentials.DefaultReloadInterval.
	CredentialsReload time.Duration
	// Auth is worker.Options.Auth, the handling of 401 and 403.
	Auth worker.AuthRule
	// MaxDeletes is worker.Options.MaxDeletesPerMinute (negative: no limit).
	MaxDeletes int
	// Clock is what the workers, the fact follower and a pod (its lease
	// manager, its grants, its wait for replays pacing alone, its
	// announcement) read and wait on; nil is clock.Real{}. The pacer takes
	// each instant from them.
	Clock clock.Clock
	// Registerer gets the worker's and the sink's metrics; nil keeps them
	// on a private registry.
	Registerer prometheus.Registerer
	Logger     zerolog.Logger
}

var _ facts.Metrics = (*worker.Metrics)(nil)

// Parts are a pipeline's pieces, built before its consumer exists: one
// Metrics for the worker and the event sink (so one registry serves both),
// the sink, the pacer and the fetch client. Build workers with NewWorker
// and run them with Run; Close when done.
type Parts struct {
	Metrics *worker.Metrics
	Sink    *facts.Sink
	Pacer   *pacer.Pacer
	Fetch   *fetch.Client
	// Bandwidth holds the bandwidth caps the fetch client spends body
	// reads on; SetPolicy gives it and the pacer a new policy.
	Bandwidth *bandwidth.Caps
	// Credentials is the loaded credential set (nil without
	// Config.Credentials).
	Credentials *credentials.Store
	// Clock is Config.Clock (clock.Real{} if it was nil): a command that
	// runs more beside the parts (a replay) reads the same one.
	Clock clock.Clock

	js       jetstream.JetStream
	cfg      Config
	follower *facts.Follower // set by Follow

	mu      sync.Mutex
	workers []*worker.Worker // told of credential changes
}

// New builds the parts. js is where the sink publishes pacer facts and the
// worker dead-letters and parks; a nil js is allowed only for a sink that
// publishes nothing (then workers cannot be built).
func New(js jetstream.JetStream, c Config) (*Parts, error) {
	metrics, err := worker.NewMetrics(c.Registerer, 0)
	if err != nil {
		return nil, err
	}
	p := &Parts{Metrics: metrics, Pacer: c.Pacer, Clock: c.Clock, js: js, cfg: c}
	if p.Clock == nil {
		p.Clock = clock.Real{}
	}
	fo := &fetch.Options{}
	if c.Fetch != nil {
		*fo = *c.Fetch
	}
	if c.Credentials != "" {
		if p.Credentials, err = credentials.Open(c.Credentials, &credentials.Options{
			Logger: c.Logger, Registerer: c.Registerer, ReloadInterval: c.CredentialsReload}); err != nil {
			return nil, err
		}
		fo.Credentials = p.Credentials
		p.Credentials.OnChange(func(changed func(authority.Authority) bool) {
			p.mu.Lock()
			ws := append([]*worker.Worker(nil), p.workers...)
			p.mu.Unlock()
			for _, w := range ws {
				w.CredentialsChanged(changed)
			}
		})
	}
	if p.Bandwidth, err = bandwidth.New(&bandwidth.Options{Policy: c.Policy, PodLimit: c.MaxBandwidth,
		Registerer: c.Registerer, Labels: metrics.HostLabels}); err != nil {
		return nil, err
	}
	fo.Throttle = p.Bandwidth
	if !fo.Proxy.IsZero() {
		c.Logger.Info().Str("proxy", fo.Proxy.String()).Msg("egress proxy")
	}
	p.Fetch = fetch.New(fo)
	var pub facts.Publisher
	if js != nil {
		pub = js
	}
	p.Sink = facts.NewSink(pub, c.Logger, metrics)
	if p.Pacer == nil {
		// The worker reports every request's write (worker.Pacer.Sent).
		// It reports every 2xx answer's headers too (worker.Pacer.Heard),
		// which end the cold hold's wait without the body.
		p.Pacer = pacer.New(&pacer.Options{Policy: c.Policy, OnEvent: p.Sink.Handle, Scale: c.TimeScale, AwaitSends: true, ColdHold: pacer.DefaultColdHold})
	}
	return p, nil
}

// SetPolicy applies a policy to the pacer (floors, in-flight caps) and to
// the bandwidth caps: the live policy's Apply (docs/adr/0023).
func (p *Parts) SetPolicy(q *pacer.Policy) {
	p.Pacer.SetPolicy(q)
	p.Bandwidth.SetPolicy(q)
}

// Close releases the fetch client's idle connections.
func (p *Parts) Close() { p.Fetch.CloseIdleConnections() }

// NewWorker is a worker on cons (nil in partitioned mode) storing into
// target, with the parts and the Config; shutdownGrace 0 is the worker's
// default. adjust may change the options and dependencies before the
// worker is made (a fetcher wrapped, partitioned mode, a hook).
func (p *Parts) NewWorker(cons jetstream.Consumer, target worker.Target, shutdownGrace time.Duration, adjust ...func(*worker.Options, *worker.Deps)) (*worker.Worker, error) {
	d := worker.Deps{JS: p.js, Consumer: cons, Fetcher: p.Fetch, Target: target, Pacer: p.Pacer}
	o := &worker.Options{
		Concurrency:   p.cfg.Concurrency,
		FailureBudget: p.cfg.FailureBudget,
		AckWait:       p.cfg.AckWait,
		AckBatch:      p.cfg.AckBatch,
		ShutdownGrace: shutdownGrace,
		WorkerID:      p.cfg.WorkerID,
		Clock:         p.Clock,
		Logger:        p.cfg.Logger,
		Metrics:       p.Metrics,
		Auth:          p.cfg.Auth,
	}
	o.MaxDeletesPerMinute = p.cfg.MaxDeletes
	for _, f := range adjust {
		f(o, &d)
	}
	w, err := worker.New(d, o)
	if err == nil && p.Credentials != nil {
		p.mu.Lock()
		p.workers = append(p.workers, w)
		p.mu.Unlock()
	}
	return w, err
}

// The stop order of every process that runs a pipeline, written once. A
// stage is told to stop (its parts' context ends) only once every part of
// the stages above it has returned; the first signal begins the stop at the
// top, a second one only shortens the worker's grace (docs/adr/0032).
//
//	stage      parts                             told when            waits for before returning
//	admission  lease manager's StopTaking        the stop begins      nothing: no partition is taken from here on
//	work       worker (or a replay)              admission returned   its fetches, up to --shutdown-grace (a second
//	                                                                  signal cancels them now); every held job acked
//	                                                                  or handed back
//	trailing   event sink, lease manager,        work returned        the sink: facts learned in the grace published
//	           the pod's announcement                                 (facts.StopWindow); the manager: facts flushed,
//	                                                                  then its leases given up
//	services   fact follower, grant server,      trailing returned    nothing: they serve until the leases are gone
//	           live policy, credentials reload
//	conn       NATS connection                   services returned    the last acks and NAKs flushed (5 s), closed
//	server     embedded NATS server              conn returned        its clients gone; its store closed
//	admin      admin endpoint                    server returned      nothing: /metrics and /readyz served until here
//
// Run and Pod.Run use the stages from admission to services; `mirrorworker
// run` adds its connection, embedded server and admin endpoint to the same
// group (cmd/mirrorworker/run.go).
const (
	StageAdmission lifecycle.Stage = iota
	StageWork
	StageTrailing
	StageServices
	StageConn
	StageServer
	StageAdmin
)

// NewGroup is a lifecycle group with the stages above.
func NewGroup(log zerolog.Logger) *lifecycle.Group {
	return lifecycle.New(log, StageWork, "admission", "work", "trailing", "services", "nats connection", "nats server", "admin")
}

// Follow names this process (self) on the pacer facts the sink publishes
// and follows MIRROR_EVENTS: the facts of every other pod (and replay) and
// operators' pauses are applied to the pacer as they are published
// (facts.Follow). Call it before the cold-start restore, so that
// nothing published in between is missed, and run the follower as one of
// the services (RunOptions.Services: its Run); Close it if it is not run.
func (p *Parts) Follow(ctx context.Context, js jetstream.JetStream, self string, log zerolog.Logger) (*facts.Follower, error) {
	p.Sink.SetPod(self)
	f, err := facts.NewFollower(ctx, js, p.Pacer, self, p.Clock, log)
	if err != nil {
		return nil, err
	}
	p.follower = f
	return f, nil
}

// SyncFacts returns once the follower has applied every fact MIRROR_EVENTS
// had stored when it was called (facts.Follower.Sync); at once without
// Follow.
func (p *Parts) SyncFacts(ctx context.Context) error {
	if p.follower == nil {
		return nil
	}
	return p.follower.Sync(ctx)
}

// RunOptions add parts to the group, at their stages. The zero value adds
// none.
type RunOptions struct {
	// Stopping is called once when the stop begins, before work's context
	// is cancelled (a pod's lease manager stops taking partitions).
	Stopping func()
	// Trailing parts run beside work; their context ends only once work has
	// returned, like the event sink's (a lease manager keeps its leases
	// until every held job is handed back).
	Trailing []func(ctx context.Context) error
	// Services run beside work and stop after the trailing parts (the
	// facts follower, a live policy).
	Services []func(ctx context.Context) error
}

// Add adds work (a worker's Run, or a replay driving workers), the event
// sink, the credentials' reload and o's parts to g at their stages (see
// StageAdmission). Work that must not end on its own (a worker) says so by
// returning an error. It returns lifecycle.ErrStopping if g's stop had
// already passed their stages (a stop asked for during start-up).
func (p *Parts) Add(g *lifecycle.Group, work func(ctx context.Context) error, o *RunOptions) error {
	if o == nil {
		o = &RunOptions{}
	}
	type part struct {
		stage lifecycle.Stage
		name  string
		run   func(ctx context.Context) error
	}
	var parts []part
	if stopping := o.Stopping; stopping != nil {
		parts = append(parts, part{StageAdmission, "stop taking", func(ctx context.Context) error {
			<-ctx.Done()
			stopping()
			return nil
		}})
	}
	parts = append(parts, part{StageWork, "work", work}, part{StageTrailing, "event sink", p.Sink.Run})
	for _, f := range o.Trailing {
		parts = append(parts, part{StageTrailing, "trailing", f})
	}
	for _, f := range o.Services {
		parts = append(parts, part{StageServices, "service", f})
	}
	if p.Credentials != nil {
		// Secret rotation: the files are re-read while the pipeline runs.
		parts = append(parts, part{StageServices, "credentials reload", p.Credentials.Run})
	}
	for _, pt := range parts {
		if err := g.Add(pt.stage, pt.name, pt.run); err != nil {
			return err
		}
	}
	return nil
}

// Run runs work with the event sink and o's parts in their own group
// (NewGroup, Add), until ctx ends or one of them returns, and stops them in
// the pipeline's order: the sink and the trailing parts stop only after
// work has returned, so that pacer facts learned during the grace period
// are still published.
//
// It returns work's error if work failed, including while stopping; else
// nil after a stop asked for by ctx or after work returned nil; else the
// error of the part that returned first.
func (p *Parts) Run(ctx context.Context, work func(ctx context.Context) error, o *RunOptions) error {
	g := NewGroup(p.cfg.Logger)
	if err := p.Add(g, work, o); err != nil {
		return err
	}
	return g.Run(ctx)
}

// DefaultTarget is the mirror target when none is given: the directory
// "mirror" under dataDir, as a file:// URL with an absolute path.
func DefaultTarget(dataDir string) (string, error) {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return "", fmt.Errorf("data dir: %w", err)
	}
	return "file://" + filepath.Join(abs, "mirror"), nil
}

// OpenTarget opens the mirror target at spec (a file:// URL or a
// directory) and proves it writable, so that a mistake fails before
// anything starts rather than at the first job.
func OpenTarget(spec string) (*mirror.FileTarget, error) { return OpenTargetWith(spec, nil) }

// OpenTargetWith is OpenTarget with the target's options (nil: defaults).
func OpenTargetWith(spec string, o *mirror.Options) (*mirror.FileTarget, error) {
	target, err := mirror.OpenWith(spec, o)
	if err != nil {
		return nil, err
	}
	if err := CheckWritableDir(filepath.Join(target.Root(), mirror.ReservedDir)); err != nil {
		return nil, fmt.Errorf("mirror target %s: %w", target.Root(), err)
	}
	return target, nil
}

// CheckWritableDir creates dir if needed and proves a file can be created
// in it, so that a read-only or foreign directory fails before start-up
// rather than at the first job.
func CheckWritableDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".mirrorworker-write-check-*")
	if err != nil {
		return fmt.Errorf("not writable: %w", err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}
